"""Values in higher-order mode: each floating-point tensor paired with a reference to its adjoint.

``Tensor[float]`` becomes ``(Tensor, ref(Tensor))`` in every type: inside tuples, closures,
references and the type arguments of ADTs. Integer and boolean tensors stay as they are.
"""

from __future__ import annotations

from kiln.ad.common import LetList, has_float, is_float, project
from kiln.errors import Error, Span
from kiln.ir.expr import Expr, RefCreate, RefRead, RefWrite, Tuple, TupleGetItem
from kiln.ir.module import IRModule
from kiln.ir.ty import (
    GlobalTypeVar,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    type_children,
    with_type_children,
)
from kiln.op.grad_helpers import call as op_call


class Types:
    """The transformed type of each type: float tensors paired with a reference to an adjoint."""

    def __init__(self, mod: IRModule | None) -> None:
        self.mod = mod
        self.checked: set[GlobalTypeVar] = set()

    def ad(self, t: Type) -> Type:
        """The type of ``t``'s values in the differentiated program."""
        out: dict[int, Type] = {}
        stack: list[tuple[Type, bool]] = [(t, False)]
        while stack:
            x, ready = stack.pop()
            if id(x) in out:
                continue
            if isinstance(x, TensorType):
                out[id(x)] = TupleType((x, RefType(x))) if is_float(x) else x
                continue
            kids = type_children(x)
            if not ready and kids:
                stack.append((x, True))
                stack.extend((k, False) for k in kids)
                continue
            if isinstance(x, TypeCall):
                self.check_adt(x.func)
            out[id(x)] = with_type_children(x, [out[id(k)] for k in kids])
        return out[id(t)]

    def check_adt(self, header: GlobalTypeVar, span: Span | None = None) -> None:
        if header in self.checked or self.mod is None:
            return
        td = self.mod.type_data(header)
        for c in td.constructors:
            for field in c.inputs:
                if has_float(field):
                    raise Error(
                        f"higher_order differentiation needs ADTs that hold tensors through "
                        f"type parameters (like List[A]); constructor {c.name} of type "
                        f"{header.name} has a field of type {field}. Make it a type parameter "
                        f"of {header.name} and use {header.name}[{field}]",
                        span,
                    )
        self.checked.add(header)


def pair(value: Expr, t: Type) -> Expr:
    """A forward value of type ``t`` as a transformed value, each float with a zero adjoint."""
    if isinstance(t, TupleType):
        return Tuple(tuple(pair(project(value, (i,)), f) for i, f in enumerate(t.fields)))
    if is_float(t):
        return Tuple((value, RefCreate(op_call("zeros_like", value))))
    return value


def primal(value: Expr, t: Type) -> Expr:
    """The forward value inside a transformed value of (original) type ``t``."""
    if isinstance(t, TupleType):
        return Tuple(tuple(primal(project(value, (i,)), f) for i, f in enumerate(t.fields)))
    if is_float(t):
        return TupleGetItem(value, 0)
    return value


def read_adjoint(value: Expr, t: Type) -> Expr:
    """The adjoint a transformed value has accumulated (zeros for integer tensors)."""
    if isinstance(t, TupleType):
        return Tuple(
            tuple(read_adjoint(project(value, (i,)), f) for i, f in enumerate(t.fields))
        )
    if is_float(t):
        return RefRead(TupleGetItem(value, 1))
    return op_call("zeros_like", value)


def accumulate(lets: LetList, value: Expr, t: Type, g: Expr) -> None:
    """Add ``g`` into the adjoint of the transformed value ``value`` of type ``t``."""
    if isinstance(t, TupleType):
        g = lets.bind(g, "g", t) if not isinstance(g, Tuple) else g
        for i, f in enumerate(t.fields):
            accumulate(lets, project(value, (i,)), f, project(g, (i,)))
    elif is_float(t):
        adjoint = TupleGetItem(value, 1)
        lets.push(RefWrite(adjoint, RefRead(adjoint) + g), "_")
