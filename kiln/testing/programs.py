"""Random well-typed programs, for checking that passes preserve meaning.

``random_program(seed)`` builds a module whose ``@main`` takes a few float32 tensors and
computes with many operators, lets and graph sharing, tuples, ifs, closures, global
functions and references. Values stay finite: unary operators that could overflow are
applied to bounded arguments (``exp(tanh(x))``, ``log(abs(x) + 1)``), divisors are kept
away from zero. Types are tracked as the program grows, using the operators' own relations.

    mod, inputs = random_program(seed=7)
    assert_allclose(interpret(some_pass(mod), *inputs), interpret(mod, *inputs))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.ty import FuncType, TensorType, TupleType, Type
from kiln.op import registry


@dataclass
class _Value:
    expr: Expr
    ty: TensorType


@dataclass
class _Scope:
    """Values visible here, and let bindings made here (emitted around the scope's result)."""

    values: list[_Value] = field(default_factory=list)
    lets: list[tuple[Var, Expr]] = field(default_factory=list)


class _Builder:
    def __init__(self, seed: int, steps: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.steps = steps
        self.scopes: list[_Scope] = [_Scope()]
        self.globals: dict[str, Function] = {}
        self.names = 0

    # --- small helpers --------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, items: list):  # noqa: ANN201
        return items[int(self.rng.integers(len(items)))]

    def fresh(self, prefix: str = "v") -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 5)) if rank is None else rank
        return tuple(int(d) for d in self.rng.integers(1, 5, size=rank))

    def const(self, shape: tuple[int, ...], low: float = -1.0, high: float = 1.0) -> _Value:
        data = self.rng.uniform(low, high, size=shape).astype("float32")
        return _Value(Constant(data), TensorType(shape, "float32"))

    @property
    def scope(self) -> _Scope:
        return self.scopes[-1]

    def visible(self) -> list[_Value]:
        return [v for s in self.scopes for v in s.values]

    def operand(self) -> _Value:
        return self.pick(self.visible()[-6:])  # recent values make deeper dataflow

    def ranked(self) -> _Value:
        """An operand of rank at least one (scalars are reshaped to one element)."""
        x = self.operand()
        return self.call("reshape", [x], newshape=[1]) if x.ty.ndim == 0 else x

    def call(self, name: str, args: list[_Value], **attrs: object) -> _Value:
        opdef = registry.get(name)
        normalized = opdef.normalize_attrs(attrs)
        ty = opdef.relation(tuple(a.ty for a in args), normalized)
        assert isinstance(ty, (TensorType, TupleType)), (name, ty)
        call = Call(opdef.op, tuple(a.expr for a in args), normalized)
        if isinstance(ty, TupleType):
            first = ty.fields[0]
            assert isinstance(first, TensorType), (name, ty)
            return _Value(TupleGetItem(call, 0), first)
        return _Value(call, ty)

    def add(self, value: _Value) -> _Value:
        """Keep a new value: bound by a let, or shared directly (graph form)."""
        if self.chance(0.4):
            v = Var(self.fresh(), value.ty if self.chance(0.5) else None)
            self.scope.lets.append((v, value.expr))
            value = _Value(v, value.ty)
        self.scope.values.append(value)
        return value

    # --- operator templates ---------------------------------------------------------------

    def unary(self) -> _Value:
        x = self.operand()
        kind = self.pick(["plain", "exp", "log", "sqrt", "rsqrt"])
        if kind == "plain":
            op = self.pick(["nn.relu", "tanh", "sigmoid", "negative", "abs", "sin", "cos",
                            "erf", "floor", "ceil", "round", "sign"])
            return self.call(op, [x])
        if kind == "exp":
            return self.call("exp", [self.call("tanh", [x])])
        margin = _Value(Constant(np.array(0.5, np.float32)), TensorType((), "float32"))
        return self.call(kind, [self.call("add", [self.call("abs", [x]), margin])])

    def broadcast_partner(self, x: _Value) -> _Value:
        """Another operand whose shape broadcasts with x's."""
        same = [v for v in self.visible() if v.ty.shape == x.ty.shape and v is not x]
        if same and self.chance(0.5):
            return self.pick(same)
        shape = list(x.ty.static_shape)
        drop = int(self.rng.integers(0, len(shape) + 1))
        shape = [1 if self.chance(0.3) else d for d in shape[drop:]]
        return self.const(tuple(shape))

    def binary(self) -> _Value:
        x = self.operand()
        y = self.broadcast_partner(x)
        if self.chance(0.5):
            x, y = y, x
        op = self.pick(["add", "subtract", "multiply", "maximum", "minimum", "divide"])
        if op == "divide":
            one = _Value(Constant(np.array(1.0, np.float32)), TensorType((), "float32"))
            y = self.call("add", [self.call("abs", [y]), one])
        return self.call(op, [x, y])

    def select(self) -> _Value:
        x = self.operand()
        y = self.broadcast_partner(x)
        cond = self.call(self.pick(["greater", "less_equal"]), [x, y])
        return self.call("where", [cond, x, y])

    def reduce(self) -> _Value:
        x = self.ranked()
        op = self.pick(["sum", "mean", "max", "min", "prod"])
        axis = int(self.rng.integers(-x.ty.ndim, x.ty.ndim))
        return self.call(op, [x], axis=[axis], keepdims=self.chance(0.5))

    def reshape(self) -> _Value:
        x = self.ranked()
        kind = self.pick(["flatten", "transpose", "expand", "softmax"])
        if kind == "flatten":
            return self.call("reshape", [x], newshape=[-1])
        if kind == "transpose":
            axes = [int(a) for a in self.rng.permutation(x.ty.ndim)]
            return self.call("transpose", [x], axes=axes)
        if kind == "expand":
            return self.call("expand_dims", [x], axis=int(self.rng.integers(0, x.ty.ndim + 1)))
        return self.call("nn.softmax", [x], axis=-1)

    def concat(self) -> _Value:
        x = self.ranked()
        axis = int(self.rng.integers(0, x.ty.ndim))
        shape = list(x.ty.static_shape)
        shape[axis] = int(self.rng.integers(1, 4))
        y = self.const(tuple(shape))
        opdef = registry.get("concatenate")
        attrs = opdef.normalize_attrs({"axis": axis})
        ty = opdef.relation((TupleType((x.ty, y.ty)),), attrs)
        assert isinstance(ty, TensorType), ty
        return _Value(Call(opdef.op, (Tuple((x.expr, y.expr)),), attrs), ty)

    def dense(self) -> _Value:
        x = self.operand()
        if x.ty.ndim != 2:
            x = self.call("reshape", [x], newshape=[1, -1])
        units = int(self.rng.integers(1, 6))
        w = self.const((units, x.ty.static_shape[1]), -0.5, 0.5)
        out = self.call("nn.dense", [x, w])
        if self.chance(0.6):
            out = self.call("nn.bias_add", [out, self.const((units,))], axis=-1)
        return out

    def conv(self) -> _Value:
        x = self.operand()
        if x.ty.ndim != 4:
            n = int(np.prod(x.ty.static_shape))
            x = self.call("reshape", [x], newshape=[1, 1, 1, n])
        c = x.ty.static_shape[1]
        out_c = int(self.rng.integers(1, 4))
        pad = int(self.rng.integers(0, 2))
        fits = min(x.ty.static_shape[2], x.ty.static_shape[3]) + 2 * pad  # the window must fit
        k = int(self.rng.integers(1, min(3, fits + 1)))
        w = self.const((out_c, c, k, k), -0.5, 0.5)
        out = self.call("nn.conv2d", [x, w], padding=[pad, pad, pad, pad])
        if self.chance(0.5):
            out = self.call("nn.relu", [self.call("nn.bias_add", [out, self.const((out_c,))])])
        return out

    def tuple_projection(self) -> _Value:
        a, b = self.operand(), self.operand()
        t = Tuple((a.expr, b.expr))
        if self.chance(0.5):
            return _Value(TupleGetItem(t, 1), b.ty)
        return _Value(TupleGetItem(t, 0), a.ty)

    # --- control and functions ------------------------------------------------------------

    def branch(self) -> _Value:
        """``if (sum(x) > 0) { f(x) } else { g(x) }`` with both branches of x's type."""
        x = self.operand()
        total = self.call("sum", [x])
        zero = _Value(Constant(np.array(0.0, np.float32)), TensorType((), "float32"))
        cond = self.call("greater", [total, zero])
        arms = []
        for _ in range(2):
            self.scopes.append(_Scope())
            body = self.same_type(x)
            arms.append(self.close_scope(body.expr))
        return _Value(If(cond.expr, arms[0], arms[1]), x.ty)

    def same_type(self, x: _Value) -> _Value:
        """A small computation from x with x's type, made in the current scope."""
        y = x
        for _ in range(int(self.rng.integers(1, 4))):
            op = self.pick(["nn.relu", "tanh", "negative", "sigmoid"])
            y = self.add(self.call(op, [y]))
            if self.chance(0.3):
                y = self.add(self.call("add", [y, self.broadcast_partner(y)]))
                if y.ty != x.ty:
                    y = self.add(self.call("reshape", [y], newshape=list(x.ty.shape)))
        return y

    def close_scope(self, result: Expr) -> Expr:
        scope = self.scopes.pop()
        for v, value in reversed(scope.lets):
            result = Let(v, value, result)
        return result

    def closure(self) -> _Value:
        """A let-bound function capturing an outer value, called once or twice."""
        x = self.operand()
        captured = self.operand()
        p = Var(self.fresh("p"), x.ty)
        self.scopes.append(_Scope([_Value(p, x.ty)]))
        if self._broadcasts(x.ty, captured.ty):
            scale = self.call("tanh", [captured])
            y = self.add(self.call("multiply", [_Value(p, x.ty), scale]))
        else:
            y = self.same_type(_Value(p, x.ty))
        if y.ty != x.ty:
            y = self.add(self.call("reshape", [y], newshape=list(x.ty.shape)))
        body = self.close_scope(y.expr)
        f = Var(self.fresh("f"))
        self.scope.lets.append((f, Function((p,), body)))
        out = _Value(Call(f, (x.expr,)), x.ty)
        if self.chance(0.5):
            out = _Value(Call(f, (self.add(out).expr,)), x.ty)
        return out

    def _broadcasts(self, a: TensorType, b: TensorType) -> bool:
        try:
            return np.broadcast_shapes(a.static_shape, b.static_shape) == a.static_shape
        except ValueError:
            return False

    def global_call(self) -> _Value:
        """A global function of one tensor (pure), called from here."""
        x = self.operand()
        name = self.fresh("g")
        p = Var("a", x.ty)
        outer = self.scopes
        self.scopes = [_Scope([_Value(p, x.ty)])]
        y = self.same_type(_Value(p, x.ty))
        body = self.close_scope(y.expr)
        self.scopes = outer
        self.globals[name] = Function((p,), body, x.ty)
        return _Value(Call(GlobalVar(name), (x.expr,)), x.ty)

    def reference(self) -> _Value:
        """``let r = ref(x); ref_write(r, f(x)); ref_read(r)`` — effects in order."""
        x = self.operand()
        r = Var(self.fresh("r"))
        self.scope.lets.append((r, RefCreate(x.expr)))
        y = self.call("nn.relu", [x])
        self.scope.lets.append((Var(self.fresh("_")), RefWrite(r, y.expr)))
        return _Value(RefRead(r), x.ty)

    # --- the program ----------------------------------------------------------------------

    def build(self) -> tuple[IRModule, list[np.ndarray]]:
        params = []
        inputs = []
        for _ in range(int(self.rng.integers(1, 4))):
            shape = self.shape()
            ty = TensorType(shape, "float32")
            v = Var(self.fresh("x"), ty)
            params.append(v)
            inputs.append(self.rng.standard_normal(shape).astype("float32"))
            self.scope.values.append(_Value(v, ty))
        actions: list[tuple[float, Callable[[], _Value]]] = [
            (3, self.unary), (3, self.binary), (1, self.select), (2, self.reduce),
            (2, self.reshape), (1, self.concat), (1, self.dense), (1, self.conv),
            (1, self.tuple_projection), (1, self.branch), (1, self.closure),
            (1, self.global_call), (0.5, self.reference),
        ]
        weights = np.array([w for w, _ in actions])
        for _ in range(self.steps):
            _, action = actions[int(self.rng.choice(len(actions), p=weights / weights.sum()))]
            self.add(action())
        extra = int(self.rng.integers(0, 3))
        outs = [self.scope.values[-1]] + [self.operand() for _ in range(extra)]
        result: Expr = outs[0].expr if len(outs) == 1 else Tuple(tuple(o.expr for o in outs))
        body = self.close_scope(result)
        funcs = {name: fn for name, fn in self.globals.items()}
        funcs["main"] = Function(tuple(params), body)
        return IRModule(funcs), inputs


def random_program(seed: int, steps: int = 12) -> tuple[IRModule, list[np.ndarray]]:
    """A random well-typed module and inputs for its ``@main`` (deterministic in ``seed``)."""
    return _Builder(seed, steps).build()


def result_type(mod: IRModule) -> Type:
    """The result type of ``@main`` (type-checks the module)."""
    from kiln.infer import infer_types

    fty = infer_types(mod)["main"].checked_type
    assert isinstance(fty, FuncType)
    return fty.ret_type
