"""Converters of ONNX's reductions, arg-reductions, cumulative sums and top-k.

ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp and ReduceSumSquare compose kiln's
reductions with elementwise operators. A reduction over no elements gives the reduction's
identity (0 for a sum, -inf for a max), as ONNX says. CumSum and TopK compare every position
along the axis with every other (a triangular mask, a rank by comparisons), which costs n² for
an axis of n elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln import op
from kiln.frontend.onnx import dynamic
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.ops_tensor import norm_axis
from kiln.frontend.onnx.table import converter
from kiln.frontend.runtime_shapes import SortAxis
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Constant, Expr

# The value of each reduction over no elements, as a function of the dtype.
_EMPTY: dict[str, Callable[[str], float]] = {
    "ReduceSum": lambda dt: 0,
    "ReduceSumSquare": lambda dt: 0,
    "ReduceL1": lambda dt: 0,
    "ReduceL2": lambda dt: 0,
    "ReduceProd": lambda dt: 1,
    "ReduceMean": lambda dt: np.nan,
    "ReduceMax": lambda dt: (-np.inf if dtype_of(dt).is_float else False if dt == "bool"
                             else np.iinfo(dt).min),
    "ReduceMin": lambda dt: (np.inf if dtype_of(dt).is_float else True if dt == "bool"
                             else np.iinfo(dt).max),
    "ReduceLogSum": lambda dt: -np.inf,
    "ReduceLogSumExp": lambda dt: -np.inf,
}


def _axes(ctx: NodeContext, from_input: bool) -> list[int] | None:
    """The reduced axes (normalized), or None for a reduction that does nothing."""
    ndim = ctx.ndim(0)
    if from_input:
        axes = ctx.ints(1, "axes") if ctx.has(1) else []
    else:
        axes = list(ctx.attr("axes", []))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return None
        return list(range(ndim))
    return sorted({norm_axis(ctx, a, ndim) for a in axes})


def _reduce(ctx: NodeContext, axes: list[int], keep: bool) -> Expr:
    name, x, dtype = ctx.op_type, ctx.x(0), ctx.dtype(0)
    t = ctx.t(0)
    shape = t.shape
    if any(shape[a] == 0 for a in axes) and t.is_static:
        out = [1 if k in axes else d for k, d in enumerate(t.static_shape)
               if keep or k not in axes]
        ctx.check_elements(out, "the reduction of an empty tensor")
        return Constant(np.full(out, _EMPTY[name](dtype), dtype=dtype))
    floating = dtype_of(dtype).is_float
    match name:
        case "ReduceSum":
            return op.sum(x, axis=axes, keepdims=keep)
        case "ReduceMean":
            if floating:
                return op.mean(x, axis=axes, keepdims=keep)
            reduced = [shape[a] for a in axes]
            if not all(isinstance(d, int) for d in reduced):
                raise ctx.error(f"{name} of {dtype} needs the reduced dimensions to be known, "
                                f"not ({', '.join(str(d) for d in reduced)})")
            count = math.prod(d for d in reduced if isinstance(d, int))
            return op.divide(op.sum(x, axis=axes, keepdims=keep), const_like(count, dtype))
        case "ReduceProd":
            return op.prod(x, axis=axes, keepdims=keep)
        case "ReduceMax":
            return (op.any if dtype == "bool" else op.max)(x, axis=axes, keepdims=keep)
        case "ReduceMin":
            return (op.all if dtype == "bool" else op.min)(x, axis=axes, keepdims=keep)
        case "ReduceSumSquare":
            return op.sum(op.multiply(x, x), axis=axes, keepdims=keep)
        case "ReduceL1":
            return op.sum(op.abs(x), axis=axes, keepdims=keep)
    wide = x if floating else cast(x, "float64")
    wdt = dtype if floating else "float64"
    match name:
        case "ReduceL2":
            y = op.sqrt(op.sum(op.multiply(wide, wide), axis=axes, keepdims=keep))
        case "ReduceLogSum":
            y = op.log(op.sum(wide, axis=axes, keepdims=keep))
        case "ReduceLogSumExp":
            top = op.max(wide, axis=axes, keepdims=True)
            finite = op.where(op.equal(op.abs(top), const_like(np.inf, wdt)),
                              op.zeros_like(top), top)
            total = op.sum(op.exp(op.subtract(wide, finite)), axis=axes, keepdims=keep)
            shift = finite if keep else op.squeeze(finite, axis=axes)
            y = op.add(op.log(total), shift)
        case _:
            raise ctx.error(f"no reduction {name}")
    return y if floating else cast(y, dtype)


def _reduce_converter(from_input: bool) -> Callable[[NodeContext], Expr]:
    def convert(ctx: NodeContext) -> Expr:
        axes = _axes(ctx, from_input)
        if axes is None:
            return ctx.x(0)
        return _reduce(ctx, axes, bool(ctx.attr("keepdims", 1)))

    return convert


converter("ReduceSum", since=1)(_reduce_converter(False))
converter("ReduceSum", since=13)(_reduce_converter(True))
for _name in ["ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceSumSquare",
              "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"]:
    converter(_name, since=1)(_reduce_converter(False))
    converter(_name, since=18)(_reduce_converter(True))


def _arg(reduce_fn: Callable[..., Expr]) -> Callable[[NodeContext], Expr]:
    def convert(ctx: NodeContext) -> Expr:
        axis = norm_axis(ctx, ctx.attr("axis", 0), ctx.ndim(0))
        y = reduce_fn(ctx.x(0), axis=[axis], keepdims=bool(ctx.attr("keepdims", 1)),
                      select_last_index=bool(ctx.attr("select_last_index", 0)))
        return cast(y, "int64")

    return convert


converter("ArgMax", since=1)(_arg(op.argmax))
converter("ArgMin", since=1)(_arg(op.argmin))


# --- along one axis: cumulative sums, top-k -------------------------------------------------


def _to_last(ctx: NodeContext, x: Expr, axis: int, ndim: int) -> tuple[Expr, list[int] | None]:
    """``x`` with ``axis`` moved last, and the permutation that moves it back."""
    if axis == ndim - 1:
        return x, None
    perm = [k for k in range(ndim) if k != axis] + [axis]
    back = [perm.index(k) for k in range(ndim)]
    return op.transpose(x, axes=perm), back


def _from_last(x: Expr, back: list[int] | None) -> Expr:
    return x if back is None else op.transpose(x, axes=back)


def _scan_mask(n: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """mask[i, j]: whether element j of the axis enters position i of the scan."""
    i, j = np.arange(n).reshape(n, 1), np.arange(n).reshape(1, n)
    if reverse:
        return (j > i) if exclusive else (j >= i)
    return (j < i) if exclusive else (j <= i)


def _cumulative(ctx: NodeContext, product: bool) -> Expr:
    if not ctx.t(0).is_static:  # shapes known at run time
        axis = norm_axis(ctx, ctx.int_scalar(1, "axis"), ctx.ndim(0))
        return dynamic.cumulative(ctx, axis, product)
    shape = ctx.shape(0)
    axis = norm_axis(ctx, ctx.int_scalar(1, "axis"), len(shape))
    n = shape[axis]
    ctx.check_elements((n, n), "its scan mask")
    mask = _scan_mask(n, bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0)))
    dtype = ctx.dtype(0)
    x, back = _to_last(ctx, ctx.x(0), axis, len(shape))
    if not product and dtype_of(dtype).is_float:
        return _from_last(op.nn.dense(x, Constant(mask.astype(dtype))), back)
    spread = op.expand_dims(x, axis=-2)  # (..., 1, n): element j for every position i
    fill = op.ones_like(spread) if product else op.zeros_like(spread)
    picked = op.where(Constant(mask), spread, fill)  # (..., n, n)
    reduce_fn = op.prod if product else op.sum
    return _from_last(reduce_fn(picked, axis=[-1]), back)


@converter("CumSum", since=11)
def cumsum(ctx: NodeContext) -> Expr:
    return _cumulative(ctx, product=False)


@converter("CumProd", since=26)
def cumprod(ctx: NodeContext) -> Expr:
    return _cumulative(ctx, product=True)


@converter("TopK", since=10)
def topk(ctx: NodeContext) -> list[Expr]:
    shape = ctx.t(0).shape  # the axis may be dynamic
    axis = norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    k = ctx.int_scalar(1, "K")
    n = shape[axis]
    if k < 0 or (isinstance(n, int) and k > n):
        raise ctx.error(f"K={k} is outside [0, {n}]")
    if isinstance(n, int):
        ctx.check_elements((n, n), "its table of comparisons")
    largest = bool(ctx.attr("largest", 1))
    x, back = _to_last(ctx, ctx.x(0), axis, len(shape))
    ax = SortAxis(x, len(shape), n)  # a symbolic n: K past the axis fails when it runs
    xi = op.expand_dims(x, axis=-1)  # (..., n, 1): element i
    xj = op.expand_dims(x, axis=-2)  # (..., 1, n): element j
    before = op.greater(xj, xi) if largest else op.less(xj, xi)
    tie = op.logical_and(op.equal(xj, xi), ax.earlier())
    # rank of element i: how many elements come before it (ties: the lower index first)
    rank = op.sum(cast(op.logical_or(before, tie), "int64"), axis=[-1])  # (..., n)
    slots = op.expand_dims(ax.places(Constant(np.arange(k, dtype="int64"))), axis=1)  # (k, 1)
    pick = op.equal(op.expand_dims(rank, axis=-2), slots)  # (..., k, n)
    values = op.sum(op.where(pick, op.expand_dims(x, axis=-2),
                             op.zeros_like(op.expand_dims(x, axis=-2))), axis=[-1])
    positions = op.expand_dims(ax.positions, axis=0)  # (1, n)
    indices = op.sum(op.where(pick, positions, Constant(np.array(0, "int64"))), axis=[-1])
    return [_from_last(values, back), _from_last(indices, back)]
