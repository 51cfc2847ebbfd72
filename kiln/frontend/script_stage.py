"""Staging: the AST of a ``@kiln.script`` function → a typed kiln Function.

Each Python construct becomes kiln IR as the function is read, top to bottom:

- an assignment is a ``let`` (SSA: reassigning a name binds a new variable); a name bound to
  a Python value known while staging (a number, a module, an operator) stays that value;
- ``if``/``else`` on a tensor condition becomes a kiln ``If`` whose branches return the tuple of
  the variables they assign, unpacked after it; an ``if`` with a ``return`` inside takes the rest
  of the function into its branches instead; an ``if`` on a Python value picks its branch now;
- ``for i in range(...)`` and ``while`` become a local tail-recursive function over the
  loop-carried variables, as kiln writes loops;
- a call of another scripted function is inlined (its body staged again, with fresh variables).

Every expression is typed as soon as it is staged, so the staging of ``@`` and of Python
numbers can depend on the types, and type errors are raised at the Python line that causes
them. Nodes carry spans into the Python file, so later errors point there too.
"""

from __future__ import annotations

import ast
import builtins
from collections import deque
from collections.abc import Callable

import numpy as np

from kiln.errors import Error, Span, TypeCheckError
from kiln.frontend.script import ScriptFunction
from kiln.frontend.script_expr import (
    UNSUPPORTED,
    Binding,
    ExprStager,
    Frame,
    assigned_names,
)
from kiln.frontend.script_values import (
    Static,
    Value,
    compatible,
    describe,
    require_scalar,
    to_expr,
)
from kiln.infer import infer_types
from kiln.ir import (
    Call,
    Constant,
    Expr,
    Function,
    FuncType,
    If,
    IRModule,
    Let,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
)
from kiln.ir.expr import const

INT32 = TensorType((), "int32")


def stage_module(sf: ScriptFunction) -> IRModule:
    """The type-checked module whose ``@main`` is the staged function."""
    try:
        fn = Stager(sf, (sf,)).function()
    except RecursionError:  # staging recurses over the Python syntax tree, as Python does
        raise Error(f"{sf.__name__} nests expressions or blocks too deeply to stage; split "
                    "them into statements") from None
    return infer_types(IRModule.from_expr(fn))


def close_lets(lets: list[Binding], body: Expr) -> Expr:
    """``let``s around a body, innermost last."""
    for v, value, span in reversed(lets):
        body = Let(v, value, body, span=span)
    return body


def _annotation(v: Var) -> Type:
    """The type of a variable the stager made with one (its loop counter and parameters)."""
    assert v.type_annotation is not None
    return v.type_annotation


def has_return(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Return) for s in stmts for n in ast.walk(s))


class Stager(ExprStager):
    """Stages one scripted function (and, through inlining, the functions it calls)."""

    # --- the function ---------------------------------------------------------------------

    def params(self) -> list[tuple[str, Type, ast.arg]]:
        """The parameters with the types their annotations give."""
        args = self.node.args
        for extra, what in ((args.vararg, "*args"), (args.kwarg, "**kwargs")):
            if extra is not None:
                raise self.error(f"{what} parameters are not supported in a kiln script", extra)
        if args.kwonlyargs:
            raise self.error("keyword-only parameters are not supported in a kiln script",
                             args.kwonlyargs[0])
        if args.defaults:
            raise self.error("parameters with default values are not supported in a kiln "
                             "script", args.defaults[0])
        out = []
        for a in (*args.posonlyargs, *args.args):
            if a.annotation is None:
                raise self.error(
                    f"parameter '{a.arg}' of {self.fn_name} has no type annotation; annotate it "
                    f"as {a.arg}: kiln.Tensor[shape, dtype]", a)
            out.append((a.arg, self.static_type(a.annotation, f"parameter '{a.arg}'"), a))
        return out

    def return_type(self) -> Type | None:
        ann = self.node.returns
        return None if ann is None else self.static_type(ann, f"the result of {self.fn_name}")

    def function(self) -> Function:
        """The staged function (not yet type-checked as a whole)."""
        params = [Var(name, t, span=self.span(a)) for name, t, a in self.params()]
        frame = Frame({p.name_hint: p for p in params}, returns=True, context="the function")
        body = self.body(frame)
        return Function(tuple(params), body, ret_type=self.return_type(), span=self.span(
            self.node))

    def body(self, frame: Frame, lets: list[Binding] | None = None) -> Expr:
        """The function body staged in ``frame``, with ``lets`` (bound arguments) around it."""
        result = self.closed(self.node.body, frame, self.node)
        ret = self.return_type()
        if ret is not None and not compatible(ret, self.type_of(result)):
            raise TypeCheckError(
                f"{self.fn_name} is declared to return {ret} but returns "
                f"{self.type_of(result)}", self.span(self.node.returns or self.node))
        return close_lets(lets or [], result)

    def inline(self, args: list[tuple[Value, ast.AST]], node: ast.Call,
               caller: Stager) -> Expr:
        """The body of this function with its parameters bound to ``args`` (staged by caller)."""
        params = self.params()
        if len(args) != len(params):
            raise caller.error(f"{self.fn_name} takes {len(params)} argument(s), "
                               f"but is given {len(args)}", node)
        env: dict[str, Value] = {}
        lets: list[Binding] = []
        for (name, t, _), (value, arg_node) in zip(params, args):
            span = caller.span(arg_node)
            e = to_expr(value, span, like=t)
            found = caller.type_of(e)
            if not compatible(t, found):
                raise TypeCheckError(
                    f"argument '{name}' of {self.fn_name} must be {t}, but it is {found}", span)
            if isinstance(e, Var):
                env[name] = e
            else:
                v = Var(name, found, span=span)
                lets.append((v, e, span))
                env[name] = v
        return self.body(Frame(env, returns=True, context=self.fn_name), lets)

    def inline_call(self, f: ScriptFunction, args: list[tuple[Value, ast.AST]],
                    node: ast.Call) -> Expr:
        if f in self.active:
            chain = " -> ".join(s.__name__ for s in (*self.active, f))
            raise self.error(f"recursive scripted functions are not supported ({chain}); "
                             "write a for or while loop", node)
        return Stager(f, (*self.active, f)).inline(args, node, self)

    # --- blocks and statements ------------------------------------------------------------

    def closed(self, stmts: list[ast.stmt], frame: Frame, owner: ast.AST) -> Expr:
        """A block that must return: its lets around its result."""
        result = self.block(stmts, frame)
        if result is None:
            where = stmts[-1] if stmts else owner
            raise self.error(f"{self.fn_name} can reach its end here without returning a value; "
                             "every path must end in a return", where)
        return close_lets(frame.lets, result)

    def block(self, stmts: list[ast.stmt], frame: Frame) -> Expr | None:
        """Stage statements into ``frame``; the block's result if it returned, else None."""
        with self.in_frame(frame):
            pending = deque(stmts)
            while pending:
                result = self.statement(pending.popleft(), pending, frame)
                if result is not None:
                    return result
        return None

    def statement(self, s: ast.stmt, rest: deque[ast.stmt], frame: Frame) -> Expr | None:
        match s:
            case ast.Return(value=value):
                if not frame.returns:
                    raise self.error(f"return inside {frame.context} is not supported; "
                                     "assign the value and return it after", s)
                if value is None:
                    raise self.error("a kiln function must return a value", s)
                return to_expr(self.expr(value), self.span(value))
            case ast.Assign(targets=targets, value=value):
                v = self.expr(value)
                for t in targets:
                    self.assign(t, v, s, frame)
            case ast.AugAssign(target=target, op=op, value=value):
                if not isinstance(target, ast.Name):
                    raise self.error("augmented assignment is supported only to a name", target)
                current = self.lookup(target.id, target)
                v = self.binary(op, current, self.expr(value), s)
                self.assign(target, v, s, frame)
            case ast.AnnAssign(target=target, annotation=ann, value=value):
                if value is None or not isinstance(target, ast.Name):
                    raise self.error("an annotated assignment must give a name a value", s)
                declared = self.static_type(ann, f"'{target.id}'")
                e = to_expr(self.expr(value), self.span(value), like=declared)
                if not compatible(declared, self.type_of(e)):
                    raise TypeCheckError(f"'{target.id}' is declared {declared} but is given "
                                         f"{self.type_of(e)}", self.span(value))
                self.assign(target, e, s, frame)
            case ast.If():
                return self.if_statement(s, rest, frame)
            case ast.For():
                self.for_loop(s, frame)
            case ast.While():
                self.while_loop(s, frame)
            case ast.Pass():
                pass
            case ast.Expr(value=ast.Constant(value=str())):
                pass  # a docstring
            case ast.Expr(value=value):
                self.expr(value)  # a call of print(), say, is reported as such
                raise self.error("an expression statement has no effect in a kiln script; "
                                 "assign its value to a name", s)
            case _:
                what = UNSUPPORTED.get(type(s), f"{type(s).__name__} statements")
                raise self.error(f"{what} are not supported in a kiln script", s)
        return None

    def assign(self, target: ast.expr, value: Value, stmt: ast.stmt, frame: Frame) -> None:
        span = self.span(stmt)
        match target:
            case ast.Name(id=name):
                frame.assigned_at[name] = self.span(target)
                frame.notes.pop(name, None)
                if isinstance(value, (Static, Var)):
                    frame.env[name] = value
                    return
                v = Var(name, self.type_of(value), span=self.span(target))
                frame.lets.append((v, value, span))
                frame.env[name] = v
            case ast.Tuple(elts=elts) | ast.List(elts=elts):
                if any(isinstance(e, ast.Starred) for e in elts):
                    raise self.error("starred assignment is not supported in a kiln script",
                                     target)
                n = len(elts)
                if isinstance(value, Static):
                    items = value.value
                    if not isinstance(items, (tuple, list)) or len(items) != n:
                        raise self.error(f"cannot unpack {describe(items)} into {n} names",
                                         target)
                    for e, item in zip(elts, items):
                        self.assign(e, Static(item), stmt, frame)
                    return
                if isinstance(value, Tuple) and len(value.fields) == n:
                    for e, f in zip(elts, value.fields):
                        self.assign(e, f, stmt, frame)
                    return
                t = self.type_of(value)
                if not isinstance(t, TupleType) or len(t.fields) != n:
                    raise TypeCheckError(f"cannot unpack a value of type {t} into {n} names",
                                         self.span(target))
                if not isinstance(value, Var):
                    tmp = Var("_".join(e.id if isinstance(e, ast.Name) else "t" for e in elts),
                              t, span=self.span(target))
                    frame.lets.append((tmp, value, span))
                    value = tmp
                for i, e in enumerate(elts):
                    self.assign(e, TupleGetItem(value, i, span=self.span(e)), stmt, frame)
            case _:
                what = "an attribute" if isinstance(target, ast.Attribute) else "an element"
                raise self.error(f"assigning to {what} is not supported: kiln values are "
                                 "immutable; assign a new value to a name", target)

    # --- if -------------------------------------------------------------------------------

    def if_statement(self, s: ast.If, rest: deque[ast.stmt], frame: Frame) -> Expr | None:
        cond = self.expr(s.test)
        if isinstance(cond, Static):  # decided while staging: only the chosen branch exists
            rest.extendleft(reversed(s.body if self.truth(cond, s.test) else s.orelse))
            return None
        span = self.span(s)
        require_scalar(self.type_of(cond), ("bool",), "an if condition", self.span(s.test))
        if frame.returns and (has_return(s.body) or has_return(s.orelse)):
            # The rest of the function moves into both branches: each ends in a return.
            tail = list(rest)
            rest.clear()
            t = self.closed(s.body + tail, frame.child(), s)
            f = self.closed(s.orelse + tail, frame.child(), s)
            return If(cond, t, f, span=span)
        self.merged_if(s, cond, frame)
        return None

    def merged_if(self, s: ast.If, cond: Expr, frame: Frame) -> None:
        """Both branches fall through: the If returns the variables they assign."""
        span = self.span(s)
        tf, ff = frame.child(context=frame.context), frame.child(context=frame.context)
        self.block(s.body, tf)
        self.block(s.orelse, ff)
        merged: list[tuple[str, Expr, Expr, Type]] = []
        for name in assigned_names(s.body + s.orelse):
            a, b = tf.env.get(name), ff.env.get(name)
            if a is None or b is None:
                frame.env.pop(name, None)
                frame.notes[name] = (tf.notes.get(name) or ff.notes.get(name) or
                                     f"'{name}' is assigned in only one branch of the if at "
                                     f"line {span.line}, so it is not defined after it")
                continue
            if a is b or (isinstance(a, Static) and isinstance(b, Static)
                          and type(a.value) is type(b.value) and a.value is b.value):
                frame.env[name] = a
                continue
            a_span = tf.assigned_at.get(name, span)
            b_span = ff.assigned_at.get(name, span)
            like = self.type_of(b) if isinstance(b, Expr) else None
            ea = to_expr(a, a_span, like=like)
            eb = to_expr(b, b_span, like=self.type_of(ea))
            ta, tb = self.type_of(ea), self.type_of(eb)
            if not compatible(ta, tb):
                raise TypeCheckError(
                    f"'{name}' is {ta} after the if branch but {tb} after the else branch; "
                    "both branches must give it the same type", b_span)
            merged.append((name, ea, eb, ta))
        if not merged:
            return  # the branches compute nothing used later
        types = TupleType(tuple(m[3] for m in merged))
        t_out = close_lets(tf.lets, Tuple(tuple(m[1] for m in merged), span=span))
        f_out = close_lets(ff.lets, Tuple(tuple(m[2] for m in merged), span=span))
        out = Var("if_out", types, span=span)
        frame.lets.append((out, If(cond, t_out, f_out, span=span), span))
        for i, (name, _, _, t) in enumerate(merged):
            self.rebind(frame, name, TupleGetItem(out, i, span=span), t, span)

    def rebind(self, frame: Frame, name: str, value: Expr, t: Type, span: Span) -> None:
        v = Var(name, t, span=span)
        frame.lets.append((v, value, span))
        frame.env[name] = v
        frame.assigned_at[name] = span
        frame.notes.pop(name, None)

    # --- loops ----------------------------------------------------------------------------

    def for_loop(self, s: ast.For, frame: Frame) -> None:
        if s.orelse:
            raise self.error("for ... else is not supported in a kiln script", s.orelse[0])
        if not isinstance(s.target, ast.Name):
            raise self.error("a kiln for loop needs a single name as its variable", s.target)
        it = s.iter
        func = self.expr(it.func) if isinstance(it, ast.Call) else None
        if not (isinstance(func, Static) and func.value is builtins.range):
            raise self.error("kiln scripts loop only over range(...)", it)
        assert isinstance(it, ast.Call)
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise self.error("range takes one to three positional arguments", it)
        bounds = [self.expr(a) for a in it.args]
        if len(bounds) == 1:
            bounds.insert(0, Static(0))
        step = self.expr(it.args[2]) if len(it.args) == 3 else Static(1)
        step_value = step.value if isinstance(step, Static) else None
        if isinstance(step_value, bool) or not isinstance(step_value, int) or step_value == 0:
            raise self.error("the step of range must be a nonzero Python int", it.args[-1])
        arg_nodes = it.args if len(it.args) > 1 else [it.args[0], it.args[0]]
        start = self.int32_scalar(bounds[0], arg_nodes[0])
        stop = self.int32_scalar(bounds[1], arg_nodes[1])
        if not isinstance(stop, (Var, Constant)):  # evaluated once, as Python does
            stop_var = Var("stop", INT32, span=self.span(it))
            frame.lets.append((stop_var, stop, self.span(it)))
            stop = stop_var
        counter = Var(s.target.id, INT32, span=self.span(s.target))
        cmp = "less" if step_value > 0 else "greater"
        self.loop(s, frame, counter, start, lambda: self.op_call(cmp, [counter, stop], s),
                  step_value, "the for loop")
        frame.env.pop(s.target.id, None)
        frame.notes[s.target.id] = (f"the loop variable '{s.target.id}' is not available after "
                                    f"the loop at line {self.span(s).line}")

    def while_loop(self, s: ast.While, frame: Frame) -> None:
        if s.orelse:
            raise self.error("while ... else is not supported in a kiln script", s.orelse[0])

        def test() -> Expr:
            cond = self.expr(s.test)
            if isinstance(cond, Static):
                raise self.error("a kiln while loop needs a tensor condition; a condition "
                                 "known while staging would never end or never run", s.test)
            require_scalar(self.type_of(cond), ("bool",), "a while condition",
                           self.span(s.test))
            return cond

        self.loop(s, frame, None, None, test, 1, "the while loop")

    def loop(self, s: ast.For | ast.While, frame: Frame, counter: Var | None,
             start: Expr | None, test: Callable[[], Expr], step: int, context: str) -> None:
        """A local tail-recursive function over the loop-carried variables, and its call."""
        span = self.span(s)
        skip = {counter.name_hint} if counter is not None else set()
        carried = [n for n in assigned_names(s.body) if n in frame.env and n not in skip]
        inits = [to_expr(frame.env[n], frame.assigned_at.get(n, span)) for n in carried]
        types = [self.type_of(e) for e in inits]
        params = [Var(n, t, span=span) for n, t in zip(carried, types)]
        all_params = ([counter] if counter is not None else []) + params
        ret = TupleType(tuple(types))
        loop_var = Var("loop" if counter is not None else "while_loop",
                       FuncType(tuple(_annotation(p) for p in all_params), ret),
                       span=span)
        inner = frame.child(returns=False, context=context)
        inner.env.update(zip(carried, params))
        if counter is not None:
            inner.env[counter.name_hint] = counter
        with self.in_frame(inner):
            cond = test()
        body = inner.child()
        self.block(s.body, body)
        new_values = []
        for name, t in zip(carried, types):
            at = body.assigned_at.get(name, span)
            e = to_expr(body.env[name], at, like=t)
            found = self.type_of(e)
            if not compatible(t, found):
                hint = ""
                before = frame.env[name]
                if isinstance(before, Static):
                    hint = (f" (it starts as the Python value {before.value!r}: start "
                            "it as a tensor of the right shape, such as kiln.op.zeros_like(...))")
                raise TypeCheckError(
                    f"loop-carried variable '{name}' is {t} before the loop but {found} after "
                    f"an iteration; a loop must keep the type of each variable it updates{hint}",
                    at)
            new_values.append(e)
        if counter is not None:
            step_expr = self.op_call("add", [counter, const(step, "int32")], s)
            new_values.insert(0, step_expr)
        again = Call(loop_var, tuple(new_values), span=span)
        done = Tuple(tuple(params), span=span)
        fn_body = close_lets(inner.lets, If(cond, close_lets(body.lets, again), done, span=span))
        frame.lets.append((loop_var, Function(tuple(all_params), fn_body, ret, span=span), span))
        first = ([start] if start is not None else []) + inits
        out = Var("loop_out", ret, span=span)
        frame.lets.append((out, Call(loop_var, tuple(first), span=span), span))
        for i, (name, t) in enumerate(zip(carried, types)):
            self.rebind(frame, name, TupleGetItem(out, i, span=span), t, span)
        for name in assigned_names(s.body):
            if name not in carried and name not in skip:
                frame.env.pop(name, None)
                frame.notes[name] = (f"'{name}' is assigned only inside the loop at line "
                                     f"{span.line}; assign it before the loop to use it after")

    def int32_scalar(self, v: Value, node: ast.expr) -> Expr:
        span = self.span(node)
        if isinstance(v, Static) and (isinstance(v.value, bool) or not isinstance(
                v.value, (int, np.integer))):
            raise self.error(f"a range bound must be an int, not {describe(v.value)}", node)
        e = to_expr(v, span, like=INT32)
        require_scalar(self.type_of(e), ("int32",), "a range bound", span)
        return e
