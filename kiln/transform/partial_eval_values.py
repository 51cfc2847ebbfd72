"""The partial evaluator's values, residual scopes and static store.

A `PV` (partially static value) pairs what is known at compile time (its ``static`` part, or
None) with an atom of residual code that computes it at run time (``atom``). Static tensors,
tuples, constructor values and closures get their atom lazily, when residual code needs them
("reification"); references, globals and dynamic values have theirs from the start.

Residual code is collected in `Scope`s: one let-list per residual function body, ``if``
branch or ``match`` clause. A lazily reified value is bound in the scope where the value was
created, which is always still open: static values never outlive their scope (a residual
branch or function returns a dynamic atom, and the store and memo are rolled back after it).

The `Store` maps static references to what they hold. It rolls back after a residual
branch, forgets everything inside a residual function body, and forgets what unknown code
may change: the contents of references that have *escaped* (whose atom reached residual
code other than their own ``ref_read``/``ref_write`` in the function that created them).
"""

from __future__ import annotations

import builtins
import itertools
from typing import Any

import numpy as np

from kiln.errors import InternalError
from kiln.ir.adt import Constructor
from kiln.ir.expr import Constant, Expr, Function, GlobalVar, Let, Tuple, Var
from kiln.ir.ty import FuncType, Type, TypeVar, substitute, type_children

# --- static values --------------------------------------------------------------------------
#
# Each static value has an interned ``key`` (equal keys: the same static information, used to
# see a recursive call that makes no progress) and a ``size`` (a well-founded measure: a
# recursive call under unknown control flow is unrolled only while some argument shrinks).


class Static:
    __slots__ = ("key", "size")
    key: int  # equal keys mean equal values (see KeyTable)
    size: int  # how many values it holds, counted towards the fuel


class STensor(Static):
    """A tensor; its key is made only when asked for (most tensors never are)."""

    __slots__ = ("data", "table", "_key")

    def __init__(self, data: np.ndarray, table: KeyTable) -> None:
        self.data, self.table = data, table
        self._key = 0
        self.size = 1
        if data.ndim == 0 and data.dtype.kind in "iu":
            self.size += max(0, min(int(data), 1 << 40))  # a counter counts down to zero

    @property  # the key is read-only here: made when first asked for
    def key(self) -> int:  # type: ignore[override]
        if not self._key:
            self._key = self.table.tensor(self.data)
        return self._key


class STuple(Static):
    __slots__ = ("fields",)

    def __init__(self, fields: tuple[PV, ...], key: int) -> None:
        self.fields, self.key = fields, key
        self.size = 1 + sum(f.size for f in fields)


class SCtor(Static):
    """A value built by a constructor: ``Cons(x, xs)``."""

    __slots__ = ("ctor", "fields")

    def __init__(self, ctor: Constructor, fields: tuple[PV, ...], key: int) -> None:
        self.ctor, self.fields, self.key = ctor, fields, key
        self.size = 1 + sum(f.size for f in fields)


class SClosure(Static):
    """A function with the values of its free variables and the type substitution in force."""

    __slots__ = ("func", "env", "tsub", "name")

    def __init__(self, func: Function, env: dict[Var, PV], tsub: dict[Type, Type],
                 key: int, name: str) -> None:
        self.func, self.env, self.tsub, self.key, self.name = func, env, tsub, key, name
        self.size = 1


class SGlobal(Static):
    """A global function (its original definition)."""

    __slots__ = ("name", "func")

    def __init__(self, name: str, func: Function, key: int) -> None:
        self.name, self.func, self.key = name, func, key
        self.size = 1


class SCtorFn(Static):
    """A constructor used as a function value: ``@foldr(Cons, ...)``."""

    __slots__ = ("ctor",)

    def __init__(self, ctor: Constructor, key: int) -> None:
        self.ctor, self.key = ctor, key
        self.size = 1


class SRef(Static):
    """A reference cell created by the program being evaluated."""

    __slots__ = ("level", "escaped")

    def __init__(self, level: int, key: int) -> None:
        self.level, self.key = level, key
        self.escaped = False
        self.size = 1


class KeyTable:
    """Interns the static information of values as small integers (0: nothing known)."""

    def __init__(self) -> None:
        self.table: dict[tuple[Any, ...], int] = {}

    def __call__(self, *parts: Any) -> int:
        return self.table.setdefault(parts, len(self.table) + 1)

    def tensor(self, data: np.ndarray) -> int:
        if data.size <= 256:
            return self("T", data.dtype.name, data.shape, data.tobytes())
        return self("T#", id(data))


class PV:
    """A partially static value: static information (or None) and a residual atom."""

    __slots__ = ("static", "atom", "scope", "ty")

    def __init__(self, static: Static | None, atom: Expr | None = None,
                 scope: Scope | None = None, ty: Type | None = None) -> None:
        self.static = static
        self.atom = atom  # None until reified (static values only)
        self.scope = scope  # where a lazily reified atom is bound
        self.ty = ty  # the value's type where residual code cannot infer it (constructors)

    @property
    def key(self) -> int:
        return 0 if self.static is None else self.static.key

    @property
    def size(self) -> int:
        return 0 if self.static is None else self.static.size

    def __repr__(self) -> str:
        kind = type(self.static).__name__ if self.static is not None else "dynamic"
        return f"PV({kind}, {self.atom!r})"


def dynamic(atom: Expr) -> PV:
    return PV(None, atom)


UNIT_ATOM = Tuple(())


def is_atom(e: Expr) -> bool:
    return isinstance(e, (Var, Constant, GlobalVar, Constructor)) or (
        isinstance(e, Tuple) and not e.fields
    )


# --- invocations ------------------------------------------------------------------------


class Frame:
    """One invocation being evaluated: variable values, the values of nodes evaluated so far
    (graph form shares nodes), and the type substitution of an inlined polymorphic function."""

    __slots__ = ("env", "memo", "tsub", "forgotten")

    def __init__(self, env: dict[Var, PV], tsub: dict[Type, Type]) -> None:
        self.env = env
        self.memo: dict[int, PV] = {}
        self.tsub = tsub
        # Nodes first evaluated inside a residual branch: id -> the scope holding the branch.
        self.forgotten: dict[int, Scope] = {}


# --- residual scopes ------------------------------------------------------------------------

_level_ids = itertools.count(1)


class Scope:
    """A let-list of residual bindings: a function body, an ``if`` branch or a match clause.

    ``level`` names the residual function the scope belongs to (branches share their
    function's level); ``tvars`` are the type variables residual annotations may mention.
    """

    __slots__ = ("bindings", "open", "level", "tvars")

    def __init__(self, level: int, tvars: frozenset[TypeVar]) -> None:
        self.bindings: list[tuple[Var, Expr]] = []
        self.open = True
        self.level = level
        self.tvars = tvars

    @staticmethod
    def new_level() -> int:
        return next(_level_ids)

    def push(self, value: Expr, hint: str = "", ty: Type | None = None) -> Expr:
        """Bind ``value`` to a fresh variable (atoms are returned as they are)."""
        if is_atom(value):
            return value
        v = Var(hint or "v", ty)
        self.bind(v, value)
        return v

    def bind(self, v: Var, value: Expr) -> None:
        if not self.open:
            raise InternalError("partial-evaluate bound a value in a scope already closed")
        self.bindings.append((v, value))

    def close(self, result: Expr) -> Expr:
        """The scope as nested lets ending in ``result``."""
        self.open = False
        body = result
        for v, value in reversed(self.bindings):
            body = Let(v, value, body)
        return body


# --- the static store -----------------------------------------------------------------------

_epochs = itertools.count(1)


class Store:
    """What each static reference holds, as far as it is known here.

    An entry is valid while the epochs it was written in are current: ``all_epoch`` changes
    when everything is forgotten (a residual function body starts), ``esc_epoch`` when unknown
    code runs (it may change escaped references). Every change is logged so that a residual
    branch can be undone.
    """

    def __init__(self) -> None:
        self.entries: dict[SRef, tuple[PV, int, int]] = {}
        self.all_epoch = next(_epochs)
        self.esc_epoch = next(_epochs)
        self.log: list[tuple[SRef, tuple[PV, int, int] | None]] = []

    def get(self, ref: SRef) -> PV | None:
        entry = self.entries.get(ref)
        if entry is None or entry[1] != self.all_epoch:
            return None
        if ref.escaped and entry[2] != self.esc_epoch:
            return None
        return entry[0]

    def _put(self, ref: SRef, entry: tuple[PV, int, int] | None) -> None:
        self.log.append((ref, self.entries.get(ref)))
        if entry is None:
            self.entries.pop(ref, None)
        else:
            self.entries[ref] = entry

    def set(self, ref: SRef, value: PV) -> None:
        self._put(ref, (value, self.all_epoch, self.esc_epoch))

    def forget(self, ref: SRef) -> None:
        if ref in self.entries:
            self._put(ref, None)

    def escape(self, ref: SRef) -> None:
        """``ref`` reached residual code: from now on unknown code may change it."""
        if ref.escaped:
            return
        known = self.get(ref)
        ref.escaped = True
        if known is not None:  # nothing unknown could touch it until now
            self.set(ref, known)

    def unknown_effect(self) -> None:
        """Unknown code ran: forget what escaped references hold."""
        self.esc_epoch = next(_epochs)

    def forget_all(self) -> None:
        self.all_epoch = next(_epochs)

    def mark(self) -> tuple[int, int, int]:
        return len(self.log), self.all_epoch, self.esc_epoch

    # (builtins.set: in this class body, `set` is the method above)
    def rollback(self, mark: tuple[int, int, int]) -> tuple[builtins.set[SRef], bool]:
        """Undo back to ``mark``; the references changed since, and whether unknown code ran."""
        n, all_epoch, esc_epoch = mark
        changed: set[SRef] = set()
        while len(self.log) > n:
            ref, old = self.log.pop()
            changed.add(ref)
            if old is None:
                self.entries.pop(ref, None)
            else:
                self.entries[ref] = old
        unknown = self.esc_epoch != esc_epoch
        self.all_epoch, self.esc_epoch = all_epoch, esc_epoch
        return changed, unknown


# --- types of residual code -----------------------------------------------------------------


def free_type_vars(ty: Type) -> set[TypeVar]:
    out: set[TypeVar] = set()
    stack: list[tuple[Type, frozenset[TypeVar]]] = [(ty, frozenset())]
    while stack:
        t, bound = stack.pop()
        if isinstance(t, TypeVar):
            if t not in bound:
                out.add(t)
            continue
        if isinstance(t, FuncType) and t.type_params:
            bound = bound | frozenset(t.type_params)
        stack.extend((k, bound) for k in type_children(t))
    return out


def residual_type(ty: Type | None, tsub: dict[Type, Type], allowed: frozenset[TypeVar]
                  ) -> Type | None:
    """``ty`` (a type of the input program) in residual terms, or None when it mentions a
    type variable the residual code cannot name."""
    if ty is None:
        return None
    out = substitute(ty, tsub) if tsub else ty
    return out if free_type_vars(out) <= allowed else None


def match_types(pattern: Type, actual: Type, tvars: frozenset[TypeVar],
                allowed: frozenset[TypeVar], out: dict[Type, Type]) -> None:
    """Bind the type variables ``tvars`` of ``pattern`` to the parts of ``actual`` they stand
    for, where those mention only ``allowed`` type variables (where the two shapes disagree,
    nothing is bound)."""
    stack = [(pattern, actual)]
    while stack:
        p, a = stack.pop()
        if isinstance(p, TypeVar):
            if p in tvars and p not in out and free_type_vars(a) <= allowed:
                out[p] = a
            continue
        if type(p) is not type(a):
            continue
        kids_p, kids_a = type_children(p), type_children(a)
        if len(kids_p) == len(kids_a):
            stack.extend(zip(kids_p, kids_a))
