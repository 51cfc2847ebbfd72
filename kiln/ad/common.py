"""Pieces both modes of differentiation share: float types, let lists, and applying a rule.

Only floating-point tensors have adjoints. Integer and boolean tensors flow through a
differentiated program as they are: loop counters, indices, conditions.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.errors import Error, InternalError
from kiln.infer.infer import describe
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr, Let, Op, Tuple, TupleGetItem, Var
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType, TupleType, Type, type_children
from kiln.op import registry

Path = tuple[int, ...]
UNIT = TupleType(())


def is_float(t: Type) -> bool:
    """A floating-point tensor type: the values that have adjoints."""
    return isinstance(t, TensorType) and dtype_of(t.dtype).is_float


def has_float(t: Type) -> bool:
    """True when a value of type ``t`` holds a floating-point tensor somewhere."""
    stack = [t]
    while stack:
        x = stack.pop()
        if is_float(x):
            return True
        stack.extend(type_children(x))
    return False


def is_plain(t: Type) -> bool:
    """A tensor, or a (nested) tuple of tensors: a value a gradient can be read from."""
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, TupleType):
            stack.extend(x.fields)
        elif not isinstance(x, TensorType):
            return False
    return True


def float_leaves(t: Type) -> list[Path]:
    """The paths to the floating-point tensors inside a tensor or tuple type."""
    out: list[Path] = []
    stack: list[tuple[Type, Path]] = [(t, ())]
    while stack:
        x, path = stack.pop()
        if isinstance(x, TupleType):
            stack.extend((f, (*path, i)) for i, f in reversed(list(enumerate(x.fields))))
        elif is_float(x):
            out.append(path)
    return out


def type_at(t: Type, path: Path) -> Type:
    for i in path:
        assert isinstance(t, TupleType)
        t = t.fields[i]
    return t


def project(e: Expr, path: Path) -> Expr:
    """``e.i.j...``, taking fields of tuple literals directly."""
    for i in path:
        e = e.fields[i] if isinstance(e, Tuple) else TupleGetItem(e, i)
    return e


def typed_var(name: str, t: Type | None) -> Var:
    """A variable whose checked type is already known (gradient rules read it)."""
    return Var(name, checked_type_=t)


class LetList:
    """Bindings emitted in order; `build` nests them around a body as a let chain."""

    def __init__(self) -> None:
        self.bindings: list[tuple[Var, Expr]] = []

    def push(self, value: Expr, name: str = "x", ty: Type | None = None) -> Var:
        """Bind ``value`` to a new variable (whose checked type is ``ty``, when given)."""
        v = typed_var(name, ty)
        self.bindings.append((v, value))
        return v

    def bind(self, value: Expr, name: str = "x", ty: Type | None = None) -> Expr:
        """``value`` itself when it is a variable, else a new variable bound to it."""
        if isinstance(value, Var):
            return value
        return self.push(value, name, ty)

    def build(self, body: Expr) -> Expr:
        for v, value in reversed(self.bindings):
            body = Let(v, value, body)
        return body


class Binder:
    """Puts adjoint expressions into a let list in A-normal form.

    Every operator call of an expression gets its own binding, once even when the expression
    shares it; ``known`` maps nodes (by identity) to the expressions that stand for them, such
    as a rule's forward call to the variable holding its result.
    """

    def __init__(self, lets: LetList, known: dict[int, Expr] | None = None) -> None:
        self.lets = lets
        self.known: dict[int, Expr] = dict(known or {})

    def bind(self, root: Expr, name: str = "g") -> Expr:
        known = self.known
        # Nodes already known are not entered: what stands for them is not rebuilt.
        for node in post_order(root, gate=lambda e: id(e) not in known):
            if id(node) in known:
                continue
            kids = children(node)
            rebuilt = with_children(node, [known.get(id(k), k) for k in kids])
            if isinstance(rebuilt, Call) and isinstance(rebuilt.op, Op):
                rebuilt = self.lets.push(rebuilt, name)
            known[id(node)] = rebuilt
        return known[id(root)]


def apply_rule(call: Call, out_grad: Expr, original: Call) -> list[Expr | None]:
    """The input adjoints an operator's gradient rule gives, checked.

    ``call`` has typed variables for arguments and the forward result type as its type;
    ``original`` is the call in the program being differentiated (for messages).
    """
    assert isinstance(call.op, Op)  # gradient rules are looked up for operator calls only
    name = call.op.name
    opdef = registry.get(name)
    span = original.span
    where = "" if span is not None and span.source is not None else f" ({describe(original)})"
    if not opdef.differentiable:
        raise Error(
            f"cannot differentiate through {name}: it is not differentiable, and its result "
            f"depends on a parameter being differentiated{where}",
            span,
        )
    if opdef.gradient is None:
        raise Error(f"operator {name} has no gradient rule registered", span)
    try:
        grads = opdef.gradient(call, out_grad)
    except Error as e:
        raise Error(e.message, e.span or span) from None
    if not isinstance(grads, Sequence) or len(grads) != len(call.args):
        raise InternalError(
            f"the gradient rule of {name} returned {grads!r}; it must give one adjoint (or None) "
            f"for each of its {len(call.args)} inputs"
        )
    return list(grads)
