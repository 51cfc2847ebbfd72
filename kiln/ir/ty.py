"""Types of the functional IR: Relay's tensor, tuple, function, reference and ADT types.

Types are small frozen values compared structurally with ``==``, except the variables
(`TypeVar`, `IncompleteType`), which compare by identity. Equality up to renaming of
bound type variables is `kiln.structural_equal`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from kiln.errors import Error, InternalError, Span

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
FLOAT_DTYPES = ("float16", "float32", "float64")
_DTYPE_SET = frozenset(DTYPES)
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def as_dtype(dtype: object) -> str:
    """The canonical name of a dtype given as a string, numpy dtype or numpy type."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            # Anything numpy cannot read as a dtype raises TypeError, answered below.
            name = np.dtype(cast("DTypeLike", dtype)).name
        except TypeError:
            raise Error(f"unsupported dtype {dtype!r}; kiln supports {', '.join(DTYPES)}") from None
    if name not in DTYPES:
        hint = ""
        if "x" in name and name.split("x")[0] in DTYPES:
            hint = " (vector dtypes such as float16x4 are not supported)"
        raise Error(f"unsupported dtype {name!r}{hint}; kiln supports {', '.join(DTYPES)}")
    return name


@dataclass(frozen=True, slots=True)
class SymDim:
    """A symbolic dimension such as ``n`` in ``Tensor[(n, 3), float32]``; equal by name."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class AnyDim:
    """A dimension unknown until run time, written ``?``."""

    def __str__(self) -> str:
        return "?"


ANY = AnyDim()
Dim = int | SymDim | AnyDim


def as_dim(d: object) -> Dim:
    """Accept an int, a numpy integer, a SymDim, ANY, None or '?' (unknown), or a name."""
    if isinstance(d, (SymDim, AnyDim)):
        return d
    if d is None or d == "?":
        return ANY
    if isinstance(d, str):
        if not d.isidentifier():
            raise Error(f"invalid symbolic dimension name {d!r}")
        return SymDim(d)
    if isinstance(d, (bool, np.bool_)):
        raise Error(f"a dimension must be an integer, not {d!r}")
    if isinstance(d, (int, np.integer)):
        if d < 0:
            raise Error(f"a dimension must not be negative, got {int(d)}")
        return int(d)
    raise Error(f"a dimension must be an integer, a symbolic name or '?', not {d!r}")


class Type:
    """Base of all types."""

    __slots__ = ()

    def __str__(self) -> str:
        from kiln.text.printer import type_text

        return type_text(self)


def static_dims(shape: Sequence[Dim], what: str = "the shape") -> tuple[int, ...]:
    """A shape known to be static (all integers); an InternalError names ``what`` otherwise."""
    dims = []
    for d in shape:
        if not isinstance(d, int):
            raise InternalError(f"a static shape was expected, but {what} has dimension {d}")
        dims.append(d)
    return tuple(dims)


@dataclass(frozen=True, slots=True)
class TensorType(Type):
    """A tensor of a dtype; each dimension an int, a `SymDim` or `ANY`. Shape () is a scalar."""

    shape: tuple[Dim, ...]
    dtype: str = "float32"
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        shape = self.shape
        if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
            object.__setattr__(self, "shape", tuple(as_dim(d) for d in shape))
        if self.dtype not in _DTYPE_SET:
            object.__setattr__(self, "dtype", as_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known integer."""
        return all(type(d) is int for d in self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape as integers, for code that runs after shapes are known (lowering)."""
        return static_dims(self.shape, str(self))



@dataclass(frozen=True, slots=True)
class TupleType(Type):
    """The type of a tuple; ``TupleType(())`` is the unit type."""

    fields: tuple[Type, ...]
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))



@dataclass(frozen=True, slots=True, eq=False)
class TypeVar(Type):
    """A type variable such as ``A`` in ``def @id[A](%x: A) -> A``; compares by identity."""

    name: str
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)



@dataclass(frozen=True, slots=True)
class FuncType(Type):
    """The type of a function: ``fn[A](A, Tensor[(2), float32]) -> A``."""

    arg_types: tuple[Type, ...]
    ret_type: Type
    type_params: tuple[TypeVar, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arg_types", tuple(self.arg_types))
        object.__setattr__(self, "type_params", tuple(self.type_params))



@dataclass(frozen=True, slots=True)
class GlobalTypeVar(Type):
    """The name of an algebraic data type, such as ``List``; compares by name."""

    name: str
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __getitem__(self, args: object) -> TypeCall:
        """``List[A]`` as a `TypeCall`."""
        if not isinstance(args, tuple):
            args = (args,)
        return TypeCall(self, args)



@dataclass(frozen=True, slots=True)
class TypeCall(Type):
    """An ADT applied to type arguments: ``List[Tensor[(), int32]]``."""

    func: GlobalTypeVar
    args: tuple[Type, ...] = ()
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))



@dataclass(frozen=True, slots=True)
class RefType(Type):
    """The type of a mutable reference cell: ``ref(Tensor[(), float32])``."""

    value: Type
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)



_incomplete_ids = itertools.count()


@dataclass(frozen=True, slots=True, eq=False)
class IncompleteType(Type):
    """A type not yet known: written ``_``, and made by inference; compares by identity."""

    id: int = field(default_factory=lambda: next(_incomplete_ids))
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)



def scalar_type(dtype: object) -> TensorType:
    """``Tensor[(), dtype]``."""
    return TensorType((), as_dtype(dtype))


def tensor_type(shape: object, dtype: object = "float32") -> TensorType:
    """A tensor type from loose inputs: any sequence of dims and any dtype spelling."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    # TensorType reads each dimension with as_dim, which refuses what is not one.
    return TensorType(tuple(cast("Iterable[Dim]", shape)), as_dtype(dtype))


def is_complete(ty: Type) -> bool:
    """True when no IncompleteType occurs in ``ty``."""
    stack = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, IncompleteType):
            return False
        stack.extend(type_children(t))
    return True


def type_children(ty: Type) -> tuple[Type, ...]:
    """The types directly inside ``ty``."""
    if isinstance(ty, TupleType):
        return ty.fields
    if isinstance(ty, FuncType):
        return (*ty.arg_types, ty.ret_type)
    if isinstance(ty, TypeCall):
        return ty.args
    if isinstance(ty, RefType):
        return (ty.value,)
    return ()


def substitute(ty: Type, mapping: dict[Type, Type]) -> Type:
    """Replace type variables (or incomplete types) by the types ``mapping`` gives."""
    if not mapping:
        return ty
    # Types are shallow trees written by people; an explicit stack keeps this safe anyway.
    out: dict[int, Type] = {}
    stack: list[tuple[Type, bool]] = [(ty, False)]
    while stack:
        t, ready = stack.pop()
        if id(t) in out:
            continue
        if isinstance(t, (TypeVar, IncompleteType)) and t in mapping:
            out[id(t)] = mapping[t]
            continue
        kids = type_children(t)
        if not ready and kids:
            stack.append((t, True))
            stack.extend((k, False) for k in kids)
            continue
        out[id(t)] = with_type_children(t, [out[id(k)] for k in kids])
    return out[id(ty)]


def with_type_children(t: Type, kids: list[Type]) -> Type:
    """``t`` rebuilt over new child types (``t`` itself when none changed)."""
    if isinstance(t, TupleType):
        return t if all(a is b for a, b in zip(kids, t.fields)) else TupleType(tuple(kids))
    if isinstance(t, FuncType):
        if all(a is b for a, b in zip(kids, type_children(t))):
            return t
        return FuncType(tuple(kids[:-1]), kids[-1], t.type_params)
    if isinstance(t, TypeCall):
        return t if all(a is b for a, b in zip(kids, t.args)) else TypeCall(t.func, tuple(kids))
    if isinstance(t, RefType):
        return t if kids[0] is t.value else RefType(kids[0])
    return t
