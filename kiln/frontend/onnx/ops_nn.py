"""Converters of ONNX's convolutions, pooling and matrix products.

kiln's convolution and pooling operators are 2-D (NCHW). One-dimensional ones run as 2-D
with a height of 1; 3-D pooling is separable (a 2-D pool over height and width, then one over
depth), and a 3-D convolution becomes one 2-D convolution over the depth taps stacked as
channels, with the output depth moved into the batch.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import op
from kiln.frontend.onnx import dynamic
from kiln.frontend.onnx.context import NodeContext, const_like
from kiln.frontend.onnx.ops_tensor import reshape
from kiln.frontend.onnx.table import converter
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Expr

# --- window geometry ------------------------------------------------------------------------


def explicit_pads(ctx: NodeContext, spatial: tuple[int, ...], kernel: list[int],
                  strides: list[int], dilations: list[int]) -> list[int]:
    """ONNX's ``pads`` (all begins, then all ends), resolving ``auto_pad``."""
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(ctx.attr("pads", [0] * 2 * n))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads {pads} must have {2 * n} values")
        return pads
    if auto == "VALID":
        return [0] * 2 * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"unknown auto_pad {auto!r}")
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def window_attrs(ctx: NodeContext, spatial: tuple[int, ...], kernel: list[int]
                 ) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads) of a convolution or pool over ``spatial``."""
    n = len(spatial)
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise ctx.error(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} "
                        f"must each have {n} values for {n} spatial dimensions")
    if any(v < 1 for v in [*kernel, *strides, *dilations]):
        raise ctx.error(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} "
                        "must be positive")
    pads = explicit_pads(ctx, spatial, kernel, strides, dilations)
    return strides, dilations, pads


def spatial_shape(ctx: NodeContext, i: int = 0) -> tuple:
    """The shape of an N-C-spatial input whose spatial dimensions are static; the batch and
    channel dimensions may be symbolic (3-D windows need the whole shape static)."""
    shape = ctx.t(i).shape
    if len(shape) == 5 or not all(isinstance(d, int) for d in shape[2:]):
        return ctx.shape(i)
    return tuple(shape)


# --- convolution ----------------------------------------------------------------------------


def _add_bias(ctx: NodeContext, y: Expr, index: int = 2) -> Expr:
    return op.nn.bias_add(y, ctx.x(index), axis=1) if ctx.has(index) else y


@converter("Conv", since=1)
def conv(ctx: NodeContext) -> Expr:
    return _add_bias(ctx, convolve(ctx, ctx.x(0), ctx.x(1)))


def convolve(ctx: NodeContext, x: Expr, w: Expr, x_index: int = 0, w_index: int = 1) -> Expr:
    """ONNX's convolution (no bias) of ``x`` by ``w``, which have the shapes of inputs
    ``x_index`` and ``w_index`` (ConvInteger and QLinearConv pass them zero-point-centered)."""
    shape, wshape = spatial_shape(ctx, x_index), ctx.shape(w_index)
    spatial = shape[2:]
    kernel = list(ctx.attr("kernel_shape", wshape[2:]))
    strides, dilations, pads = window_attrs(ctx, spatial, kernel)
    groups = ctx.attr("group", 1)
    n = len(spatial)
    if n == 2:
        return op.nn.conv2d(x, w, strides=strides, dilation=dilations, groups=groups,
                            padding=[pads[0], pads[1], pads[2], pads[3]])
    if n == 1:
        y = op.nn.conv2d(op.expand_dims(x, axis=2), op.expand_dims(w, axis=2),
                         strides=[1, strides[0]], dilation=[1, dilations[0]], groups=groups,
                         padding=[0, pads[0], 0, pads[1]])
        return op.squeeze(y, axis=[2])
    if n == 3:
        return _conv3d(ctx, x, w, shape, wshape, strides, dilations, pads, groups)
    raise ctx.error(f"kiln converts 1-, 2- and 3-D convolutions, not {n}-D")


def _conv3d(ctx: NodeContext, x: Expr, w: Expr, shape: tuple[int, ...],
            wshape: tuple[int, ...], strides: list[int], dilations: list[int],
            pads: list[int], groups: int) -> Expr:
    nb, c, d = shape[0], shape[1], shape[2]
    o, cg, kd = wshape[0], wshape[1], wshape[2]
    sd, dd, pd0, pd1 = strides[0], dilations[0], pads[0], pads[3]
    out_d = (d + pd0 + pd1 - (kd - 1) * dd - 1) // sd + 1
    ctx.check_unroll(kd, "the kernel's depth (one slice of the input per depth tap)")
    if pd0 or pd1:
        x = op.nn.pad(x, [(0, 0), (0, 0), (pd0, pd1), (0, 0), (0, 0)],
                      const_like(0, ctx.dtype(0)))
    taps = [op.strided_slice(x, begin=[k * dd], end=[k * dd + (out_d - 1) * sd + 1],
                             strides=[sd], axes=[2]) for k in range(kd)]
    stacked: Expr = op.stack(taps, axis=2)  # (N, C, kd, D', H, W)
    h, wd = shape[3], shape[4]
    stacked = op.transpose(stacked, axes=[0, 3, 1, 2, 4, 5])
    stacked = reshape(stacked, [nb * out_d, c * kd, h, wd])
    w2 = reshape(w, [o, cg * kd, wshape[3], wshape[4]])
    y: Expr = op.nn.conv2d(stacked, w2, strides=strides[1:], dilation=dilations[1:],
                           groups=groups, padding=[pads[1], pads[2], pads[4], pads[5]])
    oh, ow = ctx.tensor_type(y).static_shape[2:4]  # static, as the input shape is
    y = reshape(y, [nb, out_d, o, oh, ow])
    return op.transpose(y, axes=[0, 2, 1, 3, 4])


@converter("ConvTranspose", since=1)
def conv_transpose(ctx: NodeContext) -> Expr:
    shape, wshape = ctx.shape(0), ctx.shape(1)
    spatial = shape[2:]
    n = len(spatial)
    if n not in (1, 2):
        raise ctx.error(f"kiln converts 1- and 2-D transposed convolutions, not {n}-D")
    kernel = list(ctx.attr("kernel_shape", wshape[2:]))
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    out_pad = list(ctx.attr("output_padding", [0] * n))
    groups = ctx.attr("group", 1)
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = (list(out_shape)[-n:] if out_shape is not None
                  else [size * s for size, s in zip(spatial, strides)])
        begins, ends = [], []
        for k in range(n):
            total = (strides[k] * (spatial[k] - 1) + out_pad[k]
                     + (kernel[k] - 1) * dilations[k] + 1 - target[k])
            small, big = total // 2, total - total // 2
            upper = auto != "SAME_LOWER"
            begins.append(small if upper else big)
            ends.append(big if upper else small)
            if total < 0:  # the output is larger than the kernel reaches: extra output padding
                begins[-1], ends[-1] = 0, 0
                out_pad[k] += -total
        pads = begins + ends
    elif auto == "VALID":
        pads = [0] * 2 * n
    else:
        pads = list(ctx.attr("pads", [0] * 2 * n))
    x, w = ctx.x(0), ctx.x(1)
    if n == 1:
        y = op.nn.conv2d_transpose(op.expand_dims(x, axis=2), op.expand_dims(w, axis=2),
                                   strides=[1, strides[0]], dilation=[1, dilations[0]],
                                   groups=groups, padding=[0, pads[0], 0, pads[1]],
                                   output_padding=[0, out_pad[0]])
        y = op.squeeze(y, axis=[2])
    else:
        y = op.nn.conv2d_transpose(x, w, strides=strides, dilation=dilations, groups=groups,
                                   padding=[pads[0], pads[1], pads[2], pads[3]],
                                   output_padding=out_pad)
    return _add_bias(ctx, y)


# --- pooling --------------------------------------------------------------------------------


def _pool_out(size: int, k: int, s: int, d: int, p0: int, p1: int, ceil: bool) -> int:
    """ONNX Runtime's output size (PyTorch's rule: in ceil mode the last window starts in the
    input). Without ceil mode the quotient is truncated toward zero, as C++ divides: a window
    longer than the padded input by less than a stride still gives one output."""
    span = (k - 1) * d + 1
    room = size + p0 + p1 - span
    if not ceil:
        return (room // s if room >= 0 else -(-room // s)) + 1
    out = -(-room // s) + 1
    if (out - 1) * s >= size + p0:
        out -= 1
    return out


def _fitted_kernel(size: int, k: int, d: int, p0: int, p1: int) -> int:
    """The kernel taps that count along an axis: all ``k``, or, where the window spans more
    than the padded input, those inside it (ONNX Runtime's one window there starts at the
    padded input's first element and counts only its taps inside; with count_include_pad it
    divides by them, not by ``k``: a global pool over the padded input)."""
    padded = size + p0 + p1
    if (k - 1) * d + 1 <= padded:
        return k
    return -(-padded // d)


def _pool2d(ctx: NodeContext, kind: str, x: Expr, kernel: list[int], strides: list[int],
            dilations: list[int], pads: list[int], ceil: bool, include_pad: bool,
            hw: tuple[int, int]) -> Expr:
    """One 2-D pool (kind "max" or "avg") with ONNX Runtime's output size."""
    want = [_pool_out(hw[k], kernel[k], strides[k], dilations[k], pads[k], pads[k + 2], ceil)
            for k in range(2)]
    for k in range(2):
        if want[k] < 1:
            raise ctx.error(
                f"the pooling window spans {(kernel[k] - 1) * dilations[k] + 1} (kernel "
                f"{kernel[k]}, dilation {dilations[k]}) but the padded input has only "
                f"{hw[k] + pads[k] + pads[k + 2]}, short by a stride ({strides[k]}) or more: "
                "no window fits")
    kernel = [_fitted_kernel(hw[k], kernel[k], dilations[k], pads[k], pads[k + 2])
              for k in range(2)]
    tvm = [(hw[k] + pads[k] + pads[k + 2] - (kernel[k] - 1) * dilations[k] - 1
            + (strides[k] - 1 if ceil else 0)) // strides[k] + 1 for k in range(2)]
    attrs = {"pool_size": kernel, "strides": strides, "dilation": dilations,
             "padding": [pads[0], pads[1], pads[2], pads[3]], "ceil_mode": ceil}
    if kind == "max":
        y = op.nn.max_pool2d(x, **attrs)
    else:
        y = op.nn.avg_pool2d(x, count_include_pad=include_pad, **attrs)
    if tvm != want:
        y = op.strided_slice(y, begin=[0, 0], end=want, axes=[2, 3])
    return y


def pool(ctx: NodeContext, kind: str, x: Expr, shape: tuple[int, ...], kernel: list[int],
         strides: list[int], dilations: list[int], pads: list[int], ceil: bool,
         include_pad: bool) -> Expr:
    """Max or average pooling over the spatial axes of an N-C-spatial tensor (1-3 of them)."""
    n = len(shape) - 2
    if n == 2:
        return _pool2d(ctx, kind, x, kernel, strides, dilations, pads, ceil, include_pad,
                       (shape[2], shape[3]))
    if n == 1:
        y = _pool2d(ctx, kind, op.expand_dims(x, axis=2), [1, kernel[0]], [1, strides[0]],
                    [1, dilations[0]], [0, pads[0], 0, pads[1]], ceil, include_pad,
                    (1, shape[2]))
        return op.squeeze(y, axis=[2])
    if n == 3:
        nb, c, d, h, w = shape
        hw = _pool2d(ctx, kind, reshape(x, [nb, c * d, h, w]), kernel[1:], strides[1:],
                     dilations[1:], [pads[1], pads[2], pads[4], pads[5]], ceil, include_pad,
                     (h, w))
        oh, ow = ctx.tensor_type(hw).static_shape[2:4]  # static, as the input shape is
        y = _pool2d(ctx, kind, reshape(hw, [nb, c, d, oh * ow]), [kernel[0], 1], [strides[0], 1],
                    [dilations[0], 1], [pads[0], 0, pads[3], 0], ceil, include_pad,
                    (d, oh * ow))
        od = ctx.tensor_type(y).static_shape[2]
        return reshape(y, [nb, c, od, oh, ow])
    raise ctx.error(f"kiln converts 1-, 2- and 3-D pooling, not {n}-D")


def _pool_converter(kind: str):  # noqa: ANN202
    def convert(ctx: NodeContext) -> Expr:
        if ctx.output_used(1):
            raise ctx.error("kiln does not compute MaxPool's Indices output")
        if ctx.attr("storage_order", 0):
            raise ctx.error("storage_order=1 is not supported")
        shape = spatial_shape(ctx)
        kernel = list(ctx.need_attr("kernel_shape"))
        strides, dilations, pads = window_attrs(ctx, shape[2:], kernel)
        ceil = bool(ctx.attr("ceil_mode", 0))
        include_pad = bool(ctx.attr("count_include_pad", 0))
        x = ctx.x(0)
        if kind == "avg" and dtype_of(ctx.dtype(0)).is_int:
            raise ctx.error("average pooling of integers is not defined by ONNX")
        return pool(ctx, kind, x, shape, kernel, strides, dilations, pads, ceil, include_pad)

    return convert


converter("MaxPool", since=1)(_pool_converter("max"))
converter("AveragePool", since=1)(_pool_converter("avg"))


@converter("LpPool", since=11)
def lp_pool(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    kernel = list(ctx.need_attr("kernel_shape"))
    strides, dilations, pads = window_attrs(ctx, shape[2:], kernel)
    p = float(ctx.attr("p", 2))
    x = ctx.x(0)
    powered = op.power(op.abs(x), const_like(p, ctx.dtype(0)))
    mean = pool(ctx, "avg", powered, shape, kernel, strides, dilations, pads,
                bool(ctx.attr("ceil_mode", 0)), True)
    n = len(shape) - 2  # the mean's divisor: the taps inside the padded input
    taps = [_fitted_kernel(shape[2 + i], kernel[i], dilations[i], pads[i], pads[n + i])
            for i in range(n)]
    total = op.multiply(mean, const_like(float(math.prod(taps)), ctx.dtype(0)))
    return op.power(total, const_like(1.0 / p, ctx.dtype(0)))


def _global(reduce_fn):  # noqa: ANN001, ANN202
    def convert(ctx: NodeContext) -> Expr:
        axes = list(range(2, ctx.ndim(0)))
        return reduce_fn(ctx.x(0), axis=axes, keepdims=True)

    return convert


converter("GlobalAveragePool", since=1)(_global(op.mean))
converter("GlobalMaxPool", since=1)(_global(op.max))


@converter("GlobalLpPool", since=2)
def global_lp_pool(ctx: NodeContext) -> Expr:
    p = float(ctx.attr("p", 2))
    dtype = ctx.dtype(0)
    axes = list(range(2, ctx.ndim(0)))
    total = op.sum(op.power(op.abs(ctx.x(0)), const_like(p, dtype)), axis=axes, keepdims=True)
    return op.power(total, const_like(1.0 / p, dtype))


# --- matrix products ------------------------------------------------------------------------


def matmul(ctx: NodeContext, a: Expr, b: Expr) -> Expr:
    """numpy's matmul: 1-D operands promoted and dropped again, batch dims broadcast."""
    ash = ctx.tensor_type(a).shape
    bsh = ctx.tensor_type(b).shape
    if len(ash) == 1 and len(bsh) == 1:  # an inner product: a scalar
        return op.reshape(op.nn.dense(op.expand_dims(a, axis=0), op.expand_dims(b, axis=0)),
                          newshape=[])
    if len(ash) == 1:
        return op.squeeze(matmul(ctx, op.expand_dims(a, axis=0), b), axis=[-2])
    if len(bsh) == 1:
        return op.squeeze(matmul(ctx, a, op.expand_dims(b, axis=1)), axis=[-1])
    if len(bsh) == 2:
        return op.nn.dense(a, op.transpose(b))  # any rank of a: dense acts on its last axis
    at, bt = ctx.tensor_type(a), ctx.tensor_type(b)
    if not (at.is_static and bt.is_static):  # shapes known at run time (dynamic axes)
        return dynamic.batch_matmul(a, at.ndim, b, bt.ndim)
    sa, sb = at.static_shape, bt.static_shape
    abatch, bbatch = sa[:-2], sb[:-2]
    batch = tuple(np.broadcast_shapes(abatch, bbatch))
    count = math.prod(batch)
    if abatch != batch:
        a = op.broadcast_to(a, shape=[*batch, *sa[-2:]])
    if bbatch != batch:
        b = op.broadcast_to(b, shape=[*batch, *sb[-2:]])
    a3 = reshape(a, [count, *sa[-2:]])
    b3 = reshape(b, [count, *sb[-2:]])
    y = op.nn.batch_matmul(a3, b3, transpose_b=False)
    return reshape(y, [*batch, sa[-2], sb[-1]])


@converter("MatMul", since=1)
def matmul_(ctx: NodeContext) -> Expr:
    return matmul(ctx, ctx.x(0), ctx.x(1))


@converter("Gemm", since=1)
def gemm(ctx: NodeContext) -> Expr:
    a, b = ctx.x(0), ctx.x(1)
    dtype = ctx.dtype(0)
    if ctx.attr("transA", 0):
        a = op.transpose(a)
    # nn.dense(a, w) is a @ w.T: a transposed B is the weight as it is.
    y = op.nn.dense(a, b if ctx.attr("transB", 0) else op.transpose(b))
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = op.multiply(y, const_like(alpha, dtype))
    if ctx.has(2):
        c = ctx.x(2)
        if beta != 1.0:
            c = op.multiply(c, const_like(beta, dtype))
        y = op.add(y, c)
    return y
