"""The loop nest of a reduction: an accumulator per output element, the reduction loops.

Where the innermost reduced axis runs along memory (a row's sum, mean or maximum: layer
norm's statistics, softmax's denominator) the reduction is folded in vectors
(`_lane_folded`): four accumulators of a vector's lanes each, positions ``p·4L + u·L + l``
going to lane ``l`` of accumulator ``u``, then the accumulators and their lanes combined in
a fixed order and the positions past the last whole vector added one by one. LLVM does not
reorder a float reduction itself, so the one accumulator was a scalar loop, one element a
step: a (1024, 256) row mean took 96 µs against torch's 12 on a Sapphire Rapids-class VM.
The order depends only on the shapes, so the result does not depend on the threads.

Where instead the reduced axes all lie outside the output's last axis, which runs along
memory (a bias's gradient: a sum over the batch and tokens), each block of `COLUMN_BLOCK`
outputs keeps a local row of accumulators and every reduced position is added along it in
a vectorized loop (`_column_blocks`), in the scalar loop's order; the blocks run in
parallel.
"""

from __future__ import annotations

from kiln.loops.compute import ReduceTensor, WriteFn
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    IfThenElse,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
    subexpressions,
)
from kiln.loops.oplib import lanes_combined
from kiln.loops.schedule import NestSchedule, loop_nest, lowering_target

# Reductions folded in vectors (`_lane_folded`): their combining operators, and the fewest
# positions along the innermost reduced axis (below, the scalar loop).
FOLDED = frozenset(["add", "max", "min"])
FOLD_MIN_VECTORS = 2


def emit_reduce(t: ReduceTensor, write: WriteFn) -> Stmt:
    """``for idx: acc = init; for r: acc = combine(acc, body(idx, r)); write(idx, fin(acc))``."""
    reduced = 1
    for e in t.extents:
        reduced *= e
    if _columns(t):
        return _column_blocks(t, write, reduced)
    schedule = NestSchedule.default(t.shape, work_per_element=reduced)
    schedule = NestSchedule(schedule.parallel_axis, None)  # the reduction is innermost
    lanes = lowering_target().lanes(t.acc_dtype)

    def element(idx: tuple) -> Stmt:
        rs = tuple(Var(f"r{k}") for k in range(len(t.extents)))
        value = Var("red", t.acc_dtype)
        final = t.finalize(value, idx) if t.finalize is not None else value
        if _foldable(t, idx, rs, lanes):
            return _lane_folded(t, idx, rs, lanes, value, write(idx, final))
        acc = Buffer("acc", (1,), t.acc_dtype, "local")
        zero = (Const(0),)
        step: Stmt = Store(acc, zero, Binary(t.combine, Load(acc, zero), t.body(idx, rs)))
        for k in reversed(range(len(rs))):
            step = For(rs[k], Const(0), Const(t.extents[k]), step)
        tail = LetStmt(value, Load(acc, zero), write(idx, final))
        return Allocate(acc, Seq((Store(acc, zero, t.init), step, tail)))

    return loop_nest(t.shape, element, schedule)


def _foldable(t: ReduceTensor, idx: tuple, rs: tuple[Var, ...], lanes: int) -> bool:
    """Whether the innermost reduced axis is long enough and runs along memory: every read
    that depends on it has it as its last index, plus what does not depend on it."""
    if not t.extents or t.combine not in FOLDED or lanes < 2 \
            or t.extents[-1] < FOLD_MIN_VECTORS * lanes:
        return False
    r = rs[-1]
    for e in subexpressions(t.body(idx, rs)):
        if not isinstance(e, Load) or not e.indices:  # a scalar's read: not along r
            continue
        *outer, last = e.indices
        if any(_mentions(i, r) for i in outer):
            return False
        if _mentions(last, r) and not _plus_r(last, r):
            return False
    return True


def _mentions(e: Expr, r: Var) -> bool:
    return any(x is r for x in subexpressions(e))


def _plus_r(e: Expr, r: Var) -> bool:
    """``e`` is ``r``, or ``r`` plus (either side) an expression without ``r``."""
    if e is r:
        return True
    return (isinstance(e, Binary) and e.op == "add"
            and ((e.b is r and not _mentions(e.a, r)) or (e.a is r and not _mentions(e.b, r))))


def _lane_folded(t: ReduceTensor, idx: tuple, rs: tuple[Var, ...], lanes: int, value: Var,
                 use: Stmt) -> Stmt:
    """The reduction of one output element folded in vectors along its innermost reduced
    axis (see the module docstring); ``use`` reads the result as ``value``."""
    n = t.extents[-1]
    dt, op = t.acc_dtype, t.combine
    acc = Buffer("fold", (4, lanes), dt, "local")
    chunks, vec_tail = n // (4 * lanes), (n % (4 * lanes)) // lanes
    start = n // lanes * lanes  # the positions past the last whole vector
    u, p0, w = Var("u"), Var("p0"), Var("w")
    outer = rs[:-1]

    def fold_in(unit: Expr, at: Expr) -> Stmt:
        lane = Var("l")
        body = t.body(idx, (*outer, at + lane))
        return For(lane, Const(0), Const(lanes), Store(acc, (unit, lane), Binary(
            op, Load(acc, (unit, lane)), body)), "vectorized")

    steps: list[Stmt] = []
    if chunks:
        steps.append(For(p0, Const(0), Const(chunks), For(u, Const(0), Const(4), fold_in(
            u, p0 * (4 * lanes) + u * lanes), "unrolled")))
    if vec_tail:
        steps.append(For(w, Const(0), Const(vec_tail), fold_in(
            w, Const(chunks * 4 * lanes, INDEX) + w * lanes), "unrolled"))
    body: Stmt = Seq(tuple(steps))
    for k in reversed(range(len(outer))):
        body = For(outer[k], Const(0), Const(t.extents[k]), body)
    u0, lane0 = Var("u"), Var("l")
    init = For(u0, Const(0), Const(4), For(lane0, Const(0), Const(lanes), Store(
        acc, (u0, lane0), t.init), "vectorized"))
    # the accumulators pairwise, then their lanes as a tree
    vec = [Load(acc, (Const(k, INDEX), Const(0, INDEX)), lanes) for k in range(4)]
    combined = Store(acc, (Const(0, INDEX), Const(0, INDEX)), Binary(
        op, Binary(op, vec[0], vec[1]), Binary(op, vec[2], vec[3])))
    cell0 = (Const(0, INDEX), Const(0, INDEX))
    finish = [combined, *lanes_combined(acc, op)]
    if start < n:
        # the scalar tail after the lanes are combined, for every outer position: folded
        # in again, one by one
        finish.append(_scalar_tail(t, idx, outer, acc, start, n))
    return Allocate(acc, Seq((init, body, *finish, LetStmt(value, Load(acc, cell0), use))))


def _scalar_tail(t: ReduceTensor, idx: tuple, outer: tuple[Var, ...], acc: Buffer,
                 start: int, n: int) -> Stmt:
    """The positions ``start`` to ``n`` of the innermost reduced axis, for every position
    of the outer ones, combined one by one into ``acc[0, 0]``."""
    q = Var("q")
    cell = (Const(0, INDEX), Const(0, INDEX))
    step: Stmt = For(q, Const(start), Const(n - start), Store(acc, cell, Binary(
        t.combine, Load(acc, cell), t.body(idx, (*outer, q)))), "scalar")
    for k in reversed(range(len(outer))):
        step = For(outer[k], Const(0), Const(t.extents[k]), step)
    return step


# Reductions over outer axes (`_columns`): the output's last axis in blocks of this many
# elements, each block's accumulators a local row.
COLUMN_BLOCK = 256


def _columns(t: ReduceTensor) -> bool:
    """Whether the reduced axes all lie outside the output's last axis, which runs along
    memory: a column sum (a bias's gradient, summed over the batch and tokens). Every read
    depending on the output's last index has it as its own last index, plus what does not
    depend on it, and no reduced position there."""
    if not t.shape or not t.extents or t.shape[-1] < 2 * FOLD_MIN_VECTORS:
        return False
    idx = tuple(Var(f"i{k}") for k in range(len(t.shape)))
    rs = tuple(Var(f"r{k}") for k in range(len(t.extents)))
    j = idx[-1]
    loads = [e for e in subexpressions(t.body(idx, rs)) if isinstance(e, Load)]
    if not any(_mentions(e.indices[-1], j) for e in loads if e.indices):
        return False
    for e in loads:
        if not e.indices:
            continue
        *outer, last = e.indices
        if any(_mentions(i, j) for i in outer):
            return False
        if _mentions(last, j) and (not _plus_r(last, j)
                                   or any(_mentions(last, r) for r in rs)):
            return False
    return True


def _column_blocks(t: ReduceTensor, write: WriteFn, reduced: int) -> Stmt:
    """A reduction over outer axes (`_columns`): for each block of the output's last axis, a
    local row of accumulators, every reduced position added in order along it (a vectorized
    loop over the block), then the row written out. The sums are the scalar loop's, in the
    same order; the blocks run in parallel where the work pays."""
    n = t.shape[-1]
    block = min(n, COLUMN_BLOCK)
    blocks = -(-n // block)
    outer_shape = (*t.shape[:-1], blocks)
    schedule = NestSchedule.default(outer_shape, work_per_element=reduced * block)
    schedule = NestSchedule(schedule.parallel_axis, None)

    full = n // block

    def columns(o: tuple, start: Expr, width: int) -> Stmt:
        acc = Buffer("cols", (block,), t.acc_dtype, "local")
        rs = tuple(Var(f"r{k}") for k in range(len(t.extents)))
        j0, j1, j2 = Var("j"), Var("j"), Var("j")
        init = For(j0, Const(0), Const(width), Store(acc, (j0,), t.init), "vectorized")
        step: Stmt = For(j1, Const(0), Const(width), Store(acc, (j1,), Binary(
            t.combine, Load(acc, (j1,)), t.body((*o[:-1], start + j1), rs))), "vectorized")
        for k in reversed(range(len(rs))):
            step = For(rs[k], Const(0), Const(t.extents[k]), step)
        idx = (*o[:-1], start + j2)
        value = Var("red", t.acc_dtype)
        final = t.finalize(value, idx) if t.finalize is not None else value
        out = For(j2, Const(0), Const(width), LetStmt(value, Load(acc, (j2,)), write(
            idx, final)), "vectorized")
        return Allocate(acc, Seq((init, step, out)))

    def element(o: tuple) -> Stmt:
        if n % block == 0:
            return columns(o, o[-1] * block, block)
        # the whole blocks (the block clamped, for the verifier), then the last, narrower
        whole = columns(o, Binary("min", o[-1], Const(full - 1, INDEX)) * block, block) \
            if full else None
        last = columns(o, Const(full * block, INDEX), n % block)
        if whole is None:
            return last
        return IfThenElse(Binary("lt", o[-1], Const(full, INDEX)), whole, last)

    return loop_nest(outer_shape, element, schedule)
