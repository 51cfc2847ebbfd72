"""Converters of ONNX's linear quantization, onto kiln's qnn operators where they fit.

    DequantizeLinear:  y = (float(x) - float(zero_point)) * scale        -> qnn.dequantize
    QuantizeLinear:    y = saturate(round_half_to_even(x / scale) + zero_point)
                                                  -> qnn.quantize(rounding="HALF_TO_EVEN")

(8-bit integers and float32 data; other dtypes and blocked scales keep the core-operator
forms below.) The integer products run on integers, not dequantized floats:

    MatMulInteger, ConvInteger   -> qnn.dense / qnn.conv2d: int32, exact
    QLinearMatMul, QLinearConv   -> the same int32 sums (plus QLinearConv's int32 bias), then
                                    ONNX Runtime's requantization: float32(acc) times the
                                    float32 factor (x_scale * w_scale) / y_scale, rounded
                                    halves to even, plus y_zero_point, saturated

A QDQ model (DequantizeLinear -> Conv / MatMul / Gemm -> QuantizeLinear, as
``onnxruntime.quantization.quantize_static`` writes it) imports as qnn.dequantize and
qnn.quantize around the float operator; the ``qdq-to-qnn`` pass (kiln/transform/qdq_to_qnn.py)
then rewrites each such group into the integer form above when the model is compiled.
(DynamicQuantizeLinear converts through the function body ONNX gives it.)

The scale and zero point are scalars (per tensor), vectors along ``axis`` (per axis), or —
with ``block_size`` — tensors whose ``axis`` dimension has one entry per block, which the
converter repeats to the input's length with a ``take`` of constant indices. kiln has the
integer types of 8 bits and more; the float8, int4 and int2 forms fail as element types kiln
lacks.
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, kiln_dtype
from kiln.frontend.onnx.ops_nn import convolve, matmul, spatial_shape, window_attrs
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr


def broadcast_param(ctx: NodeContext, i: int, axis: int, rank: int, length: int) -> Expr:
    """Input ``i`` (a scale or zero point) shaped to broadcast against the data."""
    p, shape = ctx.x(i), ctx.shape(i)
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
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
    # A scale of shape (1,) is per tensor (ORT's quantizer writes one for 1-D biases).
    per_tensor = len(ctx.shape(1)) == 0 or ctx.shape(1) == (1,)
    if per_tensor or rank == 0:
        return 0, rank, shape[0] if rank else 1
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
    axis %= rank
    return axis, rank, shape[axis]


def _qnn_param(ctx: NodeContext, i: int, dtype: str) -> Expr:
    """Input ``i`` (a scale or zero point) as a qnn operator takes it: a scalar, or a vector."""
    p = ctx.x(i)
    if ctx.shape(i) in ((), (1,)):
        p = op.reshape(p, newshape=[]) if ctx.shape(i) == (1,) else p
    return cast(p, dtype)


def _zero_point(ctx: NodeContext, i: int) -> Expr:
    return _qnn_param(ctx, i, "int32") if ctx.has(i) else Constant(np.zeros((), np.int32))


def _per_tensor(ctx: NodeContext, i: int) -> bool:
    return not ctx.has(i) or ctx.shape(i) in ((), (1,))


def _fits_qnn(ctx: NodeContext) -> bool:
    """The 8-bit / float32, per-tensor or per-axis forms (not blocked) that qnn takes."""
    return (not ctx.attr("block_size", 0) and ctx.dtype(1) == "float32"
            and (_per_tensor(ctx, 1) or len(ctx.shape(1)) == 1))


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: NodeContext) -> Expr:
    axis, rank, length = _axis(ctx)
    out = ctx.attr("output_dtype", 0)
    if ctx.dtype(0) in ("int8", "uint8", "int32") and _fits_qnn(ctx) and \
            (not out or kiln_dtype(out, ctx.where) == "float32"):
        return op.qnn.dequantize(ctx.x(0), _qnn_param(ctx, 1, "float32"), _zero_point(ctx, 2),
                                 axis=axis)
    scale_dtype = ctx.dtype(1)
    out_dtype = scale_dtype
    if ctx.attr("output_dtype", 0):
        out_dtype = kiln_dtype(ctx.attr("output_dtype"), f"{ctx.where}: output_dtype")
    x = cast(ctx.x(0), "float32")
    if ctx.has(2):
        x = op.subtract(x, cast(broadcast_param(ctx, 2, axis, rank, length), "float32"))
    y = op.multiply(x, cast(broadcast_param(ctx, 1, axis, rank, length), "float32"))
    return cast(y, out_dtype)


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
    if out_dtype in ("int8", "uint8") and ctx.dtype(0) == "float32" and _fits_qnn(ctx) and \
            ctx.attr("saturate", 1):
        return op.qnn.quantize(ctx.x(0), _qnn_param(ctx, 1, "float32"), _zero_point(ctx, 2),
                               axis=axis, out_dtype=out_dtype, rounding="HALF_TO_EVEN")
    compute = "float64" if out_dtype in ("int32", "uint32") else "float32"
    scale = cast(broadcast_param(ctx, 1, axis, rank, length), ctx.dtype(0))
    q = cast(op.divide(ctx.x(0), scale), compute)
    q = op.nearbyint(q)
    if ctx.has(2):
        q = op.add(q, cast(broadcast_param(ctx, 2, axis, rank, length), compute))
    info = np.iinfo(out_dtype)
    q = op.clip(q, a_min=float(info.min), a_max=float(info.max))
    return cast(q, out_dtype)


def _centered(ctx: NodeContext, i: int, zero: int) -> Expr:
    """Input ``i`` minus its zero point (input ``zero``), exactly, in float64."""
    x = cast(ctx.x(i), "float64")
    return op.subtract(x, cast(ctx.x(zero), "float64")) if ctx.has(zero) else x


def _integer_matmul(ctx: NodeContext, a: int, b: int, a_zero: int, b_zero: int) -> Expr | None:
    """qnn.dense of inputs ``a`` @ ``b`` (b a 2-D matrix, a's zero point a scalar, b's a scalar
    or one per column): their int32 sums; None for the forms qnn.dense does not take."""
    eight = ("int8", "uint8")
    if ctx.dtype(a) not in eight or ctx.dtype(b) not in eight or len(ctx.shape(b)) != 2 or \
            len(ctx.shape(a)) < 2 or not _per_tensor(ctx, a_zero):
        return None
    if not _per_tensor(ctx, b_zero) and ctx.shape(b_zero) != (ctx.shape(b)[1],):
        return None
    one = Constant(np.ones((), np.float32))
    return op.qnn.dense(ctx.x(a), op.transpose(ctx.x(b)), _zero_point(ctx, a_zero),
                        _zero_point(ctx, b_zero), one, one)


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: NodeContext) -> Expr:
    y = _integer_matmul(ctx, 0, 1, 2, 3)
    if y is not None:
        return y
    # Other forms: products of 8-bit values summed in float64 are exact integers (to 2**53).
    return cast(matmul(ctx, _centered(ctx, 0, 2), _centered(ctx, 1, 3)), "int32")


def requantize_like_ort(ctx: NodeContext, acc: Expr, factor: Expr, zero: int,
                        out_dtype: str) -> Expr:
    """ONNX Runtime's requantization of int32 sums: round_half_even(float32(acc) * factor)
    + zero point (input ``zero``), saturated to ``out_dtype``."""
    y: Expr = op.multiply(cast(acc, "float32"), factor)
    y = op.nearbyint(y)
    if ctx.has(zero):
        y = op.add(y, cast(op.reshape(ctx.x(zero), newshape=[]), "float32"))
    info = np.iinfo(out_dtype)
    return cast(op.clip(y, a_min=float(info.min), a_max=float(info.max)), out_dtype)


def _factor(ctx: NodeContext, x_scale: int, w_scale: int, y_scale: int) -> Expr:
    """(x_scale * w_scale) / y_scale in float32, in ONNX Runtime's order."""
    return op.divide(op.multiply(op.reshape(ctx.x(x_scale), newshape=[]),
                                 _qnn_param(ctx, w_scale, "float32")),
                     op.reshape(ctx.x(y_scale), newshape=[]))


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: NodeContext) -> Expr:
    out_dtype = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    acc = _integer_matmul(ctx, 0, 3, 2, 5)
    if acc is not None and ctx.dtype(1) == "float32" and (
            _per_tensor(ctx, 4) or ctx.shape(4) == (ctx.shape(3)[1],)):
        return requantize_like_ort(ctx, acc, _factor(ctx, 1, 4, 6), 7, out_dtype)
    product = matmul(ctx, _centered(ctx, 0, 2), _centered(ctx, 3, 5))
    # The rescaling factor in the scales' own precision, as the reference computes it.
    factor = op.divide(op.multiply(ctx.x(1), ctx.x(4)), ctx.x(6))
    y = op.multiply(product, cast(factor, "float64"))
    if ctx.has(7):
        y = op.add(y, cast(ctx.x(7), "float64"))
    info = np.iinfo(out_dtype)
    y = op.clip(op.nearbyint(y), a_min=float(info.min), a_max=float(info.max))
    return cast(y, out_dtype)


def _integer_conv(ctx: NodeContext, x: int, w: int, x_zero: int, w_zero: int,
                  x_scale: Expr, w_scale: Expr) -> Expr | None:
    """qnn.conv2d of inputs ``x`` and ``w`` (2-D, 8-bit): their int32 sums; None otherwise."""
    eight = ("int8", "uint8")
    shape, wshape = ctx.shape(x), ctx.shape(w)
    if ctx.dtype(x) not in eight or ctx.dtype(w) not in eight or len(shape) != 4 or \
            len(wshape) != 4 or not _per_tensor(ctx, x_zero):
        return None
    if not _per_tensor(ctx, w_zero) and ctx.shape(w_zero) != (wshape[0],):
        return None
    kernel = list(ctx.attr("kernel_shape", wshape[2:]))
    strides, dilations, pads = window_attrs(ctx, spatial_shape(ctx, x)[2:], kernel)
    return op.qnn.conv2d(ctx.x(x), ctx.x(w), _zero_point(ctx, x_zero), _zero_point(ctx, w_zero),
                         x_scale, w_scale, strides=strides, dilation=dilations,
                         groups=ctx.attr("group", 1), padding=[pads[0], pads[1], pads[2], pads[3]],
                         kernel_size=wshape[2:], channels=wshape[0])


@converter("ConvInteger", since=10)
def conv_integer(ctx: NodeContext) -> Expr:
    one = Constant(np.ones((), np.float32))
    y = _integer_conv(ctx, 0, 1, 2, 3, one, one)
    if y is not None:
        return y
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
    out_dtype = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    acc = None
    if ctx.dtype(1) == "float32" and ctx.dtype(4) == "float32":
        acc = _integer_conv(ctx, 0, 3, 2, 5, _qnn_param(ctx, 1, "float32"),
                            _qnn_param(ctx, 4, "float32"))
    if acc is not None:
        if ctx.has(8):  # the int32 bias, in the scale x_scale * w_scale
            acc = op.nn.bias_add(acc, ctx.x(8), axis=1)
        factor = _factor(ctx, 1, 4, 6)
        if not _per_tensor(ctx, 4):
            factor = op.reshape(factor, newshape=[-1, 1, 1])
        return requantize_like_ort(ctx, acc, factor, 7, out_dtype)
    y = convolve(ctx, _centered_channels(ctx, 0, 2, 1), _centered_channels(ctx, 3, 5, 0), 0, 3)
    if ctx.has(8):  # the int32 bias, in the scale x_scale * w_scale
        y = op.nn.bias_add(y, cast(ctx.x(8), "float64"), axis=1)
    w_scale = ctx.x(4)
    if ctx.shape(4) not in ((), (1,)):  # per output channel
        w_scale = op.reshape(w_scale, newshape=[ctx.shape(4)[0]] + [1] * (len(ctx.shape(0)) - 2))
    factor = op.divide(op.multiply(op.reshape(ctx.x(1), newshape=[]), w_scale),
                       op.reshape(ctx.x(6), newshape=[]))
    y = op.multiply(y, cast(factor, "float64"))
    if ctx.has(7):
        y = op.add(y, cast(op.reshape(ctx.x(7), newshape=[]), "float64"))
    info = np.iinfo(out_dtype)
    y = op.clip(op.nearbyint(y), a_min=float(info.min), a_max=float(info.max))
    return cast(y, out_dtype)


# --- ONNX Runtime's contrib operators of the QOperator format (domain com.microsoft) -------

MS = "com.microsoft"


def _scalar(ctx: NodeContext, i: int) -> Expr:
    return op.reshape(ctx.x(i), newshape=[]) if ctx.shape(i) == (1,) else ctx.x(i)


def _centered_int32(ctx: NodeContext, i: int, zero: int) -> Expr:
    """Input ``i`` minus its (scalar) zero point, in int32."""
    x = cast(ctx.x(i), "int32")
    return op.subtract(x, _zero_point(ctx, zero)) if ctx.has(zero) else x


def _saturate(ctx: NodeContext, y: Expr, zero: int, out_dtype: str) -> Expr:
    """round_half_even(y) + zero point (input ``zero``), saturated: ORT's last step."""
    y = op.nearbyint(y)
    if ctx.has(zero):
        y = op.add(y, cast(_scalar(ctx, zero), "float32"))
    info = np.iinfo(out_dtype)
    return cast(op.clip(y, a_min=float(info.min), a_max=float(info.max)), out_dtype)


@converter("QLinearAdd", since=1, domain=MS)
def qlinear_add(ctx: NodeContext) -> Expr:
    # C = (A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale + C_zp, in float32 as ORT:
    # each side times its ratio of scales.
    c_scale = _scalar(ctx, 6)
    a = op.multiply(cast(_centered_int32(ctx, 0, 2), "float32"),
                    op.divide(_scalar(ctx, 1), c_scale))
    b = op.multiply(cast(_centered_int32(ctx, 3, 5), "float32"),
                    op.divide(_scalar(ctx, 4), c_scale))
    return _saturate(ctx, op.add(a, b), 7, ctx.dtype(0))


@converter("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    if len(shape) < 3:
        raise ctx.error(f"QLinearGlobalAveragePool takes a tensor of rank 3 or more, not "
                        f"{len(shape)}")
    last = bool(ctx.attr("channels_last", 0))
    axes = list(range(1, len(shape) - 1)) if last else list(range(2, len(shape)))
    size = int(np.prod([shape[a] for a in axes]))
    # The int32 sum of each window less size * zero point, times x_scale / (y_scale * size).
    total = op.sum(_centered_int32(ctx, 0, 2), axis=axes, keepdims=True)
    factor = op.divide(_scalar(ctx, 1),
                       op.multiply(_scalar(ctx, 3), Constant(np.asarray(size, np.float32))))
    return _saturate(ctx, op.multiply(cast(total, "float32"), factor), 4, ctx.dtype(0))


@converter("QGemm", since=1, domain=MS)
def qgemm(ctx: NodeContext) -> Expr:
    # Inputs: A, a_scale, a_zero_point, B, b_scale, b_zero_point, C (int32), y_scale, y_zp.
    if ctx.attr("transA", 0):
        raise ctx.error("kiln converts QGemm without transA")
    b = ctx.x(3) if ctx.attr("transB", 0) else op.transpose(ctx.x(3))
    one = Constant(np.ones((), np.float32))
    acc: Expr = op.qnn.dense(ctx.x(0), b, _zero_point(ctx, 2), _zero_point(ctx, 5), one, one)
    if ctx.has(6):
        acc = op.add(acc, cast(ctx.x(6), "int32"))
    alpha = Constant(np.asarray(ctx.attr("alpha", 1.0), np.float32))
    scale = op.multiply(op.multiply(alpha, _scalar(ctx, 1)), _qnn_param(ctx, 4, "float32"))
    if not ctx.has(7):  # a float32 result
        return op.multiply(cast(acc, "float32"), scale)
    factor = op.divide(scale, _scalar(ctx, 7))
    return _saturate(ctx, op.multiply(cast(acc, "float32"), factor), 8, ctx.dtype(0))
