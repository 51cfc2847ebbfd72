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
- a batch-1 dense (the dot kernel) also when its weight is at least a quarter of a core's
  L2 and 512 KiB (`worth_parallel_stream`): the model's other weights evict it between
  calls, so each call streams it from L3 at one core's bandwidth, and the cores together
  read it faster;
- a memory-bound nest (elementwise, depthwise conv, copies) only from
  `PARALLEL_MIN_ELEMENTS` elements × work per element (some 20–50 µs on one core).

Below that, waking the thread pool's workers and waiting for them costs as much as the work
saved, and on a loaded machine a worker that has claimed a chunk may be descheduled for a
whole scheduler timeslice (with libgomp's static split, a batch-1 MLP went from 0.06 ms to
40 ms that way), while a serial kernel just runs.

Schedules are chosen for a `kiln.Target` (vector width, registers, caches, cores). The
kernel builders take it as an argument; the operators' lowering rules, which do not pass
one, get the target of the lowering in progress (`lowering_target`: `lower_primitive`
sets it with `target_scope`), and outside any lowering this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from kiln.loops.ir import Const, Expr, For, Stmt, Var
from kiln.target import Target

_TARGET: ContextVar[Target | None] = ContextVar("kiln_lowering_target", default=None)


def lowering_target(target: Target | str | None = None) -> Target:
    """``target`` if given, else the target of the lowering in progress, else this machine."""
    if target is not None:
        return Target.parse(target)
    return _TARGET.get() or Target.host()


@contextmanager
def target_scope(target: Target | str) -> Iterator[Target]:
    """Kernels built inside the block are scheduled for ``target``."""
    t = Target.parse(target)
    token = _TARGET.set(t)
    try:
        yield t
    finally:
        _TARGET.reset(token)

_WEIGHT_BYTES: ContextVar[int | None] = ContextVar("kiln_weight_bytes", default=None)


@contextmanager
def weights_scope(total_bytes: int) -> Iterator[int]:
    """Kernels built inside the block belong to a program whose constants (its weights, read
    at every call) take ``total_bytes`` together (`lower_kernels` sets it)."""
    token = _WEIGHT_BYTES.set(total_bytes)
    try:
        yield total_bytes
    finally:
        _WEIGHT_BYTES.reset(token)


def current_weight_bytes() -> int | None:
    """The enclosing `weights_scope`'s bytes (None outside one)."""
    return _WEIGHT_BYTES.get()


def weights_fit_split(target: Target) -> bool:
    """Whether the weights of the program being lowered stay in the cores' L2 caches from
    call to call only if each core reads its own share of them: more than three quarters of
    one core's L2, at most three quarters of all of them. Where they do, a product with a
    constant B splits its columns (each core keeps its panels) rather than its rows (each
    core streams all of B, and all of the model's, through its L2)."""
    total = _WEIGHT_BYTES.get()
    if total is None or target.cores < 2:
        return False
    return 3 * target.l2 // 4 < total <= 3 * target.cores * target.l2 // 4


# Below this many elements (× work per element) a memory-bound nest runs on one thread.
PARALLEL_MIN_ELEMENTS = 1 << 15
# Multiply-adds per core below which a product runs on one thread (``worth_parallel``).
PARALLEL_MIN_WORK_PER_THREAD = 1 << 19
VECTORIZE_MIN_EXTENT = 4
# The smallest batch-1 weight split over the cores for its bandwidth (``worth_parallel_stream``).
STREAM_MIN_BYTES = 1 << 19


def worth_parallel(multiply_adds: int, threads: int) -> bool:
    """Whether a product of ``multiply_adds`` pays for a parallel region on ``threads``
    cores: at least `PARALLEL_MIN_WORK_PER_THREAD` for each of them."""
    return threads > 1 and multiply_adds >= threads * PARALLEL_MIN_WORK_PER_THREAD


def worth_parallel_stream(weight_bytes: int, target: Target) -> bool:
    """Whether a product that streams a weight of ``weight_bytes`` once per call (batch-1
    dense) pays for a parallel region: when the weight is at least a quarter of a core's
    L2 (and at least `STREAM_MIN_BYTES`, below which waking the pool costs what the split
    saves). A model's other weights pass through that L2 between two calls of this one, so one
    core would read it from L3 at one core's bandwidth every call; split by rows, each core
    reads its share, and the shares of all the model's weights fit the cores' L2s together.
    An MLP 784-512-512-10 at batch 1 (weights of 1.6 and 1 MiB) on a 2-core Sapphire Rapids
    with 2 MiB L2s: 115 µs a call with the split at a whole L2, 40-55 µs at a quarter."""
    return target.cores > 1 and weight_bytes >= max(target.l2 // 4, STREAM_MIN_BYTES)


# A parallel axis further in is taken only where the loops outside it run at most this many
# times (each time a fork and join of the pool).
INNER_PARALLEL_MAX_OUTER = 4


def _parallel_axis(shape: Sequence[int], cores: int) -> int | None:
    """The first axis of 2 or more, unless it shares out badly between ``cores`` threads
    (fewer than four iterations a thread, and not a multiple of them: 3 iterations on 2
    threads keep one idle a third of the time) and an axis further in, with at most
    `INNER_PARALLEL_MAX_OUTER` iterations of the loops outside it, shares out evenly."""
    def even(d: int) -> bool:
        return d % cores == 0 or d >= 4 * cores

    first = next((k for k, d in enumerate(shape) if d >= 2), None)
    if first is None or even(shape[first]):
        return first
    outer = shape[first]
    for k in range(first + 1, len(shape)):
        if outer > INNER_PARALLEL_MAX_OUTER:
            break
        if even(shape[k]):
            return k
        outer *= shape[k]
    return first


@dataclass(frozen=True)
class NestSchedule:
    """Knobs of a loop nest: the parallel axis (or None) and the vectorized axis (or None)."""

    parallel_axis: int | None
    vector_axis: int | None

    @staticmethod
    def default(shape: Sequence[int], work_per_element: int = 1,
                target: Target | None = None) -> NestSchedule:
        """Parallel over the first axis of 2 or more when the work pays and the target has
        several cores; the innermost axis vectorized when long enough."""
        total = 1
        for d in shape:
            total *= d
        parallel = None
        cores = lowering_target(target).cores
        if cores > 1 and total * work_per_element >= PARALLEL_MIN_ELEMENTS:
            parallel = _parallel_axis(shape, cores)
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
