"""Traversal and rewriting of expressions without Python recursion.

Programs in A-normal form are let chains thousands deep, so nothing here recurses over the
IR. Two tools cover most needs:

- `post_order` lists the nodes of a DAG children-first (a ``gate`` says where not to descend),
  and `rewrite` rebuilds it bottom-up;
- `trampoline` runs code written as recursive *generators* on an explicit stack: a visitor
  says ``value = yield self.visit(child)`` where it would have called itself.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from kiln.errors import Error, InternalError
from kiln.ir.adt import Constructor, PatternVar, pattern_children
from kiln.ir.expr import (
    Call,
    Clause,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)

Visit = Generator[Any, Any, Any]


def trampoline(gen: Visit) -> Any:
    """Run a generator that yields sub-generators, as if each ``yield`` were a recursive call.

    The value of ``yield g`` inside a generator is the return value of ``g``; an exception
    raised in ``g`` is thrown into its caller at that ``yield``.
    """
    stack: list[Visit] = [gen]
    value: Any = None
    error: BaseException | None = None
    while True:
        top = stack[-1]
        try:
            child = top.throw(error) if error is not None else top.send(value)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            value, error = stop.value, None
        except BaseException as exc:  # noqa: BLE001 - delivered to the caller's yield
            stack.pop()
            if not stack:
                raise
            value, error = None, exc
        else:
            stack.append(child)
            value, error = None, None


_LEAVES = (Var, GlobalVar, Constant, Op, Constructor)


def children(e: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of ``e`` in evaluation order (binders and patterns excluded)."""
    match e:
        case Var() | GlobalVar() | Constant() | Op() | Constructor():
            return ()
        case Call(op=op, args=args):
            return (op, *args)
        case Tuple(fields=fields):
            return fields
        case TupleGetItem(tuple_value=t):
            return (t,)
        case Let(value=value, body=body):
            return (value, body)
        case Function(body=body):
            return (body,)
        case If(cond=c, true_branch=t, false_branch=f):
            return (c, t, f)
        case Match(data=data, clauses=clauses):
            return (data, *(c.rhs for c in clauses))
        case RefCreate(value=v):
            return (v,)
        case RefRead(ref=r):
            return (r,)
        case RefWrite(ref=r, value=v):
            return (r, v)
    raise InternalError(f"unknown expression node {type(e).__name__}")


def with_children(e: Expr, kids: tuple[Expr, ...] | list[Expr]) -> Expr:
    """``e`` rebuilt over new children (``e`` itself when none changed); drops its type."""
    old = children(e)
    if len(old) == len(kids) and all(a is b for a, b in zip(old, kids)):
        return e
    span = e.span
    match e:
        case Call():
            return Call(kids[0], tuple(kids[1:]), e.attrs, span=span)
        case Tuple():
            return Tuple(tuple(kids), span=span)
        case TupleGetItem():
            return TupleGetItem(kids[0], e.index, span=span)
        case Let():
            return Let(e.var, kids[0], kids[1], span=span)
        case Function():
            return Function(e.params, kids[0], e.ret_type, e.type_params, e.attrs, span=span)
        case If():
            return If(kids[0], kids[1], kids[2], span=span)
        case Match():
            clauses = tuple(
                Clause(c.lhs, rhs, span=c.span) for c, rhs in zip(e.clauses, kids[1:])
            )
            return Match(kids[0], clauses, e.complete, span=span)
        case RefCreate():
            return RefCreate(kids[0], span=span)
        case RefRead():
            return RefRead(kids[0], span=span)
        case RefWrite():
            return RefWrite(kids[0], kids[1], span=span)
    raise InternalError(f"cannot rebuild expression node {type(e).__name__}")


def post_order(
    root: Expr,
    gate: Callable[[Expr], bool] | None = None,
    kids: Callable[[Expr], Sequence[Expr]] = children,
) -> list[Expr]:
    """Every distinct node reachable from ``root`` (by identity), children before parents.

    The one post-order walk of kiln, on an explicit stack. ``gate(node)`` False means "do not
    descend": the node itself is still listed, at its place in the order, but nothing below
    it is reached through it (a fused kernel, a nested function). ``kids`` gives a node's
    children, `children` unless the walk follows other edges (dataflow edges, live bindings).
    """
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if gate is not None and not gate(node):
            continue
        for kid in reversed(kids(node)):
            if id(kid) not in seen:
                if not isinstance(kid, Expr):
                    raise _not_an_expression(node, kid)
                stack.append((kid, False))
    return order


def _not_an_expression(parent: Any, value: Any) -> Error:
    """The error for a field of ``parent`` that holds ``value``, which is not an expression
    (a program built in Python with None, a number or an array where an Expr belongs)."""
    hint = " (wrap a value with kiln.const)" if value is not None else ""
    return Error(f"a {type(parent).__name__} holds a {type(value).__name__} where an expression "
                 f"belongs{hint}")


def rewrite(root: Expr, rule: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``root`` bottom-up; ``rule`` sees each rebuilt node and may replace it."""
    done: dict[int, Expr] = {}
    for node in post_order(root):
        rebuilt = with_children(node, [done[id(k)] for k in children(node)])
        replaced = rule(rebuilt)
        done[id(node)] = rebuilt if replaced is None else replaced
    return done[id(root)]


def bound_vars(root: Expr) -> list[Var]:
    """Variables bound inside ``root`` (let, function parameters, patterns), first seen first."""
    out: list[Var] = []
    for node in post_order(root):
        if isinstance(node, Let):
            out.append(node.var)
        elif isinstance(node, Function):
            out.extend(node.params)
        elif isinstance(node, Match):
            for clause in node.clauses:
                stack = [clause.lhs]
                while stack:
                    p = stack.pop()
                    if isinstance(p, PatternVar):
                        out.append(p.var)
                    stack.extend(pattern_children(p))
    return _unique(out)


def free_vars(root: Expr) -> list[Var]:
    """Variables used in ``root`` but not bound inside it, in order of first use."""
    bound = {id(v) for v in bound_vars(root)}
    used = [n for n in post_order(root) if isinstance(n, Var)]
    return [v for v in _unique(used) if id(v) not in bound]


def _unique(vs: Iterable[Var]) -> list[Var]:
    seen: set[int] = set()
    out = []
    for v in vs:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out
