"""Lowering ``match`` to SSA: constructor patterns become switches on the value's tag.

When every clause is a distinct constructor whose fields are variables or wildcards (perhaps
followed by one catch-all clause) the match is one `switch`, each case binding the fields
with `adt_field`. Otherwise clauses are tried in order: each pattern is tested where control
is — a one-case `switch` per constructor (skipped for an ADT with one constructor), fields
taken apart as they are reached — and failing goes on to the next clause. A match that can
fall off the last clause ends in `fail`, which the VM raises as `kiln.EvalError`.

`MatchLowering` is a part of the function lowering in from_relay.py, kept apart because
pattern compilation is its own idea.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import InternalError
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
)
from kiln.ir.expr import Clause, Expr, Match, Var
from kiln.ir.traverse import Visit
from kiln.ir.ty import Type, TypeCall, substitute
from kiln.ssa.ir import Block, Value


def where(e: Expr) -> str:
    return f"{e.span}: " if e.span is not None else ""


class MatchLowering:
    """The pattern-matching methods of `_FunctionLowering` (kiln/ssa/from_relay.py)."""

    # Provided by the function lowering.
    b: Any
    fn: Any
    ctx: Any
    env: dict[Var, Any]

    def value(self, e: Expr) -> Visit:
        """Lower ``e`` (the function lowering's)."""
        raise NotImplementedError

    def plain(self, v: Any, e: Expr) -> Value:
        """The SSA value of a lowered ``e`` (the function lowering's)."""
        raise NotImplementedError

    def arm(self, block: Block, e: Expr, tail: bool, join: Block | None) -> Visit:
        """Lower one arm of a branch (the function lowering's)."""
        raise NotImplementedError

    def join(self, e: Expr, tail: bool, hint: str) -> Block | None:
        """The block where a branch's arms meet (the function lowering's)."""
        raise NotImplementedError

    def match(self, e: Match, tail: bool) -> Visit:
        data = self.plain((yield self.value(e.data)), e.data)
        join = self.join(e, tail, "endmatch")
        kind = "match" if e.complete else "match?"
        message = f"{where(e)}no clause of this {kind} matches the value"
        flat = self.flat_switch(e)
        if flat is not None:
            ctors, default_clause = flat
            blocks = [self.fn.add_block(f"case_{p.constructor.name}") for _, p in ctors]
            default = None
            all_ctors = self.ctx.mod.type_data(ctors[0][1].constructor.belong_to).constructors
            if default_clause is not None:
                default = self.fn.add_block("default")
            elif len(ctors) < len(all_ctors):
                default = self.fn.add_block("nomatch")
            cases = [(p.constructor.name, blk) for (_, p), blk in zip(ctors, blocks)]
            self.b.switch(data, cases, default)
            for (clause, _), blk in zip(ctors, blocks):
                self.b.position(blk)
                self.env.update(self.bind(clause.lhs, data))
                yield from self.arm(blk, clause.rhs, tail, join)
            if default is not None:
                if default_clause is not None:
                    self.b.position(default)
                    self.env.update(self.bind(default_clause.lhs, data))
                    yield from self.arm(default, default_clause.rhs, tail, join)
                else:
                    self.b.position(default)
                    self.b.fail(message)
        else:
            fail: Block | None = None
            for i, clause in enumerate(e.clauses):
                last = i == len(e.clauses) - 1
                nxt = None
                if refutable(clause.lhs):
                    if last:
                        fail = fail or self.fn.add_block("nomatch")
                        nxt = fail
                    else:
                        nxt = self.fn.add_block(f"clause{i + 1}")
                binds = self.tests(clause.lhs, data, nxt)
                self.env.update(binds)
                yield from self.arm(self.b.block, clause.rhs, tail, join)
                if nxt is None:
                    break  # an irrefutable clause: the rest can never match
                if nxt is not fail:
                    self.b.position(nxt)
            if fail is not None:
                self.b.position(fail)
                self.b.fail(message)
        if join is None:
            return None
        self.b.position(join)
        return join.params[0]

    def flat_switch(
        self, e: Match
    ) -> tuple[list[tuple[Clause, PatternConstructor]], Clause | None] | None:
        """The clauses as one switch — distinct constructors with variable or wildcard fields
        (each with its pattern), then optionally one irrefutable clause — or None."""
        ctors: list[tuple[Clause, PatternConstructor]] = []
        default: Clause | None = None
        seen: set[str] = set()
        for i, clause in enumerate(e.clauses):
            p = clause.lhs
            if isinstance(p, PatternConstructor):
                if p.constructor.name in seen or default is not None:
                    return None
                if any(not isinstance(q, (PatternVar, PatternWildcard)) for q in p.patterns):
                    return None
                seen.add(p.constructor.name)
                ctors.append((clause, p))
            elif isinstance(p, (PatternVar, PatternWildcard)) and ctors:
                default = clause
                if i != len(e.clauses) - 1:
                    return None
            else:
                return None
        return (ctors, default) if ctors else None

    def field_type(self, value: Value, ctor: Constructor, index: int,
                   fallback: Type | None) -> Type:
        t = value.type
        raw = ctor.inputs[index]
        if isinstance(t, TypeCall):
            td = self.ctx.mod.type_data(ctor.belong_to)
            return substitute(raw, dict(zip(td.type_vars, t.args)))
        return fallback if fallback is not None else raw

    def bind(self, p: Pattern, value: Value) -> dict[Var, Value]:
        """The variables of a flat constructor pattern (or a variable/wildcard), bound."""
        out: dict[Var, Value] = {}
        if isinstance(p, PatternVar):
            out[p.var] = value
        elif isinstance(p, PatternConstructor):
            for i, q in enumerate(p.patterns):
                if isinstance(q, PatternVar):
                    ft = self.field_type(value, p.constructor, i, q.var.checked_type_)
                    out[q.var] = self.b.emit("adt_field", [value], ft, ctor=p.constructor.name,
                                             index=i)
        return out

    def tests(self, pattern: Pattern, value: Value, on_fail: Block | None) -> dict[Var, Value]:
        """Test ``value`` against ``pattern`` where control is, going to ``on_fail`` when it
        does not match; control continues where it matched. The bindings made."""
        binds: dict[Var, Value] = {}
        stack: list[tuple[Pattern, Value]] = [(pattern, value)]
        b = self.b
        while stack:
            p, v = stack.pop()
            if isinstance(p, PatternWildcard):
                continue
            if isinstance(p, PatternVar):
                binds[p.var] = v
            elif isinstance(p, PatternTuple):
                fields = [b.get_field(v, i) for i in range(len(p.patterns))]
                stack.extend(reversed(list(zip(p.patterns, fields))))
            elif isinstance(p, PatternConstructor):
                ctor = p.constructor
                siblings = self.ctx.mod.type_data(ctor.belong_to).constructors
                if len(siblings) > 1:
                    if on_fail is None:
                        raise InternalError("a refutable pattern has nowhere to go on failure")
                    ok = self.fn.add_block(f"is_{ctor.name}")
                    b.switch(v, [(ctor.name, ok)], on_fail)
                    b.position(ok)
                subs = []
                for i, q in enumerate(p.patterns):
                    if isinstance(q, PatternWildcard):
                        continue
                    fallback = q.var.checked_type_ if isinstance(q, PatternVar) else None
                    ft = self.field_type(v, ctor, i, fallback)
                    subs.append((q, b.emit("adt_field", [v], ft, ctor=ctor.name, index=i)))
                stack.extend(reversed(subs))
        return binds


def refutable(p: Pattern) -> bool:
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, PatternConstructor):
            return True  # even a one-constructor ADT: tests() skips the switch then
        if isinstance(q, PatternTuple):
            stack.extend(q.patterns)
    return False
