"""Sorting: ``sort``, ``argsort``, ``topk``, composed from kiln's operators (static shapes).

kiln has no sorting operator, so a sort counts, for each element, the elements that go before
it — its place in the result — and then puts each element at its place, on the axis moved
last (length L, L² comparisons)::

    before[i, j] = x[j] < x[i]  or  (x[j] == x[i] and j < i)     (stable; > when descending)
    place[i]     = Σⱼ before[i, j]
    out[r]       = Σᵢ where(place[i] == r, x[i], 0)                (one i per r)

NaN sorts as larger than every number (last ascending, first descending), as in torch.
``topk`` is the first k of the sort, which gives ties in index order; torch's order among
ties is its own. Fine for the lengths models sort (a vocabulary of 50k would not be).
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr, const
from kiln.ir.dtype import dtype_of
from kiln.op import (
    cast,
    equal,
    expand_dims,
    greater,
    less,
    logical_and,
    logical_not,
    logical_or,
    not_equal,
    strided_slice,
    transpose,
    where,
)
from kiln.op import sum as sum_


def _move_last(x: Expr, d: int, rank: int) -> Expr:
    return x if d == rank - 1 else transpose(x, axes=[k for k in range(rank) if k != d] + [d])


def _move_back(y: Expr, d: int, rank: int) -> Expr:
    if d == rank - 1:
        return y
    order = [k for k in range(rank) if k != d] + [d]
    return transpose(y, axes=[order.index(k) for k in range(rank)])


def _goes_before(a: Expr, b: Expr, descending: bool, floating: bool) -> tuple[Expr, Expr]:
    """Whether ``b`` goes strictly before ``a``, and whether they tie (NaN after numbers)."""
    first = greater(b, a) if descending else less(b, a)
    same = equal(a, b)
    if floating:
        nan_a, nan_b = not_equal(a, a), not_equal(b, b)
        nan_first = logical_and(nan_b, logical_not(nan_a)) if descending \
            else logical_and(nan_a, logical_not(nan_b))
        first = logical_or(first, nan_first)
        same = logical_or(same, logical_and(nan_a, nan_b))
    return first, same


def sorted_along(n: AtenCall, x: Expr, dim: int, descending: bool) -> tuple[Expr, Expr]:
    """``torch.sort(x, dim, descending, stable=True)``: the values and their int64 indices."""
    shape = n.static_shape(x, "sort")
    rank = len(shape)
    dtype = n.dtype(x)
    if dtype == "bool":
        raise n.error("sorting bool tensors is not supported")
    if rank == 0:
        return x, const(np.int64(0))
    d = axis(dim, rank, n)
    length = shape[d]
    moved = _move_last(x, d, rank)
    mine, theirs = expand_dims(moved, axis=rank), expand_dims(moved, axis=rank - 1)  # i, j
    first, same = _goes_before(mine, theirs, descending, dtype_of(dtype).is_float)
    earlier = const(np.tril(np.ones((length, length), dtype=bool), k=-1))  # [i, j]: j < i
    before = logical_or(first, logical_and(same, earlier))
    place = sum_(cast(before, dtype="int64"), axis=[rank])  # (..., L)
    at = equal(expand_dims(place, axis=rank - 1),
               const(np.arange(length, dtype=np.int64).reshape(length, 1)))  # [r, i]
    positions = const(np.arange(length, dtype=np.int64))
    indices = sum_(where(at, positions, const(np.int64(0))), axis=[rank])
    values = sum_(where(at, expand_dims(moved, axis=rank - 1), const(0, dtype)), axis=[rank])
    return _move_back(values, d, rank), _move_back(indices, d, rank)


@converter("aten.sort.default")
def sort(n: AtenCall, x: Expr, dim: int = -1, descending: bool = False) -> list[Expr]:
    return list(sorted_along(n, x, dim, bool(descending)))


@converter("aten.sort.stable")
def sort_stable(n: AtenCall, x: Expr, stable: bool | None = None, dim: int = -1,
                descending: bool = False) -> list[Expr]:
    return list(sorted_along(n, x, dim, bool(descending)))


@converter("aten.argsort.default")
def argsort(n: AtenCall, x: Expr, dim: int = -1, descending: bool = False) -> Expr:
    return sorted_along(n, x, dim, bool(descending))[1]


@converter("aten.argsort.stable")
def argsort_stable(n: AtenCall, x: Expr, stable: bool = False, dim: int = -1,
                   descending: bool = False) -> Expr:
    return sorted_along(n, x, dim, bool(descending))[1]


@converter("aten.topk.default")
def topk(n: AtenCall, x: Expr, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> list[Expr]:
    rank = n.rank(x)
    d = axis(dim, rank, n)
    values, indices = sorted_along(n, x, dim, bool(largest))
    if rank == 0:
        return [values, indices]
    length = n.static_shape(x, "topk")[d]
    if not 0 <= k <= length:
        raise n.error(f"topk of {k} from a dimension of size {length}")
    if k == length:
        return [values, indices]
    return [strided_slice(v, begin=[0], end=[k], axes=[d]) for v in (values, indices)]
