"""Loop nests of kernels that read an input across its rows: a transpose, tiled.

An elementwise kernel's loops follow its output's axes, the innermost vectorized. When a
read's last index is another of the output's axes (``out[i, j] = x[j, i]``), consecutive
elements of the innermost loop are a row of the input apart: each vector gathers from as many
cache lines, and before a line is read again the loop has gone through the whole column and
evicted it. A (1024, 256) → (256, 1024) transpose of a training step took 266 µs, 4 GB/s.

Here those two axes are tiled in `TILE` × `TILE` blocks, the output's innermost axis
innermost and vectorized within a block: the block's input lines (TILE of them) stay in L1
while all their elements are read. Only extents that tiles cover exactly take this form (a
clamped index in the vector loop would cost the stores their contiguity); the parallel loop
is the outermost axis of 2 or more, the transposed one counted by its blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.ir.dtype import dtype_of
from kiln.loops.collapse import Element
from kiln.loops.ir import Const, Expr, For, Load, Stmt, Var, subexpressions
from kiln.loops.schedule import NestSchedule

TILE = 32  # a block's side: its 32 input lines and 32 output rows fit L1 beside each other
# the L1 data cache as `_thrashes` models it (lines of 64 bytes, 64 sets: 32-48 KiB L1s)
LINE, L1_SETS, L1_WAYS = 64, 64, 8


def transposed_axis(shape: Sequence[int], element: Element) -> int | None:
    """The output axis that some read takes as its last index while the output's innermost
    axis indexes an earlier one of that read — a transpose of the two — where tiles cover
    both exactly; else None."""
    n = len(shape)
    if n < 2 or shape[-1] % TILE:
        return None
    probe = tuple(Var(f"t{k}") for k in range(n))
    value = element(probe)
    inner = probe[-1]
    for e in subexpressions(value):
        if isinstance(e, Load) and e.indices:
            last = e.indices[-1]
            at = [p for p, i in enumerate(e.indices[:-1])
                  if any(x is inner for x in subexpressions(i))]
            for k in range(n - 1):
                if last is probe[k] and at and shape[k] % TILE == 0 and _thrashes(
                        e, at[-1], shape[-1]):
                    return k
    return None


def _thrashes(load: Load, axis: int, count: int) -> bool:
    """Whether the ``count`` lines that the innermost loop reads down ``axis`` of the load's
    buffer outnumber what their cache sets hold (`L1_WAYS` lines a set, `L1_SETS` sets of
    `LINE` bytes), so that each is evicted before the next output row reads it again: rows
    1 KB apart fall in one set of 16, so 128 of them thrash (a (8, 128, 4, 64) → (0, 2, 3,
    1) transpose: 109 µs, tiled 63), while 128 rows 256 B apart fit (an attention head's
    (8, 4, 128, 64) → (0, 1, 3, 2): 31 µs, tiled 60-67)."""
    dims = load.buffer.shape[axis + 1:]
    if not all(isinstance(d, int) for d in dims):
        return False
    stride = dtype_of(load.buffer.dtype).itemsize
    for d in dims:
        stride *= d
    sets = len({(k * stride // LINE) % L1_SETS for k in range(min(count, L1_SETS * 4))})
    return count > sets * L1_WAYS


def transposed_nest(shape: Sequence[int], body: Callable[[tuple[Expr, ...]], Stmt],
                    axis: int) -> Stmt:
    """Loops over ``shape`` storing ``body(indices)``, with ``axis`` and the innermost one
    tiled in `TILE` × `TILE` blocks (see the module docstring)."""
    n = len(shape)
    vs = [Var(f"i{k}") for k in range(n)]
    a_blk, j_blk = Var(f"i{axis}b"), Var(f"i{n - 1}b")
    a_in, j_in = Var(f"i{axis}t"), Var(f"i{n - 1}t")
    idx: list[Expr] = list(vs)
    idx[axis] = a_blk * TILE + a_in
    idx[n - 1] = j_blk * TILE + j_in
    stmt: Stmt = For(j_in, Const(0), Const(TILE), body(tuple(idx)), "vectorized")
    stmt = For(a_in, Const(0), Const(TILE), stmt)
    stmt = For(j_blk, Const(0), Const(shape[n - 1] // TILE), stmt)
    # the parallel loop: the default's axis (for the transposed one, its blocks)
    parallel = NestSchedule.default(shape).parallel_axis
    for k in reversed(range(n - 1)):
        var, extent = (a_blk, shape[k] // TILE) if k == axis else (vs[k], shape[k])
        stmt = For(var, Const(0), Const(extent), stmt, "parallel" if k == parallel else "serial")
    return stmt
