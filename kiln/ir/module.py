"""IRModule: the global functions and type definitions of a program."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from kiln.errors import Error
from kiln.ir.adt import Constructor, TypeData
from kiln.ir.expr import Expr, Function, GlobalVar
from kiln.ir.ty import GlobalTypeVar


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class IRModule:
    """Global functions (``@name``) and ADT definitions. Immutable: updates return new modules.

    ``mod["main"]`` is the function named ``main``; ``mod.get_constructor("Cons")`` a constructor.
    """

    __slots__ = ("functions", "type_definitions", "_constructors", "_typed")
    functions: Mapping[GlobalVar, Function]
    type_definitions: Mapping[GlobalTypeVar, TypeData]
    _constructors: dict[str, Constructor]
    _typed: bool

    def __init__(
        self,
        functions: (
            Mapping[GlobalVar, Function] | Mapping[str, Function]
            | Mapping[GlobalVar | str, Function] | None
        ) = None,
        type_definitions: (
            Mapping[GlobalTypeVar, TypeData] | Mapping[str, TypeData]
            | Mapping[GlobalTypeVar | str, TypeData] | Iterable[TypeData] | None
        ) = None,
    ) -> None:
        funcs: dict[GlobalVar, Function] = {}
        for key, fn in (functions or {}).items():
            gv = key if isinstance(key, GlobalVar) else GlobalVar(str(key))
            if not isinstance(fn, Function):
                raise Error(f"global @{gv.name} must be a kiln.Function, got {type(fn).__name__}")
            funcs[gv] = fn
        tdefs: dict[GlobalTypeVar, TypeData] = {}
        items: Iterable[TypeData]
        if isinstance(type_definitions, Mapping):
            items = type_definitions.values()
        else:
            items = type_definitions or ()
        ctors: dict[str, Constructor] = {}
        for td in items:
            if not isinstance(td, TypeData):
                raise Error(f"a type definition must be a kiln.TypeData, got {type(td).__name__}")
            if td.header in tdefs:
                raise Error(f"type {td.header.name} is defined twice", td.span)
            tdefs[td.header] = td
            for c in td.constructors:
                if c.name in ctors:
                    raise Error(f"constructor {c.name} is defined by two types", c.span)
                ctors[c.name] = c
        object.__setattr__(self, "functions", MappingProxyType(funcs))
        object.__setattr__(self, "type_definitions", MappingProxyType(tdefs))
        object.__setattr__(self, "_constructors", ctors)
        object.__setattr__(self, "_typed", False)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("IRModule is immutable; use with_function / with_type_definition")

    # --- lookup ---------------------------------------------------------------------------

    def __getitem__(self, key: str | GlobalVar) -> Function:
        name = key.name if isinstance(key, GlobalVar) else key
        fn = self.functions.get(GlobalVar(name))
        if fn is None:
            names = [g.name for g in self.functions]
            raise Error(f"the module has no global function @{name}{_did_you_mean(name, names)}")
        return fn

    def __contains__(self, key: object) -> bool:
        name = key.name if isinstance(key, (GlobalVar, GlobalTypeVar)) else key
        if isinstance(key, GlobalTypeVar):
            return key in self.type_definitions
        return GlobalVar(str(name)) in self.functions

    def __iter__(self) -> Iterator[GlobalVar]:
        return iter(self.functions)

    def __len__(self) -> int:
        return len(self.functions)

    def get_global_var(self, name: str) -> GlobalVar:
        """The GlobalVar of a function by name."""
        for gv in self.functions:
            if gv.name == name:
                return gv
        names = [g.name for g in self.functions]
        raise Error(f"the module has no global function @{name}{_did_you_mean(name, names)}")

    @property
    def global_vars(self) -> list[GlobalVar]:
        return list(self.functions)

    @property
    def constructors(self) -> Mapping[str, Constructor]:
        """Every constructor of every type definition, by name."""
        return MappingProxyType(self._constructors)

    def get_constructor(self, name: str) -> Constructor:
        try:
            return self._constructors[name]
        except KeyError:
            hint = _did_you_mean(name, self._constructors)
            raise Error(f"the module has no constructor {name}{hint}") from None

    def type_data(self, header: GlobalTypeVar | str) -> TypeData:
        """The definition of an ADT by its GlobalTypeVar or name."""
        key = header if isinstance(header, GlobalTypeVar) else GlobalTypeVar(header)
        td = self.type_definitions.get(key)
        if td is None:
            names = [t.name for t in self.type_definitions]
            raise Error(f"the module has no type {key.name}{_did_you_mean(key.name, names)}")
        return td

    @property
    def is_typed(self) -> bool:
        """True for modules returned by `kiln.infer_types`."""
        return self._typed

    # --- functional updates ---------------------------------------------------------------

    def with_function(self, key: str | GlobalVar, fn: Function) -> IRModule:
        """A copy of the module with ``@key`` defined (or replaced) as ``fn``."""
        gv = key if isinstance(key, GlobalVar) else GlobalVar(key)
        funcs = dict(self.functions)
        funcs[gv] = fn
        return IRModule(funcs, self.type_definitions)

    def with_type_definition(self, td: TypeData) -> IRModule:
        """A copy of the module with one more ADT."""
        tdefs = dict(self.type_definitions)
        tdefs[td.header] = td
        return IRModule(self.functions, tdefs)

    @staticmethod
    def from_expr(
        expr: Expr,
        mod: IRModule | None = None,
        type_definitions: Iterable[TypeData] | None = None,
    ) -> IRModule:
        """A module whose ``@main`` is ``expr`` (a Function, or any expression over free vars).

        The globals and type definitions of ``mod``, when given, are kept beside it.
        """
        from kiln.ir.traverse import free_vars

        if not isinstance(expr, Function):
            expr = Function(tuple(free_vars(expr)), expr)
        funcs = dict(mod.functions) if mod is not None else {}
        tdefs = dict(mod.type_definitions) if mod is not None else {}
        for td in type_definitions or ():
            tdefs[td.header] = td
        funcs[GlobalVar("main")] = expr
        return IRModule(funcs, tdefs)

    def _mark_typed(self) -> IRModule:
        object.__setattr__(self, "_typed", True)
        return self

    def __str__(self) -> str:
        from kiln.text.printer import astext

        return astext(self)

    def __repr__(self) -> str:
        names = ", ".join("@" + g.name for g in self.functions)
        types = ", ".join(t.name for t in self.type_definitions)
        return f"IRModule(functions=[{names}], types=[{types}])"
