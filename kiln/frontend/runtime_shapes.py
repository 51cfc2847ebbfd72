"""What both frontends build where shapes are known only when the program runs.

- `batch_matmul`: numpy's matmul of batches of matrices. The batch dimensions broadcast
  (`dyn.broadcast_to`, a view when nothing broadcasts), are flattened into one for
  ``nn.batch_matmul``, and are restored after (`dyn.reshape`), all from ``shape_of`` the
  operands (kiln/op/dyn.py).
- `triangle`: the mask of a triangle (triu/tril, a causal mask) from the sizes of its rows and
  columns: column minus row compared with the diagonal.
- `scan`: cumulative sums and products along an axis of run-time size (a triangle again).
- `SortAxis`: the positions and the pairwise "before" table of an axis to sort along, and a
  check when the program runs that the places wanted (topk's k, kthvalue's k) lie on it.
- `gather_elements`: ``take_along_axis`` (ONNX GatherElements, torch.gather): the data cut
  to the index's sizes on the other axes, then one ``take`` with batch dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import op
from kiln.ir.expr import Constant, Expr
from kiln.op import dyn

_INT64_MAX = np.iinfo(np.int64).max


def ones(n: int) -> Expr:
    """``n`` ones, int64: leading dimensions of size 1."""
    return Constant(np.ones(n, "int64"))


def _part(shape: Expr, begin: int, end: int) -> Expr:
    return op.strided_slice(shape, begin=[begin], end=[end])


def batch_matmul(a: Expr, arank: int, b: Expr, brank: int) -> Expr:
    """numpy's matmul of a rank-3+ ``a`` by a rank-3+ ``b`` whose shapes are known at run
    time: the batch dimensions broadcast, flattened into one for ``nn.batch_matmul``, then
    restored."""
    sa, sb = op.shape_of(a, dtype="int64"), op.shape_of(b, dtype="int64")
    n = max(arank, brank) - 2
    batch_a, batch_b = _part(sa, 0, arank - 2), _part(sb, 0, brank - 2)
    if arank - 2 < n:
        batch_a = op.concatenate([ones(n - arank + 2), batch_a], axis=0)
    if brank - 2 < n:
        batch_b = op.concatenate([ones(n - brank + 2), batch_b], axis=0)
    batch = op.maximum(batch_a, batch_b)
    a = dyn.broadcast_to(a, op.concatenate([batch, _part(sa, arank - 2, arank)], axis=0))
    b = dyn.broadcast_to(b, op.concatenate([batch, _part(sb, brank - 2, brank)], axis=0))
    flat = Constant(np.array([-1], "int64"))
    a3 = dyn.reshape(a, op.concatenate([flat, _part(sa, arank - 2, arank)], axis=0))
    b3 = dyn.reshape(b, op.concatenate([flat, _part(sb, brank - 2, brank)], axis=0))
    y = op.nn.batch_matmul(a3, b3, transpose_b=False)
    out = op.concatenate([batch, _part(sa, arank - 2, arank - 1), _part(sb, brank - 1, brank)],
                         axis=0)
    return dyn.reshape(y, out)


def triangle(rows: Expr, cols: Expr, k: int, upper: bool) -> Expr:
    """A (rows, cols) bool mask of int64 scalar sizes: upper keeps j - i >= k, lower
    j - i <= k (the ramps are aranges of sizes known at run time, computed on the host)."""
    zero, one = Constant(np.array(0, "int64")), Constant(np.array(1, "int64"))
    i, j = (op.arange(zero, n, one, dtype="int64") for n in (rows, cols))
    offset = op.subtract(op.expand_dims(j, axis=0), op.expand_dims(i, axis=1))
    bound = Constant(np.array(k, "int64"))
    return op.greater_equal(offset, bound) if upper else op.less_equal(offset, bound)


def gather_elements(data: Expr, index: Expr, axis: int, rank: int,
                    same_sizes: Sequence[bool], index_dtype: str) -> Expr:
    """numpy's ``take_along_axis`` (ONNX ``GatherElements``, ``torch.gather``) of shapes
    known at run time. Negative indices count from the end of the axis. The index may be
    smaller than the data on the other axes, so there the data is first cut to the index's
    sizes (``dyn.strided_slice`` to ``shape_of`` the index), unless ``same_sizes[k]`` says
    the two are known to be equal on every such axis k; then both have the axis moved last,
    and one ``take`` along it treats every other axis as a batch dimension."""
    if any(not same for k, same in enumerate(same_sizes) if k != axis):
        sizes = op.shape_of(index, dtype="int64")
        ends: list[Expr] = [Constant(np.array([_INT64_MAX], "int64"))]
        if axis > 0:
            ends.insert(0, _part(sizes, 0, axis))
        if axis < rank - 1:
            ends.append(_part(sizes, axis + 1, rank))
        data = dyn.strided_slice(data, Constant(np.zeros(rank, "int64")),
                                 op.concatenate(ends, axis=0) if len(ends) > 1 else ends[0],
                                 Constant(np.ones(rank, "int64")))
    idx = index if index_dtype == "int64" else op.cast(index, dtype="int64")
    size = op.take(op.shape_of(data, dtype="int64"), Constant(np.array(axis, "int64")))
    idx = op.where(op.less(idx, Constant(np.array(0, "int64"))), op.add(idx, size), idx)
    picked = op.take(_move_last(data, axis, rank), _move_last(idx, axis, rank),
                     axis=rank - 1, batch_dims=rank - 1, mode="clip")
    if axis == rank - 1:
        return picked
    return op.transpose(picked, axes=[*range(axis), rank - 1, *range(axis, rank - 1)])


def _move_last(x: Expr, axis: int, rank: int) -> Expr:
    if axis == rank - 1:
        return x
    return op.transpose(x, axes=[k for k in range(rank) if k != axis] + [axis])


def scan(x: Expr, axis: int, rank: int, product: bool, exclusive: bool = False,
         reverse: bool = False) -> Expr:
    """The cumulative sum (product) along an axis whose size is known at run time: every
    position at once, the elements that enter it picked by a `triangle` of the axis's size
    (column j enters row i where j ≤ i; j < i exclusive; j ≥ i, j > i reversed), then summed
    (multiplied) — L² work for a length L, as the static scans of both frontends."""
    if axis != rank - 1:
        x = op.transpose(x, axes=[k for k in range(rank) if k != axis] + [axis])
    size = op.take(op.shape_of(x, dtype="int64"), Constant(np.array(rank - 1, "int64")))
    k = (1 if exclusive else 0) if reverse else (-1 if exclusive else 0)
    enters = triangle(size, size, k, upper=reverse)  # [i, j]
    spread = op.expand_dims(x, axis=-2)  # (..., 1, n): element j for every position i
    fill = op.ones_like(spread) if product else op.zeros_like(spread)
    y = (op.prod if product else op.sum)(op.where(enters, spread, fill), axis=[-1])
    if axis == rank - 1:
        return y
    order = [k for k in range(rank) if k != axis] + [axis]
    return op.transpose(y, axes=[order.index(k) for k in range(rank)])


class SortAxis:
    """An axis to sort or rank along, moved last, of static or run-time length L (both
    frontends' sorts compare every pair of its elements): ``length`` (an int64 scalar
    expression), ``positions`` 0..L-1 (int64), the (L, L) "j before i" table (`earlier`), and
    `places`, which checks wanted places against the axis when the program runs if L is
    symbolic (``take`` in mode ``fast``: a place outside the axis is a kiln error)."""

    def __init__(self, moved: Expr, rank: int, length: object):
        self.size = length
        self.static = isinstance(length, int)
        if isinstance(length, int):
            self.length: Expr = Constant(np.array(length, "int64"))
            self.positions: Expr = Constant(np.arange(length, dtype="int64"))
        else:
            self.length = op.take(op.shape_of(moved, dtype="int64"),
                                  Constant(np.array(rank - 1, "int64")))
            self.positions = op.arange(Constant(np.array(0, "int64")), self.length,
                                       Constant(np.array(1, "int64")), dtype="int64")

    def earlier(self) -> Expr:
        """The (L, L) bool table [i, j]: j < i."""
        if isinstance(self.size, int):
            return Constant(np.tril(np.ones((self.size, self.size), dtype=bool), k=-1))
        return triangle(self.length, self.length, -1, upper=False)

    def places(self, wanted: Expr) -> Expr:
        """``wanted`` (int64 places along the axis), checked to lie on it when the program
        runs where the length is symbolic."""
        if self.static:
            return wanted
        return op.take(self.positions, wanted, axis=0, mode="fast")
