"""The reference interpreter: the oracle every other executor is held to.

It evaluates every construct of the language directly — closures, recursion, ADTs and
pattern matching, references, tuples — and each operator with its numpy reference on whole
tensors. It favours clarity, with three exceptions that keep it usable: it never recurses in
Python (evaluation is a generator per node run by `trampoline`), it evaluates a shared node
once per function invocation (graph-form programs would otherwise take exponential time),
and it runs tail calls in constant stack, so recursive loops run as loops.

Values: numpy arrays (tensors), Python tuples, `Closure`, `ConstructorValue`, `RefValue`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import Error, EvalError, InternalError
from kiln.eval.convert import exact_array
from kiln.eval.values import Closure, ConstructorValue, RefValue
from kiln.infer import infer_types
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
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
from kiln.ir.traverse import Visit, free_vars, trampoline
from kiln.ir.ty import (
    AnyDim,
    FuncType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
)
from kiln.op import registry

_MISSING = object()


class _TailCall:
    """A call in tail position, returned to the invoking loop instead of nesting."""

    __slots__ = ("closure", "args")

    def __init__(self, closure: Closure, args: list[Any]) -> None:
        self.closure, self.args = closure, args


class _Frame:
    """One function invocation: variable values, and values of nodes evaluated so far."""

    __slots__ = ("env", "memo")

    def __init__(self, env: dict[Var, Any]) -> None:
        self.env = env
        self.memo: dict[int, Any] = {}


class Interpreter:
    """Evaluates expressions of one type-checked module."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.globals: dict[str, Closure] = {}
        self.captures: dict[int, list[Var]] = {}  # id(function) -> its free variables

    def global_closure(self, name: str) -> Closure:
        c = self.globals.get(name)
        if c is None:
            c = Closure(self.mod[name], {}, name=f"@{name}")
            self.globals[name] = c
        return c

    def make_closure(self, fn: Function, fr: _Frame) -> Closure:
        fvs = self.captures.get(id(fn))
        if fvs is None:
            fvs = free_vars(fn)
            self.captures[id(fn)] = fvs
        env = fr.env
        return Closure(fn, {v: env[v] for v in fvs if v in env})

    def call(self, f: Any, args: list[Any]) -> Any:
        """Apply a function value to argument values."""
        return trampoline(self.invoke(f, args))

    # --- evaluation -------------------------------------------------------------------------

    def invoke(self, f: Any, args: list[Any]) -> Visit:
        while True:
            if isinstance(f, Constructor):
                return ConstructorValue(f, tuple(args))
            if not isinstance(f, Closure):
                raise InternalError(f"cannot call a value of kind {type(f).__name__}")
            fn = f.func
            env = dict(f.env)
            env.update(zip(fn.params, args))
            result = yield self.eval(fn.body, _Frame(env), True)
            if isinstance(result, _TailCall):
                f, args = result.closure, result.args
                continue
            return result

    def eval(self, e: Expr, fr: _Frame, tail: bool = False) -> Visit:
        """The value of ``e`` in frame ``fr`` (a generator, run by `trampoline`)."""
        v = fr.memo.get(id(e), _MISSING)
        if v is not _MISSING:
            return v
        match e:
            case Var():
                try:
                    v = fr.env[e]
                except KeyError:
                    raise InternalError(f"variable %{e.name_hint} has no value", e.span) from None
            case Constant():
                v = e.data
            case GlobalVar():
                v = self.global_closure(e.name)
            case Constructor():
                v = e
            case Function():
                v = self.make_closure(e, fr)
            case Tuple():
                fields = []
                for f in e.fields:
                    fields.append((yield self.eval(f, fr)))
                v = tuple(fields)
            case TupleGetItem():
                v = (yield self.eval(e.tuple_value, fr))[e.index]
            case Let():
                v = yield from self.eval_let(e, fr, tail)
            case Call():
                v = yield from self.eval_call(e, fr, tail)
            case If():
                cond = yield self.eval(e.cond, fr)
                branch = e.true_branch if bool(cond) else e.false_branch
                v = yield self.eval(branch, fr, tail)
            case Match():
                v = yield from self.eval_match(e, fr, tail)
            case RefCreate():
                v = RefValue((yield self.eval(e.value, fr)))
            case RefRead():
                v = (yield self.eval(e.ref, fr)).value
            case RefWrite():
                ref = yield self.eval(e.ref, fr)
                ref.value = yield self.eval(e.value, fr)
                v = ()
            case Op():
                raise EvalError(f"operator {e.name} cannot be used as a value", e.span)
            case _:
                raise InternalError(f"the interpreter met an unknown node {type(e).__name__}")
        if not isinstance(v, _TailCall):
            fr.memo[id(e)] = v
        return v

    def eval_let(self, e: Let, fr: _Frame, tail: bool) -> Visit:
        chain = []
        body: Expr = e
        while isinstance(body, Let) and id(body) not in fr.memo:
            if isinstance(body.value, Function):
                # A let-bound function sees itself: recursive local functions.
                closure = self.make_closure(body.value, fr)
                closure.env[body.var] = closure
                fr.memo[id(body.value)] = closure
                value: Any = closure
            else:
                value = yield self.eval(body.value, fr)
            fr.env[body.var] = value
            chain.append(body)
            body = body.body
        v = yield self.eval(body, fr, tail)
        if not isinstance(v, _TailCall):
            for node in chain:
                fr.memo[id(node)] = v
        return v

    def eval_call(self, e: Call, fr: _Frame, tail: bool) -> Visit:
        if isinstance(e.op, Op):
            args = []
            for a in e.args:
                args.append((yield self.eval(a, fr)))
            return apply_op(e, args)
        f = yield self.eval(e.op, fr)
        args = []
        for a in e.args:
            args.append((yield self.eval(a, fr)))
        if isinstance(f, Constructor):
            return ConstructorValue(f, tuple(args))
        if tail and isinstance(f, Closure):
            return _TailCall(f, args)
        return (yield self.invoke(f, args))

    def eval_match(self, e: Match, fr: _Frame, tail: bool) -> Visit:
        data = yield self.eval(e.data, fr)
        for clause in e.clauses:
            bound = match_pattern(clause.lhs, data)
            if bound is not None:
                fr.env.update(bound)
                return (yield self.eval(clause.rhs, fr, tail))
        kind = "match" if e.complete else "match?"
        raise EvalError(f"no clause of this {kind} matches the value {_describe(data)}", e.span)


def match_pattern(p: Pattern, value: Any) -> dict[Var, Any] | None:
    """The bindings made by matching ``value`` against ``p``, or None if it does not match."""
    bound: dict[Var, Any] = {}
    stack = [(p, value)]
    while stack:
        q, v = stack.pop()
        match q:
            case PatternWildcard():
                pass
            case PatternVar():
                bound[q.var] = v
            case PatternConstructor():
                if not isinstance(v, ConstructorValue) or v.constructor != q.constructor:
                    return None
                stack.extend(zip(q.patterns, v.fields))
            case PatternTuple():
                stack.extend(zip(q.patterns, v))
    return bound


def apply_op(call: Call, args: list[Any]) -> Any:
    """Run an operator's numpy reference, and check the result against the call's type."""
    name = call.op.name  # type: ignore[attr-defined]
    opdef = registry.get(name, call.span)
    try:
        with np.errstate(all="ignore"):
            out = opdef.compute(args, call.attrs)
    except Error as err:
        raise type(err)(err.message, err.span or call.span) from None
    except Exception as exc:  # noqa: BLE001 - shapes only known at run time can still clash
        shapes = ", ".join(str(getattr(a, "shape", "?")) for a in args)
        raise EvalError(f"{name} failed on arguments of shapes {shapes}: {exc}", call.span) from exc
    if isinstance(out, np.generic):
        out = np.asarray(out)
    if call.checked_type_ is not None:
        problem = _mismatch(out, call.checked_type_)
        if problem:
            raise InternalError(
                f"the numpy reference of {name} returned {problem}, but its type relation says "
                f"{call.checked_type_}", call.span)
    return out


def _mismatch(value: Any, ty: Type) -> str | None:
    """What is wrong with an operator result of type ``ty`` (None when it fits)."""
    if isinstance(ty, TensorType):
        if not isinstance(value, np.ndarray):
            return f"a {type(value).__name__}, not an array"
        if value.dtype.name != ty.dtype or value.ndim != len(ty.shape):
            return f"an array of dtype {value.dtype.name} and shape {value.shape}"
        for d, n in zip(ty.shape, value.shape):
            if isinstance(d, int) and d != n:
                return f"an array of shape {value.shape}"
        return None
    if isinstance(ty, TupleType):
        if not isinstance(value, tuple) or len(value) != len(ty.fields):
            return "a value that is not a tuple of the right length"
        for v, t in zip(value, ty.fields):
            problem = _mismatch(v, t)
            if problem:
                return problem
    return None


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return repr(v.item()) if v.ndim == 0 else f"<tensor {v.dtype} {v.shape}>"
    return repr(v)


# --- the boundary: Python values in ------------------------------------------------------------


def _convert_arg(value: Any, ty: Type, what: str, dims: dict[str, int]) -> Any:
    """``value`` as a kiln value of type ``ty``; a kiln.Error saying what does not fit."""
    if isinstance(ty, TensorType):
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            if array.dtype.name != ty.dtype:
                raise Error(f"{what} expects {ty}, but got an array of dtype {array.dtype.name}")
        elif isinstance(value, (bool, int, float, list, tuple)):
            array = exact_array(value, ty.dtype, what, str(ty))
        else:
            raise Error(f"{what} expects {ty}, but got a {type(value).__name__}")
        if array.ndim != len(ty.shape):
            raise Error(f"{what} expects {ty}, but got an array of shape {array.shape}")
        for i, (d, n) in enumerate(zip(ty.shape, array.shape)):
            if isinstance(d, int) and d != n:
                raise Error(
                    f"{what} expects {ty}, but got an array of shape {array.shape} "
                    f"(dimension {i} must be {d})")
            if isinstance(d, SymDim):
                if dims.setdefault(d.name, n) != n:
                    raise Error(
                        f"{what} expects {ty}, but got an array of shape {array.shape}: "
                        f"dimension {d.name} is {dims[d.name]} in an earlier argument")
            assert isinstance(d, (int, SymDim, AnyDim))
        return array
    if isinstance(ty, TupleType):
        if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
            raise Error(f"{what} expects a tuple of {len(ty.fields)} field(s) of type {ty}")
        return tuple(
            _convert_arg(v, t, f"{what}, field {i}", dims)
            for i, (v, t) in enumerate(zip(value, ty.fields))
        )
    if isinstance(ty, TypeCall):
        if not isinstance(value, ConstructorValue) or value.constructor.belong_to != ty.func:
            raise Error(f"{what} expects a value of type {ty}, built by its constructors")
        return value
    if isinstance(ty, FuncType):
        if not isinstance(value, (Closure, Constructor)):
            raise Error(f"{what} expects a function of type {ty}")
        return value
    if isinstance(ty, RefType):
        if not isinstance(value, RefValue):
            raise Error(f"{what} expects a reference of type {ty}")
        return value
    if isinstance(ty, TypeVar):
        return value
    return value


def _bind_args(fn: Function, entry: str, args: tuple[Any, ...],
               params: Mapping[str, Any] | None) -> list[Any]:
    names = [p.name_hint for p in fn.params]
    if len(args) > len(fn.params):
        raise Error(f"@{entry} takes {len(fn.params)} argument(s) ({', '.join(names)}), "
                    f"but {len(args)} were given")
    values = list(args)
    params = dict(params or {})
    for p in fn.params[len(args):]:
        if p.name_hint not in params:
            missing = [q.name_hint for q in fn.params[len(args):] if q.name_hint not in params]
            raise Error(f"@{entry} needs argument(s) {', '.join('%' + m for m in missing)}: "
                        "pass them in order, or by name with params=")
        values.append(params.pop(p.name_hint))
    if params:
        extra = sorted(params)
        given = [q.name_hint for q in fn.params[: len(args)]]
        clash = [n for n in extra if n in given]
        if clash:
            raise Error(f"%{clash[0]} of @{entry} is given both in order and in params=")
        raise Error(f"@{entry} has no parameter named {', '.join(repr(n) for n in extra)}")
    dims: dict[str, int] = {}
    return [
        _convert_arg(v, p.checked_type, f"argument {i + 1} (%{p.name_hint}) of @{entry}", dims)
        for i, (v, p) in enumerate(zip(values, fn.params))
    ]


def interpret(
    mod: IRModule | Expr,
    *args: Any,
    entry: str = "main",
    params: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``@entry`` of a module on Python/numpy arguments with the reference interpreter.

    Arguments bind ``@entry``'s parameters in order; ``params`` binds the remaining ones by
    name (model weights). Tensors come back as numpy arrays, tuples as Python tuples, ADT values
    as `ConstructorValue`, functions as `Closure`. The module is type-checked first.
    """
    if isinstance(mod, Expr):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise Error(f"interpret takes an IRModule or an expression, not {type(mod).__name__}")
    typed = mod if mod.is_typed else infer_types(mod)
    fn = typed[entry]
    values = _bind_args(fn, entry, args, params)
    interp = Interpreter(typed)
    return interp.call(interp.global_closure(entry), values)

