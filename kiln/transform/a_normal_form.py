"""to-a-normal-form: name every intermediate value with a let, in evaluation order.

In A-normal form every operand is atomic (a variable, global, constant, operator or
constructor) and every compound computation is bound by a ``let`` in the order it runs:

    %2 = add(%x, %y); multiply(%2, %2)   becomes   let %a = add(%x, %y); multiply(%a, %a)

Each scope gets its own bindings: a function body, an ``if`` branch and a ``match`` clause
hold the lets of what is computed only there. The last computation of a scope stays unbound
(``fn (%x) { let %a = f(%x); g(%a) }``), so calls in tail position remain tail calls.
Constructs with scopes (functions, ifs, matches) are bound like any other computation.

A node shared in graph form (a dataflow DAG) is bound once, in the innermost scope that holds
all its uses (Relay's algorithm: the least common ancestor of its users' scopes in the scope
tree), at the point where evaluation first reaches it; a pure node used in a closure and
outside it is bound outside and captured. Graph form evaluates a shared node once per function
invocation, so a node whose value depends on references (`kiln.transform.effects`) and that is
used in several functions gets a binding in each. Binding a node in an outer scope moves its
evaluation earlier, out of a branch for example; a node with effects first reached inside a
branch but also used after it is rejected with a `kiln.Error`, since graph form leaves open
whether its effect happens before the branch.

`compute_scopes` (the scope tree and each node's scope) is shared with
eliminate-common-subexpr.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import Error, InternalError
from kiln.ir.adt import Constructor
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
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import Visit, children, post_order, trampoline, with_children
from kiln.transform.effects import Effect, EffectAnalysis
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass

ATOMS = (Var, GlobalVar, Constant, Op, Constructor)


# --- the scope tree -----------------------------------------------------------------------------


class Scope:
    """A node of the scope tree: a function body, a branch, or the body of a let.

    ``jump`` pointers (Myers' skew-binary scheme) make ancestor queries logarithmic, so deep
    let chains do not make the least-common-ancestor computation quadratic.
    """

    __slots__ = ("parent", "depth", "kind", "jump", "frame", "block")

    def __init__(self, parent: Scope | None, kind: str) -> None:
        self.parent = parent
        self.kind = kind  # "function", "branch" or "let"
        if parent is None:
            self.depth = 0
            self.jump: Scope = self
        else:
            self.depth = parent.depth + 1
            pj = parent.jump
            self.jump = pj.jump if parent.depth - pj.depth == pj.depth - pj.jump.depth else parent
        # The frame is the function invocation this scope runs in; the block is where its
        # let bindings go (a let body's bindings join the enclosing block).
        self.frame: Scope = self if kind == "function" or parent is None else parent.frame
        self.block: Scope = parent.block if kind == "let" and parent is not None else self

    def ancestor_at(self, depth: int) -> Scope:
        s = self
        while s.depth > depth:
            s = s.jump if s.jump.depth >= depth else s.parent  # type: ignore[assignment]
        return s


def lca(a: Scope, b: Scope) -> Scope:
    """The innermost scope enclosing both."""
    if a.depth > b.depth:
        a = a.ancestor_at(b.depth)
    elif b.depth > a.depth:
        b = b.ancestor_at(a.depth)
    while a is not b:
        if a.jump is not b.jump:
            a, b = a.jump, b.jump
        else:
            a, b = a.parent, b.parent  # type: ignore[assignment]
    return a


def scope_edges(e: Expr) -> list[tuple[Expr, str | None]]:
    """The children of ``e``, each with the kind of scope it opens (None: e's own scope)."""
    match e:
        case Function():
            return [(e.body, "function")]
        case If():
            return [(e.cond, None), (e.true_branch, "branch"), (e.false_branch, "branch")]
        case Match():
            return [(e.data, None), *((c.rhs, "branch") for c in e.clauses)]
        case Let():
            return [(e.value, None), (e.body, "let")]
    return [(k, None) for k in children(e)]


Key = Any  # id(node), or (id(node), id(frame)) for a node evaluated once per frame


@dataclass
class Scopes:
    """Where each non-atomic node of a function lives, and the scope each edge opens.

    A node listed in ``per_frame`` (one whose value depends on when it is evaluated) is not
    shared across function invocations: graph form evaluates it once in each frame that uses
    it, so it gets one copy per frame, keyed ``(id(node), id(frame))``; other nodes are keyed
    by ``id(node)``.
    """

    root: Scope
    per_frame: frozenset[int] = frozenset()
    of: dict[Key, Scope] = field(default_factory=dict)  # node copy -> its scope
    edge: dict[tuple[Key, int], Scope] = field(default_factory=dict)  # (copy, i) -> scope
    uses: dict[Key, int] = field(default_factory=dict)  # copy -> number of parent edges
    order: list[Expr] = field(default_factory=list)  # post-order (fused kernels not entered)
    copies: dict[int, list[Key]] = field(default_factory=dict)  # id(node) -> its copies

    def key(self, e: Expr, frame: Scope) -> Key:
        return (id(e), id(frame)) if id(e) in self.per_frame else id(e)


def compute_scopes(root: Expr, per_frame: frozenset[int] = frozenset()) -> Scopes:
    """Each node's scope: the least common ancestor of the scopes its users put it in."""
    s = Scopes(Scope(None, "function"), per_frame)
    # Fused kernels below the root are nodes of the graph but are not entered.
    s.order = post_order(
        root, gate=lambda n: not (isinstance(n, Function) and is_primitive(n) and n is not root)
    )
    s.of[id(root)] = s.root
    s.copies[id(root)] = [id(root)]
    for node in reversed(s.order):  # every user before what it uses
        if isinstance(node, ATOMS) or (
            isinstance(node, Function) and is_primitive(node) and node is not root
        ):
            continue
        for key in s.copies.get(id(node), ()):
            here = s.of[key]
            for i, (kid, kind) in enumerate(scope_edges(node)):
                if kind is not None:
                    inner = Scope(here, kind)
                    s.edge[(key, i)] = inner
                else:
                    inner = here
                if isinstance(kid, ATOMS):
                    continue
                kid_key = s.key(kid, inner.frame)
                s.uses[kid_key] = s.uses.get(kid_key, 0) + 1
                old = s.of.get(kid_key)
                if old is None:
                    s.of[kid_key] = inner
                    s.copies.setdefault(id(kid), []).append(kid_key)
                else:
                    s.of[kid_key] = lca(old, inner)
    return s


# --- filling the scopes with lets ---------------------------------------------------------------


class _Fill:
    """One function converted: each scope's block collects its bindings in evaluation order."""

    def __init__(self, root: Function, analysis: EffectAnalysis) -> None:
        self.effects = analysis.effects(root)
        # A node whose evaluation touches references has a value that depends on when it
        # runs: graph form runs it once in each frame that uses it, and so do we.
        per_frame = frozenset(k for k, eff in self.effects.items() if eff)
        self.s = compute_scopes(root, per_frame)
        self.local = self._local_effects(analysis)
        self.blocks: dict[Scope, list[tuple[Var, Expr]]] = {}
        self.memo: dict[Key, Expr] = {}
        self.block: Scope = self.s.root

    def _local_effects(self, analysis: EffectAnalysis) -> dict[int, Effect]:
        """Effects of evaluating a node together with the parts that are bound with it."""
        total: dict[int, int] = {}
        for nid, keys in self.s.copies.items():
            total[nid] = sum(self.s.uses.get(k, 0) for k in keys)
        out: dict[int, Effect] = {}
        for node in self.s.order:
            if isinstance(node, (Function, *ATOMS)):
                out[id(node)] = Effect.NONE
            elif isinstance(node, (If, Match)):
                out[id(node)] = self.effects[id(node)]  # their branches move with them
            else:
                eff = analysis.own_effect(node)
                for kid in children(node):
                    if total.get(id(kid), 0) == 1:
                        eff |= out[id(kid)]
                out[id(node)] = eff
        return out

    def key(self, e: Expr) -> Key:
        return self.s.key(e, self.block.frame)

    def emit(self, scope: Scope, v: Var, value: Expr) -> None:
        self.blocks[scope.block].append((v, value))

    def atom(self, e: Expr) -> Visit:
        """An atomic expression for ``e``, binding it (once) in its own scope."""
        if isinstance(e, ATOMS):
            return e
        key = self.key(e)
        done = self.memo.get(key)
        if done is not None:
            return done
        scope = self.s.of[key]
        if self.local[id(e)] and scope.block is not self.block:
            raise Error(
                "cannot convert to A-normal form: an expression with effects (on references, "
                "or a call that may have them) is first evaluated inside a branch and used "
                "again outside it in graph form, so whether its effect happens before the "
                "branch is not defined; bind it with a let", e.span)
        value = yield self.compound(e)
        v = Var("x")
        self.emit(scope, v, value)
        self.memo[key] = v
        return v

    def operand(self, e: Expr) -> Visit:
        """A computation in place (let values, the tail of a scope): bound only if shared."""
        if isinstance(e, ATOMS):
            return e
        key = self.key(e)
        if self.s.uses.get(key, 0) > 1 or key in self.memo:
            return (yield self.atom(e))
        return (yield self.compound(e))

    def scoped(self, e: Expr, scope: Scope) -> Visit:
        """``e`` as the body of a new scope: its bindings wrapped around its result."""
        outer, self.block = self.block, scope.block
        self.blocks[scope] = []
        tail = yield self.operand(e)
        bindings = self.blocks.pop(scope)
        self.block = outer
        for v, value in reversed(bindings):
            tail = Let(v, value, tail)
        return tail

    def compound(self, e: Expr) -> Visit:
        """``e``'s own step over atomic operands; the bindings it needs are emitted first."""
        key = self.key(e)
        match e:
            case Let():
                value = yield self.operand(e.value)
                self.emit(self.s.of[key], e.var, value)
                return (yield self.operand(e.body))
            case Function():
                if is_primitive(e):
                    return e
                body = yield self.scoped(e.body, self.s.edge[(key, 0)])
                return Function(e.params, body, e.ret_type, e.type_params, e.attrs, span=e.span)
            case If():
                cond = yield self.atom(e.cond)
                t = yield self.scoped(e.true_branch, self.s.edge[(key, 1)])
                f = yield self.scoped(e.false_branch, self.s.edge[(key, 2)])
                return If(cond, t, f, span=e.span)
            case Match():
                data = yield self.atom(e.data)
                clauses = []
                for i, c in enumerate(e.clauses, start=1):
                    rhs = yield self.scoped(c.rhs, self.s.edge[(key, i)])
                    clauses.append(Clause(c.lhs, rhs, span=c.span))
                return Match(data, tuple(clauses), e.complete, span=e.span)
            case Call(op=Op() | GlobalVar() | Constructor()):
                args = []
                for a in e.args:
                    args.append((yield self.atom(a)))
                out = with_children(e, [e.op, *args])
                if out is e and id(e) in self.s.per_frame:
                    out = dataclasses.replace(e)  # each frame's copy is a node of its own
                return out
        if isinstance(e, ATOMS):
            raise InternalError(f"an atom {e!r} reached compound()")
        kids = []
        for k in children(e):
            kids.append((yield self.atom(k)))
        out = with_children(e, kids)
        if out is e and id(e) in self.s.per_frame:
            out = dataclasses.replace(e)  # each frame's copy is a node of its own
        return out

    def run(self, fn: Function) -> Function:
        out = trampoline(self.compound(fn))
        assert isinstance(out, Function)
        return out


def to_a_normal_form(fn: Function, analysis: EffectAnalysis) -> Function:
    """One function in A-normal form."""
    if is_primitive(fn):
        return fn
    return _Fill(fn, analysis).run(fn)


@module_pass("to-a-normal-form", opt_level=1)
def ToANormalForm(mod: IRModule, ctx: PassContext) -> IRModule:
    """Bind every non-atomic subexpression with a let, in evaluation order, scope by scope."""
    analysis = EffectAnalysis(mod)
    funcs = {gv: to_a_normal_form(fn, analysis) for gv, fn in mod.functions.items()}
    return IRModule(funcs, mod.type_definitions)
