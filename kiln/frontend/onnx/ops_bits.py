"""Converters of ONNX's bit operations, composed of integer arithmetic (kiln has no bit
operators).

BitwiseNot is ``-x - 1`` (two's complement) or ``max - x`` (unsigned). BitwiseAnd, Or and Xor
take the operands apart bit by bit (``x mod 2``, then ``x // 2``: floor division is an
arithmetic shift, also for negative values), combine the bits, and add them back weighted by
the type's powers of two (the top one wrapped for signed types). That is 8 to 64 steps of a
few elementwise operators each: correct, not fast, for the rare model that uses them.

    x << k  =  x * 2**k          (wrapping, as integer multiplication does)
    x >> k  =  floor(x / 2**k)   (arithmetic for signed types)

``2**k`` is looked up in a constant table of the type's powers of two (the top one wraps to
the type's minimum for signed types, so that the product wraps as a shift does). Shifts by
the type's width or more, or by a negative amount, give 0 (and -1 for negative values
shifted right), as ONNX's reference does. A right shift by width - 1 of a signed type, whose
power of two does not fit, is the sign: -1 or 0.
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Constant, Expr


@converter("BitShift", since=11)
def bit_shift(ctx: NodeContext) -> Expr:
    direction = ctx.need_attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction must be LEFT or RIGHT, not {direction!r}")
    dtype = ctx.dtype(0)
    dt = dtype_of(dtype)
    if not dt.is_integer:
        raise ctx.error(f"BitShift takes integers, not {dtype}")
    x, k = ctx.x(0), cast(ctx.x(1), dtype)
    bits = dt.bits
    signed = dt.is_int
    powers = np.array([1 << j for j in range(bits)], dtype=f"uint{bits}").view(dtype)
    power = op.take(Constant(powers), cast(k, "int64"), axis=0, mode="clip")
    out_of_range = op.greater_equal(k, const_like(bits, dtype))
    if signed:
        out_of_range = op.logical_or(out_of_range, op.less(k, const_like(0, dtype)))
    zero = const_like(0, dtype)
    if direction == "LEFT":
        return op.where(out_of_range, zero, op.multiply(x, power))
    sign = op.where(op.less(x, zero), const_like(-1, dtype), zero) if signed else zero
    shifted = op.floor_divide(x, power)
    if signed:  # 2**(bits - 1) wrapped to the minimum: the shift is the sign
        top = op.equal(k, const_like(bits - 1, dtype))
        shifted = op.where(top, sign, shifted)
    return op.where(out_of_range, sign, shifted)


def _powers(dtype: str) -> np.ndarray:
    bits = dtype_of(dtype).bits
    return np.array([1 << j for j in range(bits)], dtype=f"uint{bits}").view(dtype)


def _integer(ctx: NodeContext) -> str:
    dtype = ctx.dtype(0)
    if not dtype_of(dtype).is_integer:
        raise ctx.error(f"{ctx.op_type} takes integers, not {dtype}")
    return dtype


@converter("BitwiseNot", since=18)
def bitwise_not(ctx: NodeContext) -> Expr:
    dtype = _integer(ctx)
    if dtype_of(dtype).is_int:
        return op.subtract(op.negative(ctx.x(0)), const_like(1, dtype))
    return op.subtract(const_like(np.iinfo(dtype).max, dtype), ctx.x(0))


def _combine(kind: str, a: Expr, b: Expr, dtype: str) -> Expr:
    """One bit (0 or 1) of the result from the operands' bits."""
    if kind == "BitwiseAnd":
        return op.multiply(a, b)
    if kind == "BitwiseOr":
        return op.maximum(a, b)
    return op.floor_mod(op.add(a, b), const_like(2, dtype))  # BitwiseXor


def _bitwise(ctx: NodeContext) -> Expr:
    dtype = _integer(ctx)
    two, result = const_like(2, dtype), None
    a, b = ctx.x(0), ctx.x(1)
    for power in _powers(dtype):
        bit = _combine(ctx.op_type, op.floor_mod(a, two), op.floor_mod(b, two), dtype)
        term = op.multiply(bit, Constant(np.asarray(power, dtype=dtype)))
        result = term if result is None else op.add(result, term)
        a, b = op.floor_divide(a, two), op.floor_divide(b, two)
    assert result is not None
    return result


for _name in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    converter(_name, since=18)(_bitwise)
