"""Analyses of SSA functions: the control-flow graph, dominance and liveness.

Dominance is the iterative algorithm of Cooper, Harvey and Kennedy ("A Simple, Fast Dominance
Algorithm", 2001) over blocks in reverse post-order, with each block's place in a depth-first
walk of the dominator tree so that ``dominates`` is two comparisons. A value is defined where
its instruction stands, or at the top of its block for a block argument; a use in a
terminator (including the arguments it passes to a target) is at the block's end.

Liveness is the classic backward data-flow problem over blocks (live-in = upward-exposed
uses ∪ (live-out − definitions); live-out = the live-in of each successor less its
parameters), solved with a work list; `Liveness.points` then walks each block backwards to
give the values live at every instruction. Everything is iterative: functions may hold tens
of thousands of instructions.
"""

from __future__ import annotations

from collections.abc import Iterator

from kiln.ssa.ir import Block, BlockArg, Function, Instr, Value


def predecessors(fn: Function) -> dict[Block, list[Block]]:
    """Each block's predecessors (a block branching twice to one target counts once)."""
    preds: dict[Block, list[Block]] = {b: [] for b in fn.blocks}
    for b in fn.blocks:
        for s in dict.fromkeys(b.successors):
            if s in preds:
                preds[s].append(b)
    return preds


def reverse_post_order(fn: Function) -> list[Block]:
    """The blocks reachable from the entry, in reverse post-order of a depth-first walk."""
    order: list[Block] = []
    seen = {fn.entry}
    stack: list[tuple[Block, Iterator[Block]]] = [(fn.entry, iter(fn.entry.successors))]
    while stack:
        block, succs = stack[-1]
        for s in succs:
            if s not in seen:
                seen.add(s)
                stack.append((s, iter(s.successors)))
                break
        else:
            stack.pop()
            order.append(block)
    order.reverse()
    return order


class DominatorTree:
    """Immediate dominators of the blocks reachable from the entry."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.rpo = reverse_post_order(fn)
        index = {b: i for i, b in enumerate(self.rpo)}
        preds = predecessors(fn)
        entry = fn.entry
        idom: dict[Block, Block] = {entry: entry}

        def intersect(a: Block, b: Block) -> Block:
            while a is not b:
                while index[a] > index[b]:
                    a = idom[a]
                while index[b] > index[a]:
                    b = idom[b]
            return a

        changed = True
        while changed:
            changed = False
            for b in self.rpo[1:]:
                done = [p for p in preds[b] if p in idom]
                new = done[0]
                for p in done[1:]:
                    new = intersect(p, new)
                if idom.get(b) is not new:
                    idom[b] = new
                    changed = True
        self.idom: dict[Block, Block | None] = {b: (None if b is entry else d)
                                                for b, d in idom.items()}
        self.children: dict[Block, list[Block]] = {b: [] for b in self.rpo}
        for b in self.rpo:
            d = self.idom[b]
            if d is not None:
                self.children[d].append(b)
        # Entry and exit times of a depth-first walk of the tree: a dominates b exactly when
        # a's interval holds b's.
        self._pre: dict[Block, int] = {}
        self._post: dict[Block, int] = {}
        clock = 0
        stack: list[tuple[Block, bool]] = [(entry, False)]
        while stack:
            b, leaving = stack.pop()
            if leaving:
                self._post[b] = clock
                clock += 1
                continue
            self._pre[b] = clock
            clock += 1
            stack.append((b, True))
            stack.extend((c, False) for c in reversed(self.children[b]))

    def reachable(self, b: Block) -> bool:
        return b in self._pre

    def dominates(self, a: Block, b: Block) -> bool:
        """Whether every path from the entry to ``b`` passes through ``a`` (reflexive)."""
        if a not in self._pre or b not in self._pre:
            return False
        return self._pre[a] <= self._pre[b] and self._post[b] <= self._post[a]

    def strictly_dominates(self, a: Block, b: Block) -> bool:
        return a is not b and self.dominates(a, b)

    def frontier(self) -> dict[Block, set[Block]]:
        """Dominance frontiers (Cytron et al.): where a block's dominance ends."""
        preds = predecessors(self.fn)
        df: dict[Block, set[Block]] = {b: set() for b in self.rpo}
        for b in self.rpo:
            ps = [p for p in preds[b] if self.reachable(p)]
            if len(ps) < 2:
                continue
            for p in ps:
                runner: Block | None = p
                while runner is not None and runner is not self.idom[b]:
                    df[runner].add(b)
                    runner = self.idom[runner]
        return df


def positions(fn: Function) -> dict[Value, tuple[Block, int]]:
    """Where each value is defined: its block, and its index there (-1 for block arguments)."""
    where: dict[Value, tuple[Block, int]] = {}
    for b in fn.blocks:
        for p in b.params:
            where[p] = (b, -1)
        for i, ins in enumerate(b.instrs):
            where[ins] = (b, i)
    return where


def block_uses(b: Block) -> Iterator[tuple[int, Value]]:
    """Every use in a block with its position (len(instrs) for the terminator)."""
    for i, ins in enumerate(b.instrs):
        for v in ins.operands:
            yield i, v
    if b.terminator is not None:
        for v in b.terminator.uses():
            yield len(b.instrs), v


class Liveness:
    """Which values are live into and out of each block, and at each instruction."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        ue: dict[Block, set[Value]] = {}
        defs: dict[Block, set[Value]] = {}
        for b in fn.blocks:
            defined: set[Value] = set(b.params)
            exposed: set[Value] = set()
            for ins in b.instrs:
                exposed.update(v for v in ins.operands if v not in defined)
                defined.add(ins)
            if b.terminator is not None:
                exposed.update(v for v in b.terminator.uses() if v not in defined)
            ue[b], defs[b] = exposed, defined
        self.live_in: dict[Block, set[Value]] = {b: set(ue[b]) for b in fn.blocks}
        self.live_out: dict[Block, set[Value]] = {b: set() for b in fn.blocks}
        preds = predecessors(fn)
        work = list(reversed(reverse_post_order(fn)))  # post-order: successors first
        work += [b for b in fn.blocks if b not in set(work)]
        queued = set(work)
        while work:
            b = work.pop(0)
            queued.discard(b)
            out: set[Value] = set()
            for s in b.successors:
                params = set(s.params)
                out.update(v for v in self.live_in[s] if v not in params)
            self.live_out[b] = out
            new_in = ue[b] | (out - defs[b])
            if new_in != self.live_in[b]:
                self.live_in[b] = new_in
                for p in preds[b]:
                    if p not in queued:
                        queued.add(p)
                        work.append(p)

    def points(self, b: Block) -> Iterator[tuple[int, set[Value]]]:
        """For each instruction of ``b`` (and its terminator, at ``len(b.instrs)``), the
        values live there: defined at or before it and used at or after it, and the value it
        defines. Yielded from the end of the block backwards; each set is a fresh copy."""
        live = set(self.live_out[b])
        if b.terminator is not None:
            live.update(b.terminator.uses())
            yield len(b.instrs), set(live)
        for i in range(len(b.instrs) - 1, -1, -1):
            ins = b.instrs[i]
            live.add(ins)
            live.update(ins.operands)
            yield i, set(live)
            live.discard(ins)
        # Block arguments are live together at the block's top.

    def live_across(self, value: Value) -> bool:
        """Whether ``value`` is live out of the block that defines it."""
        block = value.block if isinstance(value, (Instr, BlockArg)) else None
        return block is not None and value in self.live_out[block]
