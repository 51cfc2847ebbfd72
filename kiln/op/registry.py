"""The operator registry: an operator is data, and all its rules stand together.

Each family file (`elementwise.py`, `reduce.py`, `shape.py`, `nn.py`, ...) registers its
operators with `register`, giving for each one, side by side:

- ``inputs``: the names of its arguments (for messages), ``attrs``: its attribute schema, and
  ``attrs_type``: the typed `Attrs` subclass its calls carry (see `kiln/ir/attrs.py`), which its
  relation, compute, gradient and lowering read as ``attrs.axis`` with a known type;
- ``relation``: a type relation ``(arg_types, attrs) -> result type``, or ``None`` while the
  argument types are not yet known (TVM's `TypeRelation`; see `kiln/op/common.py`);
- ``compute``: its numpy reference ``(arrays, attrs) -> array or tuple of arrays``;
- ``pattern``: its fusion pattern kind (Relay's `TOpPattern`);
- later, its gradient and its lowering to loops.

`register` returns the `OpDef`, which is also the builder: ``kiln.op.nn.relu(x)`` makes the call.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from kiln.errors import Error, Span
from kiln.ir.attrs import Attrs, freeze_attr
from kiln.ir.expr import Call, Expr, Op, as_expr
from kiln.ir.ty import Type, as_dtype


class OpPattern(enum.IntEnum):
    """How an operator may fuse with its neighbours (Relay's TOpPattern, same values)."""

    ELEMWISE = 0  # out[i] depends on in[i] of every input, same shape
    BROADCAST = 1  # elementwise with broadcasting
    INJECTIVE = 2  # each output element reads some input elements (reshape, take, concat)
    COMM_REDUCE = 3  # a commutative reduction (sum, max)
    OUT_ELEMWISE_FUSABLE = 4  # complex (conv2d, dense) but may absorb elementwise epilogues
    TUPLE = 7  # makes or takes apart a tuple
    OPAQUE = 8  # fuses with nothing


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Attr:
    """One attribute of an operator: name, default, and the kind of value it takes.

    Kinds: ``int``, ``float``, ``bool``, ``str``, ``dtype`` (a dtype name, or "" for
    "same as the input"), ``ints`` (a tuple of ints; one int is accepted), ``floats``,
    ``int_or_ints``, and ``any``. ``optional=True`` also admits None. ``convert``, when
    given, runs after the kind check to normalize the value (e.g. padding to 4 numbers).
    """

    name: str
    default: Any = REQUIRED
    kind: str = "any"
    optional: bool = False
    convert: Callable[[Any, str], Any] | None = None
    doc: str = ""

    def check(self, value: Any, op: str) -> Any:
        """The value, validated and normalized; a kiln.Error naming the op otherwise."""
        where = f"{op}: attribute {self.name}"
        value = freeze_attr(value, where)
        if value is None:
            if self.optional or self.default is None:
                return None
            raise Error(f"{where} must not be None")
        value = _KIND_CHECKS[self.kind](value, where)
        if self.convert is not None:
            value = self.convert(value, where)
        return value


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Error(f"{where} must be an integer, got {v!r}")
    return v


def _float(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Error(f"{where} must be a number, got {v!r}")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise Error(f"{where} must be True or False, got {v!r}")


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise Error(f"{where} must be a string, got {v!r}")
    return v


def _dtype(v: Any, where: str) -> str:
    v = _str(v, where)
    if v == "":
        return v
    try:
        return as_dtype(v)
    except Error as e:
        raise Error(f"{where}: {e.message}") from None


def _ints(v: Any, where: str) -> tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,)
    if not isinstance(v, tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    ):
        raise Error(f"{where} must be a list of integers, got {v!r}")
    return v


def _floats(v: Any, where: str) -> tuple[float, ...]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (float(v),)
    if not isinstance(v, tuple) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in v
    ):
        raise Error(f"{where} must be a list of numbers, got {v!r}")
    return tuple(float(x) for x in v)


def _int_or_ints(v: Any, where: str) -> int | tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return _ints(v, where)


_KIND_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "int": _int,
    "float": _float,
    "bool": _bool,
    "str": _str,
    "dtype": _dtype,
    "ints": _ints,
    "floats": _floats,
    "int_or_ints": _int_or_ints,
    "any": lambda v, where: v,
}

Relation = Callable[..., Type | None]
A = TypeVar("A", bound=Attrs)


@dataclass(frozen=True, eq=False)
class OpDef:
    """Everything kiln knows about one operator. Calling it builds a call expression."""

    name: str
    inputs: tuple[str, ...]
    attrs: tuple[Attr, ...]
    relation: Relation
    # (arrays, attrs) -> array or tuple of arrays; attrs is an `attrs_type`.
    compute: Callable[[list[Any], Any], Any]
    pattern: OpPattern
    attrs_type: type[Attrs] = Attrs
    doc: str = ""
    # The relation also receives the argument values that are constants (arange's bounds).
    needs_values: bool = False
    differentiable: bool = True
    gradient: Callable[..., Any] | None = None
    lower: Callable[..., Any] | None = None
    # Runs on the host: the VM runs ``compute`` on the arrays (its result's shape is data;
    # kiln/op/dyn.py). Fusion leaves it alone and it has no lowering to loops.
    host: bool = False
    _attr_index: dict[str, Attr] = field(init=False, repr=False)
    _defaults: dict[str, Any] = field(init=False, repr=False)
    _default_attrs: Attrs | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        declared = self.attrs_type.declared()
        if self.attrs_type is not Attrs and set(declared) != {a.name for a in self.attrs}:
            raise Error(
                f"compiler bug: {self.name}'s {self.attrs_type.__name__} declares "
                f"{', '.join(declared) or 'nothing'} but its schema has "
                f"{', '.join(a.name for a in self.attrs) or 'nothing'}"
            )
        object.__setattr__(self, "_attr_index", {a.name: a for a in self.attrs})
        # Defaults in normalized form, so normalizing twice changes nothing.
        defaults = {a.name: a.check(a.default, self.name) for a in self.attrs
                    if a.default is not REQUIRED}
        object.__setattr__(self, "_defaults", defaults)
        # Most calls give no attributes: share one normalized Attrs for them.
        complete = len(defaults) == len(self.attrs)
        object.__setattr__(self, "_default_attrs",
                           self.attrs_type(defaults) if complete else None)

    @property
    def op(self) -> Op:
        """The `Op` expression naming this operator."""
        return Op(self.name)

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def attr(self, name: str) -> Attr:
        return self._attr_index[name]

    def normalize_attrs(self, given: Mapping[str, Any], span: Span | None = None) -> Attrs:
        """Every attribute of the op: given values checked, the rest filled with defaults."""
        if not given and self._default_attrs is not None:
            return self._default_attrs
        unknown = [k for k in given if k not in self._attr_index]
        if unknown:
            valid = ", ".join(a.name for a in self.attrs) or "none"
            hint = difflib.get_close_matches(unknown[0], list(self._attr_index), n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise Error(
                f"{self.name} has no attribute {unknown[0]!r}{suggestion}; its attributes: {valid}",
                span,
            )
        values: dict[str, Any] = {}
        for a in self.attrs:
            if a.name in given:
                try:
                    values[a.name] = a.check(given[a.name], self.name)
                except Error as e:
                    raise Error(e.message, span) from None
            elif a.default is REQUIRED:
                raise Error(f"{self.name} needs attribute {a.name!r}", span)
            else:
                values[a.name] = self._defaults[a.name]
        return self.attrs_type(values)

    def non_default_attrs(self, attrs: Attrs) -> dict[str, Any]:
        """The attributes that differ from their defaults, in schema order (for printing)."""
        out = {}
        for a in self.attrs:
            if a.name in attrs and (
                a.default is REQUIRED or attrs[a.name] != self._defaults[a.name]
            ):
                out[a.name] = attrs[a.name]
        return out

    def __call__(self, *args: object, **attrs: object) -> Call:
        if len(args) != len(self.inputs):
            raise Error(
                f"{self.name} takes {len(self.inputs)} argument(s) "
                f"({', '.join(self.inputs)}), got {len(args)}"
            )
        exprs: tuple[Expr, ...] = tuple(as_expr(a) for a in args)
        return Call(Op(self.name), exprs, self.normalize_attrs(attrs))

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


_REGISTRY: dict[str, OpDef] = {}


@overload
def register(
    name: str,
    *,
    inputs: tuple[str, ...],
    relation: Relation,
    compute: Callable[[list[Any], A], Any],
    pattern: OpPattern,
    attrs_type: type[A],
    attrs: tuple[Attr, ...] | list[Attr] = (),
    doc: str = "",
    needs_values: bool = False,
    differentiable: bool = True,
    gradient: Callable[..., Any] | None = None,
    lower: Callable[..., Any] | None = None,
    host: bool = False,
) -> OpDef: ...


@overload
def register(
    name: str,
    *,
    inputs: tuple[str, ...],
    relation: Relation,
    compute: Callable[[list[Any], Attrs], Any],
    pattern: OpPattern,
    attrs: tuple[Attr, ...] | list[Attr] = (),
    doc: str = "",
    needs_values: bool = False,
    differentiable: bool = True,
    gradient: Callable[..., Any] | None = None,
    lower: Callable[..., Any] | None = None,
    host: bool = False,
) -> OpDef: ...


def register(
    name: str,
    *,
    inputs: tuple[str, ...],
    relation: Relation,
    compute: Callable[[list[Any], Any], Any],
    pattern: OpPattern,
    attrs_type: type[Attrs] = Attrs,
    attrs: tuple[Attr, ...] | list[Attr] = (),
    doc: str = "",
    needs_values: bool = False,
    differentiable: bool = True,
    gradient: Callable[..., Any] | None = None,
    lower: Callable[..., Any] | None = None,
    host: bool = False,
) -> OpDef:
    """Add an operator to the registry and return its definition (which is its builder).

    ``attrs_type`` is the typed `Attrs` subclass of its calls; it must annotate exactly the
    attributes of the schema ``attrs``.
    """
    if name in _REGISTRY:
        raise Error(f"operator {name} is registered twice")
    opdef = OpDef(
        name=name,
        inputs=tuple(inputs),
        attrs=tuple(attrs),
        relation=relation,
        compute=compute,
        pattern=pattern,
        attrs_type=attrs_type,
        doc=doc,
        needs_values=needs_values,
        differentiable=differentiable,
        gradient=gradient,
        lower=lower,
        host=host,
    )
    _REGISTRY[name] = opdef
    return opdef


def get(name: str, span: Span | None = None) -> OpDef:
    """The definition of an operator by name; a kiln.Error suggesting a near name otherwise."""
    opdef = _REGISTRY.get(name)
    if opdef is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise Error(f"unknown operator {name}{hint}", span)
    return opdef


def lookup(name: str) -> OpDef | None:
    """The definition of an operator, or None."""
    return _REGISTRY.get(name)


def all_ops() -> list[OpDef]:
    """Every registered operator, in registration order."""
    return list(_REGISTRY.values())
