"""inline: replace calls of small helper functions by their bodies.

A global function marked ``Inline=1`` (TVM's attribute; ``inline=1`` is accepted too) is
inlined at every call: ``@f(a, b)`` becomes ``let %p = a; let %q = b; <body of @f>``, the
body copied with fresh variables. Binding the arguments with lets keeps the program's
evaluation order (arguments first, once each, then the body); atomic arguments (variables,
constants, globals, constructors) are substituted directly. Type annotations that mention
the inlined function's type parameters are dropped (inference finds the instances).

Optionally, with ``PassContext(config={"inline.max_size": n})``, every other global that is
not recursive, not ``@main`` and not a fused kernel, and whose body has at most ``n`` nodes,
is inlined too (it is kept in the module).

Recursive functions (on a cycle of the call graph) are never inlined; marking one
``Inline=1`` is an error. A global marked for inlining that is no longer referenced after
inlining is removed, as TVM did; one still used as a value (``@map(@f, %xs)``) stays, and
``@main`` always stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kiln.errors import Error
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    pattern_children,
)
from kiln.ir.expr import (
    Call,
    Clause,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Let,
    Match,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import bound_vars, children, post_order, rewrite, with_children
from kiln.ir.ty import Type, TypeVar, type_children
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass

ATOMIC_ARGS = (Var, GlobalVar, Constant, Constructor)


def marked_inline(fn: Function) -> bool:
    return bool(fn.attrs.get("Inline", 0) or fn.attrs.get("inline", 0))


def _mentions(ty: Type | None, tvars: frozenset[TypeVar]) -> bool:
    stack = [ty] if ty is not None else []
    while stack:
        t = stack.pop()
        if isinstance(t, TypeVar) and t in tvars:
            return True
        stack.extend(type_children(t))
    return False


def _map_pattern(p: Pattern, new_var: dict[Var, Var]) -> Pattern:
    """``p`` with its variables renamed (an explicit stack: patterns can nest deeply too)."""
    done: dict[int, Pattern] = {}
    stack: list[tuple[Pattern, bool]] = [(p, False)]
    while stack:
        q, ready = stack.pop()
        kids = pattern_children(q)
        if not ready and kids:
            stack.append((q, True))
            stack.extend((k, False) for k in kids)
            continue
        match q:
            case PatternVar():
                done[id(q)] = PatternVar(new_var[q.var], span=q.span)
            case PatternConstructor():
                done[id(q)] = PatternConstructor(
                    q.constructor, tuple(done[id(k)] for k in kids), span=q.span)
            case PatternTuple():
                done[id(q)] = PatternTuple(tuple(done[id(k)] for k in kids), span=q.span)
            case _:
                done[id(q)] = q
    return done[id(p)]


def fresh_copy(
    e: Expr,
    subst: dict[Var, Expr],
    tvars: frozenset[TypeVar] = frozenset(),
    retype: Callable[[Type | None], Type | None] | None = None,
) -> Expr:
    """A copy of ``e`` with fresh bound variables and free variables replaced per ``subst``.

    Annotations mentioning the type variables ``tvars`` are dropped; ``retype``, when given,
    rewrites every annotation instead.
    """
    if retype is None:
        def retype(t: Type | None) -> Type | None:
            return None if _mentions(t, tvars) else t

    new_var: dict[Var, Var] = {}
    for v in bound_vars(e):
        new_var[v] = Var(v.name_hint, retype(v.type_annotation), span=v.span)
    done: dict[int, Expr] = {}
    for node in post_order(e):
        if isinstance(node, Var):
            done[id(node)] = new_var[node] if node in new_var else subst.get(node, node)
            continue
        kids = [done[id(k)] for k in children(node)]
        match node:
            case Let():
                out: Expr = Let(new_var[node.var], kids[0], kids[1], span=node.span)
            case Function():
                params = tuple(new_var[p] for p in node.params)
                out = Function(params, kids[0], retype(node.ret_type), node.type_params,
                               node.attrs, span=node.span)
            case Match():
                clauses = tuple(Clause(_map_pattern(c.lhs, new_var), rhs, span=c.span)
                                for c, rhs in zip(node.clauses, kids[1:]))
                out = Match(kids[0], clauses, node.complete, span=node.span)
            case _:
                out = with_children(node, kids)
                if out is node and kids:
                    # A fresh node even where nothing changed: inference types nodes by
                    # identity, and two copies may be used at different types (``Nil``).
                    out = dataclasses.replace(node, checked_type_=None)
        done[id(node)] = out
    return done[id(e)]


def beta_reduce(fn: Function, args: tuple[Expr, ...]) -> Expr:
    """The body of ``fn`` applied to ``args``: arguments bound by lets, in order."""
    tvars = frozenset(fn.type_params)
    subst: dict[Var, Expr] = {}
    lets: list[tuple[Var, Expr]] = []
    for p, a in zip(fn.params, args):
        if isinstance(a, ATOMIC_ARGS):
            subst[p] = a
        else:
            ann = None if _mentions(p.type_annotation, tvars) else p.type_annotation
            fresh = Var(p.name_hint, ann, span=p.span)
            subst[p] = fresh
            lets.append((fresh, a))
    body = fresh_copy(fn.body, subst, tvars)
    for v, a in reversed(lets):
        body = Let(v, a, body)
    return body


# --- the call graph -----------------------------------------------------------------------------


def global_refs(fn: Function) -> set[str]:
    """The names of the globals ``fn`` mentions (called or used as values)."""
    return {n.name for n in post_order(fn) if isinstance(n, GlobalVar)}


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, callees before callers (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    out.append(comp)
    return out


def recursive_globals(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each global on a cycle, with the cycle's members (for messages)."""
    out: dict[str, list[str]] = {}
    for comp in sccs(graph):
        if len(comp) > 1 or comp[0] in graph[comp[0]]:
            for g in comp:
                out[g] = sorted(comp)
    return out


# --- the pass -----------------------------------------------------------------------------------


@module_pass("inline", opt_level=1)
def Inline(mod: IRModule, ctx: PassContext) -> IRModule:
    """Inline calls of global functions marked Inline=1 (and, optionally, small ones)."""
    funcs = {gv.name: fn for gv, fn in mod.functions.items()}
    graph = {name: global_refs(fn) for name, fn in funcs.items()}
    recursive = recursive_globals(graph)
    marked = {name for name, fn in funcs.items() if marked_inline(fn)}
    for name in sorted(marked & recursive.keys()):
        cycle = " -> ".join("@" + g for g in recursive[name])
        raise Error(f"@{name} is marked Inline=1 but is recursive ({cycle}); a recursive "
                    "function cannot be inlined: remove the attribute")
    max_size = int(ctx.config.get("inline.max_size", 0))
    chosen = set(marked)
    if max_size > 0:
        for name, fn in funcs.items():
            if (name != "main" and name not in recursive and not is_primitive(fn)
                    and len(post_order(fn.body)) <= max_size):
                chosen.add(name)
    chosen = {n for n in chosen if not is_primitive(funcs[n])}
    if not chosen:
        return mod

    def inline_calls(fn: Function, expanded: dict[str, Function]) -> Function:
        def rule(e: Expr) -> Expr | None:
            if isinstance(e, Call) and isinstance(e.op, GlobalVar) and e.op.name in expanded:
                callee = expanded[e.op.name]
                if len(e.args) != len(callee.params):
                    raise Error(f"@{e.op.name} takes {len(callee.params)} argument(s) but is "
                                f"called with {len(e.args)}", e.span)
                return beta_reduce(callee, e.args)
            return None

        new = rewrite(fn, rule)
        assert isinstance(new, Function)
        return new

    # Inline into the inlined functions first (callees before callers: they form a DAG).
    expanded: dict[str, Function] = {}
    for comp in sccs({n: graph[n] & chosen for n in chosen}):
        for name in comp:
            expanded[name] = inline_calls(funcs[name], expanded)
    out = {name: expanded[name] if name in expanded else inline_calls(fn, expanded)
           for name, fn in funcs.items()}
    # Drop the marked functions nothing refers to any more.
    keep = {name for name in out if name not in marked or name == "main"}
    stack = list(keep)
    while stack:
        for ref in global_refs(out[stack.pop()]):
            if ref in out and ref not in keep:
                keep.add(ref)
                stack.append(ref)
    return IRModule({name: fn for name, fn in out.items() if name in keep},
                     mod.type_definitions)
