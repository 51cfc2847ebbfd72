"""Converters of ONNX's normalizations and softmax family."""

from __future__ import annotations

import math

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.ops_tensor import norm_axis, reshape
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr


def channel_view(ctx: NodeContext, v: Expr, ndim: int) -> Expr:
    """A per-channel vector (C,) shaped to broadcast over N-C-spatial data."""
    return op.reshape(v, newshape=[-1] + [1] * (ndim - 2))


@converter("BatchNormalization", since=7)
def batch_norm(ctx: NodeContext) -> list[Expr | None]:
    x = ctx.x(0)
    if ctx.attr("spatial", 1) != 1:
        raise ctx.error("spatial=0 (statistics per element) is not supported")
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx, eps)
    if ctx.num_outputs > 1 and any(ctx.output_used(k) for k in range(1, ctx.num_outputs)):
        raise ctx.error("kiln imports BatchNormalization for inference (one output)")
    y = op.nn.batch_norm(x, ctx.x(1), ctx.x(2), ctx.x(3), ctx.x(4), axis=1, epsilon=eps)
    return [y[0]]


def _batch_norm_training(ctx: NodeContext, eps: float) -> list[Expr | None]:
    """Normalize with the batch's statistics; update the running ones with ``momentum``."""
    x, dtype, ndim = ctx.x(0), ctx.dtype(0), ctx.ndim(0)
    axes = [0, *range(2, ndim)]
    mean = op.mean(x, axis=axes, keepdims=True)
    centered = op.subtract(x, mean)
    var = op.mean(op.multiply(centered, centered), axis=axes, keepdims=True)
    inv = op.rsqrt(op.add(var, const_like(eps, dtype)))
    y = op.add(op.multiply(op.multiply(centered, inv), channel_view(ctx, ctx.x(1), ndim)),
               channel_view(ctx, ctx.x(2), ndim))
    momentum = const_like(ctx.attr("momentum", 0.9), dtype)
    rest = op.subtract(const_like(1.0, dtype), momentum)
    flat_mean, flat_var = op.reshape(mean, newshape=[-1]), op.reshape(var, newshape=[-1])
    running_mean = op.add(op.multiply(ctx.x(3), momentum), op.multiply(flat_mean, rest))
    running_var = op.add(op.multiply(ctx.x(4), momentum), op.multiply(flat_var, rest))
    return [y, running_mean, running_var]


@converter("InstanceNormalization", since=6)
def instance_norm(ctx: NodeContext) -> Expr:
    x, dtype, ndim = ctx.x(0), ctx.dtype(0), ctx.ndim(0)
    axes = list(range(2, ndim))
    mean = op.mean(x, axis=axes, keepdims=True)
    centered = op.subtract(x, mean)
    var = op.mean(op.multiply(centered, centered), axis=axes, keepdims=True)
    normed = op.multiply(centered, op.rsqrt(op.add(var, const_like(ctx.attr("epsilon", 1e-5),
                                                                    dtype))))
    return op.add(op.multiply(normed, channel_view(ctx, ctx.x(1), ndim)),
                  channel_view(ctx, ctx.x(2), ndim))


@converter("LayerNormalization", since=17)
def layer_norm(ctx: NodeContext) -> list[Expr | None]:
    x, dtype, ndim = ctx.x(0), ctx.dtype(0), ctx.ndim(0)
    axis = norm_axis(ctx, ctx.attr("axis", -1), ndim)
    eps = ctx.attr("epsilon", 1e-5)
    extra = any(ctx.output_used(k) for k in (1, 2))
    scale_rank = ctx.ndim(1)
    if (axis == ndim - 1 and not extra and scale_rank == 1 and ctx.dtype(1) == dtype
            and (not ctx.has(2) or ctx.ndim(2) == 1)):
        beta = ctx.x(2) if ctx.has(2) else op.zeros_like(ctx.x(1))
        return [op.nn.layer_norm(x, ctx.x(1), beta, axis=-1, epsilon=eps)]
    stash = "float32" if ctx.attr("stash_type", 1) == 1 and dtype == "float16" else dtype
    axes = list(range(axis, ndim))
    wide = cast(x, stash) if stash != dtype else x
    mean = op.mean(wide, axis=axes, keepdims=True)
    centered = op.subtract(wide, mean)
    var = op.mean(op.multiply(centered, centered), axis=axes, keepdims=True)
    inv = op.rsqrt(op.add(var, const_like(eps, stash)))
    normed: Expr = op.multiply(centered, inv)
    if stash != dtype:
        normed = cast(normed, dtype)
    y = op.multiply(normed, ctx.x(1))
    if ctx.has(2):
        y = op.add(y, ctx.x(2))
    return [y, mean, inv]


@converter("LRN", since=1)
def lrn(ctx: NodeContext) -> Expr:
    x, dtype = ctx.x(0), ctx.dtype(0)
    shape = ctx.shape(0)
    size = ctx.need_attr("size")
    if not isinstance(size, int) or size < 1:
        raise ctx.error(f"attribute size must be a positive integer, not {size!r}")
    if len(shape) < 2:
        raise ctx.error(f"LRN takes an N-C-... input, not one of shape {shape}")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    c = shape[1]
    # The window reaches at most c - 1 channels to each side: the rest is padding, zeros.
    before = min((size - 1) // 2, max(c - 1, 0))
    after = min(size - 1 - (size - 1) // 2, max(c - 1, 0))
    ctx.check_unroll(before + after + 1, f"the window of attribute size={size} over {c} "
                     "channels (LRN adds one slice of its input per channel of the window)")
    sq = op.multiply(x, x)
    widths = [(0, 0)] * len(shape)
    widths[1] = (before, after)
    padded = op.nn.pad(sq, widths, const_like(0, dtype))
    total = None
    for k in range(before + after + 1):
        part = op.strided_slice(padded, begin=[k], end=[k + c], axes=[1])
        total = part if total is None else op.add(total, part)
    assert total is not None
    scale = op.add(const_like(bias, dtype), op.multiply(total, const_like(alpha / size, dtype)))
    return op.divide(x, op.power(scale, const_like(beta, dtype)))


@converter("LpNormalization", since=1)
def lp_normalization(ctx: NodeContext) -> Expr:
    x, dtype = ctx.x(0), ctx.dtype(0)
    axis = norm_axis(ctx, ctx.attr("axis", -1), ctx.ndim(0))
    p = ctx.attr("p", 2)
    if p == 1:
        norm = op.sum(op.abs(x), axis=[axis], keepdims=True)
    elif p == 2:
        norm = op.sqrt(op.sum(op.multiply(x, x), axis=[axis], keepdims=True))
    else:
        raise ctx.error(f"p must be 1 or 2, got {p}")
    zero = const_like(0, dtype)
    safe = op.where(op.equal(norm, zero), op.ones_like(norm), norm)
    return op.divide(x, safe)  # a zero vector stays zero


@converter("MeanVarianceNormalization", since=9)
def mean_variance_normalization(ctx: NodeContext) -> Expr:
    x, dtype = ctx.x(0), ctx.dtype(0)
    axes = [norm_axis(ctx, a, ctx.ndim(0)) for a in ctx.attr("axes", [0, 2, 3])]
    mean = op.mean(x, axis=axes, keepdims=True)
    centered = op.subtract(x, mean)
    std = op.sqrt(op.mean(op.multiply(centered, centered), axis=axes, keepdims=True))
    return op.divide(centered, op.add(std, const_like(1e-9, dtype)))


# --- softmax --------------------------------------------------------------------------------


def _softmax_converter(fn, since_13: bool):  # noqa: ANN001, ANN202
    def convert(ctx: NodeContext) -> Expr:
        ndim = ctx.ndim(0)
        if since_13:
            return fn(ctx.x(0), axis=norm_axis(ctx, ctx.attr("axis", -1), ndim))
        # before 13: the input is flattened to 2-D at axis, softmax runs over the second part
        axis = norm_axis(ctx, ctx.attr("axis", 1), ndim) if ndim else 0
        shape = ctx.shape(0)
        if axis == ndim - 1:
            return fn(ctx.x(0), axis=-1)
        flat = reshape(ctx.x(0), [math.prod(shape[:axis]), math.prod(shape[axis:])])
        return reshape(fn(flat, axis=-1), list(shape))

    return convert


converter("Softmax", since=13)(_softmax_converter(op.nn.softmax, True))
converter("Softmax", since=1)(_softmax_converter(op.nn.softmax, False))
converter("LogSoftmax", since=13)(_softmax_converter(op.nn.log_softmax, True))
converter("LogSoftmax", since=1)(_softmax_converter(op.nn.log_softmax, False))


def _hardmax_last(ctx: NodeContext, x: Expr, n: int, dtype: str) -> Expr:
    ctx.check_elements((n,), "its table of positions")
    best = op.argmax(x, axis=[-1], keepdims=True)  # the first maximum
    hit = op.equal(cast(best, "int64"), Constant(np.arange(n, dtype="int64")))
    return cast(hit, dtype)


@converter("Hardmax", since=13)
def hardmax_13(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    axis = norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    perm = [k for k in range(len(shape)) if k != axis] + [axis]
    x = op.transpose(ctx.x(0), axes=perm) if axis != len(shape) - 1 else ctx.x(0)
    y = _hardmax_last(ctx, x, shape[axis], ctx.dtype(0))
    if axis == len(shape) - 1:
        return y
    return op.transpose(y, axes=[perm.index(k) for k in range(len(shape))])


@converter("Hardmax", since=1)
def hardmax_1(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    axis = norm_axis(ctx, ctx.attr("axis", 1), len(shape))
    inner = math.prod(shape[axis:])
    flat = reshape(ctx.x(0), [math.prod(shape[:axis]), inner])
    return reshape(_hardmax_last(ctx, flat, inner, ctx.dtype(0)), list(shape))
