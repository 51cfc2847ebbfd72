"""Scatter: ``scatter``, ``scatter_add``, ``scatter_reduce``, ``index_add``, ``index_copy``,
``index_fill``, and writes through views (``slice_scatter``, ``select_scatter``, ``copy``),
composed from kiln's operators (static shapes only).

torch's ``out = x.scatter(dim, index, src)`` writes ``src[u]`` to ``out[p]``, where ``p`` is
``u`` with ``p[dim] = index[u]``. kiln has no scatter operator, so each compares every target
position with every index, on the axis moved last::

    hit[..., t, m] = index[..., m] == t                 (N targets × M indices)
    scatter_add:     out = x + Σₘ where(hit, src, 0)
    scatter:         src at the last m that hits t, x where none does (torch leaves the choice
                     among repeated indices open; on CPU the last write wins)

``index_put`` (`indexing.py`) scatters along its merged axis the same way. The work is N·M
per row: fine for the masks, caches and small tables models scatter into, not for big ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr, TensorType, const
from kiln.ir.dtype import dtype_of
from kiln.op import (
    add,
    any_,
    broadcast_to,
    cast,
    divide,
    equal,
    expand_dims,
    floor_mod,
    full,
    logical_and,
    maximum,
    minimum,
    multiply,
    nn,
    reshape,
    strided_slice,
    take,
    transpose,
    where,
)
from kiln.op import max as max_
from kiln.op import min as min_
from kiln.op import prod as prod_
from kiln.op import sum as sum_


def _last(x: Expr, d: int, rank: int) -> Expr:
    """``x`` with axis ``d`` moved last (and back: `_unlast`)."""
    if d == rank - 1:
        return x
    return transpose(x, axes=[k for k in range(rank) if k != d] + [d])


def _unlast(x: Expr, d: int, rank: int) -> Expr:
    if d == rank - 1:
        return x
    order = [k for k in range(rank) if k != d] + [d]
    return transpose(x, axes=[order.index(k) for k in range(rank)])


def scatter_along(n: AtenCall, x: Expr, d: int, index: Expr, src: Expr, reduce: str,
                  include_self: bool = True) -> Expr:
    """torch's ``x.scatter_reduce(d, index, src, reduce, include_self)``, or with
    ``reduce="update"`` ``x.scatter(d, index, src)``; ``src`` in the result's dtype."""
    shape = n.static_shape(x, "scatter")
    rank = len(shape)
    ishape = n.static_shape(index, "scatter's index")
    sshape = n.static_shape(src, "scatter's source")
    if len(ishape) != rank or len(sshape) != rank:
        raise n.error(f"scatter's index (rank {len(ishape)}) and source (rank {len(sshape)}) "
                      f"must have the rank of the input ({rank})")
    if any(i > s for i, s in zip(ishape, sshape)) or \
            any(i > s for k, (i, s) in enumerate(zip(ishape, shape)) if k != d):
        raise n.error(f"scatter's index of shape {list(ishape)} is larger than its source "
                      f"{list(sshape)} or input {list(shape)}")
    dtype = n.out.dtype
    targets, m = shape[d], ishape[d]
    idx = cast(index, dtype="int64") if n.dtype(index) != "int64" else index
    idx = floor_mod(idx, const(np.int64(targets)))  # torch's negative indices count back
    if tuple(sshape) != tuple(ishape):  # torch reads the leading part of a larger source
        src = strided_slice(src, begin=[0] * rank, end=list(ishape))
    # Positions the index does not reach on the other axes: an index there that hits nothing.
    widths = [[0, 0] if k == d else [0, s - i] for k, (s, i) in enumerate(zip(shape, ishape))]
    if any(w[1] for w in widths):
        idx = nn.pad(idx, pad_width=widths, pad_value=const(np.int64(-1)))
        src = nn.pad(src, pad_width=widths, pad_value=const(0, dtype))
    idx = expand_dims(_last(idx, d, rank), axis=rank - 1)  # (..., 1, M)
    src = expand_dims(_last(src, d, rank), axis=rank - 1)
    hit = equal(idx, const(np.arange(targets, dtype=np.int64).reshape(targets, 1)))
    out = _combine(n, _last(x, d, rank), hit, src, m, reduce, include_self, dtype, rank)
    return _unlast(out, d, rank)


def _combine(n: AtenCall, xs: Expr, hit: Expr, src: Expr, m: int, reduce: str,
             include_self: bool, dtype: str, rank: int) -> Expr:
    """The scattered result with the axis moved last: ``xs`` (..., N), ``hit`` (..., N, M),
    ``src`` (..., 1, M)."""
    at = [rank]  # hit's axis of the M indices
    zero, one = const(0, dtype), const(1, dtype)
    hits = any_(hit, axis=at)
    if reduce == "update":
        order = const(np.arange(m, dtype=np.int64))
        final = max_(where(hit, order, const(np.int64(-1))), axis=at, keepdims=True)
        chosen = logical_and(hit, equal(order, final))  # one m per target at most
        return where(hits, sum_(where(chosen, src, zero), axis=at), xs)
    if reduce == "sum":
        total = sum_(where(hit, src, zero), axis=at)
        return add(xs, total) if include_self else where(hits, total, xs)
    if reduce == "prod":
        total = prod_(where(hit, src, one), axis=at)
        return multiply(xs, total) if include_self else where(hits, total, xs)
    if reduce == "mean":
        if not dtype_of(dtype).is_float:
            raise n.error(f"scatter_reduce with mean is imported for floats only, not {dtype}")
        total = sum_(where(hit, src, zero), axis=at)
        counted = sum_(cast(hit, dtype=dtype), axis=at)
        if include_self:
            return divide(add(total, xs), add(counted, one))
        return where(hits, divide(total, maximum(counted, one)), xs)
    if reduce in ("amax", "amin"):
        largest = reduce == "amax"
        fill = _extreme(dtype, lowest=largest)
        best = (max_ if largest else min_)(where(hit, src, fill), axis=at)
        if include_self:
            best = (maximum if largest else minimum)(best, xs)
        return where(hits, best, xs)
    raise n.error(f"scatter with reduction {reduce!r} is not supported (sum, prod, mean, amax, "
                  "amin)")


def _extreme(dtype: str, lowest: bool) -> Expr:
    if dtype_of(dtype).is_float:
        return const(-np.inf if lowest else np.inf, dtype)
    info = np.iinfo(dtype)
    return const(info.min if lowest else info.max, dtype)


def _filled(n: AtenCall, value: object, shape: Sequence[int]) -> Expr:
    filled = full(n.tensor(value, n.out.dtype), shape=list(shape), dtype=n.out.dtype)
    return n.note(filled, TensorType(tuple(shape), n.out.dtype))


_TORCH_REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod",
                 "mean": "mean", "amax": "amax", "amin": "amin"}


def _reduction(n: AtenCall, reduce: str) -> str:
    if reduce not in _TORCH_REDUCE:
        raise n.error(f"scatter with reduce={reduce!r} is not supported")
    return _TORCH_REDUCE[reduce]


@converter("aten.scatter.src", "aten.scatter.value")
def scatter(n: AtenCall, x: Expr, dim: int, index: Expr, src: object) -> Expr:
    d = axis(dim, n.rank(x), n)
    if not isinstance(src, Expr):
        src = _filled(n, src, n.static_shape(index, "scatter's index"))
    return scatter_along(n, n.tensor(x, n.out.dtype), d, index, n.tensor(src, n.out.dtype),
                         "update")


@converter("aten.scatter.reduce", "aten.scatter.value_reduce")
def scatter_reduce_old(n: AtenCall, x: Expr, dim: int, index: Expr, src: object,
                       reduce: str) -> Expr:
    d = axis(dim, n.rank(x), n)
    if not isinstance(src, Expr):
        src = _filled(n, src, n.static_shape(index, "scatter's index"))
    return scatter_along(n, n.tensor(x, n.out.dtype), d, index, n.tensor(src, n.out.dtype),
                         _reduction(n, reduce))


@converter("aten.scatter_add.default")
def scatter_add(n: AtenCall, x: Expr, dim: int, index: Expr, src: Expr) -> Expr:
    d = axis(dim, n.rank(x), n)
    return scatter_along(n, n.tensor(x, n.out.dtype), d, index, n.tensor(src, n.out.dtype),
                         "sum")


@converter("aten.scatter_reduce.two")
def scatter_reduce(n: AtenCall, x: Expr, dim: int, index: Expr, src: Expr, reduce: str,
                   include_self: bool = True) -> Expr:
    d = axis(dim, n.rank(x), n)
    return scatter_along(n, n.tensor(x, n.out.dtype), d, index, n.tensor(src, n.out.dtype),
                         _reduction(n, reduce), bool(include_self))


def _along(n: AtenCall, index: Expr, d: int, shape: Sequence[int]) -> Expr:
    """A 1-D index of ``index_add``/``index_copy`` as scatter's index: broadcast to ``shape``
    (the source's), varying along ``d``."""
    if n.rank(index) == 0:
        index = reshape(index, newshape=[1])
    view = [1] * len(shape)
    view[d] = shape[d]
    return broadcast_to(reshape(index, newshape=view), shape=list(shape))


@converter("aten.index_add.default", "aten.index_copy.default")
def index_add(n: AtenCall, x: Expr, dim: int, index: Expr, source: Expr,
              alpha: object = 1) -> Expr:
    """``x.index_add(dim, index, source)``: scatter_add with the 1-D index broadcast to the
    source's shape along ``dim``; ``index_copy`` the same with replacement."""
    d = axis(dim, n.rank(x), n)
    dtype = n.out.dtype
    shape = n.static_shape(source, n.target.split(".")[1])
    src = n.tensor(source, dtype)
    if alpha != 1:
        src = multiply(src, n.tensor(alpha, dtype))
    view = [1] * len(shape)
    view[d] = shape[d]
    idx = broadcast_to(reshape(index, newshape=view), shape=list(shape))
    reduce = "sum" if n.target == "aten.index_add.default" else "update"
    return scatter_along(n, n.tensor(x, dtype), d, n.note(idx, TensorType(shape, n.dtype(index))),
                         n.note(src, TensorType(shape, dtype)), reduce)


@converter("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def index_fill(n: AtenCall, x: Expr, dim: int, index: Expr, value: object) -> Expr:
    rank = n.rank(x)
    d = axis(dim, rank, n)
    size = n.static_shape(x, "index_fill")[d] if rank else 1
    idx = index if n.rank(index) == 1 else reshape(index, newshape=[-1])
    idx = floor_mod(cast(idx, dtype="int64"), const(np.int64(size)))
    rows = const(np.arange(size, dtype=np.int64).reshape(size, 1))
    chosen = any_(equal(rows, expand_dims(idx, axis=0)), axis=[1])  # (size,)
    if rank > 1:
        view = [1] * rank
        view[d] = size
        chosen = reshape(chosen, newshape=view)
    return where(chosen, n.tensor(value, n.out.dtype), n.tensor(x, n.out.dtype))


# --- writes through views: x[:, 1:] = y as torch.export records it ---------------------------


@converter("aten.copy.default")
def copy(n: AtenCall, x: Expr, src: Expr, non_blocking: bool = False) -> Expr:
    """``x.copy_(src)`` as a value: ``src`` in ``x``'s dtype, broadcast to its shape."""
    y = n.tensor(src, n.out.dtype)
    if tuple(n.shape(src)) != tuple(n.out.shape):
        y = broadcast_to(y, shape=n.static_out("copy"))
    return y


@converter("aten.slice_scatter.default")
def slice_scatter(n: AtenCall, x: Expr, src: Expr, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Expr:
    """``x`` with ``x[start:end:step]`` along ``dim`` replaced by ``src``: ``src`` read at
    each replaced position (a take), ``x`` kept elsewhere. Into a tensor of symbolic shape
    only a slice of the whole axis is supported (what ``x[:, i] = v`` records around its
    index_put)."""
    if not n.type(x).is_static:
        d = axis(dim, n.rank(x), n)
        whole = (start in (None, 0) and step == 1
                 and (end is None or (isinstance(end, int) and end >= 2**31 - 1)
                      or str(end) == str(n.sizes(x)[d])))
        if not whole:
            raise n.error("slice_scatter into a tensor of symbolic shape is supported for a "
                          f"slice of the whole axis only, not [{start}:{end}:{step}] of "
                          f"dimension {d}")
        return n.tensor(src, n.out.dtype)
    shape = n.static_shape(x, "slice_scatter")
    d = axis(dim, len(shape), n)
    size = shape[d]
    lo, hi, stride = slice(start, end, step).indices(size)
    return _replace_along(n, x, n.tensor(src, n.out.dtype), d, list(range(lo, hi, stride)))


@converter("aten.select_scatter.default")
def select_scatter(n: AtenCall, x: Expr, src: Expr, dim: int, index: int) -> Expr:
    shape = n.static_shape(x, "select_scatter")
    d = axis(dim, len(shape), n)
    src = expand_dims(n.tensor(src, n.out.dtype), axis=d)
    return _replace_along(n, x, src, d, [index % shape[d]])


def _replace_along(n: AtenCall, x: Expr, src: Expr, d: int, replaced: list[int]) -> Expr:
    """``x`` with the positions ``replaced`` along ``d`` taken from ``src`` (in the result's
    dtype), one after another."""
    shape = n.static_shape(x, "a write through a view")
    rank, size, dtype = len(shape), shape[d], n.out.dtype
    if not replaced:
        return n.tensor(x, dtype)
    if replaced == list(range(size)):
        return src
    where_from = np.zeros(size, dtype=np.int64)
    where_from[replaced] = np.arange(len(replaced))
    taken = take(src, const(where_from), axis=d, mode="clip")
    chosen = np.zeros(size, dtype=bool)
    chosen[replaced] = True
    view = [1] * rank
    view[d] = size
    return where(const(chosen.reshape(view)), taken, n.tensor(x, dtype))
