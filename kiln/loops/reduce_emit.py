"""The loop nest of a reduction: an accumulator per output element, the reduction loops."""

from __future__ import annotations

from kiln.loops.compute import ReduceTensor, WriteFn
from kiln.loops.ir import (
    Allocate,
    Binary,
    Buffer,
    Const,
    For,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.schedule import NestSchedule, loop_nest


def emit_reduce(t: ReduceTensor, write: WriteFn) -> Stmt:
    """``for idx: acc = init; for r: acc = combine(acc, body(idx, r)); write(idx, fin(acc))``."""
    reduced = 1
    for e in t.extents:
        reduced *= e
    schedule = NestSchedule.default(t.shape, work_per_element=reduced)
    schedule = NestSchedule(schedule.parallel_axis, None)  # the reduction is innermost

    def element(idx: tuple) -> Stmt:
        acc = Buffer("acc", (1,), t.acc_dtype, "local")
        zero = (Const(0),)
        rs = tuple(Var(f"r{k}") for k in range(len(t.extents)))
        step: Stmt = Store(acc, zero, Binary(t.combine, Load(acc, zero), t.body(idx, rs)))
        for k in reversed(range(len(rs))):
            step = For(rs[k], Const(0), Const(t.extents[k]), step)
        value = Var("red", t.acc_dtype)
        final = t.finalize(value, idx) if t.finalize is not None else value
        tail = LetStmt(value, Load(acc, zero), write(idx, final))
        return Allocate(acc, Seq((Store(acc, zero, t.init), step, tail)))

    return loop_nest(t.shape, element, schedule)
