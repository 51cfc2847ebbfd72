"""The printer of Relay's text format, in TVM's style.

Inside a body every non-atomic expression that is not in a *tail* position (a block's result or
a let's value) and every shared expression gets a graph name, ``%0 = nn.relu(%x);``, and is
referred to by that name; atoms (variables, globals, operators, constructors, constants) are
written inline. The graph names only name nodes: ``parse`` rebuilds the same dataflow graph.

A binding is printed in the innermost scope (function body, ``if`` branch, match clause,
parenthesized ``let``) that holds all its uses, which is also where all its variables are
visible: a node shared by two branches goes before the ``if``, never into one branch where the
other could not see it (TVM's printer got this wrong). The graph names count up per top-level
definition, in the order of the text.

Nothing here recurses over the program: the analysis walks explicit stacks, and printing nested
blocks runs as generators on `kiln.ir.traverse.trampoline`.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

from kiln.errors import Error, InternalError
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
from kiln.ir.traverse import children, post_order, trampoline
from kiln.ir.ty import (
    AnyDim,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
)
from kiln.op import registry
from kiln.text._gc import gc_paused
from kiln.text.literals import write_attr_float, write_scalar
from kiln.text.metadata import CONSTANT_KEY, encode

__all__ = ["astext", "type_text"]

Gen = Generator[Any, Any, Any]

VERSION = '#[version = "0.0.5"]'
_INDENT_CAP = 40  # deeper blocks keep this indentation, so the text stays linear in size
_KEYWORDS = frozenset(
    ("let", "fn", "def", "if", "else", "type", "match", "extern", "free_var", "ref",
     "ref_read", "ref_write")
)
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")
_DTYPE_LIKE = re.compile(r"(?:u?int|float|bfloat|bool)[0-9]*(?:x[0-9]+)?")
_SPECIAL_NUMBER = re.compile(r"(?:inf|nan)f[0-9]*")

# Positions of a use: a block's result, a let's value (both printed inline when the use is
# the only one), or anything else (printed by name unless atomic).
_TAIL, _LETVAL, _ARG = 0, 1, 2


def astext(obj: object, show_types: bool | None = None, *,
           elide_constants: int | None = None) -> str:
    """The text of a module, expression, type or type definition.

    With ``show_types`` None (or True), a binding or result whose checked type is known (after
    `kiln.infer_types`) is followed by ``/* ty=... */``, as TVM printed it; False leaves the
    types out. With ``elide_constants`` N, a constant of more than N elements is written as
    ``meta[relay.Constant][3] /* float32[64, 3, 7, 7] elided */`` and its data left out of the
    metadata section: text for reading (a model's weights can be megabytes), which the parser
    refuses; by default every constant is written exactly and the text round-trips.
    """
    if elide_constants is not None and (isinstance(elide_constants, bool) or not isinstance(
            elide_constants, int) or elide_constants < 0):
        raise Error(f"elide_constants must be a non-negative integer or None, not "
                    f"{elide_constants!r}")
    if isinstance(obj, IRModule):
        with gc_paused():
            return _Printer(show_types, elide_constants).module(obj)
    if isinstance(obj, Expr):
        with gc_paused():
            return _Printer(show_types, elide_constants).expression(obj)
    if isinstance(obj, Type):
        return type_text(obj)
    if isinstance(obj, TypeData):
        return _Printer(show_types).type_data(obj)
    if isinstance(obj, Pattern):
        return _Body(_Printer(show_types)).pattern(obj)
    raise Error(f"astext cannot print a {type(obj).__name__}")


def type_text(ty: Type) -> str:
    """A type in the text format: ``Tensor[(1, 784), float32]``, ``fn [A](A) -> A``, ..."""
    return _TypeWriter(None).text(ty)


# --- names ----------------------------------------------------------------------------------


_TYPE_RESERVED = _KEYWORDS | {"Tensor", "True", "False", "_", "None"}


def _tvar_hint(name: str) -> str:
    return "T" + name if _DTYPE_LIKE.fullmatch(name) else name


def _sanitize(hint: str, reserved: frozenset[str] | set[str], fallback: str) -> str:
    name = _NOT_IDENT.sub("_", hint)
    if not name or name[0].isdigit() or _SPECIAL_NUMBER.match(name):
        name = fallback + name
    if name in reserved:
        name += "_"
    return name


class _Names:
    """Unique names within one definition: ``x``, ``x1``, ``x2``, ..."""

    def __init__(self, reserved: frozenset[str] | set[str], fallback: str) -> None:
        self.used: set[str] = set()
        self.next: dict[str, int] = {}
        self.reserved = reserved
        self.fallback = fallback

    def fresh(self, hint: str) -> str:
        base = _sanitize(hint, self.reserved, self.fallback)
        name = base
        if name in self.used:
            n = self.next.get(base, 0)
            while True:
                n += 1
                name = f"{base}{n}"
                if name not in self.used:
                    break
            self.next[base] = n
        self.used.add(name)
        return name


# --- types ----------------------------------------------------------------------------------


class _TypeWriter:
    """Writes types without recursion; with a printer, type variables get unique names."""

    def __init__(self, body: _Body | None) -> None:
        self.body = body
        self.names: dict[int, str] = {}
        self.fresh = _Names(_TYPE_RESERVED, "T")

    def tvar(self, tv: TypeVar) -> str:
        names = self.body.tvar_names if self.body is not None else self.names
        return names.get(id(tv), tv.name)

    def bind(self, tv: TypeVar) -> str:
        if self.body is not None:
            return self.body.bind_tvar(tv)
        name = self.names[id(tv)] = self.fresh.fresh(_tvar_hint(tv.name))
        return name

    def text(self, ty: Type) -> str:
        out: list[str] = []
        stack: list[Any] = [ty]
        while stack:
            t = stack.pop()
            if type(t) is str:
                out.append(t)
            elif isinstance(t, TensorType):
                out.append(_tensor_text(t))
            elif isinstance(t, TupleType):
                stack.append(",)" if len(t.fields) == 1 else ")")
                _push_list(stack, t.fields)
                stack.append("(")
            elif isinstance(t, FuncType):
                params = ""
                if t.type_params:
                    params = "[" + ", ".join(self.bind(tv) for tv in t.type_params) + "]"
                stack.append(t.ret_type)
                stack.append(") -> ")
                _push_list(stack, t.arg_types)
                stack.append(f"fn {params}(")
            elif isinstance(t, TypeVar):
                out.append(self.tvar(t))
            elif isinstance(t, TypeCall):
                if t.args:
                    stack.append("]")
                    _push_list(stack, t.args)
                    stack.append(f"{t.func.name}[")
                else:
                    out.append(t.func.name)
            elif isinstance(t, GlobalTypeVar):
                out.append(t.name)
            elif isinstance(t, RefType):
                stack.append(")")
                stack.append(t.value)
                stack.append("ref(")
            elif isinstance(t, IncompleteType):
                out.append("_")
            else:
                raise InternalError(f"the printer does not know the type {type(t).__name__}")
        return "".join(out)


def _push_list(stack: list[Any], items: tuple[Any, ...]) -> None:
    """Push ``items`` separated by commas so that they pop in order."""
    for j in range(len(items) - 1, -1, -1):
        stack.append(items[j])
        if j:
            stack.append(", ")


def _tensor_text(t: TensorType) -> str:
    if not t.shape:
        return t.dtype
    dims = ", ".join("?" if isinstance(d, AnyDim) else str(d) for d in t.shape)
    return f"Tensor[({dims}), {t.dtype}]"


# --- attributes ----------------------------------------------------------------------------


def _quote(s: str) -> str:
    s = s.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + s.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def _attr_text(value: object) -> str:
    out: list[str] = []
    stack: list[object] = [value]
    while stack:
        v = stack.pop()
        if type(v) is _Raw:
            out.append(v.text)
        elif v is None:
            out.append("None")
        elif isinstance(v, bool):
            out.append("True" if v else "False")
        elif isinstance(v, int):
            out.append(str(v))
        elif isinstance(v, float):
            out.append(write_attr_float(v))
        elif isinstance(v, str):
            out.append(_quote(v))
        elif isinstance(v, tuple):
            stack.append(_Raw("]"))
            for j in range(len(v) - 1, -1, -1):
                stack.append(v[j])
                if j:
                    stack.append(_Raw(", "))
            stack.append(_Raw("["))
        else:
            out.append(_quote(str(v)))
    return "".join(out)


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _attrs_text(attrs: Attrs | dict[str, Any]) -> list[str]:
    return [f"{k}={_attr_text(v)}" for k, v in attrs.items()]


# --- the printer ---------------------------------------------------------------------------


class _Printer:
    """State shared by the definitions of one text: the metadata section, the ADT names."""

    def __init__(self, show_types: bool | None, elide_constants: int | None = None) -> None:
        self.show_types = show_types
        self.elide_constants = elide_constants
        self.meta: list[Constant] = []
        self.meta_index: dict[int, int] = {}
        self.elided: set[int] = set()
        self.type_names: set[str] = set()

    def meta_ref(self, c: Constant) -> str:
        i = self.meta_index.get(id(c))
        if i is None:
            i = self.meta_index[id(c)] = len(self.meta)
            self.meta.append(c)
            if self.elide_constants is not None and c.data.size > self.elide_constants:
                self.elided.add(i)
        if i in self.elided:
            shape = ", ".join(str(d) for d in c.data.shape)
            return f"meta[{CONSTANT_KEY}][{i}] /* {c.data.dtype.name}[{shape}] elided */"
        return f"meta[{CONSTANT_KEY}][{i}]"

    def with_metadata(self, text: str) -> str:
        if not self.meta:
            return text
        if not text.endswith("\n"):
            text += "\n"
        return text + "#[metadata]\n" + encode(self.meta, elided=self.elided)

    def module(self, mod: IRModule) -> str:
        self.type_names = {h.name for h in mod.type_definitions}
        items = [self.type_data(td) for td in mod.type_definitions.values()]
        for gv, fn in mod.functions.items():
            items.append(_Body(self).definition(gv.name, fn))
        text = VERSION + "\n" + "\n\n".join(items) + ("\n" if items else "")
        return self.with_metadata(text)

    def expression(self, expr: Expr) -> str:
        return self.with_metadata(_Body(self).expression(expr))

    def type_data(self, td: TypeData) -> str:
        body = _Body(self)
        head = f"type {td.header.name}"
        if td.type_vars:
            head += "[" + ", ".join(body.bind_tvar(tv) for tv in td.type_vars) + "]"
        lines = [head + " {"]
        for c in td.constructors:
            if c.inputs:
                inputs = ", ".join(body.type_text(t) for t in c.inputs)
                lines.append(f"  {c.name}({inputs}),")
            else:
                lines.append(f"  {c.name},")
        lines.append("}")
        return "\n".join(lines)


class _Scope:
    """A block of the text: a function body, a branch, a clause, a parenthesized let."""

    __slots__ = ("parent", "depth", "tail", "events")

    def __init__(self, parent: _Scope | None, tail: Expr) -> None:
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.tail = tail
        self.events: list[Any] = []  # statements (nodes) and let lines (("let", node))

    def up(self) -> _Scope:
        """The enclosing scope; asked only of a scope deeper than another, so never the root."""
        assert self.parent is not None
        return self.parent


def _lca(a: _Scope, b: _Scope) -> _Scope:
    while a.depth > b.depth:
        a = a.up()
    while b.depth > a.depth:
        b = b.up()
    while a is not b:
        a, b = a.up(), b.up()
    return a


def _is_atom(e: Expr) -> bool:
    if isinstance(e, (Var, GlobalVar, Op, Constant, Constructor)):
        return True
    if isinstance(e, Call):
        op = e.op
        return isinstance(op, Constructor) and not op.inputs and not e.args
    return isinstance(e, Tuple) and not e.fields


class _Body:
    """Prints one top-level definition (or one expression) with its own names."""

    def __init__(self, printer: _Printer) -> None:
        self.p = printer
        self.show_types = printer.show_types
        reserved_types = _TYPE_RESERVED | printer.type_names
        self.var_names = _Names(_KEYWORDS, "v")
        self.tnames = _Names(frozenset(reserved_types), "T")
        self.var_of: dict[int, str] = {}
        self.tvar_names: dict[int, str] = {}
        self.types = _TypeWriter(self)
        self.lines: list[tuple[int, str]] = []
        self.names: dict[int, str] = {}
        self.temps = 0
        self.inline: set[int] = set()
        self.spine: set[int] = set()
        self.blocks: dict[int, list[_Scope]] = {}
        self.let_scope: dict[int, _Scope] = {}
        self.scope_of: dict[int, _Scope] = {}
        self.used_vars: set[int] = set()

    # --- names ------------------------------------------------------------------------------

    def bind_var(self, v: Var) -> str:
        name = self.var_names.fresh(v.name_hint)
        self.var_of[id(v)] = name
        if v.type_annotation is not None:
            return f"%{name}: {self.type_text(v.type_annotation)}"
        return "%" + name

    def var(self, v: Var) -> str:
        name = self.var_of.get(id(v))
        if name is None:  # a variable used outside any binder (a free variable)
            name = self.var_of[id(v)] = self.var_names.fresh(v.name_hint)
        return "%" + name

    def bind_tvar(self, tv: TypeVar) -> str:
        name = self.tnames.fresh(_tvar_hint(tv.name))
        self.tvar_names[id(tv)] = name
        return name

    def type_text(self, ty: Type) -> str:
        return self.types.text(ty)

    # --- entry points -----------------------------------------------------------------------

    def definition(self, name: str, fn: Function) -> str:
        head = self.function_head(fn, f"def @{name}")
        root = self.analyze(fn.body, bound=list(fn.params))
        self.lines.append((0, head + " {"))
        trampoline(self.block(root, 1))
        self.lines.append((0, "}"))
        return self.render()

    def expression(self, expr: Expr) -> str:
        root = self.analyze(expr, bound=[])
        trampoline(self.block(root, 0))
        return self.render()

    def render(self) -> str:
        pads = ["  " * d for d in range(_INDENT_CAP + 1)]
        cap = _INDENT_CAP
        return "\n".join(pads[d if d < cap else cap] + text for d, text in self.lines)

    # --- analysis ---------------------------------------------------------------------------

    def analyze(self, tail: Expr, bound: list[Var]) -> _Scope:
        """Decide where each node is printed: inline, or named in which scope; order events."""
        root = _Scope(None, tail)
        order, kids_of, used = self.walk(tail)
        uses: dict[int, list[tuple[_Scope, int]]] = {id(tail): [(root, _TAIL)]}
        bound_ids = {id(v) for v in bound}
        inline, spine, blocks, scope_of = self.inline, self.spine, self.blocks, self.scope_of
        for j in range(len(order) - 1, -1, -1):  # parents before children
            node = order[j]
            nid = id(node)
            use = uses[nid]
            if len(use) == 1 and use[0][1] != _ARG:
                inline.add(nid)
                scope = use[0][0]
            else:
                scope = use[0][0]
                for other, _ in use[1:]:
                    if scope.parent is None:
                        break
                    if other is not scope:
                        scope = _lca(scope, other)
            scope_of[nid] = scope
            if isinstance(node, (Call, Tuple, TupleGetItem)):
                for child in kids_of[nid]:
                    entry = uses.get(id(child))
                    if entry is None:
                        uses[id(child)] = [(scope, _ARG)]
                    else:
                        entry.append((scope, _ARG))
            elif isinstance(node, Let):
                bound_ids.add(id(node.var))
                if nid in inline and use[0][1] == _TAIL:
                    spine.add(nid)
                    inner = scope
                else:
                    inner = _Scope(scope, node.body)
                    blocks[nid] = [inner]
                self.let_scope[nid] = inner
                _use(uses, node.value, inner, _LETVAL)
                _use(uses, node.body, inner, _TAIL)
            elif isinstance(node, Function):
                bound_ids.update(id(p) for p in node.params)
                inner = _Scope(scope, node.body)
                blocks[nid] = [inner]
                _use(uses, node.body, inner, _TAIL)
            elif isinstance(node, If):
                _use(uses, node.cond, scope, _ARG)
                then, other = _Scope(scope, node.true_branch), _Scope(scope, node.false_branch)
                blocks[nid] = [then, other]
                _use(uses, node.true_branch, then, _TAIL)
                _use(uses, node.false_branch, other, _TAIL)
            elif isinstance(node, Match):
                _use(uses, node.data, scope, _ARG)
                clauses = []
                for clause in node.clauses:
                    inner = _Scope(scope, clause.rhs)
                    clauses.append(inner)
                    _use(uses, clause.rhs, inner, _TAIL)
                    stack = [clause.lhs]
                    while stack:
                        p = stack.pop()
                        if isinstance(p, PatternVar):
                            bound_ids.add(id(p.var))
                        elif isinstance(p, (PatternConstructor, PatternTuple)):
                            stack.extend(p.patterns)
                blocks[nid] = clauses
            else:
                for child in kids_of[nid]:
                    _use(uses, child, scope, _ARG)
        self.free = [v for v in used if id(v) not in bound_ids]
        self.order_events(tail, kids_of)
        return root

    def walk(self, tail: Expr) -> tuple[list[Expr], dict[int, tuple[Expr, ...]], list[Var]]:
        """The non-atomic nodes children-first, their children, and the variables used."""
        kids_of: dict[int, tuple[Expr, ...]] = {}

        def kids(node: Expr) -> tuple[Expr, ...]:
            k = kids_of[id(node)] = _children(node)
            return k

        # Atoms are listed but not entered; the order keeps the other nodes, and the atoms
        # that are variables, in first-use order, are the variables used.
        order: list[Expr] = []
        used: list[Var] = []
        used_ids = self.used_vars
        for node in post_order(tail, gate=lambda n: not _is_atom(n), kids=kids):
            if id(node) not in kids_of:
                if type(node) is Var:
                    used_ids.add(id(node))
                    used.append(node)
                continue
            order.append(node)
        return order, kids_of, used

    def order_events(self, tail: Expr, kids_of: dict[int, tuple[Expr, ...]]) -> None:
        """Give each scope its statements and let lines, in evaluation order."""
        inline, spine, scope_of, let_scope = self.inline, self.spine, self.scope_of, self.let_scope
        stack: list[tuple[Expr, int]] = [(tail, 0)]
        seen: set[int] = set()
        while stack:
            node, state = stack.pop()
            nid = id(node)
            if state == 0:
                if nid in seen or nid not in kids_of:
                    continue
                seen.add(nid)
                if type(node) is Let:
                    if nid not in spine:
                        stack.append((node, 1))
                    stack.append((node, 2))
                    stack.append((node.value, 0))
                else:
                    stack.append((node, 1))
                    kids = kids_of[nid]
                    for j in range(len(kids) - 1, -1, -1):
                        stack.append((kids[j], 0))
            elif state == 1:
                if nid not in inline:
                    scope_of[nid].events.append(node)
            else:
                assert isinstance(node, Let)  # state 2 is pushed for let nodes only
                let_scope[nid].events.append(("let", node))
                stack.append((node.body, 0))

    # --- blocks -----------------------------------------------------------------------------

    def block(self, scope: _Scope, depth: int) -> Gen:
        lines = self.lines
        if scope.parent is None:
            for v in self.free:
                lines.append((depth, f"free_var {self.bind_var(v)};"))
        for event in scope.events:
            if type(event) is tuple:
                yield from self.let_line(event[1], depth)
                continue
            first = len(lines)
            yield from self.emit(event, depth)
            name = f"%{self.temps}"
            self.temps += 1
            self.names[id(event)] = name
            d, text = lines[first]
            lines[first] = (d, f"{name} = {text}")
            d, text = lines[-1]
            lines[-1] = (d, text + self.type_comment(event) + ";")
        result = scope.tail
        while type(result) is Let and id(result) in self.spine:
            result = result.body
        if _is_atom(result):
            lines.append((depth, self.atom(result)))
        elif id(result) in self.inline:
            yield from self.emit(result, depth)
            d, text = lines[-1]
            lines[-1] = (d, text + self.type_comment(result))
        else:
            lines.append((depth, self.names[id(result)]))

    def let_line(self, node: Let, depth: int) -> Gen:
        lines = self.lines
        v = node.var
        if (
            v.type_annotation is None
            and id(v) not in self.used_vars
            and (v.name_hint == "" or _NOT_IDENT.sub("_", v.name_hint) == "_")
        ):
            prefix = ""  # `e;` is `let %_ = e;`
        else:
            prefix = f"let {self.bind_var(v)} = "
        value = node.value
        first = len(lines)
        if _is_atom(value):
            lines.append((depth, self.atom(value)))
            comment = ""
        elif id(value) in self.inline:
            yield from self.emit(value, depth)
            comment = self.type_comment(value)
        else:
            lines.append((depth, self.names[id(value)]))
            comment = ""
        d, text = lines[first]
        lines[first] = (d, prefix + text)
        d, text = lines[-1]
        lines[-1] = (d, text + comment + ";")

    def emit(self, node: Expr, depth: int) -> Gen:
        """Write ``node``'s text as lines (its first line without any binding prefix)."""
        lines = self.lines
        if isinstance(node, Function):
            lines.append((depth, self.function_head(node, "fn ") + " {"))
            yield self.block(self.blocks[id(node)][0], depth + 1)
            lines.append((depth, "}"))
        elif isinstance(node, If):
            then, other = self.blocks[id(node)]
            lines.append((depth, f"if ({self.ref(node.cond)}) {{"))
            yield self.block(then, depth + 1)
            lines.append((depth, "} else {"))
            yield self.block(other, depth + 1)
            lines.append((depth, "}"))
        elif isinstance(node, Match):
            mark = "" if node.complete else "?"
            lines.append((depth, f"match{mark} ({self.ref(node.data)}) {{"))
            for clause, scope in zip(node.clauses, self.blocks[id(node)]):
                lines.append((depth + 1, self.pattern(clause.lhs) + " => {"))
                yield self.block(scope, depth + 2)
                lines.append((depth + 1, "},"))
            lines.append((depth, "}"))
        elif isinstance(node, Let):
            lines.append((depth, "("))
            yield self.block(self.blocks[id(node)][0], depth + 1)
            lines.append((depth, ")"))
        else:
            lines.append((depth, self.text(node)))

    # --- single-line forms ------------------------------------------------------------------

    def text(self, node: Expr) -> str:
        match node:
            case Call():
                return self.call_text(node)
            case Tuple():
                fields = [self.ref(f) for f in node.fields]
                return "(" + ", ".join(fields) + ("," if len(fields) == 1 else "") + ")"
            case TupleGetItem():
                base = self.ref(node.tuple_value)
                if base[0].isdigit() or base[0] == "-":
                    base = f"({base})"  # `1.0` would read as a float
                return f"{base}.{node.index}"
            case RefCreate():
                return f"ref({self.ref(node.value)})"
            case RefRead():
                return f"ref_read({self.ref(node.ref)})"
            case RefWrite():
                return f"ref_write({self.ref(node.ref)}, {self.ref(node.value)})"
        raise InternalError(f"the printer does not know the expression {type(node).__name__}")

    def call_text(self, call: Call) -> str:
        op = call.op
        if _is_atom(op) and type(op) is Call:
            callee = self.atom(op) + "()"  # `Nil()(...)`: a bare `Nil(...)` would be one call
        else:
            callee = self.ref(op)
        args = [self.ref(a) for a in call.args]
        if type(op) is Op and call.attrs:
            opdef = registry.lookup(op.name)
            attrs = opdef.non_default_attrs(call.attrs) if opdef is not None else call.attrs
            args.extend(_attrs_text(attrs))
        return f"{callee}({', '.join(args)})"

    def ref(self, e: Expr) -> str:
        if _is_atom(e):
            return self.atom(e)
        name = self.names.get(id(e))
        if name is None:
            raise InternalError("the printer referred to an expression before naming it")
        return name

    def atom(self, e: Expr) -> str:
        match e:
            case Var():
                return self.var(e)
            case Constant():
                data = e.data
                if data.ndim == 0:
                    literal = write_scalar(data)
                    if literal is not None:
                        return literal
                return self.p.meta_ref(e)
            case GlobalVar():
                return "@" + e.name
            case Op() | Constructor():
                return e.name
            case Call(op=Constructor() as ctor):  # a constructor without fields, applied
                return ctor.name
        return "()"

    def function_head(self, fn: Function, prefix: str) -> str:
        head = prefix
        if fn.type_params:
            head += "[" + ", ".join(self.bind_tvar(tv) for tv in fn.type_params) + "]"
        params = [self.bind_var(p) for p in fn.params]
        params.extend(_attrs_text(fn.attrs))
        head += "(" + ", ".join(params) + ")"
        if fn.ret_type is not None:
            head += " -> " + self.type_text(fn.ret_type)
        return head

    def type_comment(self, node: Expr) -> str:
        if self.show_types is False or node.checked_type_ is None:
            return ""
        return f" /* ty={self.type_text(node.checked_type_)} */"

    def pattern(self, pat: Pattern) -> str:
        out: list[str] = []
        stack: list[Any] = [pat]
        while stack:
            p = stack.pop()
            if type(p) is str:
                out.append(p)
            elif isinstance(p, PatternWildcard):
                out.append("_")
            elif isinstance(p, PatternVar):
                out.append(self.bind_var(p.var))
            elif isinstance(p, PatternConstructor):
                if p.patterns:
                    stack.append(")")
                    _push_list(stack, p.patterns)
                    stack.append(p.constructor.name + "(")
                else:
                    out.append(p.constructor.name)
            elif isinstance(p, PatternTuple):
                stack.append(",)" if len(p.patterns) == 1 else ")")
                _push_list(stack, p.patterns)
                stack.append("(")
            else:
                raise InternalError(f"the printer does not know the pattern {type(p).__name__}")
        return "".join(out)


def _use(uses: dict[int, list[tuple[_Scope, int]]], child: Expr, scope: _Scope, pos: int) -> None:
    entry = uses.get(id(child))
    if entry is None:
        uses[id(child)] = [(scope, pos)]
    else:
        entry.append((scope, pos))


def _children(e: Expr) -> tuple[Expr, ...]:
    match e:
        case Call():
            return (e.op, *e.args)
        case Let():
            return (e.value, e.body)
        case Tuple():
            return e.fields
        case TupleGetItem():
            return (e.tuple_value,)
    return children(e)
