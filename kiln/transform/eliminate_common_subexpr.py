"""eliminate-common-subexpr: compute equal pure expressions once.

Two pure computations of the same kind over the same operands give the same value, so the
later one can use the earlier one's result. Merged here, as in TVM: operator calls (same
operator, same attributes, same arguments), tuple projections, tuples, constructor calls, and
calls of global functions without effects (see `kiln.transform.effects`). Operands are
compared after merging (so chains of equal computations merge bottom-up); variables compare
by identity, constants by value (those of more than `MAX_COMPARED_CONSTANT` elements, model
weights, by identity).

Effects are never merged: a ``ref(...)``, a ``ref_read`` or a call that may write is left
alone, and two computations that read through different ``ref_read`` nodes have different
operands, so they are never equal.

Scopes are respected. An expression can take the place of another only if it is visible
there: computed earlier in the same scope or an enclosing one (never in a sibling ``if``
branch or ``match`` clause). In a let chain, ``let %b = add(%x, %y)`` inside the body of
``let %a = add(%x, %y)`` becomes a use of ``%a`` (and ``%b`` is replaced by ``%a``). A
function body sees the pure computations of the enclosing function. Fused kernels
(``Primitive=1``) are left as they are.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Let,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, with_children
from kiln.transform.a_normal_form import Scope, Scopes, compute_scopes
from kiln.transform.effects import Effect, EffectAnalysis
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass

# Constants up to this many elements compare by value; larger ones (weights) by identity:
# reading megabytes of weights to find equal copies would cost more than it could save.
MAX_COMPARED_CONSTANT = 1024


def _attr_key(value: Any) -> Any:
    """Attribute values compared exactly: 1, 1.0 and True differ, as do 0.0 and -0.0."""
    if isinstance(value, tuple):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, float):
        return ("f", repr(value))
    return (type(value).__name__, value)


class _Keys:
    """Keys under which equal computations meet."""

    def __init__(self, analysis: EffectAnalysis) -> None:
        self.analysis = analysis
        self.constants: dict[tuple, int] = {}  # constant contents -> a canonical id
        self.constant_ids: dict[int, int] = {}

    def operand(self, e: Expr) -> Any:
        match e:
            case Constant() if e.data.size <= MAX_COMPARED_CONSTANT:
                cid = self.constant_ids.get(id(e))
                if cid is None:
                    contents = (e.data.dtype.str, e.data.shape, e.data.tobytes())
                    cid = self.constants.setdefault(contents, len(self.constants))
                    self.constant_ids[id(e)] = cid
                return ("const", cid)
            case GlobalVar() | Op():
                return (type(e).__name__, e.name)
            case Constructor():
                return ("ctor", e.belong_to.name, e.name)
        return id(e)

    def key(self, e: Expr) -> Any:
        """The key of a mergeable computation, or None for anything else."""
        match e:
            case Call(op=Op() | Constructor() | GlobalVar() as op):
                if self.analysis.call_effect(e):
                    return None
                attrs = tuple(sorted((k, _attr_key(v)) for k, v in e.attrs.items()))
                return ("call", self.operand(op), attrs, *map(self.operand, e.args))
            case TupleGetItem():
                return ("proj", e.index, self.operand(e.tuple_value))
            case Tuple():
                return ("tuple", *map(self.operand, e.fields))
        return None


class _Eliminate:
    """One function: the computations available so far, each with the scope it lives in."""

    def __init__(self, fn: Function, analysis: EffectAnalysis, keys: _Keys) -> None:
        self.scopes: Scopes = compute_scopes(fn)
        self.effects = analysis.effects(fn)
        self.keys = keys
        self.table: dict[Any, list[tuple[Scope, Expr, bool]]] = {}
        self.renamed: dict[Var, Expr] = {}  # let variables replaced by an equal earlier one

    def lookup(self, key: Any, scope: Scope) -> Expr | None:
        """An expression for ``key`` available at ``scope``: offered in it or around it."""
        for where, e, pure in reversed(self.table.get(key, ())):
            if where.depth > scope.depth or scope.ancestor_at(where.depth) is not where:
                continue  # not visible here (a sibling branch, a let body that ended)
            if pure or where.frame is scope.frame:
                return e  # from an enclosing function: only pure values are the same there
        return None

    def offer(self, key: Any, scope: Scope, e: Expr, pure: bool) -> None:
        self.table.setdefault(key, []).append((scope, e, pure))

    def run(self, fn: Function) -> Function:
        s = self.scopes
        lets_of_value: dict[int, list[Let]] = {}
        for node in s.order:
            if isinstance(node, Let):
                lets_of_value.setdefault(id(node.value), []).append(node)
        renamed = self.renamed
        done: dict[int, Expr] = {}
        for node in s.order:
            if isinstance(node, Var):
                out: Expr = renamed.get(node, node)
            elif isinstance(node, Function) and is_primitive(node) and node is not fn:
                out = node
            elif isinstance(node, Let) and node.var in renamed:
                out = done[id(node.body)]
            else:
                out = with_children(node, [done[id(k)] for k in children(node)])
                key = self.keys.key(out)
                if key is not None:
                    out = self.merge(node, out, key, lets_of_value.get(id(node), ()))
            done[id(node)] = out
        new = done[id(fn)]
        assert isinstance(new, Function)
        return new

    def merge(self, node: Expr, out: Expr, key: Any, lets: tuple[Let, ...] | list[Let]) -> Expr:
        """``out`` (the rebuilt ``node``) or an available equal expression."""
        s = self.scopes
        scope = s.of[id(node)]
        found = self.lookup(key, scope)
        pure = self.effects[id(node)] == Effect.NONE
        if found is not None:
            if isinstance(found, Var):
                for let in lets:
                    self.renamed[let.var] = found
            return found
        # The value of a single let is offered as its variable, in the let's body only.
        if lets and s.uses.get(id(node), 0) == 1:
            let = lets[0]
            self.offer(key, s.edge[(id(let), 1)], let.var, pure)
        else:
            self.offer(key, scope, out, pure)
        return out


def eliminate_common_subexpr(fn: Function, analysis: EffectAnalysis, keys: _Keys) -> Function:
    """One function with its common subexpressions merged."""
    if is_primitive(fn):
        return fn
    return _Eliminate(fn, analysis, keys).run(fn)


@module_pass("eliminate-common-subexpr", opt_level=3)
def EliminateCommonSubexpr(mod: IRModule, ctx: PassContext) -> IRModule:
    """Merge equal pure computations (same operator, attributes and operands) in scope."""
    analysis = EffectAnalysis(mod)
    keys = _Keys(analysis)
    funcs = {gv: eliminate_common_subexpr(fn, analysis, keys) for gv, fn in mod.functions.items()}
    return IRModule(funcs, mod.type_definitions)
