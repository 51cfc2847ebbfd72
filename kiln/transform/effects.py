"""Effects: what evaluating an expression may do besides computing its value.

Relay's only side effects are those of references. ``ref(v)`` allocates a cell, ``ref_read``
observes one, ``ref_write`` changes one; a call has the effects of the function it calls.
Passes ask three questions, answered by three flags:

- ``ALLOC``: makes a new reference cell. Two evaluations make two distinct cells, so such an
  expression is never merged with another or duplicated, but may be dropped when unused.
- ``READ``: reads a cell. Its value depends on when it runs: it never moves across a write,
  but may be dropped when unused.
- ``WRITE``: changes a cell, or calls a function whose effects are unknown (a parameter, a
  closure taken out of a data structure). Never removed, duplicated, merged or reordered.

An expression without flags is *pure*: it may be removed when unused, merged with an equal
one, or moved. Purity here is about references only. As in TVM (and GHC), failure (integer
division by zero, an unmatched ``match?``) and non-termination are not effects that passes
preserve: an unused pure computation may be removed even if it would have failed.

The analysis is interprocedural: a global function, or a let-bound local function, has the
effects of the references its body touches and of the functions its body calls (a fixpoint
over the call graph, computed in linear time). Operators have no effects (none of kiln's
operators touches a reference; an operator registered with ``effectful=True`` would count
as a write).
"""

from __future__ import annotations

import enum

from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
    Expr,
    Function,
    GlobalVar,
    Let,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order
from kiln.op import registry


class Effect(enum.IntFlag):
    """What an evaluation may do to references (no flag: pure)."""

    NONE = 0
    ALLOC = 1
    READ = 2
    WRITE = 4


REMOVABLE = Effect.ALLOC | Effect.READ  # an unused value with only these effects may be dropped

_OWN_EFFECT = {RefCreate: Effect.ALLOC, RefRead: Effect.READ, RefWrite: Effect.WRITE}


def op_effect(name: str) -> Effect:
    """The effect of calling an operator: none, unless it is registered as effectful."""
    opdef = registry.lookup(name)
    return Effect.WRITE if opdef is None or getattr(opdef, "effectful", False) else Effect.NONE


class EffectAnalysis:
    """The effects of the functions of one module, and of the expressions in them."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        # A callable is a global (by name) or a function literal (by id of the Function).
        self.local_fns: dict[Var, Function] = {}  # let-bound function literals
        own: dict[object, Effect] = {}
        calls: dict[object, set[object]] = {}
        var_calls: list[tuple[object, Var]] = []
        for gv, fn in mod.functions.items():
            self._scan(gv.name, fn, own, calls, var_calls)
        for owner, v in var_calls:
            target = self.local_fns.get(v)
            if target is None:
                own[owner] |= Effect.WRITE  # calling an unknown function value
            else:
                calls[owner].add(id(target))
        self.callable_effect = _propagate(own, calls)
        self._cache: dict[int, dict[int, Effect]] = {}

    def _scan(self, name: str, fn: Function, own: dict, calls: dict, var_calls: list) -> None:
        """Record the direct effects and direct callees of ``fn`` and of the functions in it."""
        own[name] = Effect.NONE
        calls[name] = set()
        stack: list[tuple[Expr, object]] = [(fn.body, name)]
        seen: set[tuple[int, object]] = set()
        while stack:
            e, owner = stack.pop()
            if (id(e), owner) in seen:
                continue
            seen.add((id(e), owner))
            if isinstance(e, Function):
                key = id(e)
                if key not in own:
                    own[key] = Effect.NONE
                    calls[key] = set()
                stack.append((e.body, key))
                continue
            if isinstance(e, Let) and isinstance(e.value, Function):
                self.local_fns[e.var] = e.value
            kind = _OWN_EFFECT.get(type(e))
            if kind is not None:
                own[owner] |= kind
            elif isinstance(e, Call):
                self._scan_call(e, owner, own, calls, var_calls)
            stack.extend((k, owner) for k in children(e))

    def _scan_call(self, e: Call, owner: object, own: dict, calls: dict, var_calls: list) -> None:
        match e.op:
            case Op(name=op_name):
                own[owner] |= op_effect(op_name)
            case Constructor():
                pass
            case GlobalVar(name=callee):
                if callee in self.mod:
                    calls[owner].add(callee)
                else:
                    own[owner] |= Effect.WRITE
            case Function():
                calls[owner].add(id(e.op))
            case Var():
                var_calls.append((owner, e.op))
            case _:
                own[owner] |= Effect.WRITE  # a computed function value: unknown

    # --- queries ------------------------------------------------------------------------------

    def call_effect(self, call: Call) -> Effect:
        """The effects of the step that calls ``call.op`` (its arguments not included)."""
        match call.op:
            case Op(name=op_name):
                return op_effect(op_name)
            case Constructor():
                return Effect.NONE
            case GlobalVar(name=name):
                return self.callable_effect.get(name, Effect.WRITE)
            case Function():
                return self.callable_effect.get(id(call.op), Effect.WRITE)
            case Var():
                fn = self.local_fns.get(call.op)
                if fn is not None:
                    return self.callable_effect.get(id(fn), Effect.WRITE)
        return Effect.WRITE

    def own_effect(self, e: Expr) -> Effect:
        """The effects of ``e``'s own step, not counting its sub-expressions."""
        kind = _OWN_EFFECT.get(type(e))
        if kind is not None:
            return kind
        if isinstance(e, Call):
            return self.call_effect(e)
        return Effect.NONE

    def effects(self, root: Expr) -> dict[int, Effect]:
        """For every node under ``root`` (by id), the effects of evaluating it.

        Creating a closure has no effect: a Function's effects are those of calling it.
        """
        cached = self._cache.get(id(root))
        if cached is not None:
            return cached
        out: dict[int, Effect] = {}
        for node in post_order(root):
            if isinstance(node, Function):
                out[id(node)] = Effect.NONE
                continue
            eff = self.own_effect(node)
            for kid in children(node):
                eff |= out[id(kid)]
            out[id(node)] = eff
        self._cache[id(root)] = out
        return out


def _propagate(own: dict[object, Effect], calls: dict[object, set[object]]) -> dict[object, Effect]:
    """Each callable's effects: its own and those of everything it calls (least fixpoint)."""
    callers: dict[object, list[object]] = {c: [] for c in own}
    for caller, callees in calls.items():
        for callee in callees:
            callers.setdefault(callee, []).append(caller)
    eff = dict(own)
    work = [c for c in own if own[c]]
    while work:
        c = work.pop()
        for caller in callers.get(c, ()):
            new = eff[caller] | eff[c]
            if new != eff[caller]:
                eff[caller] = new
                work.append(caller)
    return eff
