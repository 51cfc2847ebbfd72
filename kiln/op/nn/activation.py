"""Activations: nn.relu, nn.leaky_relu, nn.softmax and nn.log_softmax."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, WriteFn, extern
from kiln.loops.ir import (
    Allocate,
    Binary,
    Buffer,
    Const,
    For,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.ir import Var as LVar
from kiln.loops.schedule import lowering_target
from kiln.op import grad_helpers as gh
from kiln.op.common import as_array, normalize_axis, require_dtype, tensor_arg
from kiln.op.grad_helpers import call, scalar
from kiln.op.registry import Attr, OpPattern, register


def _relu_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_dtype(data, "data", "numeric")
    return data


def _relu(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    return as_array(np.maximum(x, np.zeros((), x.dtype)), x.dtype.name)


def _positive_or(c: Call, g: Expr, otherwise: Expr) -> Expr:
    """The adjoint where the input is positive, ``otherwise`` elsewhere."""
    x = c.args[0]
    return call("where", call("greater", x, scalar(0, gh.dtype(x))), g, otherwise)


def _relu_grad(c: Call, g: Expr) -> list[Expr | None]:
    # the adjoint where the result is positive, which is where the input is (NaN in, NaN out,
    # neither positive): read from the result, the input keeps relu as its only consumer, so
    # that relu fuses with the operators before it (a batch norm's scale and shift) instead
    # of the input being stored for the gradient
    return [call("where", call("greater", c, scalar(0, gh.dtype(c))), g, gh.zeros_like(g))]


relu = register(
    "nn.relu",
    inputs=("data",),
    relation=_relu_relation,
    compute=_relu,
    pattern=OpPattern.ELEMWISE,
    doc="max(x, 0) elementwise.",
    gradient=_relu_grad,
    lower=oplib.unary(lambda x: Binary("max", x, oplib.dtype_const(0, x.dtype))),
)


def _float_relation(arg_types: Sequence[Type], attrs: Attrs) -> TensorType | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_dtype(data, "data", "float")
    return data


def _softmax_relation(arg_types: Sequence[Type], attrs: SoftmaxAttrs) -> Type | None:
    data = _float_relation(arg_types, attrs)
    if data is not None:
        normalize_axis(attrs.axis, data.ndim)
    return data


class LeakyReluAttrs(Attrs):
    __slots__ = ()
    alpha: float


def _leaky_relu(arrays: list[np.ndarray], attrs: LeakyReluAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    return as_array(np.where(x > 0, x, x * attrs.alpha), x.dtype.name)


def _leaky_relu_lower(inputs: list[Tensor], attrs: LeakyReluAttrs, out: Type) -> Tensor:
    def scalar(x: LExpr) -> LExpr:
        alpha = oplib.dtype_const(attrs.alpha, x.dtype)
        return Select(Binary("gt", x, oplib.dtype_const(0, x.dtype)), x, Binary("mul", x, alpha))

    return oplib.unary(scalar)(inputs, attrs, out)


leaky_relu = register(
    "nn.leaky_relu",
    inputs=("data",),
    attrs_type=LeakyReluAttrs,
    attrs=(Attr("alpha", 0.25, kind="float", doc="the slope for negative inputs"),),
    relation=_float_relation,
    compute=_leaky_relu,
    pattern=OpPattern.ELEMWISE,
    doc="x where x > 0, else alpha * x.",
    gradient=lambda c, g: [
        _positive_or(c, g, g * scalar(LeakyReluAttrs.view(c.attrs).alpha, gh.dtype(c)))
    ],
    lower=_leaky_relu_lower,
)


class SoftmaxAttrs(Attrs):
    __slots__ = ()
    axis: int


def _softmax(arrays: list[np.ndarray], attrs: SoftmaxAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True))
        return as_array(e / np.sum(e, axis=attrs.axis, keepdims=True), x.dtype.name)


def _log_softmax(arrays: list[np.ndarray], attrs: SoftmaxAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=attrs.axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=attrs.axis, keepdims=True)
        return as_array(shifted - np.log(total), x.dtype.name)


def _softmax_grad(c: Call, g: Expr) -> list[Expr | None]:
    # y (g - sum(g y)) along the axis, with y the shared forward result
    inner = call("sum", g * c, axis=[SoftmaxAttrs.view(c.attrs).axis], keepdims=True)
    return [c * (g - inner)]


def _log_softmax_grad(c: Call, g: Expr) -> list[Expr | None]:
    # g - softmax(x) sum(g) along the axis, with softmax(x) = exp(y)
    total = call("sum", g, axis=[SoftmaxAttrs.view(c.attrs).axis], keepdims=True)
    return [g - call("exp", c) * total]


Index = tuple[LExpr, ...]

# How many of a row's exponentials softmax keeps for its last pass (a local buffer, 4 KiB
# of float32). Below the stand-in sizes that symbolic kernels are lowered at (1009 and up,
# kiln/loops/generalize.py), so that the buffer has this one shape there too.
KEPT_EXPS = 1008


def _softmax_lower(log: bool) -> oplib.LowerFn:
    """softmax / log_softmax: for each row along the axis, a pass for the maximum, a pass for
    the sum of exponentials, and a pass writing the results (through the epilogue)."""

    def lower(inputs: list[Tensor], attrs: SoftmaxAttrs, out: Type) -> Tensor:
        (x,) = inputs
        dt = x.dtype
        axis = attrs.axis % x.ndim
        n = x.shape[axis]
        rows = x.shape[:axis] + x.shape[axis + 1:]

        def row(o: Index, write: WriteFn) -> Stmt:
            # Each pass is a loop LLVM vectorizes to the target's width (marked vectorized,
            # which lets it split the maximum and the sum into lane-wise partial results);
            # the exponentials are kept in a row buffer for the last pass, and it multiplies
            # by the reciprocal of the sum.
            def scan(body: Callable[[Index, LExpr], Stmt], start: LExpr | None = None,
                     stop: LExpr | None = None) -> Stmt:
                # over [start, stop): [0, n) by default; the extent stop - start unfolded
                k = LVar("k")
                end = Const(n) if stop is None else stop
                first_k = Const(0) if start is None else start
                extent = end if start is None else Binary("sub", end, start)
                return For(k, first_k, extent, body((*o[:axis], k, *o[axis:]), k),
                           "vectorized")

            acc = Buffer("row", (2,), dt, "local")  # [maximum, sum of exponentials]
            # The first KEPT_EXPS exponentials are kept, the rest computed again in the last
            # pass: the buffer's shape is then a constant also for a row of symbolic length
            # (min(n, KEPT_EXPS), unfolded, becomes min(d, KEPT_EXPS) there).
            exps = Buffer("exps", (min(n, KEPT_EXPS),), dt, "local")
            kept = Binary("min", Const(n), Const(KEPT_EXPS))
            first, second = (Const(0),), (Const(1),)
            mx, total = LVar("mx", dt), LVar("total", dt)

            def shifted(i: Index) -> LExpr:
                return Binary("sub", x(*i), mx)

            def add(value: LExpr) -> Stmt:
                return Store(acc, second, Binary("add", Load(acc, second), value))

            def keep(i: Index, k: LExpr) -> Stmt:
                e = LVar("e", dt)
                return LetStmt(e, Unary("exp", shifted(i)), Seq((Store(exps, (k,), e), add(e))))

            sums: Stmt
            if log:
                sums = Seq((
                    Store(acc, second, oplib.dtype_const(0, dt)),
                    scan(lambda i, k: add(Unary("exp", shifted(i)))),
                    LetStmt(total, Unary("log", Load(acc, second)), scan(
                        lambda i, k: write(i, Binary("sub", shifted(i), total)))),
                ))
            else:
                sums = Allocate(exps, Seq((
                    Store(acc, second, oplib.dtype_const(0, dt)),
                    scan(keep, stop=kept),
                    scan(lambda i, k: add(Unary("exp", shifted(i))), start=kept),
                    LetStmt(total, Binary("div", oplib.dtype_const(1, dt), Load(acc, second)),
                            Seq((
                                scan(lambda i, k: write(i, Binary("mul", Load(exps, (k,)),
                                                                  total)), stop=kept),
                                scan(lambda i, k: write(i, Binary(
                                    "mul", Unary("exp", shifted(i)), total)), start=kept)))),
                )))
            if axis == x.ndim - 1 and isinstance(x, BufferTensor) and not log \
                    and n <= KEPT_EXPS:
                # the exponentials first, then their sum as a vector fold of the kept row
                # (LLVM's sum in the same loop ended in its lanes added one by one: on rows
                # of 128, as long as the exponentials)
                lanes = lowering_target().lanes(dt)
                k = LVar("k")
                fill = For(k, Const(0), Const(n), Store(exps, (k,), Unary(
                    "exp", shifted((*o[:axis], k, *o[axis:])))), "vectorized")
                summed = oplib.lane_fold(
                    n, lanes, dt, oplib.dtype_const(0, dt),
                    lambda a, p: Binary("add", a, Load(exps, (p,), lanes)), "add",
                    lambda t, q: Binary("add", t, Load(exps, (q,))),
                    lambda v: LetStmt(total, Binary("div", oplib.dtype_const(1, dt), v), scan(
                        lambda i, k: write(i, Binary("mul", Load(exps, (k,)), total)))))
                sums = Allocate(exps, Seq((fill, summed)))
            if axis == x.ndim - 1 and isinstance(x, BufferTensor):
                buf, lanes = x.buffer, lowering_target().lanes(dt)
                biggest = oplib.lane_fold(
                    n, lanes, dt, oplib.lowest(dt),
                    lambda a, p: Binary("max", a, Load(buf, (*o, p), lanes)), "max",
                    lambda t, q: Binary("max", t, Load(buf, (*o, q))),
                    lambda v: LetStmt(mx, v, sums), loops=True)
                return Allocate(acc, biggest)
            return Allocate(acc, Seq((
                Store(acc, first, oplib.lowest(dt)),
                scan(lambda i, k: Store(acc, first, Binary("max", Load(acc, first), x(*i)))),
                LetStmt(mx, Load(acc, first), sums),
            )))

        return extern(x.shape, dt, lambda write: oplib.outer_nest(
            rows, lambda o: row(o, write), 3 * n))

    return lower


softmax = register(
    "nn.softmax",
    inputs=("data",),
    attrs_type=SoftmaxAttrs,
    attrs=(Attr("axis", -1, kind="int", doc="the axis that sums to one"),),
    relation=_softmax_relation,
    compute=_softmax,
    pattern=OpPattern.OPAQUE,
    doc="exp(x) / sum(exp(x)) along an axis, computed stably.",
    gradient=_softmax_grad,
    lower=_softmax_lower(log=False),
)
log_softmax = register(
    "nn.log_softmax",
    inputs=("data",),
    attrs_type=SoftmaxAttrs,
    attrs=(Attr("axis", -1, kind="int", doc="the axis normalized over"),),
    relation=_softmax_relation,
    compute=_log_softmax,
    pattern=OpPattern.OPAQUE,
    doc="log(softmax(x)) along an axis, computed stably.",
    gradient=_log_softmax_grad,
    lower=_softmax_lower(log=True),
)

__all__ = ["leaky_relu", "log_softmax", "relu", "softmax"]
