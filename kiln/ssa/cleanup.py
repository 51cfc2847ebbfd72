"""Small clean-ups of SSA functions after lowering: unreachable blocks and straight-line
chains of blocks.

Lowering makes blocks freely — a loop header for tail calls that may never be used, a block
after each constructor test — and `simplify_cfg` folds them: a block reached only by a ``br``
from a single predecessor is appended to it, its parameters replaced by the arguments the
branch passed. Blocks no path from the entry reaches are dropped.
"""

from __future__ import annotations

from kiln.ssa.analysis import predecessors, reverse_post_order
from kiln.ssa.ir import Function, Value


def replace_uses(fn: Function, mapping: dict[Value, Value]) -> None:
    """Every use of a key of ``mapping`` in ``fn`` made a use of its value (chains followed)."""
    if not mapping:
        return

    def final(v: Value) -> Value:
        seen = 0
        while v in mapping and seen <= len(mapping):
            v = mapping[v]
            seen += 1
        return v

    for b in fn.blocks:
        for ins in b.instrs:
            ins.operands = [final(v) for v in ins.operands]
        t = b.terminator
        if t is not None:
            t.operands = [final(v) for v in t.operands]
            for tgt in t.targets:
                tgt.args = [final(v) for v in tgt.args]


def remove_unreachable(fn: Function) -> None:
    reachable = set(reverse_post_order(fn))
    fn.blocks = [b for b in fn.blocks if b in reachable]


def simplify_cfg(fn: Function) -> Function:
    """Drop unreachable blocks and merge each block into its only predecessor where that
    predecessor simply branches to it."""
    remove_unreachable(fn)
    changed = True
    while changed:
        changed = False
        preds = predecessors(fn)
        mapping: dict[Value, Value] = {}
        merged = set()
        for a in fn.blocks:
            if a in merged:
                continue
            while True:
                t = a.terminator
                if t is None or t.op != "br":
                    break
                target = t.targets[0]
                b = target.block
                if b is fn.entry or b is a or len(preds[b]) != 1 or b in merged:
                    break
                mapping.update(zip(b.params, target.args))
                for ins in b.instrs:
                    ins.block = a
                a.instrs.extend(b.instrs)
                a.terminator = b.terminator
                if a.terminator is not None:
                    a.terminator.block = a
                b.instrs, b.terminator = [], None
                merged.add(b)
                for s in a.successors:
                    preds[s] = [a if p is b else p for p in preds[s]]
                changed = True
        if merged:
            fn.blocks = [b for b in fn.blocks if b not in merged]
            replace_uses(fn, mapping)
    return fn
