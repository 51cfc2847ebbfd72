"""Converters of ONNX's indexing operators: slices, gathers, scatters, padding, masks.

kiln has ``take`` (gather along one axis) and ``strided_slice``; the other gathers read the
flattened data with ``take`` at positions computed from the indices, and the scatters compare
each update's position with every element's (a one-hot mask), which is fine for the sizes
scatters are used at in inference graphs.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import op
from kiln.frontend.onnx import dynamic
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.ops_tensor import norm_axis, reshape
from kiln.frontend.onnx.table import converter
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Constant, Expr
from kiln.op import dyn

# --- slices ---------------------------------------------------------------------------------


def onnx_slice(ctx: NodeContext, starts: list[int], ends: list[int], axes: list[int] | None,
               steps: list[int] | None) -> Expr:
    shape = ctx.t(0).shape
    ndim = len(shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must "
                        "have one value per sliced axis")
    if len(axes) > ndim:
        raise ctx.error(f"it slices {len(axes)} axes of a tensor of rank {ndim}")
    begin, end, strides, kaxes = [], [], [], []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(ctx, a, ndim)
        if st == 0:
            raise ctx.error("a slice step must not be 0")
        n = shape[a]
        if not isinstance(n, int):
            raise ctx.error(f"Slice needs dimension {a} to be static")
        # ONNX clamps the bounds to the dimension; Python's slicing does the same except that
        # an end of -1 going backwards means "before the first element" in ONNX.
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
        else:
            s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
            s = -n - 1 if s < 0 else s
            e = -n - 1 if e < 0 else e
        begin.append(s)
        end.append(e)
        strides.append(st)
        kaxes.append(a)
    if not kaxes:
        return ctx.x(0)
    return op.strided_slice(ctx.x(0), begin=begin, end=end, strides=strides, axes=kaxes)


@converter("Slice", since=10)
def slice_10(ctx: NodeContext) -> Expr:
    if ctx.const(1) is None or ctx.const(2) is None:  # bounds computed at run time
        return dynamic.slice_(ctx)
    axes = ctx.ints(3, "axes") if ctx.has(3) else None
    steps = ctx.ints(4, "steps") if ctx.has(4) else None
    starts = ctx.ints(1, "starts")
    shape = ctx.t(0).shape
    sliced = axes if axes is not None else list(range(len(starts)))
    if any(not isinstance(shape[norm_axis(ctx, a, len(shape))], int) for a in sliced) \
            and all(st > 0 for st in steps or [1]):
        # constant bounds on an axis of run-time size (BART's ids[:, :5] over a dynamic
        # sequence): clamped when the program runs, as ONNX clamps them
        return dynamic.slice_(ctx)
    return onnx_slice(ctx, starts, ctx.ints(2, "ends"), axes, steps)


@converter("Slice", since=1)
def slice_1(ctx: NodeContext) -> Expr:
    axes = ctx.attr("axes")
    return onnx_slice(ctx, list(ctx.need_attr("starts")), list(ctx.need_attr("ends")),
                      list(axes) if axes is not None else None, None)


# --- gathers --------------------------------------------------------------------------------


def positive_index(idx: Expr, n: Expr | int, dtype: str) -> Expr:
    """Indices with negative values counted from the end (as int64)."""
    idx = cast(idx, "int64") if dtype != "int64" else idx
    size = const_like(n, "int64") if isinstance(n, int) else n
    return op.where(op.less(idx, const_like(0, "int64")), op.add(idx, size), idx)


@converter("Gather", since=1)
def gather(ctx: NodeContext) -> Expr:
    axis = norm_axis(ctx, ctx.attr("axis", 0), ctx.ndim(0))
    known = dynamic.static_dims(ctx, ctx.x(0), ctx.const(1))
    if known is not None:  # static dimensions of a tensor with dynamic axes (Swin's H, W)
        return known
    return op.take(ctx.x(0), ctx.x(1), axis=axis, mode="wrap")


def strides_of(shape: tuple[int, ...] | list[int]) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def grid_offsets(ctx: NodeContext, shape: tuple[int, ...], strides: list[int], skip: int
                 ) -> np.ndarray:
    """Sum over the axes but ``skip`` of (position along the axis) * stride, for each element."""
    ctx.check_elements(shape, "its table of element offsets")
    total = np.zeros(shape, dtype="int64")
    if total.size == 0:
        return total  # (an empty tensor may still have a huge dimension)
    for k, d in enumerate(shape):
        if k == skip:
            continue
        view = [1] * len(shape)
        view[k] = d
        total = total + np.arange(d, dtype="int64").reshape(view) * strides[k]
    return total


@converter("GatherElements", since=11)
def gather_elements(ctx: NodeContext) -> Expr:
    if not (ctx.t(0).is_static and ctx.t(1).is_static):  # shapes known at run time
        return dynamic.gather_elements(ctx, norm_axis(ctx, ctx.attr("axis", 0), ctx.ndim(0)))
    shape, ishape = ctx.shape(0), ctx.shape(1)
    axis = norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    strides = strides_of(shape)
    idx = positive_index(ctx.x(1), shape[axis], ctx.dtype(1))
    flat = op.add(op.multiply(idx, const_like(strides[axis], "int64")),
                  Constant(grid_offsets(ctx, ishape, strides, axis)))
    return op.take(reshape(ctx.x(0), [-1]), flat, axis=0, mode="clip")


@converter("GatherND", since=11)
def gather_nd(ctx: NodeContext) -> Expr:
    shape, ishape = ctx.shape(0), ctx.shape(1)
    b = ctx.attr("batch_dims", 0)
    m = ishape[-1]
    lead = shape[: b + m]
    strides = strides_of(lead)
    idx = positive_index(ctx.x(1), Constant(np.asarray(lead[b:], "int64")), ctx.dtype(1))
    flat = op.sum(op.multiply(idx, Constant(np.asarray(strides[b:], "int64"))), axis=[-1])
    if b:
        batch = grid_offsets(ctx, tuple(ishape[:b]), strides[:b], -1)
        flat = op.add(flat, Constant(batch.reshape(batch.shape + (1,) * (len(ishape) - 1 - b))))
    data = reshape(ctx.x(0), [math.prod(lead), *shape[b + m:]])
    return op.take(data, flat, axis=0, mode="clip")


# --- scatters -------------------------------------------------------------------------------


def scatter_flat(ctx: NodeContext, data: Expr, flat: Expr, updates: Expr, n: int, k: int,
                 reduction: str) -> Expr:
    """data (n, t) with rows ``flat`` (k,) replaced or combined with updates (k, t)."""
    dtype = ctx.dtype(0)
    ctx.check_elements((n,), "its table of positions")
    ctx.check_shape((k, n, ctx.tensor_type(updates).shape[-1]), "its one-hot update mask")
    hit = op.equal(op.reshape(flat, newshape=[k, 1]),
                   Constant(np.arange(n, dtype="int64").reshape(1, n)))  # (k, n)
    mask = op.expand_dims(hit, axis=2)  # (k, n, 1)
    upd = op.expand_dims(updates, axis=1)  # (k, 1, t)
    touched = op.any(mask, axis=[0])  # (n, 1)
    zero = op.zeros_like(upd)
    if reduction in ("none", "add"):
        total = op.sum(op.where(mask, upd, zero), axis=[0])
        if reduction == "add":
            return op.add(data, total)
        return op.where(touched, total, data)
    if reduction == "mul":
        return op.multiply(data, op.prod(op.where(mask, upd, op.ones_like(upd)), axis=[0]))
    if reduction in ("max", "min"):
        info = None if dtype_of(dtype).is_float else np.iinfo(dtype)
        low, high = (-np.inf, np.inf) if info is None else (int(info.min), int(info.max))
        fill = const_like(low if reduction == "max" else high, dtype)
        picked = op.where(mask, upd, op.add(zero, fill))
        best = op.max(picked, axis=[0]) if reduction == "max" else op.min(picked, axis=[0])
        combine = op.maximum if reduction == "max" else op.minimum
        return op.where(touched, combine(data, best), data)
    raise ctx.error(f"unknown reduction {reduction!r}")


@converter("ScatterElements", since=11)
@converter("Scatter", since=9)
def scatter_elements(ctx: NodeContext) -> Expr:
    shape, ishape = ctx.shape(0), ctx.shape(1)
    axis = norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    strides = strides_of(shape)
    idx = positive_index(ctx.x(1), shape[axis], ctx.dtype(1))
    flat = op.add(op.multiply(idx, const_like(strides[axis], "int64")),
                  Constant(grid_offsets(ctx, ishape, strides, axis)))
    n, k = math.prod(shape), math.prod(ishape)
    out = scatter_flat(ctx, reshape(ctx.x(0), [n, 1]), reshape(flat, [k]),
                       reshape(ctx.x(2), [k, 1]), n, k, ctx.attr("reduction", "none"))
    return reshape(out, shape)


@converter("ScatterND", since=11)
def scatter_nd(ctx: NodeContext) -> Expr:
    shape, ishape = ctx.shape(0), ctx.shape(1)
    m = ishape[-1]
    lead, tail = shape[:m], shape[m:]
    strides = strides_of(lead)
    idx = positive_index(ctx.x(1), Constant(np.asarray(lead, "int64")), ctx.dtype(1))
    flat = op.sum(op.multiply(idx, Constant(np.asarray(strides, "int64"))), axis=[-1])
    n, k, t = math.prod(lead), math.prod(ishape[:-1]), math.prod(tail)
    out = scatter_flat(ctx, reshape(ctx.x(0), [n, t]), reshape(flat, [k]),
                       reshape(ctx.x(2), [k, t]), n, k, ctx.attr("reduction", "none"))
    return reshape(out, shape)


# --- masks and one-hot ----------------------------------------------------------------------


@converter("OneHot", since=9)
def one_hot(ctx: NodeContext) -> Expr:
    depth = ctx.int_scalar(1, "depth")
    if depth < 1:
        raise ctx.error(f"depth must be positive, not {depth}")
    ctx.check_elements((depth,), "its table of positions (depth)")
    values = ctx.x(2)
    rank = ctx.ndim(0) + 1
    ctx.check_rank(rank, "the result")
    axis = norm_axis(ctx, ctx.attr("axis", -1), rank)
    idx = ctx.x(0)
    if ctx.dtype(0) != "int64":
        idx = cast(idx, "int64")
    idx = op.where(op.less(idx, const_like(0, "int64")),
                   op.add(idx, const_like(depth, "int64")), idx)
    view = [1] * rank
    view[axis] = depth
    positions = Constant(np.arange(depth, dtype="int64").reshape(view))
    on = op.equal(op.expand_dims(idx, axis=axis), positions)
    off_value = op.take(values, const_like(0, "int64"), axis=0)
    on_value = op.take(values, const_like(1, "int64"), axis=0)
    return op.where(on, on_value, off_value)


@converter("Trilu", since=14)
def trilu(ctx: NodeContext) -> Expr:
    if not ctx.t(0).is_static:  # sizes known at run time (a causal mask of the sequence)
        k = ctx.int_scalar(1, "k") if ctx.has(1) else 0
        return dynamic.trilu(ctx, k, bool(ctx.attr("upper", 1)))
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.error(f"Trilu takes a tensor of rank 2 or more, not shape {shape}")
    rows, cols = shape[-2], shape[-1]
    k = ctx.int_scalar(1, "k") if ctx.has(1) else 0
    k = min(max(k, -rows), cols)  # further out, the mask is all or nothing already
    ctx.check_elements((rows, cols), "its triangular mask")
    if ctx.attr("upper", 1):
        keep = np.triu(np.ones((rows, cols), dtype=bool), k)
    else:
        keep = np.tril(np.ones((rows, cols), dtype=bool), k)
    return op.where(Constant(keep), ctx.x(0), op.zeros_like(ctx.x(0)))


# --- padding --------------------------------------------------------------------------------

_PAD_MODES = {"constant": "constant", "edge": "edge", "reflect": "reflect"}


def onnx_pad(ctx: NodeContext, pads: list[int], mode: str, value: Expr | None,
             axes: list[int] | None) -> Expr:
    ndim = ctx.ndim(0)
    axes = list(range(ndim)) if axes is None else [norm_axis(ctx, a, ndim) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must give a begin and an end for each of {len(axes)} axes")
    before, after = [0] * ndim, [0] * ndim
    for j, a in enumerate(axes):
        before[a], after[a] = pads[j], pads[j + len(axes)]
    x = ctx.x(0)
    # negative pads crop
    if any(p < 0 for p in before + after):
        shape = ctx.shape(0)
        begin = [max(-p, 0) for p in before]
        end = [shape[k] - max(-after[k], 0) for k in range(ndim)]
        x = op.strided_slice(x, begin=begin, end=end)
        before, after = [max(p, 0) for p in before], [max(p, 0) for p in after]
    if not any(before + after):
        return x
    if mode == "wrap":
        return _wrap_pad(ctx, x, before, after)
    if mode not in _PAD_MODES:
        raise ctx.error(f"unknown pad mode {mode!r}")
    fill = value if value is not None else const_like(0, ctx.dtype(0))
    return op.nn.pad(x, list(zip(before, after)), fill, _PAD_MODES[mode])


def _wrap_pad(ctx: NodeContext, x: Expr, before: list[int], after: list[int]) -> Expr:
    shape = list(ctx.tensor_type(x).shape)
    for a, (b, e) in enumerate(zip(before, after)):
        if not b and not e:
            continue
        n = shape[a]
        if not isinstance(n, int):
            raise ctx.error(f"wrap padding needs dimension {a} to be known, not {n}")
        if n == 0:
            raise ctx.error(f"wrap padding needs dimension {a} to be non-empty")
        ctx.check_elements((b + n + e,), f"its wrapped positions along axis {a}")
        idx = np.arange(-b, n + e) % n
        x = op.take(x, Constant(idx.astype("int64")), axis=a)
    return x


@converter("Pad", since=11)
def pad_11(ctx: NodeContext) -> Expr:
    pads = ctx.ints(1, "pads")
    value = None
    if ctx.has(2):
        value = op.reshape(ctx.x(2), newshape=[])
    axes = ctx.ints(3, "axes") if ctx.has(3) else None
    return onnx_pad(ctx, pads, ctx.attr("mode", "constant"), value, axes)


@converter("Pad", since=2)
def pad_2(ctx: NodeContext) -> Expr:
    value = const_like(ctx.attr("value", 0.0), ctx.dtype(0))
    return onnx_pad(ctx, list(ctx.need_attr("pads")), ctx.attr("mode", "constant"), value, None)


# --- data-dependent shapes, from constants --------------------------------------------------


@converter("NonZero", since=9)
def nonzero(ctx: NodeContext) -> Expr:
    x = ctx.const(0)
    if x is not None:  # known now: the indices are a constant
        return Constant(np.asarray(np.nonzero(x), dtype="int64").reshape(x.ndim, -1))
    # counted when the program runs: argwhere on the host gives (count, rank), ONNX (rank, count)
    return op.transpose(cast(dyn.argwhere(ctx.x(0)), "int64"), axes=[1, 0])


@converter("Compress", since=11)
def compress(ctx: NodeContext) -> Expr:
    cond = np.asarray(ctx.need_const(1, "condition"), dtype=bool).reshape(-1)
    axis = ctx.attr("axis")
    x = ctx.x(0)
    if axis is None:
        x, axis = reshape(x, [-1]), 0
    else:
        axis = norm_axis(ctx, axis, ctx.ndim(0))
    picked = np.nonzero(cond)[0].astype("int64")
    return op.take(x, Constant(picked), axis=axis, mode="clip")


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    batch_axis, time_axis = ctx.attr("batch_axis", 1), ctx.attr("time_axis", 0)
    t = shape[time_axis]
    lens = cast(ctx.x(1), "int64")  # (batch,)
    view = [1] * len(shape)
    view[batch_axis] = shape[batch_axis]
    lens = op.reshape(lens, newshape=view)
    tview = [1] * len(shape)
    tview[time_axis] = t
    steps = Constant(np.arange(t, dtype="int64").reshape(tview))
    source = op.where(op.less(steps, lens),
                      op.subtract(op.subtract(lens, const_like(1, "int64")), steps), steps)
    source = op.broadcast_to(source, shape=list(shape))
    strides = strides_of(shape)
    flat = op.add(op.multiply(source, const_like(strides[time_axis], "int64")),
                  Constant(grid_offsets(ctx, tuple(shape), strides, time_axis)))
    return op.take(reshape(ctx.x(0), [-1]), flat, axis=0, mode="clip")
