"""Staging Python expressions: names, arithmetic, ``@``, operator calls, tuples.

`ExprStager` holds what staging one function needs (its source, its Python scopes, the frame of
the block being staged) and turns each Python expression into a `Value`: a kiln expression, or
a Python value known while staging. Every expression is typed as soon as it is staged (see
`ExprStager.type_of`), so the staging of ``@`` and of Python numbers can depend on types, and
type errors are raised at the Python expression that causes them. Statements are staged by
`kiln.frontend.script_stage.Stager`, which extends this class.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from kiln.errors import Error, InternalError, Span, TypeCheckError
from kiln.frontend.script import ParsedSource, ScriptFunction
from kiln.frontend.script_values import (
    NUMBERS,
    ScriptError,
    Static,
    Value,
    describe,
    require_scalar,
    to_expr,
)
from kiln.infer import infer_types
from kiln.ir import (
    Call,
    Constant,
    Expr,
    If,
    Op,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
)
from kiln.ir.expr import const
from kiln.op.registry import OpDef, get

Binding = tuple[Var, Expr, Span]


@dataclass
class Frame:
    """The state of one block being staged: names in scope and the lets made so far."""

    env: dict[str, Value]
    returns: bool  # may the block return? (not inside loops, nor in merged if branches)
    context: str  # where the block is, for messages
    lets: list[Binding] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # why a name is no longer defined
    assigned_at: dict[str, Span] = field(default_factory=dict)

    def child(self, returns: bool | None = None, context: str | None = None) -> Frame:
        return Frame(dict(self.env), self.returns if returns is None else returns,
                     context or self.context, notes=dict(self.notes),
                     assigned_at=dict(self.assigned_at))


def assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """The names a list of statements assigns, in source order, each once."""
    found = [n for s in stmts for n in ast.walk(s)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return list(dict.fromkeys(n.id for n in found))


BINARY_OPS: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("add", operator.add),
    ast.Sub: ("subtract", operator.sub),
    ast.Mult: ("multiply", operator.mul),
    ast.Div: ("divide", operator.truediv),
    ast.FloorDiv: ("floor_divide", operator.floordiv),
    ast.Mod: ("floor_mod", operator.mod),  # Python's % rounds down, like floor_mod
    ast.Pow: ("power", operator.pow),
}
COMPARISONS: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Lt: ("less", operator.lt),
    ast.LtE: ("less_equal", operator.le),
    ast.Gt: ("greater", operator.gt),
    ast.GtE: ("greater_equal", operator.ge),
    ast.Eq: ("equal", operator.eq),
    ast.NotEq: ("not_equal", operator.ne),
}
UNSUPPORTED: dict[type, str] = {
    ast.Lambda: "lambda expressions",
    ast.ListComp: "list comprehensions",
    ast.SetComp: "set comprehensions",
    ast.DictComp: "dict comprehensions",
    ast.GeneratorExp: "generator expressions",
    ast.Dict: "dictionaries",
    ast.Set: "sets",
    ast.JoinedStr: "f-strings",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.Starred: "starred expressions",
    ast.Await: "await expressions",
    ast.Yield: "yield expressions",
    ast.YieldFrom: "yield expressions",
    ast.ClassDef: "class definitions",
    ast.FunctionDef: "nested function definitions",
    ast.AsyncFunctionDef: "nested function definitions",
    ast.Try: "try statements",
    ast.With: "with statements",
    ast.Raise: "raise statements",
    ast.Assert: "assert statements",
    ast.Delete: "del statements",
    ast.Global: "global declarations",
    ast.Nonlocal: "nonlocal declarations",
    ast.Import: "imports",
    ast.ImportFrom: "imports",
    ast.Break: "break statements (put the exit condition in a while loop's test)",
    ast.Continue: "continue statements (use if/else in the loop body)",
    ast.Match: "match statements",
    ast.AsyncFor: "async for loops",
    ast.AsyncWith: "async with statements",
}


class ExprStager:
    """Stages the expressions of one scripted function; `Stager` adds the statements."""

    def __init__(self, sf: ScriptFunction, active: tuple[ScriptFunction, ...]) -> None:
        self.sf = sf
        self.parsed: ParsedSource = sf.parsed()
        self.node = self.parsed.node
        self.fn_name = self.node.name
        self.active = active  # the scripted functions being inlined, outermost first
        fn = sf.python
        self.globals: dict[str, Any] = fn.__globals__
        self.closure: dict[str, Any] = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # a cell not yet filled
                pass
        args = self.node.args
        params = [a.arg for a in (*args.posonlyargs, *args.args)]
        self.locals = set(params) | set(assigned_names(self.node.body))
        self.types: dict[int, tuple[Expr, Type]] = {}
        self.frame = Frame({}, returns=False, context="the annotations")

    # --- spans, errors and types ----------------------------------------------------------

    def span(self, node: ast.AST) -> Span:
        return self.parsed.span(node)

    def error(self, message: str, node: ast.AST) -> ScriptError:
        return ScriptError(message, self.span(node))

    def type_of(self, e: Expr) -> Type:
        """The type of a staged expression (every free variable of it is annotated)."""
        if isinstance(e, Var):
            if e.type_annotation is None:
                raise InternalError(f"script variable %{e.name_hint} has no type")
            return e.type_annotation
        if isinstance(e, Constant):
            return e.tensor_type
        hit = self.types.get(id(e))
        if hit is None:
            hit = (e, infer_types(e).checked_type)
            self.types[id(e)] = hit
        return hit[1]

    def in_frame(self, frame: Frame) -> _Switch:
        return _Switch(self, frame)

    def static_type(self, node: ast.expr, what: str) -> Type:
        """A kiln type from an annotation, evaluated while staging."""
        with self.in_frame(Frame({}, returns=False, context="an annotation")):
            v = self.expr(node)
        t = v.value if isinstance(v, Static) else None
        if isinstance(t, tuple) and all(isinstance(f, Type) for f in t):
            t = TupleType(t)
        if not isinstance(t, Type):
            found = describe(v.value) if isinstance(v, Static) else "a tensor expression"
            raise self.error(f"the annotation of {what} must be a kiln type such as "
                             f"kiln.Tensor[(1, 4), \"float32\"], not {found}", node)
        return t

    # --- expressions ----------------------------------------------------------------------

    def expr(self, node: ast.expr) -> Value:
        rule = _EXPRESSION_RULES.get(type(node))
        if rule is None:
            what = UNSUPPORTED.get(type(node), f"{type(node).__name__} expressions")
            raise self.error(f"{what} are not supported in a kiln script", node)
        return rule(self, node)

    def constant(self, node: ast.Constant) -> Value:
        return Static(node.value)

    def name_ref(self, node: ast.Name) -> Value:
        return self.lookup(node.id, node)

    def lookup(self, name: str, node: ast.AST) -> Value:
        frame = self.frame
        if name in frame.env:
            return frame.env[name]
        if name in self.locals and frame.context != "an annotation":
            raise self.error(frame.notes.get(name, f"'{name}' is used before it is assigned"),
                             node)
        for scope in (self.closure, self.globals):
            if name in scope:
                return Static(scope[name])
        if hasattr(builtins, name):
            return Static(getattr(builtins, name))
        raise self.error(f"name '{name}' is not defined", node)

    def attribute(self, node: ast.Attribute) -> Value:
        base = self.expr(node.value)
        attr = node.attr
        if isinstance(base, Static):
            try:
                return Static(getattr(base.value, attr))
            except AttributeError:
                raise self.error(f"{describe(base.value)} has no attribute '{attr}'",
                                 node) from None
        if attr == "T":
            return self.op_call("transpose", [base], node)
        t = self.type_of(base)
        if isinstance(t, TensorType) and attr in ("shape", "ndim", "dtype"):
            return Static({"shape": t.shape, "ndim": t.ndim, "dtype": t.dtype}[attr])
        raise self.error(f"a kiln value has no attribute '{attr}' in a script (tensors have "
                         ".T, .shape, .ndim and .dtype); call kiln.op functions instead", node)

    def binop(self, node: ast.BinOp) -> Value:
        return self.binary(node.op, self.expr(node.left), self.expr(node.right), node)

    def binary(self, op: ast.operator, a: Value, b: Value, node: ast.AST) -> Value:
        if isinstance(op, ast.MatMult):
            return self.matmul(a, b, node)
        rule = BINARY_OPS.get(type(op))
        if rule is None:
            raise self.error(f"the operator {type(op).__name__} is not supported in a kiln "
                             "script", node)
        return self.arith(rule, a, b, node)

    def arith(self, rule: tuple[str, Callable[[Any, Any], Any]], a: Value, b: Value,
              node: ast.AST) -> Value:
        name, python = rule
        if (isinstance(a, Static) and isinstance(b, Static) and isinstance(a.value, NUMBERS)
                and isinstance(b.value, NUMBERS)):
            try:
                return Static(python(a.value, b.value))
            except ArithmeticError as e:
                raise self.error(f"{e} while staging", node) from None
        return self.op_call(name, [a, b], node)

    def matmul(self, a: Value, b: Value, node: ast.AST) -> Expr:
        """``a @ b``: nn.dense for matrices, nn.batch_matmul when a side is a batch (3-D)."""
        span = self.span(node)
        weight: Expr | None = None  # b as nn.dense's (units, in) weight, when free
        if isinstance(b, Static) and isinstance(b.value, np.ndarray) and b.value.ndim == 2:
            weight = Constant(np.ascontiguousarray(b.value.T), span=span)
        elif (isinstance(b, Call) and b.op == Op("transpose") and b.attrs.axes in (None, (1, 0))
              and _rank(self.type_of(b.args[0])) == 2):
            weight = b.args[0]
        ea = to_expr(a, span)
        eb = to_expr(b, span, like=self.type_of(ea))
        ta, tb = self.type_of(ea), self.type_of(eb)
        ranks = (_rank(ta), _rank(tb))
        if ranks not in ((2, 2), (3, 3), (3, 2), (2, 3)):
            raise TypeCheckError(
                f"@ multiplies matrices (2-D) or batches of matrices (3-D), but its operands "
                f"have types {ta} and {tb}", span)
        assert isinstance(ta, TensorType) and isinstance(tb, TensorType)
        ka, kb = ta.shape[-1], tb.shape[-2]
        if isinstance(ka, int) and isinstance(kb, int) and ka != kb:
            raise TypeCheckError(
                f"@: the left operand has shape {tuple(ta.shape)} and the right {tuple(tb.shape)}"
                f"; the left's last dimension ({ka}) must equal the right's next-to-last ({kb})",
                span)
        if ranks == (2, 2):
            if weight is None:
                weight = self.op_call("transpose", [eb], node)
            return self.op_call("nn.dense", [ea, weight], node)
        if ranks == (3, 2):
            eb = self.op_call("expand_dims", [eb], node, axis=0)
        elif ranks == (2, 3):
            ea = self.op_call("expand_dims", [ea], node, axis=0)
        return self.op_call("nn.batch_matmul", [ea, eb], node, transpose_b=False)

    def op_call(self, name: str | OpDef, args: list[Value], node: ast.AST,
                **attrs: Any) -> Expr:
        """A call of an operator; Python numbers among its inputs take the tensors' dtype."""
        span = self.span(node)
        opdef = name if isinstance(name, OpDef) else get(name)
        like = next((self.type_of(a) for a in args if isinstance(a, Expr)), None)
        exprs = [to_expr(a, span, like=like) for a in args]
        try:
            c = opdef(*exprs, **attrs)
        except Error as e:
            raise ScriptError(e.message, span) from None
        out = Call(c.op, c.args, c.attrs, span=span)
        self.type_of(out)  # type errors point at this Python expression
        return out

    def unaryop(self, node: ast.UnaryOp) -> Value:
        v = self.expr(node.operand)
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Invert):
            raise self.error("~ is not supported in a kiln script; use not or "
                             "kiln.op.logical_not", node)
        if isinstance(v, Static) and isinstance(v.value, NUMBERS):
            value = v.value
            if not isinstance(node.op, ast.USub):
                return Static(not value)
            if isinstance(value, np.bool_):  # numpy refuses it as well
                raise self.error("- of a numpy bool is not supported; use not", node)
            return Static(-value)
        name = "negative" if isinstance(node.op, ast.USub) else "logical_not"
        return self.op_call(name, [v], node)

    def compare(self, node: ast.Compare) -> Value:
        result: Value | None = None
        left = self.expr(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            rule = COMPARISONS.get(type(op))
            if rule is None:
                raise self.error(f"the comparison {type(op).__name__} is not supported in a "
                                 "kiln script", node)
            right = self.expr(right_node)
            part = self.arith(rule, left, right, node)
            result = part if result is None else self.logical(ast.And(), [result, part], node)
            left = right
        assert result is not None
        return result

    def boolop(self, node: ast.BoolOp) -> Value:
        return self.logical(node.op, [self.expr(v) for v in node.values], node)

    def logical(self, op: ast.boolop, values: list[Value], node: ast.AST) -> Value:
        """``and``/``or``: Python's on values known while staging, else logical_and/or."""
        statics = [v for v in values if isinstance(v, Static)]
        if len(statics) == len(values):
            known = statics[0]
            for s in statics[1:]:
                if bool(known.value) == isinstance(op, ast.And):
                    known = s
            return known
        name = "logical_and" if isinstance(op, ast.And) else "logical_or"
        out = values[0]
        for v in values[1:]:
            out = self.op_call(name, [out, v], node)
        return out

    def truth(self, cond: Static, node: ast.expr) -> bool:
        """A condition known while staging, read as Python reads it."""
        if not isinstance(cond.value, (*NUMBERS, type(None), str, tuple)):
            raise self.error(f"cannot decide an if on {describe(cond.value)} while staging",
                             node)
        return bool(cond.value)

    def ifexp(self, node: ast.IfExp) -> Value:
        cond = self.expr(node.test)
        if isinstance(cond, Static):
            return self.expr(node.body if self.truth(cond, node.test) else node.orelse)
        require_scalar(self.type_of(cond), ("bool",), "an if condition", self.span(node.test))
        a, b = self.expr(node.body), self.expr(node.orelse)
        span = self.span(node)
        ea = to_expr(a, span, like=self.type_of(b) if isinstance(b, Expr) else None)
        eb = to_expr(b, span, like=self.type_of(ea))
        out = If(cond, ea, eb, span=span)
        self.type_of(out)
        return out

    def sequence(self, node: ast.Tuple | ast.List) -> Value:
        values = [self.expr(e) for e in node.elts]
        statics = [v.value for v in values if isinstance(v, Static)]
        if len(statics) == len(values):
            return Static(tuple(statics))
        span = self.span(node)
        return Tuple(tuple(to_expr(v, span) for v in values), span=span)

    def subscript(self, node: ast.Subscript) -> Value:
        base = self.expr(node.value)
        index = self.expr(node.slice)
        if isinstance(base, Static) and isinstance(index, Static):
            # Any Python value: indexed as Python would, what it refuses is caught below.
            container: Any = base.value
            try:
                return Static(container[index.value])
            except Error as e:
                raise self.error(e.message, node) from None
            except (TypeError, IndexError, KeyError, ValueError) as e:
                raise self.error(f"cannot index {describe(base.value)}: {e}", node) from None
        if isinstance(base, Expr) and isinstance(index, Static):
            t = self.type_of(base)
            i = index.value
            if isinstance(t, TupleType) and isinstance(i, int) and not isinstance(i, bool):
                n = len(t.fields)
                if not -n <= i < n:
                    raise TypeCheckError(f"index {i} is out of range for a tuple of {n} "
                                         "field(s)", self.span(node))
                return TupleGetItem(base, i % n, span=self.span(node))
        raise self.error("only tuples can be indexed in a kiln script, with a constant int; "
                         "index tensors with kiln.op.take or kiln.op.strided_slice", node)

    def slice_of(self, node: ast.Slice) -> Static:
        parts = []
        for p in (node.lower, node.upper, node.step):
            v = Static(None) if p is None else self.expr(p)
            if not isinstance(v, Static):
                raise self.error("slices of tensors are not supported in a kiln script; use "
                                 "kiln.op.strided_slice", node)
            parts.append(v.value)
        return Static(slice(*parts))

    def call(self, node: ast.Call) -> Value:
        func = self.expr(node.func)
        if not isinstance(func, Static):
            raise self.error("a tensor cannot be called", node.func)
        f = func.value
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise self.error("*args in calls are not supported in a kiln script", a)
        for k in node.keywords:
            if k.arg is None:
                raise self.error("**kwargs in calls are not supported in a kiln script", k)
        args: list[tuple[Value, ast.AST]] = [(self.expr(a), a) for a in node.args]
        kwargs: dict[str, tuple[Value, ast.AST]] = {
            k.arg: (self.expr(k.value), k.value) for k in node.keywords
            if k.arg is not None}  # all are: **kwargs was refused above
        if isinstance(f, ScriptFunction):
            if kwargs:
                raise self.error("call scripted functions with positional arguments", node)
            if f in self.active:
                chain = " -> ".join(s.__name__ for s in (*self.active, f))
                raise self.error(f"recursive scripted functions are not supported ({chain}); "
                                 "write a for or while loop", node)
            return self.inline_call(f, args, node)
        if isinstance(f, OpDef):
            return self.operator_call(f, args, kwargs, node)
        if _is_builder(f):
            return self.builder(f, args, kwargs, node)
        if f is builtins.range:
            raise self.error("range(...) is supported only as the iterable of a for loop", node)
        raise self.error(
            f"cannot call {describe(f)} in a kiln script: only kiln.op operators and other "
            "@kiln.script functions can be called (the function is staged, not run)", node)

    def operator_call(self, opdef: OpDef, args: list[tuple[Value, ast.AST]],
                 kwargs: dict[str, tuple[Value, ast.AST]], node: ast.Call) -> Expr:
        """``kiln.op.sum(x, 1, keepdims=True)``: inputs first, then attributes in order."""
        n = opdef.num_inputs
        inputs = [v for v, _ in args[:n]]
        for name in opdef.inputs[len(inputs):]:
            if name in kwargs:
                inputs.append(kwargs.pop(name)[0])
        attrs: dict[str, tuple[Value, ast.AST]] = {}
        names = [a.name for a in opdef.attrs]
        if len(args) > n + len(names):
            raise self.error(f"{opdef.name} takes {n} input(s) and {len(names)} "
                             f"attribute(s), but is given {len(args)} arguments", node)
        for name, arg in zip(names, args[n:]):
            if name in kwargs:
                raise self.error(f"{opdef.name} is given attribute {name!r} twice", node)
            attrs[name] = arg
        attrs.update(kwargs)
        values = {}
        for name, (v, at) in attrs.items():
            if not isinstance(v, Static):
                raise self.error(f"attribute {name!r} of {opdef.name} must be a Python value "
                                 "known while staging, not a tensor", at)
            values[name] = v.value
        return self.op_call(opdef, inputs, node, **values)

    def builder(self, f: Callable[..., Any], args: list[tuple[Value, ast.AST]],
                kwargs: dict[str, tuple[Value, ast.AST]], node: ast.Call) -> Expr:
        """Builders such as kiln.op.zeros(shape, dtype): called with the staged values."""
        def plain(v: Value) -> Any:
            return v.value if isinstance(v, Static) else v

        span = self.span(node)
        try:
            out = f(*(plain(v) for v, _ in args), **{k: plain(v) for k, (v, _) in kwargs.items()})
        except Error as e:
            raise ScriptError(e.message, span) from None
        except (TypeError, ValueError) as e:
            raise ScriptError(f"{getattr(f, '__name__', f)}: {e}", span) from None
        if not isinstance(out, Expr):
            raise self.error(f"{describe(f)} did not build a kiln expression", node)
        out = dataclasses.replace(out, span=span)
        self.type_of(out)
        return out

    def inline_call(self, f: ScriptFunction, args: list[tuple[Value, ast.AST]],
                    node: ast.Call) -> Expr:
        raise InternalError("inline_call is defined by Stager")


def _rank(t: Type) -> int | None:
    return t.ndim if isinstance(t, TensorType) else None


def _is_builder(f: object) -> TypeGuard[Callable[..., Any]]:
    """Functions that build kiln expressions from staged values: kiln.op's, and kiln.const."""
    module = getattr(f, "__module__", None) or ""
    if module == "kiln.op.registry":
        return False
    return callable(f) and (f is const or module == "kiln.op" or module.startswith("kiln.op."))


_EXPRESSION_RULES: dict[type, Callable[[ExprStager, Any], Value]] = {
    ast.Constant: ExprStager.constant,
    ast.Name: ExprStager.name_ref,
    ast.Attribute: ExprStager.attribute,
    ast.BinOp: ExprStager.binop,
    ast.UnaryOp: ExprStager.unaryop,
    ast.Compare: ExprStager.compare,
    ast.BoolOp: ExprStager.boolop,
    ast.IfExp: ExprStager.ifexp,
    ast.Tuple: ExprStager.sequence,
    ast.List: ExprStager.sequence,
    ast.Subscript: ExprStager.subscript,
    ast.Slice: ExprStager.slice_of,
    ast.Call: ExprStager.call,
}


class _Switch:
    """``with stager.in_frame(frame):`` stages into ``frame``, then restores the previous one."""

    def __init__(self, stager: ExprStager, frame: Frame) -> None:
        self.stager, self.frame, self.saved = stager, frame, stager.frame

    def __enter__(self) -> None:
        self.saved = self.stager.frame
        self.stager.frame = self.frame

    def __exit__(self, *exc: object) -> None:
        self.stager.frame = self.saved
