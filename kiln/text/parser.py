"""The parser of Relay's text format (TVM 0.8–0.12's version 0.0.5, read as TVM read it).

A recursive-descent parser whose recursion never uses Python's stack for nesting: each parse
function is a generator, and where it needs a nested expression, type or pattern it says
``value = yield self._expr()``; `kiln.ir.traverse.trampoline` runs the generators on an explicit
stack. Fixed-depth delegation (binary operators → postfix chains → atoms) uses ``yield from``,
and chains — let bindings, graph bindings, sequences, operator precedence, call and projection
suffixes — are loops, so a 20,000-long chain costs no depth at all.

Module parsing reads all ``type`` and ``def`` headers before the bodies, so definitions may come
in any order and refer to each other. Every error is a `kiln.ParseError` pointing at the token
that is wrong.

Where TVM's parser left a choice open, kiln reads:

- ``let %f = fn ...`` binds ``%f`` in the function too (a recursive closure); any other let
  value is read before its variable is bound, so ``let %x = %x + 1`` refers to an outer ``%x``;
- ``%x -1`` subtracts (a literal's leading minus after an operand is the operator);
- ``(T)`` in a type groups (a one-field tuple type is ``(T,)``), while ``(p)`` in a pattern is a
  one-field tuple pattern, as TVM printed it;
- ``.0`` after any expression projects, and chains: ``%t.0.1``, ``f(%x).1``;
- graph bindings ``%0 = e;`` are scoped like lets: one made in a branch or a function body is
  not visible after it.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

import kiln.op  # noqa: F401  (the package registers the operators the parser resolves)
from kiln.errors import Error, InternalError, ParseError, SourceFile, Span
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TypeData,
)
from kiln.ir.attrs import EMPTY_ATTRS, Attrs
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
from kiln.ir.traverse import trampoline
from kiln.ir.ty import (
    ANY,
    DTYPES,
    Dim,
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
    as_dtype,
)
from kiln.op import registry
from kiln.text._gc import gc_paused
from kiln.text.dtypes import TVM_SHORTHANDS, canonical_dtype
from kiln.text.lexer import Tokens, tokenize
from kiln.text.literals import LiteralError, read_attr_number, read_number, scalar_array
from kiln.text.metadata import CONSTANT_KEY, MetadataError, decode

__all__ = ["parse", "parse_expr", "parse_type"]

Gen = Generator[Any, Any, Any]
_T = typing.TypeVar("_T")

# Infix operators: precedence (higher binds tighter) and the operator each one calls.
_BINARY = {
    "*": (3, "multiply"),
    "/": (3, "divide"),
    "+": (2, "add"),
    "-": (2, "subtract"),
    "<": (1, "less"),
    ">": (1, "greater"),
    "<=": (1, "less_equal"),
    ">=": (1, "greater_equal"),
    "==": (0, "equal"),
    "!=": (0, "not_equal"),
}
_DTYPE_LIKE = re.compile(r"(?:u?int|float|bfloat|bool)[0-9]*(?:x[0-9]+)?")
_DIM = re.compile(r"([0-9]{1,18})(?:i|i32|i64)?")
_META = re.compile(r"meta\[([^\]]*)\]\[([0-9]{1,9})\]")
_ATTR_NESTING = 64
_ATOMS = frozenset(("local", "graph", "num", "global", "bool"))


def parse(text: str, source_name: str = "<string>") -> IRModule:
    """A module from its text: ``def``/``type`` definitions, or one expression as ``@main``."""
    return _run(text, source_name, lambda p: p.module())


def parse_expr(text: str, source_name: str = "<string>") -> Expr:
    """One expression; ``free_var %x: T;`` declarations before it make free variables."""
    return _run(text, source_name, lambda p: p.expression())


def parse_type(text: str, source_name: str = "<string>") -> Type:
    """One type, such as ``Tensor[(1, ?, n), float32]`` or ``fn[A](A) -> A``."""
    return _run(text, source_name, lambda p: p.lone_type())


def _run(text: str, source_name: str, entry: Callable[[_Parser], _T]) -> _T:
    if not isinstance(text, str):
        raise Error(f"the text to parse must be a str, not {type(text).__name__}")
    source = SourceFile(str(source_name), text)
    parser: _Parser | None = None
    try:
        with gc_paused():
            parser = _Parser(tokenize(source))
            return entry(parser)
    except ParseError as e:
        # The user's mistake, not the parser's: drop the parser's frames from the traceback.
        raise e.with_traceback(None) from None
    except Error as e:  # raised by an IR constructor: report it where the parser stands
        span = e.span or (parser.here() if parser is not None else None)
        raise ParseError(e.message, span) from None
    except RecursionError:
        span = parser.here() if parser is not None else None
        raise ParseError("the text is nested too deeply to read", span) from None
    except Exception as e:  # noqa: BLE001 - a bug in the parser, reported as one
        span = parser.here() if parser is not None else None
        raise InternalError(f"the parser failed: {type(e).__name__}: {e}", span) from e


class _Parser:
    """One parse of one source text."""

    def __init__(self, tokens: Tokens) -> None:
        self.toks = tokens
        self.kinds = tokens.kinds
        self.values = tokens.values
        self.pos = 0
        # Lexical scopes: a name maps to the stack of its bindings; each frame lists what it
        # bound so that leaving it unbinds exactly that.
        self.locals: dict[str, list[Var]] = {}
        self.graph: dict[int, list[Expr]] = {}
        self.frames: list[list[tuple[dict[Any, list[Any]], Any]]] = [[]]
        self.tvars: dict[str, list[TypeVar]] = {}
        self.tframes: list[list[str]] = [[]]
        self.free_vars: dict[str, Var] = {}
        self.pattern_names: set[str] = set()
        # Module-level names.
        self.adts: dict[str, GlobalTypeVar] = {}
        self.ctors: dict[str, Constructor] = {}
        self.global_names: set[str] | None = None
        self.globals: dict[str, GlobalVar] = {}
        self.ops: dict[str, Op] = {}
        self.default_attrs: dict[str, Attrs] = {}
        self.minus_taken = -1  # a `-1` token whose minus was read as the infix operator
        self.meta: dict[str, list[Constant]] | None = None
        if tokens.metadata is not None:
            try:
                self.meta = decode(tokens.metadata)
            except MetadataError as e:
                raise ParseError(str(e), self._metadata_span()) from None

    # --- entry points ---------------------------------------------------------------------

    def module(self) -> IRModule:
        kinds, values = self.kinds, self.values
        self._skip_version()
        body_start = self.pos
        self._collect_headers()
        type_ends: dict[int, int] = {}
        tdefs: list[TypeData] = []
        for i in self.type_starts:
            self.pos = i
            tdefs.append(self._typedef())
            type_ends[i] = self.pos
        functions: dict[str, Function] = {}
        self.pos = body_start
        while True:
            i = self.pos
            k = kinds[i]
            if k == "def":
                name = values[i + 1]
                self.pos = i + 2
                functions[name] = trampoline(self._function(i))
            elif k == "type" or k == "extern":
                self.pos = type_ends[i]
            elif k == "eof":
                break
            elif k == "version":
                raise self._fail("the version header must come first")
            else:
                expr = trampoline(self._expr())
                self._expect("eof", " after the expression")
                if "main" in functions:
                    raise self._fail("this module defines @main and also has a bare expression", i)
                functions["main"] = self._as_main(expr)
                break
        return IRModule(functions, tdefs)

    def expression(self) -> Expr:
        self._skip_version()
        expr = trampoline(self._expr())
        self._expect("eof", " after the expression")
        return expr

    def lone_type(self) -> Type:
        ty = trampoline(self._type())
        self._expect("eof", " after the type")
        return ty

    def here(self) -> Span:
        """The span of the current token (for errors raised outside the parser's own checks)."""
        i = min(self.pos, len(self.kinds) - 1)
        return self.toks.span(i)

    # --- errors ---------------------------------------------------------------------------

    def _fail(self, message: str, first: int | None = None, last: int | None = None) -> ParseError:
        i = self.pos if first is None else first
        return ParseError(message, self.toks.span(i, i if last is None else last))

    def _describe(self, i: int) -> str:
        k, v = self.kinds[i], self.values[i]
        if k == "eof":
            return "the end of the input"
        if k in ("local", "graph"):
            return f"`%{v}`"
        if k == "global":
            return f"`@{v}`"
        if k in ("ident", "num", "meta"):
            return f"`{v}`"
        if k == "bool":
            return f"`{v}`"
        if k == "str":
            return "a string"
        if k == "proj":
            return f"`.{v}`"
        if k == "version":
            return "a version header"
        return f"`{k}`"

    def _expect(self, kind: str, context: str = "") -> int:
        i = self.pos
        if self.kinds[i] != kind:
            want = "the end of the input" if kind == "eof" else f"`{kind}`"
            raise self._fail(f"expected {want}{context}, but found {self._describe(i)}")
        self.pos = i + 1
        return i

    def _metadata_span(self) -> Span:
        start = self.toks.starts[-1]
        return self.toks.offset_span(start, self.toks.metadata_start)

    # --- scopes ---------------------------------------------------------------------------

    def _push(self) -> None:
        self.frames.append([])

    def _pop(self) -> None:
        for table, key in reversed(self.frames.pop()):
            stack = table[key]
            stack.pop()
            if not stack:
                del table[key]

    def _bind(self, table: dict[Any, list[Any]], key: Any, value: Any) -> None:
        stack = table.get(key)
        if stack is None:
            table[key] = [value]
        else:
            stack.append(value)
        self.frames[-1].append((table, key))

    def _tpush(self) -> None:
        self.tframes.append([])

    def _tpop(self) -> None:
        for name in reversed(self.tframes.pop()):
            stack = self.tvars[name]
            stack.pop()
            if not stack:
                del self.tvars[name]

    # --- module structure -----------------------------------------------------------------

    def _skip_version(self) -> None:
        if self.kinds[0] == "version":
            self.pos = 1

    def _collect_headers(self) -> None:
        """Find every `type T` and `def @f` first, so bodies may refer to later definitions."""
        kinds, values = self.kinds, self.values
        self.type_starts: list[int] = []
        names: set[str] = set()
        for i in _indices(kinds, "type"):
            start = i - 1 if i > 0 and kinds[i - 1] == "extern" else i
            if kinds[i + 1] == "ident":
                name = values[i + 1]
                if name in self.adts:
                    raise self._fail(f"type {name} is defined twice", i + 1)
                self.adts[name] = GlobalTypeVar(name, span=self.toks.span(i + 1))
            self.type_starts.append(start)
        for i in _indices(kinds, "def"):
            if kinds[i + 1] != "global":
                raise self._fail(
                    f"expected a global name like `@main` after `def`, but found "
                    f"{self._describe(i + 1)}",
                    i + 1,
                )
            name = values[i + 1]
            if name in names:
                raise self._fail(f"@{name} is defined twice", i + 1)
            names.add(name)
        for i in _indices(kinds, "extern"):
            if kinds[i + 1] != "type":
                raise self._fail("expected `type` after `extern`", i + 1)
        self.global_names = names

    def _typedef(self) -> TypeData:
        kinds, values = self.kinds, self.values
        start = self.pos
        extern = kinds[start] == "extern"
        if extern:
            self.pos += 1
        self._expect("type")
        i = self.pos
        if kinds[i] != "ident" or "." in values[i]:
            raise self._fail(f"expected a type name after `type`, but found {self._describe(i)}")
        name = values[i]
        if name == "Tensor" or _DTYPE_LIKE.fullmatch(name):
            raise self._fail(f"`{name}` is a built-in type and cannot be defined", i)
        header = self.adts[name]
        self.pos = i + 1
        self._tpush()
        tvars = self._type_params() if kinds[self.pos] == "[" else []
        ctors: list[Constructor] = []
        if kinds[self.pos] == "{":
            if extern:
                raise self._fail("an extern type has no constructors")
            self.pos += 1
            while kinds[self.pos] != "}":
                c = self.pos
                if kinds[c] != "ident" or "." in values[c]:
                    raise self._fail(
                        f"expected a constructor name or `}}`, but found {self._describe(c)}"
                    )
                cname = values[c]
                if cname in self.ctors:
                    raise self._fail(f"constructor {cname} is defined twice", c)
                self.pos = c + 1
                inputs: list[Type] = []
                if kinds[self.pos] == "(":
                    inputs = trampoline(self._type_list("(", ")"))
                span = self.toks.span(c, self.pos - 1)
                ctor = Constructor(cname, tuple(inputs), header, span=span)
                self.ctors[cname] = ctor
                ctors.append(ctor)
                if kinds[self.pos] == ",":
                    self.pos += 1
                elif kinds[self.pos] != "}":
                    raise self._fail(
                        f"expected `,` or `}}` after constructor {cname}, "
                        f"but found {self._describe(self.pos)}"
                    )
            self.pos += 1
        self._tpop()
        span = self.toks.span(start, self.pos - 1)
        return TypeData(header, tuple(tvars), tuple(ctors), span=span)

    def _as_main(self, expr: Expr) -> Function:
        params = tuple(self.free_vars.values())
        if params or not isinstance(expr, Function):
            return Function(params, expr, span=expr.span)
        return expr

    # --- expressions: bindings and sequences ----------------------------------------------

    def _expr(self) -> Gen:
        """``(let %x = e; | %0 = e; | free_var %x: T; | e;)* e``: one scope, built by a loop."""
        kinds, values = self.kinds, self.values
        self._push()
        items: list[tuple[Var | None, Expr, int]] = []
        while True:
            i = self.pos
            k = kinds[i]
            if k == "let":
                self.pos = i + 1
                var = yield from self._binder("let")
                self._expect("=", f" after `let %{var.name_hint}`")
                recursive = kinds[self.pos] == "fn"
                if recursive:  # `let %f = fn ... { %f(...) }` may call itself
                    self._bind(self.locals, var.name_hint, var)
                value = yield from self._binop()
                self._expect(";", f" after the value of `let %{var.name_hint}`")
                if not recursive:
                    self._bind(self.locals, var.name_hint, var)
                items.append((var, value, i))
            elif k == "graph" and kinds[i + 1] == "=":
                self.pos = i + 2
                value = yield from self._binop()
                self._expect(";", f" after the value of `%{values[i]}`")
                self._bind(self.graph, int(values[i]), value)
            elif k == "free_var":
                self.pos = i + 1
                var = yield from self._binder("free_var")
                if var.name_hint in self.free_vars:
                    raise self._fail(f"free variable %{var.name_hint} is declared twice", i + 1)
                self.free_vars[var.name_hint] = var
                self._expect(";", f" after `free_var %{var.name_hint}`")
            else:
                value = yield from self._binop()
                if kinds[self.pos] != ";":
                    break
                self.pos += 1
                items.append((None, value, i))
        self._pop()
        if items:
            end = self.pos - 1
            span = self.toks.span
            for var, bound, i in reversed(items):
                if var is None:
                    var = Var("_", None)
                value = Let(var, bound, value, span=span(i, end))
        return value

    def _binder(self, what: str) -> Gen:
        """``%x`` or ``%x: T`` after `let` / `free_var`, as a new Var (not yet in scope)."""
        i = self.pos
        if self.kinds[i] != "local":
            hint = ""
            if self.kinds[i] == "graph":
                hint = f" (`%{self.values[i]}` is a graph binding; variables need a name)"
            raise self._fail(
                f"expected a variable like `%x` after `{what}`, but found "
                f"{self._describe(i)}{hint}"
            )
        self.pos = i + 1
        annotation = None
        if self.kinds[self.pos] == ":":
            self.pos += 1
            annotation = yield self._type()
        return Var(self.values[i], annotation, span=self.toks.span(i))

    # --- expressions: operators, calls, projections -------------------------------------

    def _binop(self) -> Gen:
        """Infix operators by precedence, left-associative: a loop over an operand stack."""
        kinds, values = self.kinds, self.values
        first = self.pos
        lhs = yield from self._postfix()
        k = kinds[self.pos]
        if k not in _BINARY and not (k == "num" and values[self.pos][0] == "-"):
            return lhs
        operands = [(lhs, first, self.pos - 1)]
        ops: list[tuple[int, str, int]] = []
        while True:
            i = self.pos
            k = kinds[i]
            if k in _BINARY:
                prec, name = _BINARY[k]
                self.pos = i + 1
            elif k == "num" and values[i][0] == "-":
                # `%x -1` is `%x - 1`: the literal's first minus is the operator.
                prec, name = _BINARY["-"]
                self.minus_taken = i
            else:
                break
            while ops and ops[-1][0] >= prec:
                self._reduce(operands, ops)
            ops.append((prec, name, i))
            start = self.pos
            rhs = yield from self._postfix()
            operands.append((rhs, start, self.pos - 1))
        while ops:
            self._reduce(operands, ops)
        return operands[0][0]

    def _reduce(
        self, operands: list[tuple[Expr, int, int]], ops: list[tuple[int, str, int]]
    ) -> None:
        _, name, i = ops.pop()
        rhs, _, end = operands.pop()
        lhs, start, _ = operands.pop()
        op = self._op(name, i)
        span = self.toks.span(start, end)
        attrs = self._attrs_of(name, None, None, span)
        operands.append((Call(op, (lhs, rhs), attrs, span=span), start, end))

    def _postfix(self) -> Gen:
        """An atom followed by any number of calls ``(args)`` and projections ``.i``."""
        kinds, values = self.kinds, self.values
        start = i = self.pos
        k = kinds[i]
        e: Expr
        if k == "local":
            e = self._local(i)
            self.pos = i + 1
        elif k == "graph":
            e = self._graph_ref(i)
            self.pos = i + 1
        elif k == "ident":
            e = self._ident_expr(i)
        elif k == "num":
            e = self._number(i)
            self.pos = i + 1
        elif k == "global":
            e = self._global(i)
            self.pos = i + 1
        elif k == "bool":
            e = Constant(np.array(values[i] == "True"), span=self.toks.span(i))
            self.pos = i + 1
        else:
            e = yield from self._nested_atom()
        while True:
            i = self.pos
            k = kinds[i]
            if k == "(":
                e = yield from self._call(e, start)
            elif k == "proj":
                e = TupleGetItem(e, int(values[i]), span=self.toks.span(start, i))
                self.pos = i + 1
            else:
                return e

    def _fast_atom(self) -> Expr | None:
        """An atom that is a whole argument (followed by `,` or `)`), without a generator."""
        i = self.pos
        kinds = self.kinds
        k = kinds[i]
        if k not in _ATOMS or kinds[i + 1] not in (",", ")"):
            return None
        self.pos = i + 1
        if k == "local":
            return self._local(i)
        if k == "graph":
            return self._graph_ref(i)
        if k == "num":
            return self._number(i)
        if k == "global":
            return self._global(i)
        return Constant(np.array(self.values[i] == "True"), span=self.toks.span(i))

    def _call(self, callee: Expr, start: int) -> Gen:
        kinds = self.kinds
        opening = self.pos
        self.pos += 1
        args: list[Expr] = []
        given: dict[str, Any] | None = None
        where: dict[str, tuple[int, int, int]] = {}
        while True:
            i = self.pos
            k = kinds[i]
            if k == ")":
                self.pos = i + 1
                break
            if k == "ident" and kinds[i + 1] == "=":
                given, where = self._attr_pairs()
                self._expect(")", " to close the call")
                break
            arg = self._fast_atom()
            if arg is None:
                try:
                    arg = yield self._expr()
                except ParseError:
                    unclosed = self._unclosed_call(opening, i)
                    if unclosed is None:
                        raise
                    raise unclosed from None
            args.append(arg)
            k = kinds[self.pos]
            if k == ",":
                self.pos += 1
            elif k != ")":
                unclosed = self._unclosed_call(opening, i)
                if unclosed is not None:
                    raise unclosed
                raise self._fail(
                    f"expected `,` or `)` after a call argument, but found "
                    f"{self._describe(self.pos)}"
                )
        span = self.toks.span(start, self.pos - 1)
        if isinstance(callee, Op):
            opdef = registry.lookup(callee.name)
            if opdef is not None and len(args) != opdef.num_inputs:
                inputs = ", ".join(opdef.inputs)
                raise ParseError(
                    f"{callee.name} takes {opdef.num_inputs} argument(s) ({inputs}), "
                    f"but this call gives {len(args)}",
                    span,
                )
            attrs = self._attrs_of(callee.name, given, where, span)
        else:
            # TVM's printer writes a non-operator call's attributes (its CallAttrs) followed by
            # `attrs_type_key`, and its parser needs that key. They never change what calling
            # a function does (TVM's interpreter and executors ignore them), so kiln reads and
            # drops them.
            if given and "attrs_type_key" not in given:
                key = next(iter(where.values()))[0]
                raise self._fail(
                    "attributes of a call of a function (not an operator) need "
                    '`attrs_type_key="..."` naming their kind, as TVM writes them',
                    key,
                )
            attrs = EMPTY_ATTRS
        return Call(callee, tuple(args), attrs, span=span)

    def _unclosed_call(self, opening: int, arg_start: int) -> ParseError | None:
        """The error for a call whose `)` is missing before a `;`, if that is what went wrong.

        A call argument may be a sequence ``e1; e2``, but TVM's printer never writes one: a
        plain expression followed by `;` inside the argument means the call was not closed
        (``%0 = add(%x, %x;``). Bindings (`let`, `%0 = `, `free_var`) before a `;` are not.
        """
        kinds = self.kinds
        depth = 0
        statement = arg_start
        for j in range(arg_start, min(self.pos + 1, len(kinds))):
            k = kinds[j]
            if k in ("(", "[", "{"):
                depth += 1
            elif k in (")", "]", "}"):
                depth -= 1
                if depth < 0:
                    return None
            elif k == ";" and depth == 0:
                first = kinds[statement]
                binding = first in ("let", "free_var") or (
                    first == "graph" and kinds[statement + 1] == "="
                )
                if not binding:
                    at = self.toks.span(opening)
                    return self._fail(
                        "expected `,` or `)` after a call argument, but found `;`: the `(` "
                        f"of this call (line {at.line}, column {at.column}) is never closed",
                        j,
                    )
                statement = j + 1
        return None

    def _attrs_of(
        self,
        name: str,
        given: dict[str, Any] | None,
        where: dict[str, tuple[int, int, int]] | None,
        span: Span,
    ) -> Attrs:
        """The operator's full attributes: the given ones checked, defaults for the rest."""
        opdef = registry.get(name)
        if not given:
            attrs = self.default_attrs.get(name)
            if attrs is None:
                try:
                    attrs = opdef.normalize_attrs({}, span)
                except Error as e:
                    raise ParseError(e.message, span) from None
                self.default_attrs[name] = attrs
            return attrs
        assert where is not None
        known = {a.name for a in opdef.attrs}
        given = {  # TVM's dtype spellings (`int`, `float`, ...) as kiln names them
            key: canonical_dtype(value) or value
            if key in known and opdef.attr(key).kind == "dtype" and isinstance(value, str)
            else value
            for key, value in given.items()
        }
        for key, value in given.items():
            k, v0, v1 = where[key]
            if key not in known:
                valid = ", ".join(a.name for a in opdef.attrs) or "none"
                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise self._fail(
                    f"{name} has no attribute {key}{hint}; its attributes are: {valid}", k
                )
            try:
                opdef.attr(key).check(value, name)
            except Error as e:
                raise self._fail(e.message, v0, v1) from None
            except (TypeError, ValueError) as e:  # an attribute converter that did not expect it
                raise self._fail(f"{name}: invalid value for attribute {key} ({e})", v0, v1) from e
        try:
            return opdef.normalize_attrs(given, span)
        except Error as e:
            raise ParseError(e.message, e.span or span) from None

    def _attr_pairs(self) -> tuple[dict[str, Any], dict[str, tuple[int, int, int]]]:
        """``name=value, ...`` up to (not including) the closing `)`."""
        kinds, values = self.kinds, self.values
        given: dict[str, Any] = {}
        where: dict[str, tuple[int, int, int]] = {}
        while True:
            i = self.pos
            if kinds[i] != "ident" or kinds[i + 1] != "=":
                raise self._fail(
                    "expected an attribute `name=value` (positional arguments come before "
                    f"attributes), but found {self._describe(i)}"
                )
            key = values[i]
            if key in given:
                raise self._fail(f"attribute {key} is given twice", i)
            self.pos = i + 2
            given[key] = self._attr_value()
            where[key] = (i, i + 2, self.pos - 1)
            if kinds[self.pos] != ",":
                return given, where
            self.pos += 1
            if kinds[self.pos] == ")":
                return given, where

    def _attr_value(self) -> Any:
        """A literal, a string, True/False, None, or a (nested) list of those, as Python values."""
        kinds = self.kinds
        stack: list[list[Any]] = []
        while True:
            if kinds[self.pos] == "[":
                if len(stack) >= _ATTR_NESTING:
                    raise self._fail("this attribute value is nested too deeply")
                self.pos += 1
                if kinds[self.pos] != "]":
                    stack.append([])
                    continue
                self.pos += 1
                value: Any = ()
            else:
                value = self._attr_scalar()
            while stack:
                stack[-1].append(value)
                k = kinds[self.pos]
                if k == ",":
                    self.pos += 1
                    if kinds[self.pos] != "]":
                        break
                    k = "]"
                if k != "]":
                    raise self._fail(
                        f"expected `,` or `]` in a list, but found {self._describe(self.pos)}"
                    )
                self.pos += 1
                value = tuple(stack.pop())
            else:
                return value

    def _attr_scalar(self) -> Any:
        i = self.pos
        k, v = self.kinds[i], self.values[i]
        self.pos = i + 1
        if k == "num":
            try:
                return read_attr_number(v)
            except LiteralError as e:
                raise self._fail(str(e), i) from None
        if k == "str":
            return v
        if k == "bool":
            return v == "True"
        if k == "ident" and v in ("None", "nullptr"):
            return None
        raise self._fail(
            "expected an attribute value (a number, a string, True, False, None or a list), "
            f"but found {self._describe(i)}",
            i,
        )

    # --- expressions: atoms ---------------------------------------------------------------

    def _local(self, i: int) -> Var:
        name = self.values[i]
        stack = self.locals.get(name)
        if stack:
            return stack[-1]
        var = self.free_vars.get(name)
        if var is not None:
            return var
        close = difflib.get_close_matches(name, list(self.locals) + list(self.free_vars), n=1)
        hint = f"; did you mean %{close[0]}?" if close else ""
        raise self._fail(
            f"unbound variable %{name}: no let, parameter, pattern or free_var binds it here{hint}",
            i,
        )

    def _graph_ref(self, i: int) -> Expr:
        stack = self.graph.get(int(self.values[i]))
        if stack:
            return stack[-1]
        raise self._fail(
            f"%{self.values[i]} is not defined here: no `%{self.values[i]} = ...;` precedes it "
            "in this scope",
            i,
        )

    def _global(self, i: int) -> GlobalVar:
        name = self.values[i]
        gv = self.globals.get(name)
        if gv is None:
            if self.global_names is not None and name not in self.global_names:
                close = difflib.get_close_matches(name, sorted(self.global_names), n=1)
                hint = f"; did you mean @{close[0]}?" if close else ""
                raise self._fail(f"undefined global function @{name}{hint}", i)
            gv = self.globals[name] = GlobalVar(name, span=self.toks.span(i))
        return gv

    def _number(self, i: int) -> Constant:
        text = self.values[i]
        if i == self.minus_taken:
            text = text[1:]
        try:
            dtype, value = read_number(text)
        except LiteralError as e:
            raise self._fail(str(e), i) from None
        return Constant(scalar_array(dtype, value), span=self.toks.span(i))

    def _op(self, name: str, i: int) -> Op:
        op = self.ops.get(name)
        if op is None:
            if registry.lookup(name) is None:
                raise self._fail(self._unknown_name(name), i)
            op = self.ops[name] = Op(name, span=self.toks.span(i))
        return op

    def _unknown_name(self, name: str) -> str:
        if name in self.adts or name in DTYPES or name in TVM_SHORTHANDS or name == "Tensor":
            return f"`{name}` is a type, not an expression"
        candidates = [op.name for op in registry.all_ops()] + list(self.ctors)
        close = difflib.get_close_matches(name, candidates, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        if name[:1].isupper():
            return f"undefined constructor or operator `{name}`{hint}"
        return f"unknown operator `{name}`{hint}"

    def _ident_expr(self, i: int) -> Expr:
        name = self.values[i]
        ctor = self.ctors.get(name)
        self.pos = i + 1
        if ctor is None:
            return self._op(name, i)
        if not ctor.inputs and self.kinds[i + 1] != "(":
            # A bare constructor without fields is its value, as TVM's parser reads it.
            return Call(ctor, (), span=self.toks.span(i))
        return ctor

    def _nested_atom(self) -> Gen:
        kinds = self.kinds
        i = self.pos
        k = kinds[i]
        if k == "(":
            return (yield from self._paren(i))
        if k == "fn":
            self.pos = i + 1
            return (yield from self._function(i))
        if k == "if":
            return (yield from self._if(i))
        if k == "match" or k == "match?":
            return (yield from self._match(i))
        if k == "ref" or k == "ref_read":
            self.pos = i + 1
            self._expect("(", f" after `{k}`")
            value = yield self._expr()
            self._expect(")", f" to close `{k}(`")
            span = self.toks.span(i, self.pos - 1)
            return RefCreate(value, span=span) if k == "ref" else RefRead(value, span=span)
        if k == "ref_write":
            self.pos = i + 1
            self._expect("(", " after `ref_write`")
            ref = yield self._expr()
            self._expect(",", " between the reference and the value of `ref_write`")
            value = yield self._expr()
            self._expect(")", " to close `ref_write(`")
            return RefWrite(ref, value, span=self.toks.span(i, self.pos - 1))
        if k == "{":
            self.pos = i + 1
            value = yield self._expr()
            self._expect("}", " to close the block")
            return value
        if k == "meta":
            return self._meta(i)
        raise self._fail(self._not_an_expression(i), i)

    def _not_an_expression(self, i: int) -> str:
        k = self.kinds[i]
        if k == "let":
            return "a `let` here must be wrapped in parentheses: `(let %x = ...; ...)`"
        if k == "-":
            return "`-` negates only number literals here; write negative(e) to negate e"
        if k == "eof":
            return "expected an expression, but the input ended"
        return f"expected an expression, but found {self._describe(i)}"

    def _paren(self, start: int) -> Gen:
        kinds = self.kinds
        self.pos = start + 1
        if kinds[self.pos] == ")":
            self.pos += 1
            return Tuple((), span=self.toks.span(start, self.pos - 1))
        first = self._fast_atom()
        if first is None:
            first = yield self._expr()
        if kinds[self.pos] == ")":
            self.pos += 1
            return first
        if kinds[self.pos] != ",":
            raise self._fail(
                f"expected `,` or `)` in parentheses, but found {self._describe(self.pos)}"
            )
        fields = [first]
        while kinds[self.pos] == ",":
            self.pos += 1
            if kinds[self.pos] == ")":
                break
            field = self._fast_atom()
            if field is None:
                field = yield self._expr()
            fields.append(field)
        self._expect(")", " to close the tuple")
        return Tuple(tuple(fields), span=self.toks.span(start, self.pos - 1))

    def _meta(self, i: int) -> Constant:
        m = _META.fullmatch(self.values[i])
        if m is None:
            raise self._fail("a metadata reference looks like meta[relay.Constant][0]", i)
        key, index = m.group(1), int(m.group(2))
        if self.meta is None:
            raise self._fail(
                f"{self.values[i]} refers to the metadata section, but this text has none "
                "(it starts with #[metadata] after the program)",
                i,
            )
        if key != CONSTANT_KEY:
            raise self._fail(f"kiln's metadata section holds only {CONSTANT_KEY}, not {key}", i)
        table = self.meta[key]
        if index >= len(table):
            raise self._fail(
                f"{self.values[i]} is out of range: the metadata section holds "
                f"{len(table)} constant(s)",
                i,
            )
        self.pos = i + 1
        return table[index]

    # --- expressions: functions, conditionals, matches -----------------------------------

    def _function(self, start: int) -> Gen:
        """``[A, B](%x: T, attr=v) -> R { body }`` after `fn` (or after `def @name`)."""
        kinds, values = self.kinds, self.values
        self._push()
        self._tpush()
        type_params = self._type_params() if kinds[self.pos] == "[" else []
        self._expect("(", " to open the parameter list")
        params: list[Var] = []
        attrs: dict[str, Any] = {}
        seen: set[str] = set()
        while True:
            i = self.pos
            k = kinds[i]
            if k == ")":
                self.pos = i + 1
                break
            if k == "ident" and kinds[i + 1] == "=":
                attrs, _ = self._attr_pairs()
                self._expect(")", " to close the parameter list")
                break
            if k != "local":
                raise self._fail(
                    "expected a parameter like `%x: Tensor[(2), float32]`, an attribute or "
                    f"`)`, but found {self._describe(i)}"
                )
            name = values[i]
            self.pos = i + 1
            annotation = None
            if kinds[self.pos] == ":":
                self.pos += 1
                annotation = yield self._type()
            if name in seen:
                raise self._fail(f"parameter %{name} is declared twice", i)
            seen.add(name)
            var = Var(name, annotation, span=self.toks.span(i))
            self._bind(self.locals, name, var)
            params.append(var)
            if kinds[self.pos] == ",":
                self.pos += 1
            elif kinds[self.pos] != ")":
                raise self._fail(
                    f"expected `,` or `)` after parameter %{name}, but found "
                    f"{self._describe(self.pos)}"
                )
        ret_type = None
        if kinds[self.pos] == "->":
            self.pos += 1
            ret_type = yield self._type()
        self._expect("{", " to open the function body")
        body = yield self._expr()
        self._expect("}", " to close the function body")
        self._tpop()
        self._pop()
        return Function(
            tuple(params),
            body,
            ret_type,
            tuple(type_params),
            Attrs(attrs) if attrs else EMPTY_ATTRS,
            span=self.toks.span(start, self.pos - 1),
        )

    def _if(self, start: int) -> Gen:
        self.pos = start + 1
        self._expect("(", " after `if`")
        cond = yield self._expr()
        self._expect(")", " to close the condition of `if`")
        self._expect("{", " to open the `then` branch")
        then = yield self._expr()
        self._expect("}", " to close the `then` branch")
        self._expect("else", " after the `then` branch (an `if` needs both branches)")
        self._expect("{", " to open the `else` branch")
        other = yield self._expr()
        self._expect("}", " to close the `else` branch")
        return If(cond, then, other, span=self.toks.span(start, self.pos - 1))

    def _match(self, start: int) -> Gen:
        kinds = self.kinds
        complete = kinds[start] == "match"
        self.pos = start + 1
        data = yield from self._postfix()
        self._expect("{", " to open the clauses of the match")
        clauses: list[Clause] = []
        while kinds[self.pos] != "}":
            c = self.pos
            self._push()
            self.pattern_names = set()
            lhs = yield self._pattern()
            self._expect("=>", " after the pattern")
            rhs = yield self._expr()
            self._pop()
            clauses.append(Clause(lhs, rhs, span=self.toks.span(c, self.pos - 1)))
            if kinds[self.pos] == ",":
                self.pos += 1
            elif kinds[self.pos] != "}":
                raise self._fail(
                    f"expected `,` or `}}` after a match clause, but found "
                    f"{self._describe(self.pos)}"
                )
        self.pos += 1
        return Match(data, tuple(clauses), complete, span=self.toks.span(start, self.pos - 1))

    def _pattern(self) -> Gen:
        kinds, values = self.kinds, self.values
        i = self.pos
        k = kinds[i]
        if k == "_":
            self.pos = i + 1
            return PatternWildcard(span=self.toks.span(i))
        if k == "local":
            name = values[i]
            self.pos = i + 1
            annotation = None
            if kinds[self.pos] == ":":
                self.pos += 1
                annotation = yield self._type()
            if name in self.pattern_names:
                raise self._fail(f"pattern variable %{name} is bound twice in this pattern", i)
            self.pattern_names.add(name)
            var = Var(name, annotation, span=self.toks.span(i))
            self._bind(self.locals, name, var)
            return PatternVar(var, span=self.toks.span(i))
        if k == "ident":
            name = values[i]
            ctor = self.ctors.get(name)
            if ctor is None:
                raise self._fail(
                    f"undefined constructor `{name}` (to bind a variable, write `%{name}`)", i
                )
            self.pos = i + 1
            fields: list[Pattern] = []
            if kinds[self.pos] == "(":
                fields = yield from self._pattern_list()
            if len(fields) != len(ctor.inputs):
                raise self._fail(
                    f"constructor {name} has {len(ctor.inputs)} field(s), but this pattern "
                    f"gives {len(fields)}",
                    i,
                    self.pos - 1,
                )
            return PatternConstructor(ctor, tuple(fields), span=self.toks.span(i, self.pos - 1))
        if k == "(":
            fields = yield from self._pattern_list()
            return PatternTuple(tuple(fields), span=self.toks.span(i, self.pos - 1))
        raise self._fail(
            "expected a pattern (`_`, `%x`, a constructor such as `Cons(%h, %t)`, or a tuple "
            f"`(p, q)`), but found {self._describe(i)}"
        )

    def _pattern_list(self) -> Gen:
        kinds = self.kinds
        self.pos += 1  # the `(`
        fields: list[Pattern] = []
        while kinds[self.pos] != ")":
            fields.append((yield self._pattern()))
            if kinds[self.pos] == ",":
                self.pos += 1
            elif kinds[self.pos] != ")":
                raise self._fail(
                    f"expected `,` or `)` in a pattern, but found {self._describe(self.pos)}"
                )
        self.pos += 1
        return fields

    # --- types ----------------------------------------------------------------------------

    def _type(self) -> Gen:
        kinds, values = self.kinds, self.values
        i = self.pos
        k = kinds[i]
        span = self.toks.span
        if k == "ident":
            name = values[i]
            self.pos = i + 1
            if name == "Tensor":
                self._expect("[", " after `Tensor`")
                shape = self._shape()
                self._expect(",", " between the shape and the dtype of a tensor type")
                dtype = self._dtype(self.pos)
                self.pos += 1
                self._expect("]", " to close the tensor type")
                return TensorType(shape, dtype, span=span(i, self.pos - 1))
            scalar = canonical_dtype(name)
            if scalar is not None:
                return TensorType((), scalar, span=span(i))
            stack = self.tvars.get(name)
            if stack:
                if kinds[self.pos] == "[":
                    raise self._fail(f"type variable {name} takes no type arguments", self.pos)
                return stack[-1]
            header = self.adts.get(name)
            if header is not None:
                args: list[Type] = []
                if kinds[self.pos] == "[":
                    args = yield from self._type_list("[", "]")
                return TypeCall(header, tuple(args), span=span(i, self.pos - 1))
            if _DTYPE_LIKE.fullmatch(name):
                self._dtype(i)  # a dtype-like name gets the dtype's own message
            raise self._fail(f"undefined type `{name}`", i)
        if k == "(":
            self.pos = i + 1
            if kinds[self.pos] == ")":
                self.pos += 1
                return TupleType((), span=span(i, self.pos - 1))
            first = yield self._type()
            if kinds[self.pos] == ")":
                self.pos += 1
                return first  # `(T)` groups; a one-field tuple type is `(T,)`
            fields = [first]
            while kinds[self.pos] == ",":
                self.pos += 1
                if kinds[self.pos] == ")":
                    break
                fields.append((yield self._type()))
            self._expect(")", " to close the tuple type")
            return TupleType(tuple(fields), span=span(i, self.pos - 1))
        if k == "fn":
            self.pos = i + 1
            self._tpush()
            type_params = self._type_params() if kinds[self.pos] == "[" else []
            if kinds[self.pos] != "(":
                raise self._fail(
                    f"expected `(` and the argument types of a function type, but found "
                    f"{self._describe(self.pos)}"
                )
            arg_types = yield from self._type_list("(", ")")
            self._expect("->", " and the result type of a function type")
            ret = yield self._type()
            self._tpop()
            return FuncType(tuple(arg_types), ret, tuple(type_params), span=span(i, self.pos - 1))
        if k == "ref":
            self.pos = i + 1
            self._expect("(", " after `ref` in a type")
            value = yield self._type()
            self._expect(")", " to close `ref(`")
            return RefType(value, span=span(i, self.pos - 1))
        if k == "_":
            self.pos = i + 1
            return IncompleteType(span=span(i))
        raise self._fail(f"expected a type, but found {self._describe(i)}")

    def _type_list(self, open_: str, close: str) -> Gen:
        kinds = self.kinds
        self._expect(open_)
        types: list[Type] = []
        while kinds[self.pos] != close:
            types.append((yield self._type()))
            if kinds[self.pos] == ",":
                self.pos += 1
            elif kinds[self.pos] != close:
                raise self._fail(
                    f"expected `,` or `{close}` in a list of types, but found "
                    f"{self._describe(self.pos)}"
                )
        self.pos += 1
        return types

    def _dtype(self, i: int) -> str:
        name = self.values[i]
        if self.kinds[i] != "ident":
            raise self._fail(f"expected a dtype such as float32, but found {self._describe(i)}", i)
        dtype = canonical_dtype(name)
        if dtype is not None:
            return dtype
        if _DTYPE_LIKE.fullmatch(name) or name == "Tensor":
            try:
                as_dtype(name)
            except Error as e:
                raise self._fail(e.message, i) from None
        raise self._fail(f"expected a dtype such as float32, but found `{name}`", i)

    def _shape(self) -> tuple[Dim, ...]:
        kinds, values = self.kinds, self.values
        self._expect("(", " to open the shape of a tensor type")
        dims: list[Dim] = []
        while kinds[self.pos] != ")":
            i = self.pos
            k = kinds[i]
            if k == "num" and (m := _DIM.fullmatch(values[i])) is not None:
                dims.append(int(m.group(1)))
            elif k == "?":
                dims.append(ANY)
            elif k == "ident" and "." not in values[i]:
                dims.append(SymDim(values[i]))
            else:
                raise self._fail(
                    "expected a dimension (a non-negative integer, `?`, or a name), but found "
                    f"{self._describe(i)}"
                )
            self.pos = i + 1
            if kinds[self.pos] == ",":
                self.pos += 1
            elif kinds[self.pos] != ")":
                raise self._fail(
                    f"expected `,` or `)` in a shape, but found {self._describe(self.pos)}"
                )
        self.pos += 1
        return tuple(dims)

    def _type_params(self) -> list[TypeVar]:
        kinds, values = self.kinds, self.values
        self._expect("[")
        params: list[TypeVar] = []
        names: set[str] = set()
        while True:
            i = self.pos
            if kinds[i] != "ident" or "." in values[i]:
                raise self._fail(
                    f"expected a type parameter name such as A, but found {self._describe(i)}"
                )
            name = values[i]
            if name in DTYPES or name == "Tensor" or _DTYPE_LIKE.fullmatch(name):
                raise self._fail(f"`{name}` is a built-in type and cannot name a type parameter", i)
            if name in names:
                raise self._fail(f"type parameter {name} is declared twice", i)
            names.add(name)
            tv = TypeVar(name, span=self.toks.span(i))
            stack = self.tvars.get(name)
            if stack is None:
                self.tvars[name] = [tv]
            else:
                stack.append(tv)
            self.tframes[-1].append(name)
            params.append(tv)
            self.pos = i + 1
            if kinds[self.pos] != ",":
                break
            self.pos += 1
            if kinds[self.pos] == "]":
                break
        self._expect("]", " to close the type parameters")
        return params


def _indices(items: list[str], value: str) -> list[int]:
    """Every index of ``value`` in ``items`` (list.index runs in C)."""
    out = []
    i = -1
    try:
        while True:
            i = items.index(value, i + 1)
            out.append(i)
    except ValueError:
        return out
