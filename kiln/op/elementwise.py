"""Elementwise operators: unary math, broadcasting binary arithmetic and comparisons,
``where``, ``clip`` and ``cast``.

Binary operators never promote: both operands must have the same dtype, and the result keeps
it exactly (comparisons give bool). Integer ``divide`` and ``mod`` truncate toward zero as C
(and TVM) do; ``floor_divide`` and ``floor_mod`` round toward negative infinity. Integer
division by zero is an `EvalError`; floating-point division by zero gives inf or nan quietly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import Error, EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Indices, Tensor, WriteFn, broadcast_indices, compute
from kiln.loops.ir import (
    Allocate,
    Binary,
    Buffer,
    Check,
    Const,
    For,
    IfThenElse,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.ir import Var as LVar
from kiln.loops.oplib import LowerFn
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    as_array,
    broadcast_shape,
    require_dtype,
    same_dtype,
    tensor_arg,
    tensor_args,
    trunc_divide,
)
from kiln.op.grad_helpers import call, scalar, unbroadcast, zeros_like
from kiln.op.registry import Attr, OpDef, OpPattern, register

Gradient = Callable[[Call, Expr], list[Expr | None]]

# --- unary --------------------------------------------------------------------------------


def _unary_relation(kind: str) -> Callable[[Sequence[Type], Attrs], Type | None]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
        data = tensor_arg(arg_types[0], "data")
        if data is None:
            return None
        require_dtype(data, "data", kind)
        return data

    return relation


def _unary(
    name: str,
    fn: Callable[[np.ndarray], object],
    doc: str,
    *,
    kind: str = "float",
    differentiable: bool = True,
    gradient: Gradient | None = None,
    lower: LowerFn | None = None,
) -> OpDef:
    """Register an operator applying ``fn`` to every element, keeping shape and dtype.

    ``kind="float"`` marks floating-point math (exp, log, ...). TVM types these with its
    IdentityRel, which takes integers too and keeps their dtype; kiln computes them on integers
    in float64 and converts back, truncating toward zero as ``cast`` does (``_float_math``
    lowers them the same way).
    """

    def compute(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        x = np.asarray(arrays[0])
        with np.errstate(all="ignore"):
            if kind == "float" and x.dtype.kind in "iu":
                return as_array(fn(x.astype(np.float64)), x.dtype.name)
            return as_array(fn(x), x.dtype.name)

    return register(
        name,
        inputs=("data",),
        relation=_unary_relation("numeric" if kind == "float" else kind),
        compute=compute,
        pattern=OpPattern.ELEMWISE,
        doc=doc,
        differentiable=differentiable,
        gradient=gradient,
        lower=lower,
    )


def _round_half_away(x: np.ndarray) -> np.ndarray:
    # TVM's round lowers to llvm.round: halves go away from zero (numpy's rint goes to even).
    whole = np.trunc(x)
    frac = x - whole  # exact in floating point
    return whole + np.where(np.abs(frac) >= 0.5, np.sign(x), 0).astype(x.dtype)


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function in float64, from a series near 0 and a continued fraction beyond."""
    z = np.abs(x.astype(np.float64))
    out = np.empty_like(z)
    near = z < 3.0
    zn = z[near]
    # erf z = 2/sqrt(pi) exp(-z^2) sum_n (2 z^2)^n z / (1*3*...*(2n+1)): all terms positive.
    term = zn.copy()
    total = zn.copy()
    scale = 2.0 * zn * zn
    for n in range(1, 100):
        term *= scale / (2 * n + 1)
        total += term
        if not np.any(term > total * 1e-17):  # every series has converged
            break
    out[near] = 2.0 / np.sqrt(np.pi) * np.exp(-zn * zn) * total
    zf = z[~near]
    # erfc z = exp(-z^2)/sqrt(pi) / (z + (1/2)/(z + 1/(z + (3/2)/(z + ...)))), from the tail.
    frac = np.zeros_like(zf)
    for k in range(60, 0, -1):
        frac = (k / 2.0) / (zf + frac)
    out[~near] = 1.0 - np.exp(-zf * zf) / np.sqrt(np.pi) / (zf + frac)
    return np.copysign(out, x)


# Lowerings that depend on the dtype: integers round trivially, and integer division needs a
# run-time check of the divisor (a statement), so it lowers as an elementwise extern.


def _float_math(op: str) -> LowerFn:
    """exp, log, ...: the loop-IR op on floats; integers go through float64 and back
    (truncated toward zero), as the reference computes them."""

    def scalar(x: LExpr) -> LExpr:
        if dtype_of(x.dtype).is_float:
            return Unary(op, x)
        return oplib.convert(Unary(op, oplib.convert(x, "float64")), x.dtype)

    return oplib.unary(scalar)


def _float_or_identity(op: str) -> LowerFn:
    """floor, ceil, round: the loop-IR unary op on floats; integers are already whole."""
    return oplib.unary(lambda x: Unary(op, x) if dtype_of(x.dtype).is_float else x)


def _sign(x: LExpr) -> LExpr:
    if dtype_of(x.dtype).is_float:
        return Unary("sign", x)
    one, zero = oplib.dtype_const(1, x.dtype), oplib.dtype_const(0, x.dtype)
    positive = Select(Binary("gt", x, zero), one, zero)
    if not dtype_of(x.dtype).is_int:
        return positive
    return Select(Binary("lt", x, zero), oplib.dtype_const(-1, x.dtype), positive)


def _abs(x: LExpr) -> LExpr:
    return x if dtype_of(x.dtype).is_uint else Unary("abs", x)


def _float_floor_mod(a: LExpr, b: LExpr) -> LExpr:
    return Binary("sub", a, Binary("mul", Unary("floor", Binary("div", a, b)), b))


_INT_DIVISION = {"divide": "truncdiv", "mod": "truncmod", "floor_divide": "floordiv",
                 "floor_mod": "floormod"}
_FLOAT_DIVISION = {
    "divide": lambda a, b: Binary("div", a, b),
    "mod": lambda a, b: Binary("truncmod", a, b),  # C's fmod
    "floor_divide": lambda a, b: Unary("floor", Binary("div", a, b)),
    "floor_mod": _float_floor_mod,
}


def _division(name: str) -> LowerFn:
    """divide, mod, floor_divide, floor_mod: float arithmetic, or checked integer division.

    A signed division by -1 is computed as a negation (it wraps for the minimum value, as
    numpy does, where the machine's division instruction would trap).
    """
    float_rule = oplib.binary(_FLOAT_DIVISION[name])
    op = _INT_DIVISION[name]

    def lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
        out = oplib.out_tensor_type(out_type)
        if dtype_of(out.dtype).is_float:
            return float_rule(inputs, attrs, out_type)
        a, b = inputs
        shape = out.static_shape

        def element(idx: Indices, write: WriteFn) -> Stmt:
            x, y = LVar("x", out.dtype), LVar("y", out.dtype)
            zero = oplib.dtype_const(0, out.dtype)
            if dtype_of(out.dtype).is_int:
                minus_one = oplib.dtype_const(-1, out.dtype)
                by_minus_one = Binary("eq", y, minus_one)
                safe = Select(by_minus_one, oplib.dtype_const(1, out.dtype), y)
                value: LExpr = Binary(op, x, safe)
                if op in ("truncdiv", "floordiv"):
                    value = Select(by_minus_one, Unary("neg", x), value)
            else:
                value = Binary(op, x, y)
            body = Seq((Check(Binary("ne", y, zero), "integer division by zero"),
                        write(idx, value)))
            return LetStmt(x, a(*broadcast_indices(a.shape, shape, idx)),
                           LetStmt(y, b(*broadcast_indices(b.shape, shape, idx)), body))

        return oplib.elementwise_extern(shape, out.dtype, element)

    return lower


def _power_lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    """Float pow; integers by repeated squaring (wrapping as numpy), a negative exponent is
    an error."""
    out = oplib.out_tensor_type(out_type)
    if dtype_of(out.dtype).is_float:
        return oplib.binary("pow")(inputs, attrs, out_type)
    a, b = inputs
    shape, dt = out.static_shape, out.dtype
    bits = dtype_of(dt).bits - (1 if dtype_of(dt).is_int else 0)

    def element(idx: Indices, write: WriteFn) -> Stmt:
        # state: [result, base, remaining exponent]
        st = Buffer("pow", (3,), dt, "local")
        acc, base, rest = (Load(st, (Const(k),)) for k in range(3))
        k = LVar("bit")
        one, two = oplib.dtype_const(1, dt), oplib.dtype_const(2, dt)
        step = Seq((
            IfThenElse(Binary("eq", Binary("floormod", rest, two), one),
                       Store(st, (Const(0),), Binary("mul", acc, base))),
            Store(st, (Const(1),), Binary("mul", base, base)),
            Store(st, (Const(2),), Binary("floordiv", rest, two)),
        ))
        stmts: list[Stmt] = []
        exponent = b(*broadcast_indices(b.shape, shape, idx))
        if dtype_of(dt).is_int:
            stmts.append(Check(Binary("ge", exponent, oplib.dtype_const(0, dt)),
                               "integer power with a negative exponent"))
        stmts += [
            Store(st, (Const(0),), one),
            Store(st, (Const(1),), a(*broadcast_indices(a.shape, shape, idx))),
            Store(st, (Const(2),), exponent),
            For(k, Const(0), Const(bits), step),
            write(idx, acc),
        ]
        return Allocate(st, Seq(tuple(stmts)))

    return oplib.elementwise_extern(shape, dt, element, work_per_element=bits)


# Unary gradients: ``call`` is the forward result y = f(x), computed once and shared.


def _x(c: Call) -> Expr:
    return c.args[0]


def _k(c: Call, value: float) -> Expr:
    return scalar(value, gh.dtype(c))


exp = _unary(
    "exp",
    np.exp,
    "e raised to each element.",
    gradient=lambda c, g: [g * c],
    lower=_float_math("exp"),
)
log = _unary(
    "log",
    np.log,
    "Natural logarithm of each element.",
    gradient=lambda c, g: [g / _x(c)],
    lower=_float_math("log"),
)
sqrt = _unary(
    "sqrt",
    np.sqrt,
    "Square root of each element.",
    gradient=lambda c, g: [g * _k(c, 0.5) / c],
    lower=_float_math("sqrt"),
)
rsqrt = _unary(
    "rsqrt",
    lambda x: 1 / np.sqrt(x),
    "Reciprocal square root of each element.",
    gradient=lambda c, g: [g * _k(c, -0.5) * c * c * c],  # d/dx x^-1/2 = -1/2 y^3
    lower=_float_math("rsqrt"),
)
tanh = _unary(
    "tanh",
    np.tanh,
    "Hyperbolic tangent of each element.",
    gradient=lambda c, g: [g * (_k(c, 1.0) - c * c)],
    lower=_float_math("tanh"),
)
sigmoid = _unary(
    "sigmoid",
    lambda x: 1 / (1 + np.exp(-x)),
    "Logistic sigmoid 1/(1+e^-x).",
    gradient=lambda c, g: [g * c * (_k(c, 1.0) - c)],
    lower=_float_math("sigmoid"),
)
erf = _unary(
    "erf",
    _erf,
    "Gauss error function of each element.",
    gradient=lambda c, g: [g * _k(c, 2.0 / np.sqrt(np.pi)) * exp(negative(_x(c) * _x(c)))],
    lower=_float_math("erf"),
)
sin = _unary(
    "sin",
    np.sin,
    "Sine of each element (radians).",
    gradient=lambda c, g: [g * cos(_x(c))],
    lower=_float_math("sin"),
)
cos: OpDef = _unary(
    "cos",
    np.cos,
    "Cosine of each element (radians).",
    gradient=lambda c, g: [negative(g * sin(_x(c)))],
    lower=_float_math("cos"),
)
negative: OpDef = _unary(
    "negative",
    np.negative,
    "Negation of each element.",
    kind="numeric",
    gradient=lambda c, g: [negative(g)],
    lower=oplib.unary("neg"),
)
# where() rather than sign(): the adjoint stays differentiable (sign is not).
abs_ = _unary(
    "abs",
    np.abs,
    "Absolute value of each element.",
    kind="numeric",
    gradient=lambda c, g: [where(less(_x(c), _k(c, 0.0)), negative(g), g)],
    lower=oplib.unary(_abs),
)
floor = _unary(
    "floor",
    np.floor,
    "Largest integer <= each element.",
    kind="numeric",
    differentiable=False,
    lower=_float_or_identity("floor"),
)
ceil = _unary(
    "ceil",
    np.ceil,
    "Smallest integer >= each element.",
    kind="numeric",
    differentiable=False,
    lower=_float_or_identity("ceil"),
)
round_ = _unary(
    "round",
    _round_half_away,
    "Nearest integer; halves round away from zero.",
    kind="numeric",
    differentiable=False,
    lower=_float_or_identity("round"),
)
nearbyint = _unary(
    "nearbyint",
    np.rint,
    "Nearest integer; halves round to even (TVM's tir.nearbyint; numpy's and ONNX's round).",
    kind="numeric",
    differentiable=False,
    lower=_float_or_identity("nearbyint"),
)
sign = _unary(
    "sign",
    np.sign,
    "-1, 0 or 1 by the sign of each element.",
    kind="numeric",
    differentiable=False,
    lower=oplib.unary(_sign),
)
logical_not = _unary(
    "logical_not",
    np.logical_not,
    "Boolean negation of each element.",
    kind="bool",
    differentiable=False,
    lower=oplib.unary("not"),
)


# --- binary -------------------------------------------------------------------------------


def _binary_relation(
    kind: str, result_dtype: str | None
) -> Callable[[Sequence[Type], Attrs], Type | None]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
        args = tensor_args(arg_types, ("lhs", "rhs"))
        if args is None:
            return None
        lhs, rhs = args
        dtype = same_dtype(args, ("lhs", "rhs"))
        require_dtype(lhs, "lhs", kind)
        shape = broadcast_shape(lhs.shape, rhs.shape)
        return TensorType(shape, result_dtype or dtype)

    return relation


def _binary(
    name: str,
    fn: Callable[[np.ndarray, np.ndarray], object],
    doc: str,
    *,
    kind: str = "numeric",
    result_dtype: str | None = None,
    differentiable: bool = True,
    gradient: Gradient | None = None,
    lower: LowerFn | None = None,
) -> OpDef:
    """Register a broadcasting binary operator computing ``fn(lhs, rhs)``."""

    def compute(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        lhs, rhs = np.asarray(arrays[0]), np.asarray(arrays[1])
        with np.errstate(all="ignore"):
            return as_array(fn(lhs, rhs), result_dtype or lhs.dtype.name)

    return register(
        name,
        inputs=("lhs", "rhs"),
        relation=_binary_relation(kind, result_dtype),
        compute=compute,
        pattern=OpPattern.BROADCAST,
        doc=doc,
        differentiable=differentiable,
        gradient=gradient,
        lower=lower,
    )


def _nonzero_divisor(b: np.ndarray) -> None:
    if np.any(b == 0):
        raise EvalError("integer division by zero")


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtype_of(a.dtype.name).is_integer:
        _nonzero_divisor(b)
        return trunc_divide(a, b)
    return a / b


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtype_of(a.dtype.name).is_integer:
        _nonzero_divisor(b)
    return np.fmod(a, b)  # C's %: the result takes the sign of the dividend


def _floor_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtype_of(a.dtype.name).is_integer:
        _nonzero_divisor(b)
        return np.floor_divide(a, b)
    return np.floor(a / b)


def _floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtype_of(a.dtype.name).is_integer:
        _nonzero_divisor(b)
        return np.remainder(a, b)
    return a - np.floor(a / b) * b  # TVM's floormod for floats


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtype_of(a.dtype.name).is_integer and np.any(b < 0):
        raise EvalError("integer power with a negative exponent")
    return np.power(a, b)


# Binary gradients: each adjoint is summed back over the axes its operand was broadcast along.


def _binary_grads(c: Call, dlhs: Expr | None, drhs: Expr | None) -> list[Expr | None]:
    lhs, rhs = c.args
    out = c.checked_type
    return [
        None if dlhs is None else unbroadcast(dlhs, lhs, out),
        None if drhs is None else unbroadcast(drhs, rhs, out),
    ]


def _zero(g: Expr) -> Expr:
    return zeros_like(g)


add = _binary(
    "add",
    np.add,
    "Elementwise sum, with broadcasting.",
    gradient=lambda c, g: _binary_grads(c, g, g),
    lower=oplib.binary("add"),
)
subtract = _binary(
    "subtract",
    np.subtract,
    "Elementwise difference, with broadcasting.",
    gradient=lambda c, g: _binary_grads(c, g, negative(g)),
    lower=oplib.binary("sub"),
)
multiply = _binary(
    "multiply",
    np.multiply,
    "Elementwise product, with broadcasting.",
    gradient=lambda c, g: _binary_grads(c, g * c.args[1], g * c.args[0]),
    lower=oplib.binary("mul"),
)
divide = _binary(
    "divide",
    _divide,
    "Elementwise quotient; integers truncate toward zero.",
    # d(a/b)/db = -a/b^2 = -(a/b)/b, from the shared quotient
    gradient=lambda c, g: _binary_grads(c, g / c.args[1], negative(g * c / c.args[1])),
    lower=_division("divide"),
)


def _power_grad(c: Call, g: Expr) -> list[Expr | None]:
    base, exponent = c.args
    one = scalar(1.0, gh.dtype(c))
    dbase = g * exponent * power(base, exponent - one)
    dexponent = g * c * log(base)  # nan for a negative base, as the derivative is undefined
    return _binary_grads(c, dbase, dexponent)


power = _binary(
    "power", _power, "lhs raised to the power rhs, with broadcasting.", gradient=_power_grad,
    lower=_power_lower,
)
# At a tie the whole adjoint goes to lhs.
maximum = _binary(
    "maximum",
    np.maximum,
    "Elementwise larger value, with broadcasting.",
    gradient=lambda c, g: _binary_grads(
        c,
        where(greater_equal(c.args[0], c.args[1]), g, _zero(g)),
        where(greater_equal(c.args[0], c.args[1]), _zero(g), g),
    ),
    lower=oplib.binary("max"),
)
minimum = _binary(
    "minimum",
    np.minimum,
    "Elementwise smaller value, with broadcasting.",
    gradient=lambda c, g: _binary_grads(
        c,
        where(less_equal(c.args[0], c.args[1]), g, _zero(g)),
        where(less_equal(c.args[0], c.args[1]), _zero(g), g),
    ),
    lower=oplib.binary("min"),
)
mod = _binary(
    "mod",
    _mod,
    "Remainder of truncated division (sign of lhs).",
    differentiable=False,
    lower=_division("mod"),
)
floor_divide = _binary(
    "floor_divide",
    _floor_divide,
    "Quotient rounded toward -infinity.",
    differentiable=False,
    lower=_division("floor_divide"),
)
floor_mod = _binary(
    "floor_mod",
    _floor_mod,
    "Remainder of floor division (sign of rhs).",
    differentiable=False,
    lower=_division("floor_mod"),
)


def _shift_compute(left: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    from kiln.loops.evaluate import shift_left, shift_right

    return shift_left if left else shift_right


left_shift = _binary(
    "left_shift",
    _shift_compute(True),
    "Integer lhs shifted left by rhs bits (0 from the width on; a negative rhs: no shift).",
    kind="int",
    differentiable=False,
    lower=oplib.binary("shl"),
)
right_shift = _binary(
    "right_shift",
    _shift_compute(False),
    "Integer lhs shifted right by rhs bits, arithmetic when signed: floor(lhs / 2**rhs) "
    "(from the width on: 0, or -1 for a negative lhs; a negative rhs: no shift).",
    kind="int",
    differentiable=False,
    lower=oplib.binary("shr"),
)


def _compare(
    name: str, fn: Callable[[np.ndarray, np.ndarray], object], doc: str, op: str
) -> OpDef:
    """Register a broadcasting comparison: any dtype in, bool out, no gradient."""
    return _binary(
        name, fn, doc, kind="any", result_dtype="bool", differentiable=False,
        lower=oplib.binary(op),
    )


equal = _compare("equal", np.equal, "lhs == rhs elementwise, as bool.", "eq")
not_equal = _compare("not_equal", np.not_equal, "lhs != rhs elementwise, as bool.", "ne")
less: OpDef = _compare("less", np.less, "lhs < rhs elementwise, as bool.", "lt")
less_equal: OpDef = _compare("less_equal", np.less_equal, "lhs <= rhs elementwise, as bool.", "le")
greater = _compare("greater", np.greater, "lhs > rhs elementwise, as bool.", "gt")
greater_equal: OpDef = _compare(
    "greater_equal", np.greater_equal, "lhs >= rhs elementwise, as bool.", "ge"
)
logical_and = _binary(
    "logical_and",
    np.logical_and,
    "Boolean and of bool tensors.",
    kind="bool",
    differentiable=False,
    lower=oplib.binary("and"),
)
logical_or = _binary(
    "logical_or",
    np.logical_or,
    "Boolean or of bool tensors.",
    kind="bool",
    differentiable=False,
    lower=oplib.binary("or"),
)


# --- where, clip, cast --------------------------------------------------------------------


def _where_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, ("condition", "x", "y"))
    if args is None:
        return None
    cond, x, y = args
    require_dtype(cond, "condition", "bool")
    dtype = same_dtype((x, y), ("x", "y"))
    shape = broadcast_shape(x.shape, y.shape, ("x", "y"))
    shape = broadcast_shape(cond.shape, shape, ("condition", "the broadcast of x and y"))
    return TensorType(shape, dtype)


def _where_grad(c: Call, g: Expr) -> list[Expr | None]:
    cond, x, y = c.args
    out = c.checked_type
    zero = zeros_like(g)
    return [
        None,
        unbroadcast(where(cond, g, zero), x, out),
        unbroadcast(where(cond, zero, g), y, out),
    ]


def _where_lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    cond, x, y = inputs
    shape = out.static_shape

    def element(*i: LExpr) -> LExpr:
        return Select(cond(*broadcast_indices(cond.shape, shape, i)),
                      x(*broadcast_indices(x.shape, shape, i)),
                      y(*broadcast_indices(y.shape, shape, i)))

    return compute(shape, out.dtype, element)


where: OpDef = register(
    "where",
    inputs=("condition", "x", "y"),
    attrs=(),
    relation=_where_relation,
    compute=lambda arrays, attrs: as_array(
        np.where(arrays[0], arrays[1], arrays[2]), np.asarray(arrays[1]).dtype.name
    ),
    pattern=OpPattern.BROADCAST,
    doc="Elements of x where condition is true, else of y, with broadcasting.",
    gradient=_where_grad,
    lower=_where_lower,
)


class ClipAttrs(Attrs):
    __slots__ = ()
    a_min: float
    a_max: float


def _clip_relation(arg_types: Sequence[Type], attrs: ClipAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "a")
    if data is None:
        return None
    require_dtype(data, "a", "numeric")
    if attrs.a_min > attrs.a_max:
        raise TypeCheckError(
            f"clip needs a_min <= a_max, got a_min={attrs.a_min}, a_max={attrs.a_max}"
        )
    return data


def _clip(arrays: list[np.ndarray], attrs: ClipAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    lo, hi = float(attrs.a_min), float(attrs.a_max)
    if dtype_of(x.dtype.name).is_integer:
        # TVM converts the bounds to the element type; keep infinite bounds inside its range.
        info = np.iinfo(x.dtype)
        lo = int(np.clip(lo, info.min, info.max))
        hi = int(np.clip(hi, info.min, info.max))
    return as_array(np.clip(x, np.asarray(lo, x.dtype), np.asarray(hi, x.dtype)), x.dtype.name)


def _clip_grad(c: Call, g: Expr) -> list[Expr | None]:
    x = c.args[0]
    dt = gh.dtype(x)
    attrs = ClipAttrs.view(c.attrs)
    inside = logical_and(
        greater_equal(x, scalar(attrs.a_min, dt)),
        less_equal(x, scalar(attrs.a_max, dt)),
    )
    return [where(inside, g, zeros_like(g))]


def _clip_bound(value: float, dtype: str) -> float | int:
    """A bound as the reference applies it: converted to an integer dtype, within its range."""
    if not dtype_of(dtype).is_integer:
        return value
    info = np.iinfo(dtype)
    return min(max(int(np.clip(value, info.min, info.max)), int(info.min)), int(info.max))


def _clip_lower(inputs: list[Tensor], attrs: ClipAttrs, out_type: Type) -> Tensor:
    (x,) = inputs
    lo = oplib.dtype_const(_clip_bound(attrs.a_min, x.dtype), x.dtype)
    hi = oplib.dtype_const(_clip_bound(attrs.a_max, x.dtype), x.dtype)
    return compute(x.shape, x.dtype, lambda *i: Binary("min", Binary("max", x(*i), lo), hi))


clip = register(
    "clip",
    inputs=("a",),
    attrs=(
        Attr("a_min", kind="float", doc="the smallest value kept"),
        Attr("a_max", kind="float", doc="the largest value kept"),
    ),
    attrs_type=ClipAttrs,
    relation=_clip_relation,
    compute=_clip,
    pattern=OpPattern.ELEMWISE,
    doc="Each element limited to the range [a_min, a_max].",
    gradient=_clip_grad,
    lower=_clip_lower,
)


def _cast_dtype(value: str, where: str) -> str:
    if value == "":
        raise Error(f"{where} must name a dtype")
    return value


class CastAttrs(Attrs):
    __slots__ = ()
    dtype: str


def _cast_relation(arg_types: Sequence[Type], attrs: CastAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    return TensorType(data.shape, attrs.dtype)


def _cast(arrays: list[np.ndarray], attrs: CastAttrs) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # nan or out-of-range floats to integers
        return np.asarray(arrays[0]).astype(attrs.dtype)


def _cast_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Back to the input's dtype; an integer input has no gradient.
    source = gh.dtype(c.args[0])
    if not dtype_of(source).is_float:
        return [None]
    return [g if source == gh.dtype(c) else call("cast", g, dtype=source)]


cast = register(
    "cast",
    inputs=("data",),
    attrs=(Attr("dtype", kind="dtype", convert=_cast_dtype, doc="the target dtype"),),
    attrs_type=CastAttrs,
    relation=_cast_relation,
    compute=_cast,
    pattern=OpPattern.ELEMWISE,
    doc="Each element converted to another dtype (floats to integers truncate).",
    gradient=_cast_grad,
    lower=lambda inputs, attrs, out: compute(
        out.static_shape, out.dtype, lambda *i: oplib.convert(inputs[0](*i), out.dtype)),
)

# fmt: off
__all__ = [
    "abs_", "add", "cast", "ceil", "clip", "cos", "divide", "equal", "erf", "exp", "floor",
    "floor_divide", "floor_mod", "greater", "greater_equal", "left_shift", "less", "less_equal",
    "log", "logical_and", "logical_not", "logical_or", "maximum", "minimum", "mod", "multiply",
    "nearbyint", "negative", "not_equal", "power", "right_shift", "round_", "rsqrt", "sigmoid",
    "sign", "sin", "sqrt", "subtract", "tanh", "where",
]
# fmt: on
