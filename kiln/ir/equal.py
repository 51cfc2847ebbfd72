"""Structural equality and hashing, up to renaming of bound variables.

Two programs are structurally equal when they have the same shape, the same operators,
attributes and constants (bit for bit), and their bound variables correspond one to one.
Free variables must be the same objects unless ``map_free_vars=True``. Spans and checked
types are ignored. Both walks use explicit stacks, never recursion.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TypeData,
)
from kiln.ir.expr import (
    Call,
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
from kiln.ir.traverse import bound_vars, children, post_order
from kiln.ir.ty import (
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    type_children,
)


class _Equal:
    """One comparison: the correspondence of bound variables found so far."""

    def __init__(self, map_free_vars: bool) -> None:
        self.map_free_vars = map_free_vars
        self.vars: dict[int, Var] = {}
        self.vars_back: dict[int, Var] = {}
        self.tvars: dict[int, TypeVar] = {}
        self.tvars_back: dict[int, TypeVar] = {}
        self.proven: set[tuple[int, int]] = set()

    # --- variables ------------------------------------------------------------------------

    def bind(self, a: Var, b: Var) -> bool:
        if id(a) in self.vars or id(b) in self.vars_back:
            return self.vars.get(id(a)) is b
        self.vars[id(a)] = b
        self.vars_back[id(b)] = a
        return self.types(a.type_annotation, b.type_annotation)

    def var(self, a: Var, b: Var) -> bool:
        if id(a) in self.vars:
            return self.vars[id(a)] is b
        if id(b) in self.vars_back:
            return False
        if a is b:
            return True
        return self.map_free_vars and self.bind(a, b)

    def bind_tvars(self, xs: tuple[TypeVar, ...], ys: tuple[TypeVar, ...]) -> bool:
        if len(xs) != len(ys):
            return False
        for x, y in zip(xs, ys):
            if id(x) in self.tvars or id(y) in self.tvars_back:
                if self.tvars.get(id(x)) is not y:
                    return False
                continue
            self.tvars[id(x)] = y
            self.tvars_back[id(y)] = x
        return True

    # --- types ----------------------------------------------------------------------------

    def types(self, a: Type | None, b: Type | None) -> bool:
        if a is None or b is None:
            return a is None and b is None
        stack = [(a, b)]
        while stack:
            x, y = stack.pop()
            if x is y:
                continue
            if type(x) is not type(y):
                return False
            match x, y:
                case TensorType(), TensorType():
                    if x != y:
                        return False
                case TypeVar(), TypeVar():
                    if id(x) in self.tvars:
                        if self.tvars[id(x)] is not y:
                            return False
                    elif id(y) in self.tvars_back or not self.map_free_vars:
                        return False
                    else:
                        self.bind_tvars((x,), (y,))
                case GlobalTypeVar(), GlobalTypeVar():
                    if x != y:
                        return False
                case IncompleteType(), IncompleteType():
                    pass
                case FuncType(), FuncType():
                    if not self.bind_tvars(x.type_params, y.type_params):
                        return False
                    if len(x.arg_types) != len(y.arg_types):
                        return False
                case TupleType(), TupleType():
                    if len(x.fields) != len(y.fields):
                        return False
                case TypeCall(), TypeCall():
                    if x.func != y.func or len(x.args) != len(y.args):
                        return False
                case RefType(), RefType():
                    pass
                case _:
                    return False
            stack.extend(zip(type_children(x), type_children(y)))
        return True

    # --- patterns -------------------------------------------------------------------------

    def pattern(self, a: Pattern, b: Pattern) -> bool:
        stack = [(a, b)]
        while stack:
            x, y = stack.pop()
            if type(x) is not type(y):
                return False
            match x, y:
                case PatternWildcard(), PatternWildcard():
                    pass
                case PatternVar(), PatternVar():
                    if not self.bind(x.var, y.var):
                        return False
                case PatternConstructor(), PatternConstructor():
                    if x.constructor != y.constructor or len(x.patterns) != len(y.patterns):
                        return False
                    stack.extend(zip(x.patterns, y.patterns))
                case PatternTuple(), PatternTuple():
                    if len(x.patterns) != len(y.patterns):
                        return False
                    stack.extend(zip(x.patterns, y.patterns))
        return True

    # --- expressions ----------------------------------------------------------------------

    def exprs(self, a: Expr, b: Expr) -> bool:
        stack = [(a, b)]
        while stack:
            x, y = stack.pop()
            key = (id(x), id(y))
            if key in self.proven:
                continue
            if type(x) is not type(y):
                return False
            if not self.node(x, y):
                return False
            self.proven.add(key)
            kx, ky = children(x), children(y)
            if len(kx) != len(ky):
                return False
            stack.extend(reversed(list(zip(kx, ky))))
        return True

    def node(self, x: Any, y: Any) -> bool:
        """Compare what distinguishes two nodes of one kind, binding what they bind."""
        match x:
            case Var():
                return self.var(x, y)
            case GlobalVar() | Op() | Constructor():
                return x == y
            case Constant():
                return (
                    x.data.dtype == y.data.dtype
                    and x.data.shape == y.data.shape
                    and x.data.tobytes() == y.data.tobytes()
                )
            case Call():
                return x.attrs == y.attrs and len(x.args) == len(y.args)
            case Tuple():
                return len(x.fields) == len(y.fields)
            case TupleGetItem():
                return x.index == y.index
            case Let():
                return self.bind(x.var, y.var)
            case Function():
                return (
                    len(x.params) == len(y.params)
                    and x.attrs == y.attrs
                    and self.bind_tvars(x.type_params, y.type_params)
                    and all(self.bind(p, q) for p, q in zip(x.params, y.params))
                    and self.types(x.ret_type, y.ret_type)
                )
            case Match():
                return (
                    x.complete == y.complete
                    and len(x.clauses) == len(y.clauses)
                    and all(self.pattern(c.lhs, d.lhs) for c, d in zip(x.clauses, y.clauses))
                )
            case If() | RefCreate() | RefRead() | RefWrite():
                return True
        return False

    def type_data(self, a: TypeData, b: TypeData) -> bool:
        if a.header != b.header or len(a.constructors) != len(b.constructors):
            return False
        if not self.bind_tvars(a.type_vars, b.type_vars):
            return False
        for c, d in zip(a.constructors, b.constructors):
            if c.name != d.name or len(c.inputs) != len(d.inputs):
                return False
            if not all(self.types(s, t) for s, t in zip(c.inputs, d.inputs)):
                return False
        return True


def structural_equal(a: object, b: object, map_free_vars: bool = False) -> bool:
    """True when two expressions, types, patterns or modules are equal up to renaming."""
    eq = _Equal(map_free_vars)
    if isinstance(a, IRModule) and isinstance(b, IRModule):
        if set(a.functions) != set(b.functions):
            return False
        if set(a.type_definitions) != set(b.type_definitions):
            return False
        for header, td in a.type_definitions.items():
            if not _Equal(map_free_vars).type_data(td, b.type_definitions[header]):
                return False
        return all(_Equal(map_free_vars).exprs(f, b.functions[g]) for g, f in a.functions.items())
    if isinstance(a, Expr) and isinstance(b, Expr):
        return eq.exprs(a, b)
    if isinstance(a, Type) and isinstance(b, Type):
        return eq.types(a, b)
    if isinstance(a, Pattern) and isinstance(b, Pattern):
        return eq.pattern(a, b)
    if isinstance(a, TypeData) and isinstance(b, TypeData):
        return eq.type_data(a, b)
    return False


# --- hashing --------------------------------------------------------------------------------


def _type_hash(t: Type | None) -> int:
    """A hash consistent with `structural_equal` on types (type variables hash alike)."""
    if t is None:
        return 0
    parts: list[object] = []
    stack = [t]
    while stack:
        x = stack.pop()
        match x:
            case TensorType():
                parts.append(("T", x.shape, x.dtype))
            case TypeVar() | IncompleteType():
                parts.append(type(x).__name__)
            case GlobalTypeVar():
                parts.append(("G", x.name))
            case FuncType():
                parts.append(("F", len(x.arg_types), len(x.type_params)))
            case TupleType():
                parts.append(("U", len(x.fields)))
            case TypeCall():
                parts.append(("C", x.func.name, len(x.args)))
            case RefType():
                parts.append("R")
        stack.extend(reversed(type_children(x)))
    return hash(tuple(parts))


def _pattern_hash(p: Pattern) -> int:
    parts: list[object] = []
    stack = [p]
    while stack:
        q = stack.pop()
        match q:
            case PatternWildcard():
                parts.append("_")
            case PatternVar():
                parts.append(("v", _type_hash(q.var.type_annotation)))
            case PatternConstructor():
                parts.append(("c", q.constructor.belong_to.name, q.constructor.name))
                stack.extend(reversed(q.patterns))
            case PatternTuple():
                parts.append(("t", len(q.patterns)))
                stack.extend(reversed(q.patterns))
    return hash(tuple(parts))


def _expr_hash(root: Expr, map_free_vars: bool) -> int:
    bound = {id(v) for v in bound_vars(root)}
    done: dict[int, int] = {}
    for node in post_order(root):
        kids = tuple(done[id(k)] for k in children(node))
        match node:
            case Var():
                if id(node) in bound or map_free_vars:
                    own: object = ("var", _type_hash(node.type_annotation))
                else:
                    own = ("free", id(node))
            case GlobalVar():
                own = ("global", node.name)
            case Op():
                own = ("op", node.name)
            case Constructor():
                own = ("ctor", node.belong_to.name, node.name)
            case Constant():
                own = ("const", node.data.dtype.str, node.data.shape, hash(node.data.tobytes()))
            case Call():
                own = ("call", hash(node.attrs))
            case TupleGetItem():
                own = ("proj", node.index)
            case Let():
                own = ("let", _type_hash(node.var.type_annotation))
            case Function():
                own = (
                    "fn",
                    tuple(_type_hash(p.type_annotation) for p in node.params),
                    _type_hash(node.ret_type),
                    len(node.type_params),
                    hash(node.attrs),
                )
            case Match():
                own = ("match", node.complete, tuple(_pattern_hash(c.lhs) for c in node.clauses))
            case _:
                own = type(node).__name__
        done[id(node)] = hash((own, kids))
    return done[id(root)]


def structural_hash(x: object, map_free_vars: bool = False) -> int:
    """A hash such that structurally equal values hash equally."""
    if isinstance(x, IRModule):
        funcs = sorted((g.name, _expr_hash(f, map_free_vars)) for g, f in x.functions.items())
        types = sorted(
            (h.name, tuple(c.name for c in td.constructors)) for h, td in x.type_definitions.items()
        )
        return hash((tuple(funcs), tuple(types)))
    if isinstance(x, Expr):
        return _expr_hash(x, map_free_vars)
    if isinstance(x, Type):
        return _type_hash(x)
    if isinstance(x, Pattern):
        return _pattern_hash(x)
    raise TypeError(f"structural_hash does not apply to {type(x).__name__}")
