"""A small pattern language for local rewrites, and the one driver that applies them.

Local simplifications read as tables (tinygrad's ``UPat``, TVM's dataflow patterns)::

    x = Pat.var("x")
    RULES = RewriteTable([
        (x * 1, lambda x, root, ctx: x if ctx.same_type(x, root) else None),  # x*1 -> x
        (Pat.op("negative", -x), lambda x: x),                                # --x -> x
    ])
    new_func = RULES.apply(func)

A pattern matches an operator call by name (`Pat.op`, or ``+ - * /`` and unary ``-``),
its attributes (a dict that must agree, or a predicate), and its arguments (sub-patterns);
`Pat.var` binds anything (the same name twice must bind the same node), `Pat.const` a
constant with an optional predicate on its value (`Pat.value(1)`: every element is 1), and
`Pat.item` a tuple projection. A rewrite function receives the bindings as keyword arguments,
plus ``root`` (the matched expression) and ``ctx`` (a `RewriteContext`: types, use counts,
pass options) when it names them, and returns the replacement or None to decline.

The driver rewrites bottom-up to a fixpoint: a replacement is itself simplified before its
users see it. It never recurses over the IR. Across ``let`` it sees through a variable bound
once (in the same function) to its value; inside such a value a wildcard binds only variables
and constants, so a rewrite never moves an effect or duplicates work (a named call pattern
may bind an operator call on those, for rules that check `RewriteContext.uses`). A rewrite
must keep the type of what it replaces; in debug mode (``PassContext(debug=True)``) the
driver checks, and reports a rule that does not as a compiler bug.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.adt import Constructor, PatternVar, pattern_children
from kiln.ir.attrs import Attrs
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Let,
    Match,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import FuncType, TensorType, TupleType, Type
from kiln.op import registry
from kiln.transform.pass_manager import PassContext, is_primitive, typed

# --- patterns ---------------------------------------------------------------------------------


class Pat:
    """A pattern over expressions; build one with the static constructors below."""

    name: str | None = None

    @staticmethod
    def var(name: str) -> Pat:
        """Anything, bound to ``name``."""
        return AnyPat(name)

    @staticmethod
    def any() -> Pat:
        """Anything, not bound."""
        return AnyPat(None)

    @staticmethod
    def op(
        op: str | Sequence[str],
        *args: object,
        attrs: Mapping[str, object] | None = None,
        where: Callable[[Attrs], bool] | None = None,
        name: str | None = None,
    ) -> Pat:
        """A call of the operator ``op`` (or of any of several) on arguments matching ``args``."""
        names = (op,) if isinstance(op, str) else tuple(op)
        for n in names:
            registry.get(n)  # a misspelt operator in a table is a bug found at import
        return OpPat(names, tuple(as_pat(a) for a in args), dict(attrs or {}), where, name)

    @staticmethod
    def const(name: str | None = None, where: Callable[[np.ndarray], bool] | None = None) -> Pat:
        """A constant (whose value satisfies ``where``)."""
        return ConstPat(name, where)

    @staticmethod
    def value(v: float, name: str | None = None) -> Pat:
        """A constant every element of which equals ``v`` (any shape, any dtype)."""
        return ConstPat(name, lambda data: all_equal(data, v), f"={v}")

    @staticmethod
    def item(tuple_pat: object, index: int, name: str | None = None) -> Pat:
        """Field ``index`` of a tuple matching ``tuple_pat``: ``%t.0``."""
        return ItemPat(as_pat(tuple_pat), index, name)

    def named(self, name: str) -> Pat:
        """This pattern, also binding what it matches to ``name``."""
        raise NotImplementedError

    def match(self, e: Expr, m: _Matching) -> bool:
        raise NotImplementedError

    # Sugar: ``x * 1`` is a multiply pattern; numbers become `Pat.value` patterns.
    def __add__(self, other: object) -> Pat:
        return Pat.op("add", self, other)

    def __radd__(self, other: object) -> Pat:
        return Pat.op("add", other, self)

    def __sub__(self, other: object) -> Pat:
        return Pat.op("subtract", self, other)

    def __rsub__(self, other: object) -> Pat:
        return Pat.op("subtract", other, self)

    def __mul__(self, other: object) -> Pat:
        return Pat.op("multiply", self, other)

    def __rmul__(self, other: object) -> Pat:
        return Pat.op("multiply", other, self)

    def __truediv__(self, other: object) -> Pat:
        return Pat.op("divide", self, other)

    def __rtruediv__(self, other: object) -> Pat:
        return Pat.op("divide", other, self)

    def __neg__(self) -> Pat:
        return Pat.op("negative", self)


def as_pat(p: object) -> Pat:
    """A pattern from a pattern or a number (a constant of that value everywhere)."""
    if isinstance(p, Pat):
        return p
    if isinstance(p, (bool, int, float)):
        return Pat.value(p)
    raise Error(f"cannot use {p!r} as a pattern")


def all_equal(data: np.ndarray, v: float) -> bool:
    """True when every element of ``data`` equals ``v`` (False for an empty array)."""
    if data.size == 1:
        return bool(data.item() == v)
    return data.size > 0 and bool(np.all(data == v))


class AnyPat(Pat):
    def __init__(self, name: str | None) -> None:
        self.name = name

    def named(self, name: str) -> Pat:
        return AnyPat(name)

    def match(self, e: Expr, m: _Matching) -> bool:
        return m.bind(self.name, e)

    def __repr__(self) -> str:
        return f"Pat.var({self.name!r})" if self.name else "Pat.any()"


class OpPat(Pat):
    def __init__(self, names: tuple[str, ...], args: tuple[Pat, ...], attrs: dict[str, object],
                 where: Callable[[Attrs], bool] | None, name: str | None) -> None:
        self.names, self.args, self.attrs, self.where, self.name = names, args, attrs, where, name

    def named(self, name: str) -> Pat:
        return OpPat(self.names, self.args, self.attrs, self.where, name)

    def match(self, e: Expr, m: _Matching) -> bool:
        e, entered = m.look_through(e)
        if not (isinstance(e, Call) and isinstance(e.op, Op) and e.op.name in self.names):
            return False
        if len(e.args) != len(self.args):
            return False
        if any(e.attrs.get(k) != v for k, v in self.attrs.items()):
            return False
        if self.where is not None and not self.where(e.attrs):
            return False
        m.inside_let += entered
        ok = m.bind(self.name, e, call=True) and all(
            p.match(a, m) for p, a in zip(self.args, e.args))
        m.inside_let -= entered
        return ok

    def __repr__(self) -> str:
        return f"Pat.op({'|'.join(self.names)}, {', '.join(map(repr, self.args))})"


class ConstPat(Pat):
    def __init__(self, name: str | None, where: Callable[[np.ndarray], bool] | None,
                 text: str = "") -> None:
        self.name, self.where, self.text = name, where, text

    def named(self, name: str) -> Pat:
        return ConstPat(name, self.where, self.text)

    def match(self, e: Expr, m: _Matching) -> bool:
        e, _ = m.look_through(e)
        if not isinstance(e, Constant):
            return False
        if self.where is not None and not self.where(e.data):
            return False
        return m.bind(self.name, e)

    def __repr__(self) -> str:
        return f"Pat.const({self.text})"


class ItemPat(Pat):
    def __init__(self, tuple_pat: Pat, index: int, name: str | None) -> None:
        self.tuple_pat, self.index, self.name = tuple_pat, index, name

    def named(self, name: str) -> Pat:
        return ItemPat(self.tuple_pat, self.index, name)

    def match(self, e: Expr, m: _Matching) -> bool:
        e, entered = m.look_through(e)
        if not (isinstance(e, TupleGetItem) and e.index == self.index):
            return False
        m.inside_let += entered
        ok = m.bind(self.name, e, call=True) and self.tuple_pat.match(e.tuple_value, m)
        m.inside_let -= entered
        return ok

    def __repr__(self) -> str:
        return f"Pat.item({self.tuple_pat!r}, {self.index})"


class _Matching:
    """The state of one attempt to match one pattern: bindings, and let values looked into."""

    __slots__ = ("ctx", "bindings", "inside_let")

    def __init__(self, ctx: RewriteContext) -> None:
        self.ctx = ctx
        self.bindings: dict[str, Expr] = {}
        self.inside_let = 0  # > 0 while matching inside the value of a let-bound variable

    def look_through(self, e: Expr) -> tuple[Expr, bool]:
        """The value of a let-bound variable when the pattern needs to see inside it."""
        if isinstance(e, Var):
            value = self.ctx.let_value(e)
            if value is not None:
                return value, True
        return e, False

    def bind(self, name: str | None, e: Expr, call: bool = False) -> bool:
        if name is None:
            return True
        if self.inside_let and not (_movable(e) if call else isinstance(e, _ATOMS)):
            # A compound value inside a let binding: moving it to the use could reorder an
            # effect, or compute it twice. A wildcard there binds only variables and
            # constants; a named call pattern, a call on those (for its attributes, or for
            # a rule that checks `RewriteContext.uses` before moving it).
            return False
        old = self.bindings.get(name)
        if old is not None:
            return old is e
        self.bindings[name] = e
        return True


_ATOMS = (Var, Constant, GlobalVar, Op)


def _movable(e: Expr) -> bool:
    if isinstance(e, _ATOMS):
        return True
    if isinstance(e, Call) and isinstance(e.op, Op):
        return all(isinstance(a, _ATOMS) for a in e.args)
    return isinstance(e, TupleGetItem) and isinstance(e.tuple_value, _ATOMS)


# --- rules and tables -------------------------------------------------------------------------

RewriteFn = Callable[..., Expr | None]


class Rule:
    """One row of a rewrite table: a pattern and what to put in place of a match."""

    __slots__ = ("pattern", "fn", "accepts", "wants_root", "wants_ctx")

    def __init__(self, pattern: Pat, fn: RewriteFn) -> None:
        self.pattern = pattern
        self.fn = fn
        params = inspect.signature(fn).parameters
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        bound = _names(pattern)
        wanted = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        missing = wanted - bound - {"root", "ctx"}
        if missing:
            raise InternalError(
                f"rewrite {fn.__name__} asks for {sorted(missing)}, which {pattern!r} does not bind"
            )
        self.accepts = bound if takes_all else bound & wanted
        self.wants_root = "root" in params
        self.wants_ctx = "ctx" in params

    def __call__(self, root: Expr, ctx: RewriteContext) -> Expr | None:
        m = _Matching(ctx)
        if not self.pattern.match(root, m):
            return None
        kwargs: dict[str, Any] = {k: v for k, v in m.bindings.items() if k in self.accepts}
        if self.wants_root:
            kwargs["root"] = root
        if self.wants_ctx:
            kwargs["ctx"] = ctx
        return self.fn(**kwargs)

    def __repr__(self) -> str:
        return f"Rule({self.pattern!r}, {self.fn.__name__})"


def _names(p: Pat) -> set[str]:
    out: set[str] = set()
    stack = [p]
    while stack:
        q = stack.pop()
        if q.name:
            out.add(q.name)
        if isinstance(q, OpPat):
            stack.extend(q.args)
        elif isinstance(q, ItemPat):
            stack.append(q.tuple_pat)
    return out


_NONE: list[Rule] = []
_LEAVES = (Var, Constant, GlobalVar, Op, Constructor)


class RewriteTable:
    """Rows of (pattern, rewrite function), tried in order at every node, bottom-up."""

    def __init__(self, rows: Iterable[tuple[Pat, RewriteFn] | Rule]) -> None:
        self.rules = [r if isinstance(r, Rule) else Rule(as_pat(r[0]), r[1]) for r in rows]
        self.by_op: dict[str, list[Rule]] = {}
        self.by_item: list[Rule] = []
        for rule in self.rules:
            p = rule.pattern
            if isinstance(p, OpPat):
                for n in p.names:
                    self.by_op.setdefault(n, []).append(rule)
            elif isinstance(p, ItemPat):
                self.by_item.append(rule)
            else:
                raise InternalError(f"a rewrite pattern must be an operator call or a tuple "
                                    f"projection at its root, not {p!r}")

    def __add__(self, other: RewriteTable) -> RewriteTable:
        return RewriteTable([*self.rules, *other.rules])

    def candidates(self, e: Expr) -> list[Rule]:
        if isinstance(e, Call) and isinstance(e.op, Op):
            return self.by_op.get(e.op.name, _NONE)
        if isinstance(e, TupleGetItem):
            return self.by_item
        return _NONE

    def apply(self, func: Function, pass_ctx: PassContext | None = None) -> Function:
        """``func`` rewritten with these rules to a fixpoint (its nodes should be typed)."""
        out = RewriteContext(self, func, pass_ctx).run()
        if not isinstance(out, Function):
            raise InternalError(f"rewriting a function produced a {type(out).__name__}")
        return out

    def apply_to_module(self, mod: IRModule, pass_ctx: PassContext | None = None) -> IRModule:
        """Every non-primitive function of ``mod`` rewritten; ``mod`` itself when none changed."""
        tmod = typed(mod)
        funcs = {}
        changed = False
        for gv, fn in tmod.functions.items():
            new = fn if is_primitive(fn) else self.apply(fn, pass_ctx)
            changed |= new is not fn
            funcs[gv] = new
        return IRModule(funcs, tmod.type_definitions) if changed else mod


# --- the driver -------------------------------------------------------------------------------

_VISIT, _BUILD, _ALIAS = 0, 1, 2
MAX_REWRITES_PER_NODE = 1000


class RewriteContext:
    """What a rewrite function may ask while a table runs: types, uses, options."""

    def __init__(self, table: RewriteTable, root: Expr, pass_ctx: PassContext | None) -> None:
        self.table = table
        self.root = root
        self.pass_ctx = pass_ctx if pass_ctx is not None else PassContext.current()
        self.done: dict[int, Expr] = {}
        self.keep: list[Expr] = []  # every node whose id is a key somewhere stays alive
        self.types: dict[int, Type] = {}
        self.origin: dict[int, Expr] = {}
        self.lets: dict[int, tuple[Expr, int]] = {}  # id(var) -> (original value, scope)
        self.via: dict[int, Var] = {}  # id(a let value seen through) -> its variable
        self.scope = 0
        self.last_rule: Rule | None = None
        self._uses: dict[int, int] | None = None  # computed when a rule first asks
        # Seeing into lets needs each variable bound once. A binding that could spoil a
        # use is an ancestor of the use, so it is met (in _VISIT) before the use is rebuilt.
        self.bound: set[int] = set()
        self.rebinds = False

    def config(self, key: str, default: Any = None) -> Any:
        """An option of the current PassContext (``config={"pass-name.key": value}``)."""
        return self.pass_ctx.config.get(key, default)

    # --- questions rules ask ------------------------------------------------------------------

    def type_of(self, e: Expr) -> Type | None:
        """The type of ``e``: checked, remembered, or worked out from its operands."""
        t = self.type_of_known(e)
        if t is not None:
            return t
        # Only nodes made by rewrites lack types; work them out children first.
        for node in post_order(e, gate=lambda n: self.type_of_known(n) is None):
            if self.type_of_known(node) is not None:
                continue
            t = self._local_type(node)
            if t is not None:
                self.types[id(node)] = t
                self.keep.append(node)
        return self.types.get(id(e))

    def tensor_type(self, e: Expr) -> TensorType | None:
        """The tensor type of ``e``, or None if it is not (known to be) a tensor."""
        t = self.type_of(e)
        return t if isinstance(t, TensorType) else None

    def static_shape(self, e: Expr) -> tuple[int, ...] | None:
        """The shape of ``e`` when every dimension is a known integer."""
        t = self.tensor_type(e)
        return t.static_shape if t is not None and t.is_static else None

    def same_type(self, a: Expr, b: Expr) -> bool:
        """True when both types are known and equal (so one may stand for the other)."""
        ta, tb = self.type_of(a), self.type_of(b)
        return ta is not None and ta == tb

    def uses(self, e: Expr) -> int:
        """How many places of the input program use ``e`` (0 when unknown)."""
        if self._uses is None:
            self._uses = use_counts(self.root)
        o = self.origin.get(id(e), e)
        n = self._uses.get(id(o), 0)
        var = self.via.get(id(e))
        if var is not None:
            n += self._uses.get(id(var), 0) - 1  # the let's own use becomes the var's uses
        return n

    def value_of(self, e: Expr) -> Expr:
        """``e``, or the value of the let-bound variable ``e`` when a rewrite may use it in
        place of the variable (an operator call on variables and constants)."""
        if isinstance(e, Var):
            value = self.let_value(e)
            if value is not None and _movable(value):
                return value
        return e

    def let_value(self, v: Var) -> Expr | None:
        """The (rewritten) value of a let-bound variable of the current function, if known."""
        entry = self.lets.get(id(v))
        if entry is None or entry[1] != self.scope:
            return None
        if self.rebinds:
            return None
        value = self.done.get(id(entry[0]))
        if value is not None:
            self.via[id(value)] = v
        return value

    def _local_type(self, node: Expr) -> Type | None:
        kid_types = [self.type_of_known(k) for k in children(node)]
        match node:
            case Constant():
                return node.tensor_type
            case Call(op=Op(name=name)):
                args = kid_types[1:]
                if any(t is None for t in args):
                    return None
                opdef = registry.get(name)
                try:
                    if opdef.needs_values:
                        values = tuple(a.data if isinstance(a, Constant) else None
                                       for a in node.args)
                        return opdef.relation(tuple(args), node.attrs, values)
                    return opdef.relation(tuple(args), node.attrs)
                except Error as e:
                    raise InternalError(
                        f"a rewrite built an ill-typed {name} call: {e.message}"
                    ) from None
            case Call():
                f = kid_types[0]
                return f.ret_type if isinstance(f, FuncType) and not f.type_params else None
            case Tuple():
                return None if None in kid_types else TupleType(tuple(kid_types))  # type: ignore
            case TupleGetItem():
                t = kid_types[0]
                return t.fields[node.index] if isinstance(t, TupleType) else None
            case Let():
                return kid_types[1]
        return None

    def type_of_known(self, e: Expr) -> Type | None:
        return e.checked_type_ or self.types.get(id(e))

    # --- the walk ----------------------------------------------------------------------------

    def run(self) -> Expr:
        done, keep = self.done, self.keep
        rewrites: dict[int, int] = {}  # id(an input node) -> rewrites at its place
        stack: list[tuple[int, Expr, Any]] = [(_VISIT, self.root, 0)]
        while stack:
            state, node, extra = stack.pop()
            if state == _ALIAS:
                done[id(node)] = done[id(extra)]
                continue
            if id(node) in done:
                continue
            if state == _VISIT:
                scope = extra
                kids = children(node)
                stack.append((_BUILD, node, (scope, kids)))
                if isinstance(node, (Function, Let, Match)):
                    self._note_binders(node)
                    if isinstance(node, Function):
                        scope = id(node)
                    elif isinstance(node, Let):
                        self.lets[id(node.var)] = (node.value, scope)
                for kid in reversed(kids):
                    if id(kid) in done:
                        continue
                    if isinstance(kid, _LEAVES):  # no rule has a leaf at its root
                        done[id(kid)] = kid
                    else:
                        stack.append((_VISIT, kid, scope))
                continue
            self.scope, kids = extra
            new_kids = [done[id(k)] for k in kids]
            if all(a is b for a, b in zip(kids, new_kids)):
                rebuilt = node
            else:
                rebuilt = with_children(node, new_kids)
            keep.append(node)
            if rebuilt is not node:
                keep.append(rebuilt)
                self.origin[id(rebuilt)] = self.origin.get(id(node), node)
                if node.checked_type_ is not None:
                    self.types[id(rebuilt)] = node.checked_type_
            new = self._try_rules(rebuilt)
            if new is None:
                done[id(node)] = rebuilt
                done[id(rebuilt)] = rebuilt
                continue
            origin = self.origin.get(id(rebuilt), node)
            count = rewrites.get(id(origin), 0) + 1
            if count > MAX_REWRITES_PER_NODE:
                raise InternalError(
                    f"rewrite rules do not reach a fixpoint: {self.last_rule!r} rewrote one place "
                    f"{count - 1} times (a rule undoes another, or grows the program forever)")
            rewrites[id(origin)] = count
            keep.append(new)
            if self.pass_ctx.debug:
                self._check_type(rebuilt, new)
            elif new.checked_type_ is None and id(new) not in self.types:
                t = self.type_of_known(rebuilt)
                if t is not None:
                    self.types[id(new)] = t  # a rewrite keeps the type of what it replaces
            self.origin.setdefault(id(new), origin)
            stack.append((_ALIAS, node, new))
            stack.append((_VISIT, new, self.scope))
        return done[id(self.root)]

    def _note_binders(self, node: Expr) -> None:
        for v in binders(node):
            if id(v) in self.bound:
                self.rebinds = True
            self.bound.add(id(v))

    def _try_rules(self, e: Expr) -> Expr | None:
        for rule in self.table.candidates(e):
            out = rule(e, self)
            if out is not None and out is not e:
                self.last_rule = rule
                return out
        return None

    def _check_type(self, old: Expr, new: Expr) -> None:
        """A rewrite must keep the type of what it replaces."""
        before, after = self.type_of_known(old), self.type_of(new)
        if before is not None and after is not None and before != after:
            raise InternalError(
                f"the rewrite {self.last_rule!r} changed a type from {before} to {after}"
            )


def use_counts(root: Expr) -> dict[int, int]:
    """How many references each node of the DAG has (the root counts as used once)."""
    counts: dict[int, int] = {id(root): 1}
    for node in post_order(root):
        counts.setdefault(id(node), 0)
        for kid in children(node):
            counts[id(kid)] = counts.get(id(kid), 0) + 1
    return counts


def binders(node: Expr) -> list[Var]:
    """The variables a let, function or match binds (none for other nodes)."""
    if isinstance(node, Let):
        return [node.var]
    if isinstance(node, Function):
        return list(node.params)
    out: list[Var] = []
    if isinstance(node, Match):
        for clause in node.clauses:
            stack = [clause.lhs]
            while stack:
                p = stack.pop()
                if isinstance(p, PatternVar):
                    out.append(p.var)
                stack.extend(pattern_children(p))
    return out


def binders_unique(root: Expr) -> bool:
    """True when no variable is bound twice in ``root``."""
    seen: set[int] = set()
    for node in post_order(root):
        for v in binders(node):
            if id(v) in seen:
                return False
            seen.add(id(v))
    return True
