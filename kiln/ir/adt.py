"""Algebraic data types: type definitions, constructors and the patterns that take them apart.

```
type List[A] { Cons(A, List[A]), Nil }
```
is ``TypeData(List, (A,), (Cons, Nil))`` where ``Cons = Constructor("Cons", (A, List[A]), List)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import Error, Span
from kiln.ir.expr import Expr, Var
from kiln.ir.ty import FuncType, GlobalTypeVar, Type, TypeCall, TypeVar


@dataclass(frozen=True, slots=True, eq=False)
class Constructor(Expr):
    """A constructor of an ADT; an expression that can be called (or passed as a function).

    Constructors compare by their name and the name of the type they belong to.
    """

    name: str
    inputs: tuple[Type, ...]
    belong_to: GlobalTypeVar

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Constructor)
            and other.name == self.name
            and other.belong_to == self.belong_to
        )

    def __hash__(self) -> int:
        return hash(("Constructor", self.belong_to.name, self.name))

    def __repr__(self) -> str:
        return f"Constructor({self.name} of {self.belong_to.name})"


@dataclass(frozen=True, slots=True, eq=False)
class TypeData:
    """The definition of an ADT: its name, type parameters and constructors."""

    header: GlobalTypeVar
    type_vars: tuple[TypeVar, ...]
    constructors: tuple[Constructor, ...]
    span: Span | None = field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "type_vars", tuple(self.type_vars))
        object.__setattr__(self, "constructors", tuple(self.constructors))
        seen = set()
        for c in self.constructors:
            if c.belong_to != self.header:
                raise Error(
                    f"constructor {c.name} belongs to {c.belong_to.name}, not {self.header.name}"
                )
            if c.name in seen:
                raise Error(f"type {self.header.name} defines constructor {c.name} twice", c.span)
            seen.add(c.name)

    def constructor_type(self, ctor: Constructor) -> FuncType:
        """The polymorphic function type of a constructor: ``fn[A](A, List[A]) -> List[A]``."""
        result = TypeCall(self.header, self.type_vars)
        return FuncType(ctor.inputs, result, self.type_vars)


class Pattern:
    """Base of the patterns of a match clause."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False)
class PatternWildcard(Pattern):
    """``_``: matches anything, binds nothing."""

    span: Span | None = field(default=None, kw_only=True, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class PatternVar(Pattern):
    """``%x``: matches anything and binds it."""

    var: Var
    span: Span | None = field(default=None, kw_only=True, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class PatternConstructor(Pattern):
    """``Cons(p1, p2)``: matches a value built by the constructor, then its fields."""

    constructor: Constructor
    patterns: tuple[Pattern, ...] = ()
    span: Span | None = field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "patterns", tuple(self.patterns))


@dataclass(frozen=True, slots=True, eq=False)
class PatternTuple(Pattern):
    """``(p1, p2)``: matches a tuple field by field."""

    patterns: tuple[Pattern, ...]
    span: Span | None = field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "patterns", tuple(self.patterns))


def pattern_children(p: Pattern) -> tuple[Pattern, ...]:
    """The sub-patterns directly inside ``p``."""
    if isinstance(p, (PatternConstructor, PatternTuple)):
        return p.patterns
    return ()


def pattern_vars(p: Pattern) -> list[Var]:
    """The variables a pattern binds, left to right."""
    out: list[Var] = []
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, PatternVar):
            out.append(q.var)
        stack.extend(reversed(pattern_children(q)))
    return out
