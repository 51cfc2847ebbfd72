"""The cleanup after partial evaluation: dead bindings and references nobody reads.

The partial evaluator emits every value it might need and keeps every reference operation;
this removes what the residual program does not use:

- a binding whose variable is unused and whose value has no effect (operators, tuples,
  projections, constructors, functions, ``ref``, ``ref_read``, and ``if``/``match`` made of
  such) — a function that only calls itself counts as unused;
- a reference that is only ever written: when every use of ``%r`` (bound to ``ref(...)``)
  is as the target of a ``ref_write``, no one can observe its contents, so the writes go;
- ``let %v = e; %v`` becomes ``e``.

The residual program is a tree (only atoms are shared), so uses are counted with
multiplicity; bindings are visited last to first, so removing one frees those before it.
"""

from __future__ import annotations

from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
    Expr,
    Function,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefWrite,
    Tuple,
    Var,
)
from kiln.ir.traverse import Visit, children, free_vars, trampoline, with_children

# Only these hold bindings; residual code has atoms everywhere else.
_SCOPES = (Let, If, Match, Function)


def cleanup(fn: Function) -> Function:
    """``fn`` without dead bindings and write-only references."""
    body = fn.body
    for _ in range(3):  # a dead read removed can leave a reference that is only written
        uses, write_only = _census(body)
        new = trampoline(_Cleaner(uses, write_only).clean(body))
        if new is body:
            break
        body = new
    if body is fn.body:
        return fn
    return Function(fn.params, body, fn.ret_type, fn.type_params, fn.attrs, span=fn.span)


def _census(root: Expr) -> tuple[dict[Var, int], set[Var]]:
    """Uses of each variable, and the references (by variable) that are only written."""
    uses: dict[Var, int] = {}
    writes: dict[Var, int] = {}
    refs: list[Var] = []
    stack = [root]
    while stack:
        e = stack.pop()
        if isinstance(e, Var):
            uses[e] = uses.get(e, 0) + 1
            continue
        if isinstance(e, Let) and isinstance(e.value, RefCreate):
            refs.append(e.var)
        elif isinstance(e, RefWrite) and isinstance(e.ref, Var):
            writes[e.ref] = writes.get(e.ref, 0) + 1
        stack.extend(children(e))
    return uses, {r for r in refs if uses.get(r, 0) == writes.get(r, 0)}


class _Cleaner:
    def __init__(self, uses: dict[Var, int], write_only: set[Var]) -> None:
        self.uses = uses
        self.write_only = write_only

    def unused(self, v: Var, value: Expr) -> bool:
        n = self.uses.get(v, 0)
        if n and isinstance(value, Function):
            n -= _count(value, v)  # a function that only calls itself is still unused
        return n == 0

    def drop(self, e: Expr) -> None:
        """``e`` is removed: its variables lose a use each."""
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, Var):
                self.uses[x] -= 1
            else:
                stack.extend(children(x))

    def is_pure(self, e: Expr) -> bool:
        """No effect anywhere in ``e`` (calls of unknown functions and writes are effects)."""
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, Function):
                continue  # making a closure does nothing; calling it is judged elsewhere
            if isinstance(x, Call) and not isinstance(x.op, (Op, Constructor)):
                return False
            if isinstance(x, RefWrite) and x.ref not in self.write_only:
                return False
            if isinstance(x, Match) and not x.complete:
                return False  # a match? may fail
            stack.extend(children(x))
        return True

    def clean(self, e: Expr) -> Visit:
        if not isinstance(e, Let):
            kids = children(e)
            if not kids:
                return e
            new = []
            for k in kids:
                new.append((yield self.clean(k)) if isinstance(k, _SCOPES) else k)
            return with_children(e, new)
        chain: list[Let] = []
        body: Expr = e
        while isinstance(body, Let):
            chain.append(body)
            body = body.body
        result = yield self.clean(body)
        kept: list[tuple[Var, Expr]] = []
        for node in reversed(chain):
            v, value = node.var, node.value
            if isinstance(value, RefWrite) and value.ref in self.write_only:
                self.drop(value)
                if self.uses.get(v, 0):
                    kept.append((v, Tuple(())))
                continue
            if self.unused(v, value) and self.is_pure(value):
                self.drop(value)
                continue
            if isinstance(value, _SCOPES):
                value = yield self.clean(value)
            kept.append((v, value))
        if kept and _is_result(kept[0], result, self.uses):
            result = kept.pop(0)[1]
        for v, value in kept:
            result = Let(v, value, result)
        return result


def _is_result(binding: tuple[Var, Expr], result: Expr, uses: dict[Var, int]) -> bool:
    """Whether ``let %v = e; result`` is just ``e``: ``result`` is ``%v`` used only there, or
    ``()`` after a write (which evaluates to ``()``)."""
    v, value = binding
    if isinstance(value, RefWrite) and isinstance(result, Tuple) and not result.fields:
        return uses.get(v, 0) == 0
    if result is not v or uses.get(v, 0) != 1:
        return False
    return not (isinstance(value, Function) and v in free_vars(value))


def _count(e: Expr, v: Var) -> int:
    n = 0
    stack = [e]
    while stack:
        x = stack.pop()
        if x is v:
            n += 1
        elif not isinstance(x, Var):
            stack.extend(children(x))
    return n
