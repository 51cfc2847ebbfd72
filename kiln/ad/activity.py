"""Activity in higher-order mode: which values may depend on a differentiated parameter."""

from __future__ import annotations

from kiln.errors import InternalError
from kiln.ir.adt import Constructor, pattern_vars
from kiln.ir.expr import (
    Call,
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
from kiln.ir.traverse import post_order


class Taint:
    """A conservative answer to "may this value depend on a differentiated parameter?".

    Function parameters, reference reads and calls of closures are assumed to; a global
    function's result depends only on its arguments. Only the "no" answers are used: a value
    that cannot depend on the parameters needs no adjoint, and a non-differentiable operator is
    an error only where its arguments may depend on them.
    """

    def __init__(self, root: Expr, tainted: set[Var]) -> None:
        self.vars: dict[Var, bool] = {v: True for v in tainted}
        self.nodes: dict[int, bool] = {}
        by_value: dict[int, list[Var]] = {}
        by_data: dict[int, list[Match]] = {}
        order = post_order(root)
        for node in order:
            if isinstance(node, Let):
                by_value.setdefault(id(node.value), []).append(node.var)
                if isinstance(node.value, Function):  # used in its own body, before it is done
                    self.vars[node.var] = True
            elif isinstance(node, Match):
                by_data.setdefault(id(node.data), []).append(node)
            elif isinstance(node, Function):
                self.vars.update((p, True) for p in node.params)
        for node in order:
            t = self.compute(node)
            self.nodes[id(node)] = t
            for v in by_value.get(id(node), ()):
                self.vars[v] = self.vars.get(v, False) or t
            for m in by_data.get(id(node), ()):
                for clause in m.clauses:
                    for v in pattern_vars(clause.lhs):
                        self.vars[v] = self.vars.get(v, False) or t

    def of(self, e: Expr) -> bool:
        if isinstance(e, Var):
            return self.vars.get(e, False)
        return self.nodes.get(id(e), True)

    def compute(self, e: Expr) -> bool:
        match e:
            case Var():
                return self.vars.get(e, False)
            case Constant() | GlobalVar() | Constructor() | Op() | RefWrite():
                return False
            case Call(op=Op() | GlobalVar() | Constructor()):
                return any(self.of(a) for a in e.args)
            case Call() | Function() | RefRead() | RefCreate():
                return True
            case Tuple():
                return any(self.of(f) for f in e.fields)
            case TupleGetItem():
                return self.of(e.tuple_value)
            case Let():
                return self.of(e.body)
            case If():
                return self.of(e.true_branch) or self.of(e.false_branch)
            case Match():
                return any(self.of(c.rhs) for c in e.clauses)
        raise InternalError(f"unknown expression node {type(e).__name__}")

