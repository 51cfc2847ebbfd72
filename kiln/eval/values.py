"""Run-time values of the reference interpreter besides numpy arrays and Python tuples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.ir.adt import Constructor
from kiln.ir.expr import Function, Var


@dataclass(eq=False)
class Closure:
    """A function value: the function and the values of its free variables."""

    func: Function
    env: dict[Var, Any] = field(repr=False)
    name: str | None = None

    def __repr__(self) -> str:
        return f"<closure {self.name or 'fn'}/{len(self.func.params)}>"


@dataclass(frozen=True, eq=False)
class ConstructorValue:
    """A value built by an ADT constructor, e.g. ``Cons(x, Nil)``."""

    constructor: Constructor
    fields: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        return self.constructor.name

    def __repr__(self) -> str:
        if not self.fields:
            return self.constructor.name
        inner = ", ".join(_short(f) for f in self.fields)
        return f"{self.constructor.name}({inner})"


@dataclass(eq=False)
class RefValue:
    """A mutable reference cell."""

    value: Any

    def __repr__(self) -> str:
        return f"ref({_short(self.value)})"


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return repr(v.item()) if v.ndim == 0 else f"<{v.dtype} {v.shape}>"
    return repr(v)


def adt_to_list(value: Any) -> list[Any]:
    """The elements of a `List` value built from ``Cons``/``Nil`` as a Python list."""
    out = []
    while isinstance(value, ConstructorValue) and value.fields:
        out.append(value.fields[0])
        value = value.fields[-1]
    return out
