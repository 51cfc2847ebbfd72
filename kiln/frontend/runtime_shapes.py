"""What both frontends build where shapes are known only when the program runs.

- `batch_matmul`: numpy's matmul of batches of matrices. The batch dimensions broadcast
  (`dyn.broadcast_to`, a view when nothing broadcasts), are flattened into one for
  ``nn.batch_matmul``, and are restored after (`dyn.reshape`), all from ``shape_of`` the
  operands (kiln/op/dyn.py).
- `triangle`: the mask of a triangle (triu/tril, a causal mask) from the sizes of its rows and
  columns: column minus row compared with the diagonal.
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.ir.expr import Constant, Expr
from kiln.op import dyn


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
