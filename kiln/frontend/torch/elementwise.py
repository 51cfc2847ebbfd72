"""Elementwise ATen operators: arithmetic, math functions, comparisons, logic, where, casts.

torch promotes mixed dtypes (an int tensor times a float is float); kiln never converts
implicitly, so each operand is cast to the dtype torch computes in: the result's dtype for
arithmetic, the promoted dtype of the operands for comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kiln.frontend.torch.registry import AtenCall, converter
from kiln.ir import Expr
from kiln.ir.dtype import dtype_of
from kiln.op import (
    abs,
    add,
    cast,
    ceil,
    clip,
    cos,
    divide,
    equal,
    erf,
    exp,
    floor,
    floor_divide,
    floor_mod,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    mod,
    multiply,
    nearbyint,
    negative,
    not_equal,
    power,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sqrt,
    subtract,
    tanh,
    where,
)


def _arith(n: AtenCall, a: object, b: object) -> tuple[Expr, Expr]:
    dtype = n.out.dtype
    return n.tensor(a, dtype), n.tensor(b, dtype)


def _scaled(n: AtenCall, x: Expr, alpha: object) -> Expr:
    return x if alpha == 1 else multiply(x, n.tensor(alpha, n.out.dtype))


@converter("aten.add.Tensor", "aten.add.Scalar")
def add_(n: AtenCall, a: object, b: object, alpha: object = 1) -> Expr:
    x, y = _arith(n, a, b)
    return add(x, _scaled(n, y, alpha))


@converter("aten.sub.Tensor", "aten.sub.Scalar")
def sub(n: AtenCall, a: object, b: object, alpha: object = 1) -> Expr:
    x, y = _arith(n, a, b)
    return subtract(x, _scaled(n, y, alpha))


@converter("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(n: AtenCall, a: object, b: object, alpha: object = 1) -> Expr:
    x, y = _arith(n, a, b)
    return subtract(y, _scaled(n, x, alpha))


@converter("aten.mul.Tensor", "aten.mul.Scalar")
def mul(n: AtenCall, a: object, b: object) -> Expr:
    return multiply(*_arith(n, a, b))


@converter("aten.div.Tensor", "aten.div.Scalar")
def div(n: AtenCall, a: object, b: object) -> Expr:
    return divide(*_arith(n, a, b))


@converter("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(n: AtenCall, a: object, b: object, rounding_mode: str | None) -> Expr:
    x, y = _arith(n, a, b)
    floating = dtype_of(n.out.dtype).is_float
    if rounding_mode is None:
        return divide(x, y)
    if rounding_mode == "floor":
        return floor(divide(x, y)) if floating else floor_divide(x, y)
    if rounding_mode == "trunc":
        return _trunc(divide(x, y)) if floating else divide(x, y)
    raise n.error(f"unknown rounding mode {rounding_mode!r}")


@converter("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide_(n: AtenCall, a: object, b: object) -> Expr:
    x, y = _arith(n, a, b)
    return floor(divide(x, y)) if dtype_of(n.out.dtype).is_float else floor_divide(x, y)


@converter("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(n: AtenCall, a: object, b: object) -> Expr:
    return floor_mod(*_arith(n, a, b))


@converter("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(n: AtenCall, a: object, b: object) -> Expr:
    return mod(*_arith(n, a, b))


@converter("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar")
def pow_(n: AtenCall, a: object, b: object) -> Expr:
    if b == 2:
        x = n.tensor(a, n.out.dtype)
        return multiply(x, x)
    return power(*_arith(n, a, b))


@converter("aten.maximum.default")
def maximum_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    return maximum(*_arith(n, a, b))


@converter("aten.minimum.default")
def minimum_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    return minimum(*_arith(n, a, b))


# --- unary functions: the input cast to the result's dtype (exp of an int tensor is float) ----


def _unary(fn: Callable[[Expr], Expr]) -> Callable[[AtenCall, Expr], Expr]:
    def convert(n: AtenCall, x: Expr) -> Expr:
        return fn(n.tensor(x, n.out.dtype))

    return convert


_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "aten.neg.default": negative,
    "aten.abs.default": abs,
    "aten.exp.default": exp,
    "aten.log.default": log,
    "aten.sqrt.default": sqrt,
    "aten.rsqrt.default": rsqrt,
    "aten.tanh.default": tanh,
    "aten.sigmoid.default": sigmoid,
    "aten.erf.default": erf,
    "aten.sin.default": sin,
    "aten.cos.default": cos,
    "aten.floor.default": floor,
    "aten.ceil.default": ceil,
    "aten.sign.default": sign,
}
for _name, _fn in _UNARY.items():
    converter(_name)(_unary(_fn))


def _trunc(x: Expr) -> Expr:
    return multiply(sign(x), floor(abs(x)))


@converter("aten.trunc.default")
def trunc(n: AtenCall, x: Expr) -> Expr:
    return _trunc(x) if dtype_of(n.out.dtype).is_float else x


@converter("aten.round.default")
def round_(n: AtenCall, x: Expr) -> Expr:
    if not dtype_of(n.out.dtype).is_float:
        return x
    return nearbyint(x)  # torch's round goes to the even neighbour (kiln's round: away)


@converter("aten.reciprocal.default")
def reciprocal(n: AtenCall, x: Expr) -> Expr:
    return divide(n.tensor(1.0, n.out.dtype), n.tensor(x, n.out.dtype))


@converter("aten.square.default")
def square(n: AtenCall, x: Expr) -> Expr:
    x = n.tensor(x, n.out.dtype)
    return multiply(x, x)


@converter("aten.log2.default", "aten.log10.default")
def log_base(n: AtenCall, x: Expr) -> Expr:
    base = 2.0 if n.target == "aten.log2.default" else 10.0
    return divide(log(n.tensor(x, n.out.dtype)), n.tensor(math.log(base), n.out.dtype))


@converter("aten.exp2.default")
def exp2(n: AtenCall, x: Expr) -> Expr:
    return power(n.tensor(2.0, n.out.dtype), n.tensor(x, n.out.dtype))


@converter("aten.log1p.default")
def log1p(n: AtenCall, x: Expr) -> Expr:
    return log(add(n.tensor(x, n.out.dtype), n.tensor(1.0, n.out.dtype)))


@converter("aten.expm1.default")
def expm1(n: AtenCall, x: Expr) -> Expr:
    return subtract(exp(n.tensor(x, n.out.dtype)), n.tensor(1.0, n.out.dtype))


@converter("aten.isnan.default")
def isnan(n: AtenCall, x: Expr) -> Expr:
    return not_equal(x, x)


@converter("aten.isinf.default")
def isinf(n: AtenCall, x: Expr) -> Expr:
    if not dtype_of(n.dtype(x)).is_float:
        return not_equal(x, x)  # all false
    return equal(abs(x), n.tensor(math.inf, n.dtype(x)))


# --- comparisons and logic -----------------------------------------------------------------


def _compare(fn: Callable[[Expr, Expr], Expr]) -> Callable[[AtenCall, object, object], Expr]:
    def convert(n: AtenCall, a: object, b: object) -> Expr:
        dtype = n.promoted(a, b)
        return fn(n.tensor(a, dtype), n.tensor(b, dtype))

    return convert


for _base, _fn in {"eq": equal, "ne": not_equal, "lt": less, "le": less_equal,
                   "gt": greater, "ge": greater_equal}.items():
    converter(f"aten.{_base}.Tensor", f"aten.{_base}.Scalar")(_compare(_fn))


def _truth(n: AtenCall, x: Expr) -> Expr:
    """A tensor as bool, as torch's logical operators read it (nonzero is true)."""
    if n.dtype(x) == "bool":
        return x
    return not_equal(x, n.tensor(0, n.dtype(x)))


@converter("aten.logical_not.default", "aten.bitwise_not.default")
def logical_not_(n: AtenCall, x: Expr) -> Expr:
    if n.target == "aten.bitwise_not.default" and n.dtype(x) != "bool":
        raise n.error("kiln has no bitwise operators on integers")
    return logical_not(_truth(n, x))


@converter("aten.logical_and.default", "aten.bitwise_and.Tensor")
def logical_and_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    _bool_only(n, a, b)
    return logical_and(_truth(n, a), _truth(n, b))


@converter("aten.logical_or.default", "aten.bitwise_or.Tensor")
def logical_or_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    _bool_only(n, a, b)
    return logical_or(_truth(n, a), _truth(n, b))


@converter("aten.logical_xor.default", "aten.bitwise_xor.Tensor")
def logical_xor(n: AtenCall, a: Expr, b: Expr) -> Expr:
    _bool_only(n, a, b)
    return not_equal(_truth(n, a), _truth(n, b))


def _bool_only(n: AtenCall, *xs: Expr) -> None:
    if n.target.startswith("aten.bitwise") and any(n.dtype(x) != "bool" for x in xs):
        raise n.error("kiln has no bitwise operators on integers")


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def where_(n: AtenCall, condition: Expr, a: object, b: object) -> Expr:
    x, y = _arith(n, a, b)
    return where(_truth(n, condition), x, y)


@converter("aten.clamp.default", "aten.clamp.Tensor")
def clamp(n: AtenCall, x: Expr, low: object = None, high: object = None) -> Expr:
    dtype = n.out.dtype
    x = n.tensor(x, dtype)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low <= high:
        return clip(x, a_min=float(low), a_max=float(high))
    if low is not None:
        x = maximum(x, n.tensor(low, dtype))
    if high is not None:
        x = minimum(x, n.tensor(high, dtype))
    return x


@converter("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(n: AtenCall, x: Expr, low: object) -> Expr:
    return maximum(*_arith(n, x, low))


@converter("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(n: AtenCall, x: Expr, high: object) -> Expr:
    return minimum(*_arith(n, x, high))


@converter("aten._to_copy.default")
def to_copy(n: AtenCall, x: Expr, *_: object) -> Expr:
    return x if n.dtype(x) == n.out.dtype else cast(x, dtype=n.out.dtype)


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(n: AtenCall, x: Expr, mask: Expr, value: object) -> Expr:
    dtype = n.out.dtype
    return where(_truth(n, mask), n.tensor(value, dtype), n.tensor(x, dtype))
