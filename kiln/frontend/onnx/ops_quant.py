"""Converters of ONNX's linear quantization: QuantizeLinear, DequantizeLinear (and, through
the function body ONNX gives it, DynamicQuantizeLinear), composed of kiln's operators.

    DequantizeLinear:  y = (float(x) - float(zero_point)) * scale
    QuantizeLinear:    y = saturate(round_half_to_even(x / scale) + zero_point)

The scale and zero point are scalars (per tensor), vectors along ``axis`` (per axis), or —
with ``block_size`` — tensors whose ``axis`` dimension has one entry per block, which the
converter repeats to the input's length with a ``take`` of constant indices. kiln has the
integer types of 8 bits and more; the float8, int4 and int2 forms fail as element types kiln
lacks.
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like, kiln_dtype
from kiln.frontend.onnx.ops_nn import convolve, matmul
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr


def broadcast_param(ctx: NodeContext, i: int, axis: int, rank: int, length: int) -> Expr:
    """Input ``i`` (a scale or zero point) shaped to broadcast against the data."""
    p, shape = ctx.x(i), ctx.shape(i)
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1 and rank != 1):
        return op.reshape(p, newshape=[]) if len(shape) else p
    block = int(ctx.attr("block_size", 0))
    if block > 0:
        if len(shape) != rank:
            raise ctx.error(f"a blocked scale or zero point must have rank {rank}, not "
                            f"{len(shape)}")
        ctx.check_elements((length,), "its table of block indices")
        index = Constant((np.arange(length) // block).astype("int64"))
        return op.take(p, index, axis=axis)
    if len(shape) != 1 or shape[0] != length:
        raise ctx.error(f"input {i} has shape {shape}; a per-axis scale or zero point has one "
                        f"value per element of axis {axis} ({length})")
    return op.reshape(p, newshape=[length] + [1] * (rank - axis - 1))


def _axis(ctx: NodeContext) -> tuple[int, int, int]:
    """(axis, rank, length of the axis) of the data; the axis is checked where it is used."""
    shape = ctx.shape(0)
    rank = len(shape)
    axis = int(ctx.attr("axis", 1))
    per_tensor = len(ctx.shape(1)) == 0 or (ctx.shape(1) == (1,) and rank != 1)
    if per_tensor or rank == 0:
        return 0, rank, shape[0] if rank else 1
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
    axis %= rank
    return axis, rank, shape[axis]


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: NodeContext) -> Expr:
    axis, rank, length = _axis(ctx)
    scale_dtype = ctx.dtype(1)
    out_dtype = scale_dtype
    if ctx.attr("output_dtype", 0):
        out_dtype = kiln_dtype(ctx.attr("output_dtype"), f"{ctx.where}: output_dtype")
    x = cast(ctx.x(0), "float32")
    if ctx.has(2):
        x = op.subtract(x, cast(broadcast_param(ctx, 2, axis, rank, length), "float32"))
    y = op.multiply(x, cast(broadcast_param(ctx, 1, axis, rank, length), "float32"))
    return cast(y, out_dtype)


def round_half_even(x: Expr, dtype: str) -> Expr:
    """Round to nearest, halves to even (kiln's ``round`` takes them away from zero)."""
    half = op.equal(op.abs(op.subtract(x, op.floor(x))), const_like(0.5, dtype))
    even = op.multiply(op.round(op.multiply(x, const_like(0.5, dtype))), const_like(2.0, dtype))
    return op.where(half, even, op.round(x))


@converter("QuantizeLinear", since=10)
def quantize_linear(ctx: NodeContext) -> Expr:
    axis, rank, length = _axis(ctx)
    if ctx.has(2):
        out_dtype = ctx.dtype(2)
    elif ctx.attr("output_dtype", 0):
        out_dtype = kiln_dtype(ctx.attr("output_dtype"), f"{ctx.where}: output_dtype")
    else:
        out_dtype = "uint8"
    if out_dtype not in ("int8", "uint8", "int16", "uint16", "int32", "uint32"):
        raise ctx.error(f"kiln quantizes to 8-, 16- and 32-bit integers, not {out_dtype}")
    compute = "float64" if out_dtype in ("int32", "uint32") else "float32"
    scale = cast(broadcast_param(ctx, 1, axis, rank, length), ctx.dtype(0))
    q = cast(op.divide(ctx.x(0), scale), compute)
    q = round_half_even(q, compute)
    if ctx.has(2):
        q = op.add(q, cast(broadcast_param(ctx, 2, axis, rank, length), compute))
    info = np.iinfo(out_dtype)
    q = op.clip(q, a_min=float(info.min), a_max=float(info.max))
    return cast(q, out_dtype)


def _centered(ctx: NodeContext, i: int, zero: int) -> Expr:
    """Input ``i`` minus its zero point (input ``zero``), exactly, in float64."""
    x = cast(ctx.x(i), "float64")
    return op.subtract(x, cast(ctx.x(zero), "float64")) if ctx.has(zero) else x


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: NodeContext) -> Expr:
    # Products of 8-bit values summed in float64 are exact integers (to 2**53).
    return cast(matmul(ctx, _centered(ctx, 0, 2), _centered(ctx, 1, 3)), "int32")


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: NodeContext) -> Expr:
    product = matmul(ctx, _centered(ctx, 0, 2), _centered(ctx, 3, 5))
    # The rescaling factor in the scales' own precision, as the reference computes it.
    factor = op.divide(op.multiply(ctx.x(1), ctx.x(4)), ctx.x(6))
    y = op.multiply(product, cast(factor, "float64"))
    out_dtype = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    if ctx.has(7):
        y = op.add(y, cast(ctx.x(7), "float64"))
    info = np.iinfo(out_dtype)
    y = op.clip(round_half_even(y, "float64"), a_min=float(info.min), a_max=float(info.max))
    return cast(y, out_dtype)


@converter("ConvInteger", since=10)
def conv_integer(ctx: NodeContext) -> Expr:
    y = convolve(ctx, _centered_channels(ctx, 0, 2, 0), _centered_channels(ctx, 1, 3, 0), 0, 1)
    return cast(y, "int32")


def _centered_channels(ctx: NodeContext, i: int, zero: int, axis: int) -> Expr:
    """Input ``i`` minus its zero point, which is a scalar or has one value per entry of
    ``axis`` (QLinearConv's per-output-channel weights), exactly, in float64."""
    x = cast(ctx.x(i), "float64")
    if not ctx.has(zero):
        return x
    zp = cast(ctx.x(zero), "float64")
    zshape = ctx.shape(zero)
    if len(zshape) == 1 and zshape[0] > 1:
        zp = op.reshape(zp, newshape=[zshape[0]] + [1] * (len(ctx.shape(i)) - 1 - axis))
    elif len(zshape) == 1:
        zp = op.reshape(zp, newshape=[])
    return op.subtract(x, zp)


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: NodeContext) -> Expr:
    # Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B.
    y = convolve(ctx, _centered_channels(ctx, 0, 2, 1), _centered_channels(ctx, 3, 5, 0), 0, 3)
    if ctx.has(8):  # the int32 bias, in the scale x_scale * w_scale
        y = op.nn.bias_add(y, cast(ctx.x(8), "float64"), axis=1)
    w_scale = ctx.x(4)
    if ctx.shape(4) not in ((), (1,)):  # per output channel
        w_scale = op.reshape(w_scale, newshape=[ctx.shape(4)[0]] + [1] * (len(ctx.shape(0)) - 2))
    factor = op.divide(op.multiply(op.reshape(ctx.x(1), newshape=[]), w_scale),
                       op.reshape(ctx.x(6), newshape=[]))
    y = op.multiply(y, cast(factor, "float64"))
    out_dtype = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    if ctx.has(7):
        y = op.add(y, cast(op.reshape(ctx.x(7), newshape=[]), "float64"))
    info = np.iinfo(out_dtype)
    y = op.clip(round_half_even(y, "float64"), a_min=float(info.min), a_max=float(info.max))
    return cast(y, out_dtype)
