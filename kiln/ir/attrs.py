"""Attributes of operator calls and functions: an immutable, hashable mapping.

An operator with attributes declares a typed subclass next to its rules (xDSL's ``prop_def``)::

    class ConcatenateAttrs(Attrs):
        __slots__ = ()
        axis: int

The annotations only tell the type checker what ``attrs.axis`` holds; the values live in the
same mapping as for any `Attrs`, so equality, hashing and printing do not depend on the class.
`OpDef.normalize_attrs` (and so every builder) makes calls with the operator's class, checks each
value against the schema, and `register` checks that the annotations name the schema's attributes.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Self

import numpy as np

from kiln.errors import Error

AttrValue = object  # None, bool, int, float, str, or a (nested) tuple of those


def freeze_attr(value: object, name: str = "attribute") -> AttrValue:
    """Normalize an attribute value: lists become tuples, numpy scalars Python scalars."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return freeze_attr(value.tolist(), name)
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v, name) for v in value)
    raise Error(f"{name}: unsupported attribute value {value!r} of type {type(value).__name__}")


class Attrs(Mapping[str, AttrValue]):
    """Named attribute values; read as ``attrs["axis"]`` or ``attrs.axis``."""

    __slots__ = ("_items", "_hash")
    _items: dict[str, AttrValue]
    _hash: int | None

    def __init__(self, items: Mapping[str, object] | None = None, **kwargs: object) -> None:
        merged = dict(items or {})
        merged.update(kwargs)
        object.__setattr__(self, "_items", {k: freeze_attr(v, k) for k, v in merged.items()})
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: str) -> AttrValue:
        return self._items[key]

    def __getattr__(self, key: str) -> AttrValue:
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Attrs are immutable")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        return isinstance(other, Mapping) and self._items == dict(other)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(sorted(self._items.items()))))
        assert self._hash is not None
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"Attrs({inner})"

    def with_(self, **changes: object) -> Self:
        """A copy with some values replaced (of the same typed class)."""
        return type(self)(self._items, **changes)

    @classmethod
    def view(cls, attrs: Attrs) -> Self:
        """``attrs`` read through this typed class.

        Calls made by an operator's builder already carry its class; a call put together by hand
        from a plain mapping gets the same values re-wrapped (the values are not re-checked).
        """
        if isinstance(attrs, cls):
            return attrs
        return cls(attrs._items)

    @classmethod
    def declared(cls) -> tuple[str, ...]:
        """The attribute names this class annotates (its own and its bases' below Attrs)."""
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            if issubclass(klass, Attrs) and klass is not Attrs:
                names.extend(n for n in inspect.get_annotations(klass)
                             if not n.startswith("_") and n not in names)
        return tuple(names)


EMPTY_ATTRS = Attrs()
