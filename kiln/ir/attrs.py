"""Attributes of operator calls and functions: an immutable, hashable mapping."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

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
        return self._hash  # type: ignore[return-value]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"Attrs({inner})"

    def with_(self, **changes: object) -> Attrs:
        """A copy with some values replaced."""
        return Attrs(self._items, **changes)


EMPTY_ATTRS = Attrs()
