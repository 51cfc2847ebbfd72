"""Converters of ONNX's inverse trigonometric functions, composed of kiln's operators.

kiln has no ``atan``; it is Cephes' ``atanf`` written with ``where``: reduce |x| to
[0, tan(pi/8)] by atan(x) = pi/2 - atan(1/x) (|x| > tan(3pi/8)) or pi/4 + atan((x-1)/(x+1))
(|x| > tan(pi/8)), then a degree-9 odd polynomial, accurate to float32 rounding. ``asin`` and
``acos`` go through it by half-angle forms that keep their precision near +-1:

    asin(x) = atan(x / sqrt((1 - x)(1 + x)))        acos(x) = 2 atan(sqrt((1 - x) / (1 + x)))

Outside [-1, 1] the square roots give NaN, as ONNX's (numpy's) functions do.
"""

from __future__ import annotations

import math

from kiln import op
from kiln.frontend.onnx.context import NodeContext, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Expr

# Cephes atanf: atan(x) ~ x + x^3 P(x^2) on |x| <= tan(pi/8).
_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)


def atan(x: Expr, dtype: str) -> Expr:
    """Arctangent of a floating-point tensor, by range reduction and a polynomial."""
    def c(v: float) -> Expr:
        return const_like(v, dtype)

    a = op.abs(x)
    big = op.greater(a, c(2.414213562373095))  # tan(3pi/8)
    mid = op.logical_and(op.greater(a, c(0.4142135623730950)), op.logical_not(big))
    # The reduced argument (a division by zero when a = 0 is never selected: then `big` is
    # false, and 1/a is guarded).
    safe = op.where(big, a, c(1.0))
    r = op.where(big, op.negative(op.divide(c(1.0), safe)),
                 op.where(mid, op.divide(op.subtract(a, c(1.0)), op.add(a, c(1.0))), a))
    base = op.where(big, c(math.pi / 2), op.where(mid, c(math.pi / 4), c(0.0)))
    z = op.multiply(r, r)
    poly = c(_P[0])
    for coef in _P[1:]:
        poly = op.add(op.multiply(poly, z), c(coef))
    y = op.add(base, op.add(op.multiply(op.multiply(poly, z), r), r))
    return op.where(op.less(x, c(0.0)), op.negative(y), y)


@converter("Atan", since=7)
def atan_7(ctx: NodeContext) -> Expr:
    return atan(ctx.x(0), ctx.dtype(0))


@converter("Asin", since=7)
def asin_7(ctx: NodeContext) -> Expr:
    x, dtype = ctx.x(0), ctx.dtype(0)
    one = const_like(1.0, dtype)
    root = op.sqrt(op.multiply(op.subtract(one, x), op.add(one, x)))
    # At |x| = 1 the root is 0: x / 0 is +-inf, whose atan is +-pi/2.
    return atan(op.divide(x, root), dtype)


@converter("Acos", since=7)
def acos_7(ctx: NodeContext) -> Expr:
    x, dtype = ctx.x(0), ctx.dtype(0)
    one = const_like(1.0, dtype)
    ratio = op.divide(op.subtract(one, x), op.add(one, x))
    return op.multiply(const_like(2.0, dtype), atan(op.sqrt(ratio), dtype))
