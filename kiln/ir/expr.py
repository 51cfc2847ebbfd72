"""Expressions of the functional IR (Level 1): Relay's language.

Nodes are frozen, slotted dataclasses. ``==`` on expressions is identity (a `Var`'s name is
only a hint); `kiln.structural_equal` compares structure up to renaming of bound variables.
Every node may carry a source ``span`` and, after `kiln.infer_types`, a ``checked_type``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from kiln.errors import Error, Span
from kiln.ir.attrs import EMPTY_ATTRS, Attrs
from kiln.ir.ty import DTYPES, FuncType, TensorType, Type, TypeVar, as_dtype, tensor_type

if TYPE_CHECKING:
    from kiln.ir.adt import Pattern

_NUMPY_DTYPES = frozenset(np.dtype(d) for d in DTYPES)


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    """Base of all expressions."""

    span: Span | None = field(default=None, kw_only=True, repr=False)
    checked_type_: Type | None = field(default=None, kw_only=True, repr=False)

    @property
    def checked_type(self) -> Type:
        """The type inference gave this expression (run `kiln.infer_types` first)."""
        if self.checked_type_ is None:
            raise Error(
                f"{type(self).__name__} has no checked type yet: run kiln.infer_types on its module"
            )
        return self.checked_type_

    # Arithmetic sugar for building programs from Python, as Relay's Python API offers.
    def __add__(self, other: object) -> Call:
        return _binary("add", self, other)

    def __radd__(self, other: object) -> Call:
        return _binary("add", other, self)

    def __sub__(self, other: object) -> Call:
        return _binary("subtract", self, other)

    def __rsub__(self, other: object) -> Call:
        return _binary("subtract", other, self)

    def __mul__(self, other: object) -> Call:
        return _binary("multiply", self, other)

    def __rmul__(self, other: object) -> Call:
        return _binary("multiply", other, self)

    def __truediv__(self, other: object) -> Call:
        return _binary("divide", self, other)

    def __rtruediv__(self, other: object) -> Call:
        return _binary("divide", other, self)

    def __neg__(self) -> Call:
        return Call(Op("negative"), (self,))

    def __lt__(self, other: object) -> Call:
        return _binary("less", self, other)

    def __gt__(self, other: object) -> Call:
        return _binary("greater", self, other)

    def __le__(self, other: object) -> Call:
        return _binary("less_equal", self, other)

    def __ge__(self, other: object) -> Call:
        return _binary("greater_equal", self, other)

    def __getitem__(self, index: int) -> TupleGetItem:
        """``t[0]`` projects a field out of a tuple-valued expression."""
        if not isinstance(index, int):
            raise Error(f"tuple projection needs an integer index, got {index!r}")
        return TupleGetItem(self, index)

    def __iter__(self) -> NoReturn:
        # Without this, __getitem__ would make every expression an endless sequence.
        raise TypeError("kiln expressions are not iterable; project tuple fields with e[i]")

    def __str__(self) -> str:
        from kiln.text.printer import astext

        return astext(self)

    # Nodes hold Python containers; keep them usable as dict keys by identity.
    __hash__ = object.__hash__


def as_expr(value: object) -> Expr:
    """An expression from an expression, a numpy array or a Python scalar (as a Constant)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        return const(value)
    if isinstance(value, (tuple, list)):
        return Tuple(tuple(as_expr(v) for v in value))
    raise Error(f"cannot use {type(value).__name__} {value!r} as a kiln expression")


def _binary(name: str, lhs: object, rhs: object) -> Call:
    return Call(Op(name), (as_expr(lhs), as_expr(rhs)))


@dataclass(frozen=True, slots=True, eq=False)
class Var(Expr):
    """A local variable. Compares by identity: ``name_hint`` is only for printing."""

    name_hint: str
    type_annotation: Type | None = None

    def __repr__(self) -> str:
        return f"Var(%{self.name_hint})"


@dataclass(frozen=True, slots=True, eq=False)
class GlobalVar(Expr):
    """The name of a global function, ``@name``; compares by name."""

    name: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GlobalVar) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("GlobalVar", self.name))

    def __repr__(self) -> str:
        return f"GlobalVar(@{self.name})"


@dataclass(frozen=True, slots=True, eq=False)
class Constant(Expr):
    """A tensor constant. The array is copied, made contiguous and read-only."""

    data: np.ndarray

    def __post_init__(self) -> None:
        data = self.data
        if (
            type(data) is np.ndarray
            and data.dtype in _NUMPY_DTYPES
            and not data.flags.writeable
            and data.flags.owndata
            and data.flags.c_contiguous
        ):
            return  # already a private read-only copy (another Constant's data)
        array = np.array(data, copy=True, order="C")
        as_dtype(array.dtype)  # reject unsupported dtypes early
        array.setflags(write=False)
        object.__setattr__(self, "data", array)

    @property
    def dtype(self) -> str:
        return self.data.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def tensor_type(self) -> TensorType:
        return TensorType(self.data.shape, self.data.dtype.name)

    def __repr__(self) -> str:
        if self.data.ndim == 0:
            return f"Constant({self.data.item()!r}, {self.dtype})"
        return f"Constant(<{self.dtype} {self.data.shape}>)"


@dataclass(frozen=True, slots=True, eq=False)
class Tuple(Expr):
    """A tuple of values; ``Tuple(())`` is the unit value."""

    fields: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))


@dataclass(frozen=True, slots=True, eq=False)
class TupleGetItem(Expr):
    """Projection of one field of a tuple: ``%t.0``."""

    tuple_value: Expr
    index: int


@dataclass(frozen=True, slots=True, eq=False)
class Let(Expr):
    """``let %var = value; body``."""

    var: Var
    value: Expr
    body: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Function(Expr):
    """A function (a closure when it has free variables): ``fn[A](%x: A) -> A { %x }``.

    ``attrs`` holds function attributes such as ``Primitive=1`` for fused kernels.
    """

    params: tuple[Var, ...]
    body: Expr
    ret_type: Type | None = None
    type_params: tuple[TypeVar, ...] = ()
    attrs: Attrs = EMPTY_ATTRS

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "type_params", tuple(self.type_params))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        for p in self.params:
            if not isinstance(p, Var):
                raise Error(f"function parameters must be kiln.Var, got {type(p).__name__}")

    @property
    def func_type_annotation(self) -> FuncType | None:
        """The function's type when every parameter and the result are annotated."""
        arg_types = tuple(p.type_annotation for p in self.params if p.type_annotation is not None)
        if self.ret_type is None or len(arg_types) < len(self.params):
            return None
        return FuncType(arg_types, self.ret_type, self.type_params)


@dataclass(frozen=True, slots=True, eq=False)
class Call(Expr):
    """A call of an operator, function, closure or constructor; ``attrs`` for operators."""

    op: Expr
    args: tuple[Expr, ...]
    attrs: Attrs = EMPTY_ATTRS

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))


@dataclass(frozen=True, slots=True, eq=False)
class If(Expr):
    """``if (cond) { true_branch } else { false_branch }``; cond is a scalar bool tensor."""

    cond: Expr
    true_branch: Expr
    false_branch: Expr


@dataclass(frozen=True, slots=True)
class Clause:
    """One arm of a match: ``pattern => expression``."""

    lhs: Pattern
    rhs: Expr
    span: Span | None = field(default=None, kw_only=True, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class Match(Expr):
    """``match (data) { clauses }``; ``complete=False`` is ``match?`` (non-exhaustive)."""

    data: Expr
    clauses: tuple[Clause, ...]
    complete: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "clauses", tuple(self.clauses))


@dataclass(frozen=True, slots=True, eq=False)
class RefCreate(Expr):
    """``ref(value)``: a new mutable cell."""

    value: Expr


@dataclass(frozen=True, slots=True, eq=False)
class RefRead(Expr):
    """``ref_read(ref)``."""

    ref: Expr


@dataclass(frozen=True, slots=True, eq=False)
class RefWrite(Expr):
    """``ref_write(ref, value)``; evaluates to the unit value ``()``."""

    ref: Expr
    value: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Op(Expr):
    """A primitive operator by name, such as ``nn.conv2d``; compares by name."""

    name: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("Op", self.name))

    def __repr__(self) -> str:
        return f"Op({self.name})"


# --- builders -----------------------------------------------------------------------------


def var(
    name: str,
    type_annotation: Type | None = None,
    *,
    shape: Sequence[object] | None = None,
    dtype: object = "float32",
) -> Var:
    """A variable; give a type, or a ``shape`` (and ``dtype``) for a tensor."""
    if type_annotation is not None and shape is not None:
        raise Error("give var() a type_annotation or a shape, not both")
    if shape is not None:
        type_annotation = tensor_type(tuple(shape), dtype)
    if type_annotation is not None and not isinstance(type_annotation, Type):
        raise Error(f"a type annotation must be a kiln type, got {type_annotation!r}")
    return Var(name, type_annotation)


def const(value: object, dtype: object = None) -> Constant:
    """A constant tensor; Python floats default to float32 and ints to int32, as in Relay."""
    if dtype is not None:
        array = np.asarray(value, dtype=as_dtype(dtype))
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
    elif isinstance(value, bool):
        array = np.asarray(value, dtype="bool")
    elif isinstance(value, int):
        array = np.asarray(value, dtype="int32" if -(2**31) <= value < 2**31 else "int64")
    elif isinstance(value, float):
        array = np.asarray(value, dtype="float32")
    else:
        array = np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype("float32")  # nested Python lists of floats
        elif array.dtype == np.int64 and (array.size == 0 or (
            array.min() >= -(2**31) and array.max() < 2**31
        )):
            array = array.astype("int32")
    return Constant(array)


def let(v: Var, value: object, body: object) -> Let:
    """``let %v = value; body``."""
    return Let(v, as_expr(value), as_expr(body))


def tuple_(*fields: object) -> Tuple:
    """A tuple expression of the given fields."""
    return Tuple(tuple(as_expr(f) for f in fields))


def if_(cond: object, true_branch: object, false_branch: object) -> If:
    """``if (cond) { true_branch } else { false_branch }``."""
    return If(as_expr(cond), as_expr(true_branch), as_expr(false_branch))
