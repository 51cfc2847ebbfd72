"""First-order adjoint code generation (DLVM): a dataflow program to its straight-line adjoint.

The body must be a dataflow graph: lets, operator calls, tuples and projections, variables
and constants. The result computes the forward program once, in A-normal form, and then the
adjoint of every value that both depends on a differentiated parameter and reaches the
differentiated output, in reverse order: each operator's gradient rule turns its result's
adjoint into contributions to its inputs' adjoints, and a value's adjoint is the sum of the
contributions it receives. Forward values are shared by the adjoint code; there are no
references or closures. Anything else is rejected with a `kiln.Error` pointing to
``mode="higher_order"``.
"""

from __future__ import annotations

from kiln.ad.common import (
    Binder,
    LetList,
    Path,
    apply_rule,
    float_leaves,
    has_float,
    is_float,
    project,
    type_at,
)
from kiln.ad.grad import GradSpec
from kiln.errors import Error
from kiln.infer.infer import describe
from kiln.ir.adt import Constructor
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
from kiln.ir.ty import TupleType, Type
from kiln.op.grad_helpers import call as op_call

_CONSTRUCTS = {
    If: "an if expression",
    Match: "a match expression",
    Function: "a function (closure)",
    RefCreate: "a reference (ref)",
    RefRead: "a reference read (ref_read)",
    RefWrite: "a reference write (ref_write)",
}


def _reject(fn: Function) -> None:
    """A kiln.Error naming the first construct first-order differentiation cannot handle."""
    nodes = post_order(fn.body)
    called = {id(n.op) for n in nodes if isinstance(n, Call)}
    for node in nodes:
        what = _CONSTRUCTS.get(type(node))
        if what is None and isinstance(node, Call) and not isinstance(node.op, Op):
            if isinstance(node.op, GlobalVar):
                what = f"a call of the global function @{node.op.name}"
            elif isinstance(node.op, Constructor):
                what = f"a constructor call ({node.op.name})"
            else:
                what = f"a call of a closure ({describe(node.op)})"
        elif what is None and isinstance(node, (GlobalVar, Constructor)):
            if id(node) in called:
                continue  # reported at the call
            what = f"a reference to {describe(node)}"
        if what is not None:
            raise Error(
                f"first_order differentiation handles dataflow programs (lets, operator calls, "
                f"tuples); this one has {what}. Use mode=\"higher_order\", which handles the "
                "whole language",
                node.span,
            )


def _inputs(n: Expr) -> tuple[Expr, ...]:
    match n:
        case Call():
            return n.args
        case Tuple():
            return n.fields
        case TupleGetItem():
            return (n.tuple_value,)
    return ()


class _Adjoints:
    """The adjoint contributions each value has received, by path to its tensors."""

    def __init__(self, lets: LetList) -> None:
        self.lets = lets
        self.parts: dict[int, dict[Path, list[Expr]]] = {}

    def add(self, node: Expr, path: Path, ty: Type, value: Expr) -> None:
        """Record ``value`` as a contribution to the adjoint of ``node`` at ``path``."""
        if isinstance(ty, TupleType):
            if not isinstance(value, (Tuple, Var)):
                value = self.lets.push(value, "g")
            for i, field in enumerate(ty.fields):
                self.add(node, (*path, i), field, project(value, (i,)))
        elif is_float(ty):
            self.parts.setdefault(id(node), {}).setdefault(path, []).append(value)

    def received(self, node: Expr) -> bool:
        return id(node) in self.parts

    def total(self, node: Expr, forward: Expr, ty: Type, path: Path = ()) -> Expr:
        """The adjoint of ``node`` (at ``path``): its contributions summed, zero without any."""
        if isinstance(ty, TupleType):
            return Tuple(
                tuple(
                    self.total(node, forward, f, (*path, i)) for i, f in enumerate(ty.fields)
                )
            )
        parts = self.parts.get(id(node), {}).get(path, [])
        if not parts:
            return op_call("zeros_like", project(forward, path))
        out = parts[0]
        for p in parts[1:]:
            out = self.lets.push(out + p, "g", ty)
        return out


def differentiate(spec: GradSpec) -> Function:
    """The adjoint program of ``spec.fn`` (see the module docstring)."""
    fn = spec.fn
    _reject(fn)
    nodes = post_order(fn.body)
    bound: dict[Var, Expr] = {}
    for node in nodes:
        if isinstance(node, Let):
            bound[node.var] = node.value

    def resolve(e: Expr) -> Expr:
        while True:
            if isinstance(e, Let):
                e = e.body
            elif isinstance(e, Var) and e in bound:
                e = bound[e]
            else:
                return e

    names = {id(value): v.name_hint for v, value in bound.items()}
    graph = [n for n in nodes if isinstance(n, (Call, Tuple, TupleGetItem))]
    lets = LetList()

    # Forward: every value once, in A-normal form.
    forward: dict[int, Expr] = {id(p): p for p in fn.params}
    for n in nodes:
        if isinstance(n, Constant):
            forward[id(n)] = n

    def fwd(e: Expr) -> Expr:
        return forward[id(resolve(e))]

    for n in graph:
        name = names.get(id(n), "v")
        match n:
            case Call():
                value: Expr = Call(n.op, tuple(fwd(a) for a in n.args), n.attrs, span=n.span)
            case Tuple():
                value = Tuple(tuple(fwd(f) for f in n.fields))
            case TupleGetItem():
                value = TupleGetItem(fwd(n.tuple_value), n.index)
        forward[id(n)] = lets.push(value, name, n.checked_type)

    # Which values depend on a differentiated parameter (through floating-point tensors).
    active: set[int] = {id(fn.params[i]) for i in spec.wrt}
    for n in graph:
        if has_float(n.checked_type) and any(id(resolve(a)) in active for a in _inputs(n)):
            active.add(id(n))

    # Backward: seed the output, then each active value that received an adjoint, in reverse.
    result = resolve(fn.body)
    adjoints = _Adjoints(lets)

    def output_at(path: Path) -> Expr:
        node = result
        while path and isinstance(node, Tuple):
            node, path = resolve(node.fields[path[0]]), path[1:]
        return project(forward[id(node)], path)

    if id(result) in active:
        for path, seed in spec.seed_leaves(output_at):
            adjoints.add(result, path, type_at(result.checked_type, path), seed)
    for n in reversed(graph):
        if id(n) not in active or not adjoints.received(n):
            continue
        match n:
            case Call():
                g = adjoints.total(n, forward[id(n)], n.checked_type)
                g = lets.bind(g, "g", n.checked_type)
                rule_call = Call(
                    n.op, tuple(fwd(a) for a in n.args), n.attrs, checked_type_=n.checked_type
                )
                grads = apply_rule(rule_call, g, n)
                binder = Binder(lets, {id(rule_call): forward[id(n)]})
                for a, ga in zip(n.args, grads):
                    target = resolve(a)
                    if ga is None or id(target) not in active:
                        continue
                    adjoints.add(target, (), target.checked_type, binder.bind(ga))
            case Tuple():
                for i, f in enumerate(n.fields):
                    target = resolve(f)
                    if id(target) in active:
                        tuple_type = n.checked_type
                        assert isinstance(tuple_type, TupleType)  # the type of a Tuple node
                        ty = tuple_type.fields[i]
                        for leaf in float_leaves(ty):
                            parts = adjoints.parts[id(n)].get((i, *leaf), [])
                            for p in parts:
                                adjoints.add(target, leaf, type_at(ty, leaf), p)
            case TupleGetItem():
                target = resolve(n.tuple_value)
                for leaf, parts in adjoints.parts[id(n)].items():
                    ty = type_at(n.checked_type, leaf)
                    for p in parts:
                        adjoints.add(target, (n.index, *leaf), ty, p)

    param_grads: list[Expr] = []
    for i in spec.wrt:
        p = fn.params[i]
        total = adjoints.total(p, p, p.checked_type)
        param_grads.append(lets.bind(total, f"d_{p.name_hint}", p.checked_type))
    body = lets.build(spec.assemble(forward[id(result)], param_grads))
    return Function(spec.params(), body)

