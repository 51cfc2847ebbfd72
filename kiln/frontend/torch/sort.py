"""Sorting: ``sort``, ``argsort``, ``topk``, ``kthvalue``, ``median``, from kiln's operators.

kiln has no sorting operator, so a sort counts, for each element, the elements that go before
it — its place in the result — and then puts each element at its place, on the axis moved
last (length L, L² comparisons)::

    before[i, j] = x[j] < x[i]  or  (x[j] == x[i] and j < i)     (stable; > when descending)
    place[i]     = Σⱼ before[i, j]
    out[r]       = Σᵢ where(place[i] == r, x[i], 0)                (one i per r)

NaN sorts as larger than every number (last ascending, first descending), as in torch.
``topk`` is the first k of the sort, which gives ties in index order; torch's order among
ties is its own. Fine for the lengths models sort (a vocabulary of 50k would not be).

``kthvalue``, ``median`` and ``nanmedian`` need one place of that order, not the whole sort:
the element whose ``place`` is the wanted position (k - 1; ``(L - 1) // 2`` for the lower
median; for ``median`` of a row holding NaN, the row's first NaN, as torch's result is NaN;
for ``nanmedian`` the lower median of the row's numbers, counted per row). Among equal values
torch documents its index as unspecified (its CPU quickselect picks one); kiln gives the one
of that place in the stable order, so the value always matches torch and the index always
points at an element equal to it.

The sorted axis may be symbolic (``torch.export`` with ``dynamic_shapes``): its length is then
``shape_of`` the input when the program runs, the positions an ``arange`` of it and the
"j before i" table a `triangle` (kiln/frontend/runtime_shapes.py). A ``k`` that does not fit the
axis (topk's k > L, kthvalue's k > L, the median of an empty axis) is then found when the
program runs: the wanted places are taken from the axis's positions with ``take`` in mode
``fast``, which is a kiln error for a position outside the axis — never a silent zero.
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.runtime_shapes import SortAxis
from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import ANY, Expr, TensorType, const
from kiln.ir.dtype import dtype_of
from kiln.op import (
    any_,
    arange,
    cast,
    equal,
    expand_dims,
    floor_divide,
    greater,
    less,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    not_equal,
    reshape,
    shape_of,
    squeeze,
    strided_slice,
    subtract,
    take,
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
    shape = n.shape(x)
    rank = len(shape)
    dtype = n.dtype(x)
    if dtype == "bool":
        raise n.error("sorting bool tensors is not supported")
    if rank == 0:
        return x, const(np.int64(0))
    d = axis(dim, rank, n)
    moved = _move_last(x, d, rank)
    ax = SortAxis(moved, rank, shape[d])
    place = _places(moved, rank, ax, descending, dtype_of(dtype).is_float)  # (..., L)
    at = equal(expand_dims(place, axis=rank - 1), expand_dims(ax.positions, axis=1))  # [r, i]
    positions = ax.positions
    indices = sum_(where(at, positions, const(np.int64(0))), axis=[rank])
    values = sum_(where(at, expand_dims(moved, axis=rank - 1), const(0, dtype)), axis=[rank])
    return _move_back(values, d, rank), _move_back(indices, d, rank)


def _places(moved: Expr, rank: int, ax: SortAxis, descending: bool, floating: bool) -> Expr:
    """Each element's place in the stable order along the last axis (int64, shape kept)."""
    mine, theirs = expand_dims(moved, axis=rank), expand_dims(moved, axis=rank - 1)  # i, j
    first, same = _goes_before(mine, theirs, descending, floating)
    before = logical_or(first, logical_and(same, ax.earlier()))
    return sum_(cast(before, dtype="int64"), axis=[rank])


def ranked(n: AtenCall, x: Expr, dim: int, what: str, k: int | None = None,
           nan: str = "last") -> tuple[Expr, Expr, int]:
    """The value and int64 index of one place of the ascending stable order along ``dim``
    (the axis kept, size 1): place ``k`` (0-based), or with ``k=None`` the lower median —
    ``nan="propagate"`` the row's first NaN where it holds one (torch.median), ``nan="skip"``
    the median of the row's numbers (torch.nanmedian). Also the axis, made non-negative."""
    shape: tuple[object, ...] = tuple(n.shape(x))
    rank, dtype = len(shape), n.dtype(x)
    if dtype == "bool":
        raise n.error(f"{what} of bool tensors is not supported")
    if rank == 0:
        x = reshape(x, newshape=[1])
        shape, rank = (1,), 1
    d = axis(dim, rank, n)
    length = shape[d]
    if length == 0:
        raise n.error(f"{what} of an empty dimension")
    moved = _move_last(x, d, rank)
    ax = SortAxis(moved, rank, length)
    floating = dtype_of(dtype).is_float
    place = _places(moved, rank, ax, False, floating)
    if k is not None:
        wanted: Expr = const(np.int64(k))
    elif isinstance(length, int):
        wanted = const(np.int64((length - 1) // 2))
    else:
        wanted = floor_divide(subtract(ax.length, const(np.int64(1))), const(np.int64(2)))
    if k is None and floating and nan != "last":
        nans = not_equal(moved, moved)
        numbers = sum_(cast(logical_not(nans), dtype="int64"), axis=[rank - 1], keepdims=True)
        if nan == "propagate":  # the first NaN sits just after the numbers
            wanted = where(any_(nans, axis=[rank - 1], keepdims=True), numbers, wanted)
        else:
            half = floor_divide(subtract(numbers, const(np.int64(1))), const(np.int64(2)))
            wanted = maximum(half, const(np.int64(0)))  # all NaN: the first one
    wanted = ax.places(wanted)  # k past the axis, an empty axis: an error when it runs
    at = equal(place, wanted)  # one element per row
    index = sum_(where(at, ax.positions, const(np.int64(0))), axis=[rank - 1], keepdims=True)
    value = sum_(where(at, moved, const(0, dtype)), axis=[rank - 1], keepdims=True)
    return _move_back(value, d, rank), _move_back(index, d, rank), d


def _kept(pair: tuple[Expr, Expr, int], keepdim: bool, scalar: bool) -> list[Expr]:
    value, index, d = pair
    if scalar:
        return [reshape(value, newshape=[]), reshape(index, newshape=[])]
    if keepdim:
        return [value, index]
    return [squeeze(value, axis=[d]), squeeze(index, axis=[d])]


@converter("aten.kthvalue.default")
def kthvalue(n: AtenCall, x: Expr, k: int, dim: int = -1, keepdim: bool = False) -> list[Expr]:
    """The k-th smallest (1-based) along ``dim`` and its index (NaN counts as the largest)."""
    rank = n.rank(x)
    size = n.shape(x)[axis(dim, rank, n)] if rank else 1
    if k < 1 or (isinstance(size, int) and k > size):
        raise n.error(f"kthvalue's k={k} is outside [1, {size}] (the size of dimension {dim})")
    return _kept(ranked(n, x, dim, "kthvalue", k=k - 1), bool(keepdim), rank == 0)


@converter("aten.median.dim", "aten.nanmedian.dim")
def median_dim(n: AtenCall, x: Expr, dim: int, keepdim: bool = False) -> list[Expr]:
    """The lower median along ``dim`` and its index; ``median`` is NaN where the row holds
    NaN, ``nanmedian`` the median of the row's numbers."""
    nan = "skip" if n.target.startswith("aten.nanmedian") else "propagate"
    what = n.target.split(".")[1]
    return _kept(ranked(n, x, dim, what, nan=nan), bool(keepdim), n.rank(x) == 0)


@converter("aten.median.default", "aten.nanmedian.default")
def median(n: AtenCall, x: Expr) -> Expr:
    """The lower median of all the elements."""
    nan = "skip" if n.target.startswith("aten.nanmedian") else "propagate"
    what = n.target.split(".")[1]
    dims = [d for d in n.shape(x) if isinstance(d, int)]
    count = int(np.prod(dims)) if len(dims) == n.rank(x) else ANY
    flat = n.note(reshape(x, newshape=[-1]), TensorType((count,), n.dtype(x)))
    value = ranked(n, flat, 0, what, nan=nan)[0]
    return reshape(value, newshape=[])


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
    values, indices = sorted_along(n, x, dim, bool(largest))
    if rank == 0:
        return [values, indices]
    d = axis(dim, rank, n)
    length = n.shape(x)[d]
    if k < 0 or (isinstance(length, int) and k > length):
        raise n.error(f"topk of {k} from a dimension of size {length}")
    if k == length:
        return [values, indices]
    if not isinstance(length, int):  # k past the axis is an error when the program runs
        first = take(arange(const(np.int64(0)), take(shape_of(x, dtype="int64"),
                                                     const(np.int64(d))),
                            const(np.int64(1)), dtype="int64"),
                     const(np.arange(k, dtype=np.int64)), axis=0, mode="fast")
        return [take(v, first, axis=d) for v in (values, indices)]
    return [strided_slice(v, begin=[0], end=[k], axes=[d]) for v in (values, indices)]
