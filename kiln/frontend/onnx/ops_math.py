"""Converters of ONNX's elementwise arithmetic, math functions, comparisons and logic."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Expr

# --- unary math -----------------------------------------------------------------------------

_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "Abs": op.abs,
    "Neg": op.negative,
    "Exp": op.exp,
    "Log": op.log,
    "Sqrt": op.sqrt,
    "Floor": op.floor,
    "Ceil": op.ceil,
    "Sign": op.sign,
    "Sin": op.sin,
    "Cos": op.cos,
    "Tanh": op.tanh,
    "Sigmoid": op.sigmoid,
    "Erf": op.erf,
    "Relu": op.nn.relu,
    "Not": op.logical_not,
}
# The operators that ONNX added after opset 1, from their first version.
_FIRST = {"Sin": 7, "Cos": 7, "Erf": 9, "Sign": 9, "LessOrEqual": 12, "GreaterOrEqual": 12}


def _unary(fn: Callable[[Expr], Expr]) -> Callable[[NodeContext], Expr]:
    def convert(ctx: NodeContext) -> Expr:
        return fn(ctx.x(0))

    return convert


for _name, _unary_fn in _UNARY.items():
    converter(_name, since=_FIRST.get(_name, 1))(_unary(_unary_fn))


def scalar(ctx: NodeContext, value: float, i: int = 0) -> Expr:
    """A scalar constant of input ``i``'s dtype."""
    return const_like(value, ctx.dtype(i))


@converter("Reciprocal", since=1)
def reciprocal(ctx: NodeContext) -> Expr:
    return op.divide(scalar(ctx, 1.0), ctx.x(0))


@converter("Round", since=11)
def round_half_even(ctx: NodeContext) -> Expr:
    # ONNX rounds halves to even (kiln's round takes them away from zero)
    return op.nearbyint(ctx.x(0))


@converter("Tan", since=7)
def tan(ctx: NodeContext) -> Expr:
    return op.divide(op.sin(ctx.x(0)), op.cos(ctx.x(0)))


@converter("Sinh", since=9)
def sinh(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.multiply(op.subtract(op.exp(x), op.exp(op.negative(x))), scalar(ctx, 0.5))


@converter("Cosh", since=9)
def cosh(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.multiply(op.add(op.exp(x), op.exp(op.negative(x))), scalar(ctx, 0.5))


@converter("Asinh", since=9)
def asinh(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    a = op.abs(x)  # odd function: compute on |x| to avoid cancellation for negative x
    r = op.log(op.add(a, op.sqrt(op.add(op.multiply(a, a), scalar(ctx, 1.0)))))
    return op.where(op.less(x, scalar(ctx, 0.0)), op.negative(r), r)


@converter("Acosh", since=9)
def acosh(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.log(op.add(x, op.sqrt(op.subtract(op.multiply(x, x), scalar(ctx, 1.0)))))


@converter("Atanh", since=9)
def atanh(ctx: NodeContext) -> Expr:
    x, one = ctx.x(0), scalar(ctx, 1.0)
    ratio = op.divide(op.add(one, x), op.subtract(one, x))
    return op.multiply(op.log(ratio), scalar(ctx, 0.5))


@converter("IsNaN", since=9)
def isnan(ctx: NodeContext) -> Expr:
    return op.not_equal(ctx.x(0), ctx.x(0))


@converter("IsInf", since=10)
def isinf(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    pos = op.equal(x, scalar(ctx, np.inf))
    neg = op.equal(x, scalar(ctx, -np.inf))
    detect_pos, detect_neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if detect_pos and detect_neg:
        return op.logical_or(pos, neg)
    if detect_pos:
        return pos
    if detect_neg:
        return neg
    return op.logical_and(pos, neg)  # detects nothing: all false


# --- binary arithmetic ----------------------------------------------------------------------

_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "Add": op.add,
    "Sub": op.subtract,
    "Mul": op.multiply,
    "Div": op.divide,
    "Equal": op.equal,
    "Less": op.less,
    "Greater": op.greater,
    "LessOrEqual": op.less_equal,
    "GreaterOrEqual": op.greater_equal,
    "And": op.logical_and,
    "Or": op.logical_or,
    "Xor": op.not_equal,  # on bools
}


def _binary(fn: Callable[[Expr, Expr], Expr]) -> Callable[[NodeContext], Expr]:
    def convert(ctx: NodeContext) -> Expr:
        return fn(ctx.x(0), ctx.x(1))

    return convert


for _name, _binary_fn in _BINARY.items():
    converter(_name, since=_FIRST.get(_name, 1))(_binary(_binary_fn))


@converter("Pow", since=1)
def pow_(ctx: NodeContext) -> Expr:
    base, exponent = ctx.x(0), ctx.x(1)
    bt, et = ctx.dtype(0), ctx.dtype(1)
    if bt == et:
        return op.power(base, exponent)
    if dtype_of(bt).is_float:
        return op.power(base, cast(exponent, bt))
    # an integer base with a float exponent: numpy computes in floating point
    wide = op.power(cast(base, "float64"), cast(exponent, "float64"))
    return cast(wide, bt)


@converter("Mod", since=10)
def mod(ctx: NodeContext) -> Expr:
    a, b = ctx.x(0), ctx.x(1)
    if ctx.attr("fmod", 0):
        return op.mod(a, b)  # C's fmod: the sign of the dividend
    if not dtype_of(ctx.dtype(0)).is_float:
        return op.floor_mod(a, b)  # Python's %: the sign of the divisor
    # numpy's float mod, exactly: fmod, moved into the divisor's sign (inf divisors too)
    r = op.mod(a, b)
    zero = scalar(ctx, 0.0)
    flip = op.logical_and(op.not_equal(r, zero),
                          op.not_equal(op.less(r, zero), op.less(b, zero)))
    moved = op.where(flip, op.add(r, b), r)
    return op.where(op.equal(r, zero), op.multiply(op.abs(r), op.sign(b)), moved)


def _variadic(combine: Callable[[Expr, Expr], Expr]) -> Callable[[NodeContext], Expr]:
    def convert(ctx: NodeContext) -> Expr:
        out = ctx.x(0)
        for i in range(1, len(ctx.inputs)):
            out = combine(out, ctx.x(i))
        return out

    return convert


converter("Sum", since=1)(_variadic(op.add))
converter("Max", since=1)(_variadic(op.maximum))
converter("Min", since=1)(_variadic(op.minimum))


@converter("Mean", since=1)
def mean(ctx: NodeContext) -> Expr:
    total = _variadic(op.add)(ctx)
    return op.divide(total, scalar(ctx, float(len(ctx.inputs))))


@converter("Clip", since=11)
def clip(ctx: NodeContext) -> Expr:
    out = ctx.x(0)
    if ctx.has(1):
        out = op.maximum(out, ctx.x(1))
    if ctx.has(2):
        out = op.minimum(out, ctx.x(2))
    return out


@converter("Clip", since=6)
def clip_6(ctx: NodeContext) -> Expr:
    lo = ctx.attr("min", float(np.finfo(np.float32).min))
    hi = ctx.attr("max", float(np.finfo(np.float32).max))
    return op.minimum(op.maximum(ctx.x(0), scalar(ctx, lo)), scalar(ctx, hi))


@converter("Where", since=9)
def where(ctx: NodeContext) -> Expr:
    return op.where(ctx.x(0), ctx.x(1), ctx.x(2))


# --- activations ----------------------------------------------------------------------------


@converter("LeakyRelu", since=6)
def leaky_relu(ctx: NodeContext) -> Expr:
    return op.nn.leaky_relu(ctx.x(0), alpha=ctx.attr("alpha", 0.01))


@converter("Elu", since=6)
def elu(ctx: NodeContext) -> Expr:
    x, alpha = ctx.x(0), scalar(ctx, ctx.attr("alpha", 1.0))
    neg = op.multiply(alpha, op.subtract(op.exp(x), scalar(ctx, 1.0)))
    return op.where(op.greater(x, scalar(ctx, 0.0)), x, neg)


@converter("Selu", since=6)
def selu(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    alpha = scalar(ctx, ctx.attr("alpha", 1.67326319217681884765625))
    gamma = scalar(ctx, ctx.attr("gamma", 1.05070102214813232421875))
    neg = op.multiply(alpha, op.subtract(op.exp(x), scalar(ctx, 1.0)))
    return op.multiply(gamma, op.where(op.greater(x, scalar(ctx, 0.0)), x, neg))


@converter("Celu", since=12)
def celu(ctx: NodeContext) -> Expr:
    x, a = ctx.x(0), ctx.attr("alpha", 1.0)
    neg = op.multiply(scalar(ctx, a), op.subtract(op.exp(op.divide(x, scalar(ctx, a))),
                                                  scalar(ctx, 1.0)))
    return op.add(op.nn.relu(x), op.minimum(scalar(ctx, 0.0), neg))


@converter("HardSigmoid", since=6)
def hard_sigmoid(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return op.clip(op.add(op.multiply(x, scalar(ctx, alpha)), scalar(ctx, beta)),
                   a_min=0.0, a_max=1.0)


@converter("HardSwish", since=14)
def hard_swish(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    gate = op.clip(op.add(op.multiply(x, scalar(ctx, 1.0 / 6.0)), scalar(ctx, 0.5)),
                   a_min=0.0, a_max=1.0)
    return op.multiply(x, gate)


def softplus_of(x: Expr, dtype: str) -> Expr:
    """log(1 + e^x), computed as max(x, 0) + log(1 + e^-|x|) so that it cannot overflow."""
    one = const_like(1.0, dtype)
    return op.add(op.nn.relu(x), op.log(op.add(one, op.exp(op.negative(op.abs(x))))))


@converter("Softplus", since=1)
def softplus(ctx: NodeContext) -> Expr:
    return softplus_of(ctx.x(0), ctx.dtype(0))


@converter("Softsign", since=1)
def softsign(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.divide(x, op.add(scalar(ctx, 1.0), op.abs(x)))


@converter("ThresholdedRelu", since=10)
def thresholded_relu(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    keep = op.greater(x, scalar(ctx, ctx.attr("alpha", 1.0)))
    return op.where(keep, x, op.zeros_like(x))


@converter("Shrink", since=9)
def shrink(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    bias, lambd = ctx.attr("bias", 0.0), ctx.attr("lambd", 0.5)
    low = op.less(x, scalar(ctx, -lambd))
    high = op.greater(x, scalar(ctx, lambd))
    return op.where(low, op.add(x, scalar(ctx, bias)),
                    op.where(high, op.subtract(x, scalar(ctx, bias)), op.zeros_like(x)))


@converter("Mish", since=18)
def mish(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.multiply(x, op.tanh(softplus_of(x, ctx.dtype(0))))


@converter("Swish", since=24)
def swish(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    return op.multiply(x, op.sigmoid(op.multiply(x, scalar(ctx, ctx.attr("alpha", 1.0)))))


@converter("Gelu", since=20)
def gelu(ctx: NodeContext) -> Expr:
    x = ctx.x(0)
    half, one = scalar(ctx, 0.5), scalar(ctx, 1.0)
    if ctx.attr("approximate", "none") == "tanh":
        inner = op.multiply(scalar(ctx, np.sqrt(2.0 / np.pi)),
                            op.add(x, op.multiply(scalar(ctx, 0.044715),
                                                  op.multiply(x, op.multiply(x, x)))))
        return op.multiply(op.multiply(half, x), op.add(one, op.tanh(inner)))
    cdf = op.add(one, op.erf(op.multiply(x, scalar(ctx, 1.0 / np.sqrt(2.0)))))
    return op.multiply(op.multiply(half, x), cdf)


@converter("PRelu", since=9)
def prelu(ctx: NodeContext) -> Expr:
    x, slope = ctx.x(0), ctx.x(1)
    negative = op.less(x, scalar(ctx, 0.0))
    return op.where(negative, op.multiply(x, slope), x)
