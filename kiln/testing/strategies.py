"""Hypothesis strategies for kiln programs.

`modules()` draws well-formed (well-scoped, not necessarily well-typed) modules that use every
construct of the language: lets (recursive ones too), sequencing, dataflow sharing within and
across scopes, tuples and projections, conditionals, closures and calls, operator calls with
drawn attributes, constants of every dtype (scalars and arrays, NaN and infinities included),
algebraic data types with matches and nested patterns, references, type annotations with type
parameters, and awkward variable names. It is meant for properties such as
``structural_equal(parse(astext(m)), m)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kiln.errors import Error
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TypeData,
)
from kiln.ir.attrs import Attrs
from kiln.ir.expr import (
    Call,
    Clause,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.ty import (
    ANY,
    DTYPES,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
)
from kiln.op import registry

__all__ = ["constants", "modules", "types", "VAR_NAMES"]

# Variable names a printer must cope with: clashes, keywords, digits, spaces, punctuation.
VAR_NAMES = ("x", "x", "y", "x1", "data", "_", "", "0", "1x", "let", "fn", "True", "my var",
             "a-b", "w/b", "%", "é", "inff", "p0")
TYPE_VAR_NAMES = ("A", "B", "A", "T", "float32", "Tensor", "List", "_", "fn", "a b", "int8x4")
ATTR_KEYS = ("Primitive", "Inline", "Compiler", "global_symbol", "relay.reshape_only", "n")
_STR = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
_FLOAT = st.floats(allow_nan=False, width=64)


@st.composite
def types(draw: st.DrawFn, depth: int = 2) -> Type:
    """A closed type (no free type variables)."""
    return _Gen(draw, depth, [], {}).type(_Env(), depth)


@st.composite
def constants(draw: st.DrawFn) -> Constant:
    """A constant of any kiln dtype: scalars and small arrays, NaN and infinities included."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.one_of(st.just(()), hnp.array_shapes(min_dims=1, max_dims=3, min_side=0,
                                                         max_side=3)))
    return Constant(draw(hnp.arrays(np.dtype(dtype), shape)))


@st.composite
def modules(draw: st.DrawFn, max_depth: int = 3, max_functions: int = 3) -> IRModule:
    """A well-scoped module: ADTs, global functions and every kind of expression."""
    adts = _adts(draw)
    names = ["main"] + [f"f{i}" for i in range(draw(st.integers(0, max_functions - 1)))]
    gen = _Gen(draw, max_depth, adts, {n: GlobalVar(n) for n in names})
    functions = {name: gen.function(_Env(), max_depth, top=True) for name in names}
    return IRModule(functions, adts)


def _adts(draw: st.DrawFn) -> list[TypeData]:
    out: list[TypeData] = []
    lst = GlobalTypeVar("List")
    a = TypeVar("A")
    out.append(TypeData(lst, (a,), (Constructor("Cons", (a, TypeCall(lst, (a,))), lst),
                                   Constructor("Nil", (), lst))))
    if draw(st.booleans()):
        opt = GlobalTypeVar("Option")
        b = TypeVar("A")
        out.append(TypeData(opt, (b,), (Constructor("Some", (b,), opt),
                                        Constructor("None", (), opt))))
    if draw(st.booleans()):
        pair = GlobalTypeVar("Pair")
        k, v = TypeVar("K"), TypeVar("float32")
        ins = (k, TupleType((v, TypeCall(lst, (k,)))), FuncType((k,), v))
        out.append(TypeData(pair, (k, v), (Constructor("MkPair", ins, pair),)))
    if draw(st.booleans()):
        color = GlobalTypeVar("Color")
        out.append(TypeData(color, (), (Constructor("Red", (), color),
                                        Constructor("Green", (TensorType((2, 2), "int8"),),
                                                    color))))
    if draw(st.booleans()):
        out.append(TypeData(GlobalTypeVar("Empty"), (TypeVar("A"),), ()))
    return out


@dataclass
class _Env:
    """What is in scope: variables, type variables, and expressions that may be shared."""

    vars: list[Var] = field(default_factory=list)
    tvars: list[TypeVar] = field(default_factory=list)
    pool: list[Expr] = field(default_factory=list)

    def child(self, vars: Sequence[Var] = (), tvars: Sequence[TypeVar] = ()) -> _Env:
        return _Env(self.vars + list(vars), self.tvars + list(tvars), list(self.pool))


class _Gen:
    def __init__(
        self, draw: st.DrawFn, depth: int, adts: list[TypeData], globals_: dict[str, GlobalVar]
    ) -> None:
        self.draw = draw
        self.adts = adts
        self.globals = list(globals_.values())
        self.ctors = [c for td in adts for c in td.constructors]
        ops = sorted(registry.all_ops(), key=lambda o: o.name)
        self.ops = ops

    # --- small pieces ---------------------------------------------------------------------

    def var(self, env: _Env) -> Var:
        name = self.draw(st.sampled_from(VAR_NAMES))
        annotation = self.type(env, 1) if self.draw(st.booleans()) else None
        return Var(name, annotation)

    def tvars(self) -> list[TypeVar]:
        n = self.draw(st.integers(0, 2))
        return [TypeVar(self.draw(st.sampled_from(TYPE_VAR_NAMES))) for _ in range(n)]

    def type(self, env: _Env, depth: int) -> Type:
        draw = self.draw
        choices = ["tensor", "tensor", "incomplete"]
        if env.tvars:
            choices += ["tvar", "tvar"]
        if depth > 0:
            choices += ["tuple", "func", "ref"]
            if self.adts:
                choices.append("adt")
        kind = draw(st.sampled_from(choices))
        if kind == "tensor":
            dims = draw(st.lists(st.one_of(st.integers(0, 64), st.just(ANY),
                                           st.sampled_from([SymDim("n"), SymDim("batch")])),
                                 max_size=3))
            return TensorType(tuple(dims), draw(st.sampled_from(DTYPES)))
        if kind == "incomplete":
            return IncompleteType()
        if kind == "tvar":
            return draw(st.sampled_from(env.tvars))
        if kind == "tuple":
            n = draw(st.integers(0, 3))
            return TupleType(tuple(self.type(env, depth - 1) for _ in range(n)))
        if kind == "func":
            params = self.tvars() if draw(st.booleans()) else []
            inner = env.child(tvars=params)
            args = tuple(self.type(inner, depth - 1) for _ in range(draw(st.integers(0, 2))))
            return FuncType(args, self.type(inner, depth - 1), tuple(params))
        if kind == "ref":
            return RefType(self.type(env, depth - 1))
        td = draw(st.sampled_from(self.adts))
        return TypeCall(td.header, tuple(self.type(env, depth - 1) for _ in td.type_vars))

    def constant(self) -> Constant:
        return self.draw(constants())

    def attr_value(self, depth: int = 1) -> Any:
        options = [st.none(), st.booleans(), st.integers(-(2**40), 2**40), _FLOAT, _STR]
        value = self.draw(st.one_of(*options)) if depth == 0 or self.draw(st.booleans()) else None
        if depth > 0 and value is None and self.draw(st.booleans()):
            return tuple(self.attr_value(depth - 1) for _ in range(self.draw(st.integers(0, 3))))
        return value

    def op_attrs(self, opdef: registry.OpDef) -> Attrs | None:
        draw = self.draw
        given: dict[str, Any] = {}
        for a in opdef.attrs:
            if a.default is not registry.REQUIRED and not draw(st.booleans()):
                continue
            given[a.name] = draw(_attr_strategy(a))
        try:
            return opdef.normalize_attrs(given)
        except (Error, TypeError, ValueError):  # drawn values an operator rejects
            try:
                return opdef.normalize_attrs({})
            except Error:
                return None

    # --- expressions ----------------------------------------------------------------------

    def function(self, env: _Env, depth: int, top: bool = False) -> Function:
        draw = self.draw
        tparams = self.tvars() if draw(st.integers(0, 3)) == 0 else []
        inner = env.child(tvars=tparams)
        params = [self.var(inner) for _ in range(draw(st.integers(0, 3)))]
        inner = inner.child(vars=params)
        ret = self.type(inner, 1) if draw(st.booleans()) else None
        attrs: dict[str, Any] = {}
        if not top and draw(st.integers(0, 3)) == 0:
            attrs = {draw(st.sampled_from(ATTR_KEYS)): self.attr_value()}
        body = self.expr(inner, depth)
        return Function(tuple(params), body, ret, tuple(tparams), Attrs(attrs))

    def expr(self, env: _Env, depth: int) -> Expr:
        draw = self.draw
        leaves = ["var", "const", "global", "unit", "ctor0"]
        if env.pool:
            leaves += ["shared", "shared"]
        kinds = list(leaves)
        if depth > 0:
            kinds += ["let", "let", "seq", "graph", "tuple", "proj", "if", "fn", "call",
                      "op", "op", "match", "ref", "ctor", "rec"]
        kind = draw(st.sampled_from(kinds))
        e = self._make(kind, env, depth)
        if not isinstance(e, (Var, GlobalVar, Constant, Op, Constructor)):
            env.pool.append(e)
        return e

    def _make(self, kind: str, env: _Env, depth: int) -> Expr:
        draw = self.draw
        sub = depth - 1
        if kind == "var":
            if env.vars:
                return draw(st.sampled_from(env.vars))
            kind = "const"
        if kind == "const":
            return self.constant()
        if kind == "global":
            return draw(st.sampled_from(self.globals))
        if kind == "unit":
            return Tuple(())
        if kind == "ctor0":
            nullary = [c for c in self.ctors if not c.inputs]
            withargs = [c for c in self.ctors if c.inputs]
            if draw(st.booleans()) or not withargs:
                return Call(draw(st.sampled_from(nullary)), ())
            return draw(st.sampled_from(withargs))  # a constructor as a function value
        if kind == "shared":
            return draw(st.sampled_from(env.pool))
        if kind in ("let", "seq", "rec"):
            if kind == "seq":
                v = Var(draw(st.sampled_from(["_", ""])))
            else:
                v = self.var(env)
            if kind == "rec":  # a recursive closure: the function refers to its own name
                value: Expr = self.function(env.child(vars=[v]), sub)
            else:
                value = self.expr(env, sub)
            body = self.expr(env.child(vars=[] if kind == "seq" else [v]), sub)
            return Let(v, value, body)
        if kind == "graph":
            # one value used twice: a dataflow graph with sharing
            shared = self.expr(env, sub)
            return Tuple((shared, self.expr(env, sub), shared))
        if kind == "tuple":
            return Tuple(tuple(self.expr(env, sub) for _ in range(draw(st.integers(1, 3)))))
        if kind == "proj":
            return TupleGetItem(self.expr(env, sub), draw(st.integers(0, 3)))
        if kind == "if":
            cond = self.expr(env, sub)
            return If(cond, self.expr(env.child(), sub), self.expr(env.child(), sub))
        if kind == "fn":
            return self.function(env, sub)
        if kind == "call":
            callee = self.expr(env, sub)
            args = tuple(self.expr(env, sub) for _ in range(draw(st.integers(0, 2))))
            return Call(callee, args)
        if kind == "op" and self.ops:
            opdef = draw(st.sampled_from(self.ops))
            attrs = self.op_attrs(opdef)
            if attrs is not None:
                args = tuple(self.expr(env, sub) for _ in range(opdef.num_inputs))
                return Call(Op(opdef.name), args, attrs)
            kind = "ctor"
        if kind == "ctor" or kind == "op":
            ctor = draw(st.sampled_from(self.ctors))
            return Call(ctor, tuple(self.expr(env, sub) for _ in ctor.inputs))
        if kind == "match":
            data = self.expr(env, sub)
            clauses = []
            for _ in range(draw(st.integers(1, 3))):
                bound: list[Var] = []
                pattern = self.pattern(env, bound, 2)
                clauses.append(Clause(pattern, self.expr(env.child(vars=bound), sub)))
            return Match(data, tuple(clauses), draw(st.booleans()))
        if kind == "ref":
            which = draw(st.integers(0, 2))
            if which == 0:
                return RefCreate(self.expr(env, sub))
            if which == 1:
                return RefRead(self.expr(env, sub))
            return RefWrite(self.expr(env, sub), self.expr(env, sub))
        raise AssertionError(kind)

    def pattern(self, env: _Env, bound: list[Var], depth: int) -> Pattern:
        draw = self.draw
        choices = ["wild", "var"] + (["ctor", "ctor", "tuple"] if depth > 0 else [])
        kind = draw(st.sampled_from(choices))
        if kind == "wild":
            return PatternWildcard()
        if kind == "var":
            v = self.var(env)
            bound.append(v)
            return PatternVar(v)
        if kind == "ctor":
            ctor = draw(st.sampled_from(self.ctors))
            return PatternConstructor(
                ctor, tuple(self.pattern(env, bound, depth - 1) for _ in ctor.inputs)
            )
        n = draw(st.integers(0, 3))
        return PatternTuple(tuple(self.pattern(env, bound, depth - 1) for _ in range(n)))


def _attr_strategy(a: registry.Attr) -> st.SearchStrategy[Any]:
    ints = st.integers(-4, 8)
    kinds: dict[str, st.SearchStrategy[Any]] = {
        "int": ints,
        "float": _FLOAT,
        "bool": st.booleans(),
        "str": st.one_of(st.sampled_from(["NCHW", "NHWC", "OIHW", "", "clip"]), _STR),
        "dtype": st.sampled_from(DTYPES + ("",)),
        "ints": st.lists(ints, max_size=4).map(tuple),
        "floats": st.lists(_FLOAT, max_size=3).map(tuple),
        "int_or_ints": st.one_of(ints, st.lists(ints, max_size=4).map(tuple)),
        "any": st.one_of(st.none(), ints, _STR),
    }
    base = kinds.get(a.kind, st.none())
    if a.optional or a.default is None:
        return st.one_of(st.none(), base)
    return base
