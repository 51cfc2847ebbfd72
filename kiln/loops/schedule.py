"""Schedules: the explicit knobs of a kernel's loops, with defaults chosen from the shapes.

An elementwise (or reduction) loop nest over an output shape has three knobs: which loop
runs in parallel on the thread pool (only when there is enough work to pay for waking the
threads), which innermost loop is marked for vectorization, and whether to unroll short
innermost loops. The GEMM micro-kernel has its own knobs (kiln/loops/gemm.py).

When a loop runs in parallel (one rule for every kernel, decided at compile time from the
shapes, by work rather than element counts):

- a product (gemm, conv2d as implicit GEMM, the dot kernel of batch-1 dense) only when it
  has at least `PARALLEL_MIN_WORK_PER_THREAD` multiply-adds (about 1 MFLOP, some 20–50 µs
  on one core) for each of the cores the process may use (`worth_parallel`);
- a memory-bound nest (elementwise, depthwise conv, copies) only from
  `PARALLEL_MIN_ELEMENTS` elements × work per element (some 20–50 µs on one core).

Below that, waking libgomp's team and joining it costs as much as the work saved, and on a
loaded machine a parallel region may wait a whole scheduler timeslice for a busy core (a
batch-1 MLP went from 0.06 ms to 40 ms that way), while a serial kernel just runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.loops.ir import Const, Expr, For, Stmt, Var

# Below this many elements (× work per element) a memory-bound nest runs on one thread.
PARALLEL_MIN_ELEMENTS = 1 << 15
# Multiply-adds per core below which a product runs on one thread (``worth_parallel``).
PARALLEL_MIN_WORK_PER_THREAD = 1 << 19
VECTORIZE_MIN_EXTENT = 4


def worth_parallel(multiply_adds: int, threads: int) -> bool:
    """Whether a product of ``multiply_adds`` pays for a parallel region on ``threads``
    cores: at least `PARALLEL_MIN_WORK_PER_THREAD` for each of them."""
    return threads > 1 and multiply_adds >= threads * PARALLEL_MIN_WORK_PER_THREAD


@dataclass(frozen=True)
class NestSchedule:
    """Knobs of a loop nest: the parallel axis (or None) and the vectorized axis (or None)."""

    parallel_axis: int | None
    vector_axis: int | None

    @staticmethod
    def default(shape: Sequence[int], work_per_element: int = 1) -> NestSchedule:
        total = 1
        for d in shape:
            total *= d
        parallel = None
        if total * work_per_element >= PARALLEL_MIN_ELEMENTS:
            parallel = next((k for k, d in enumerate(shape) if d >= 2), None)
        vector = None
        if shape and shape[-1] >= VECTORIZE_MIN_EXTENT and parallel != len(shape) - 1:
            vector = len(shape) - 1
        return NestSchedule(parallel, vector)


def loop_nest(
    shape: Sequence[int],
    body: Callable[[tuple[Expr, ...]], Stmt],
    schedule: NestSchedule | None = None,
    names: str = "i",
) -> Stmt:
    """Loops over ``shape`` (outermost first) around ``body(indices)``, as scheduled."""
    schedule = schedule or NestSchedule.default(shape)
    vs = tuple(Var(f"{names}{k}") for k in range(len(shape)))
    stmt = body(vs)
    for k in reversed(range(len(shape))):
        kind = "serial"
        if k == schedule.parallel_axis:
            kind = "parallel"
        elif k == schedule.vector_axis:
            kind = "vectorized"
        stmt = For(vs[k], Const(0), Const(shape[k]), stmt, kind)
    return stmt
