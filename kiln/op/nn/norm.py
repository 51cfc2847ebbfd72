"""Normalization: nn.batch_norm, nn.layer_norm, and nn.dropout.

By default the references compute what a model does at inference: batch_norm normalizes with
the moving statistics it is given (and returns them unchanged), and dropout is the identity.
``nn.batch_norm(..., training=True, momentum=m)`` (a kiln extension, not in TVM) normalizes
with the batch's own mean and biased variance over every axis but ``axis`` and returns the
running statistics updated as torch does: ``(1 - m) * running + m * batch``, the variance
term unbiased. Training-mode dropout, with its explicit key, is nn.dropout_train (dropout.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, WriteFn, compute, extern
from kiln.loops.ir import (
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Const,
    For,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Unary,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.ir import Var as LVar
from kiln.loops.schedule import lowering_target
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    as_array,
    check_dims_equal,
    normalize_axis,
    require_dtype,
    require_rank,
    same_dtype,
    shape_str,
    tensor_arg,
    tensor_args,
    unify_dim,
)
from kiln.op.grad_helpers import along, call, scalar
from kiln.op.registry import Attr, OpPattern, register


def _channel_vectors(
    data: TensorType, axis: int, vectors: Sequence[TensorType], names: Sequence[str]
) -> TensorType:
    """Check each vector is 1-D and as long as ``data``'s axis; their common type."""
    size = data.shape[axis]
    for v, name in zip(vectors, names, strict=True):
        require_rank(v, name, 1)
        check_dims_equal(
            v.shape[0],
            size,
            f"{name} has shape {shape_str(v.shape)} but data of shape {shape_str(data.shape)} "
            f"has {size} elements along axis {axis}",
        )
        size = unify_dim(size, v.shape[0])
    return TensorType((size,), data.dtype)


def _along(vector: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A 1-D vector shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    shape = [1] * ndim
    shape[axis] = vector.shape[0]
    return vector.reshape(shape)


BATCH_NORM_INPUTS = ("data", "gamma", "beta", "moving_mean", "moving_var")


class NormAttrs(Attrs):
    """layer_norm's attributes."""

    __slots__ = ()
    axis: int
    epsilon: float
    center: bool
    scale: bool


class BatchNormAttrs(Attrs):
    """batch_norm's attributes: layer_norm's, and the training-mode extension."""

    __slots__ = ()
    axis: int
    epsilon: float
    center: bool
    scale: bool
    training: bool
    momentum: float


def _batch_norm_relation(arg_types: Sequence[Type], attrs: BatchNormAttrs) -> Type | None:
    args = tensor_args(arg_types, BATCH_NORM_INPUTS)
    if args is None:
        return None
    data = args[0]
    require_dtype(data, "data", "float")
    same_dtype(args, BATCH_NORM_INPUTS)
    axis = normalize_axis(attrs.axis, data.ndim)
    vector = _channel_vectors(data, axis, args[1:], BATCH_NORM_INPUTS[1:])
    if attrs.training:
        if not 0.0 <= attrs.momentum <= 1.0:
            raise TypeCheckError(f"batch_norm momentum must lie in [0, 1], got {attrs.momentum}")
        others = [d for i, d in enumerate(data.shape) if i != axis]
        sizes = [d for d in others if isinstance(d, int)]
        if len(sizes) == len(others) and int(np.prod(sizes, dtype=np.int64)) < 2:
            raise TypeCheckError(
                f"batch_norm in training mode needs more than one value per channel; data of "
                f"shape {shape_str(data.shape)} has one along every axis but {axis}")
    return TupleType((data, vector, vector))


def _batch_axes(ndim: int, axis: int) -> tuple[int, ...]:
    return tuple(a for a in range(ndim) if a != axis)


def _batch_norm_training(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                         running_mean: np.ndarray, running_var: np.ndarray,
                         attrs: BatchNormAttrs) -> tuple[np.ndarray, ...]:
    axis = normalize_axis(attrs.axis, x.ndim)
    axes = _batch_axes(x.ndim, axis)
    count = x.size // x.shape[axis]
    mean = x.mean(axis=axes)
    centred = x - _along(mean, x.ndim, axis)
    var = (centred * centred).mean(axis=axes)
    out = centred * _along(1 / np.sqrt(var + attrs.epsilon), x.ndim, axis)
    if attrs.scale:
        out = out * _along(gamma, x.ndim, axis)
    if attrs.center:
        out = out + _along(beta, x.ndim, axis)
    m = attrs.momentum
    new_mean = (1 - m) * running_mean + m * mean
    new_var = (1 - m) * running_var + m * (var * (count / (count - 1)))
    dt = x.dtype.name
    return as_array(out, dt), as_array(new_mean, dt), as_array(new_var, dt)


def _batch_norm(arrays: list[np.ndarray], attrs: BatchNormAttrs) -> tuple[np.ndarray, ...]:
    x, gamma, beta, mean, var = (np.asarray(a) for a in arrays)
    if attrs.training:
        return _batch_norm_training(x, gamma, beta, mean, var, attrs)
    axis = normalize_axis(attrs.axis, x.ndim)
    scale = 1 / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        scale = scale * gamma
    out = (x - _along(mean, x.ndim, axis)) * _along(scale, x.ndim, axis)
    if attrs.center:
        out = out + _along(beta, x.ndim, axis)
    return as_array(out, x.dtype.name), mean.copy(), var.copy()


def _batch_norm_training_grad(c: Call, g: Expr) -> list[Expr | None]:
    # With the batch statistics mu and biased var per channel, rstd = (var + eps)^-1/2,
    # xhat = (x - mu) * rstd and dxhat = g * gamma, over the n values of a channel:
    #   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    # and the running statistics add their own terms: new_mean = (1-m) rm + m mu gives
    # dx += m g_mean / n; new_var = (1-m) rv + m var n/(n-1) gives dx += 2 m g_var (x-mu)/(n-1).
    x, gamma, _, _, _ = c.args
    g_out, g_mean, g_var = gh.fields(g, 3)
    xt = gh.tensor_type(x)
    attrs = BatchNormAttrs.view(c.attrs)
    axis = normalize_axis(attrs.axis, xt.ndim)
    dt = xt.dtype
    n = gh.static_shape(x, "nn.batch_norm in training mode")
    count = int(np.prod(n, dtype=np.int64)) // n[axis]
    m = attrs.momentum

    def per_channel(e: Expr) -> Expr:  # e has x's shape
        return gh.sum_over_rows(e, x, axis)

    def mean(e: Expr) -> Expr:  # per channel, broadcast back along the channel axis
        return along(per_channel(e) * scalar(1 / count, dt), xt.ndim, axis)

    centred = x - mean(x)
    rstd = call("rsqrt", mean(centred * centred) + scalar(attrs.epsilon, dt))
    xhat = centred * rstd
    dxhat = g_out * along(gamma, xt.ndim, axis) if attrs.scale else g_out
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dx = dx + along(g_mean * scalar(m / count, dt), xt.ndim, axis)
    dx = dx + centred * along(g_var * scalar(2 * m / (count - 1), dt), xt.ndim, axis)
    dgamma = per_channel(g_out * xhat) if attrs.scale else None
    dbeta = per_channel(g_out) if attrs.center else None
    keep = scalar(1 - m, dt)
    return [dx, dgamma, dbeta, g_mean * keep, g_var * keep]


def _batch_norm_grad(c: Call, g: Expr) -> list[Expr | None]:
    if BatchNormAttrs.view(c.attrs).training:
        return _batch_norm_training_grad(c, g)
    # out = (x - mean) * inv * gamma + beta with inv = (var + eps)^-1/2, per channel; the
    # second and third results pass moving_mean and moving_var through unchanged.
    x, gamma, _, mean, var = c.args
    g_out, g_mean, g_var = gh.fields(g, 3)
    xt = gh.tensor_type(x)
    attrs = BatchNormAttrs.view(c.attrs)
    axis = normalize_axis(attrs.axis, xt.ndim)
    dt = xt.dtype

    def per_channel(e: Expr) -> Expr:  # e has x's shape
        return gh.sum_over_rows(e, x, axis)

    inv = call("rsqrt", var + scalar(attrs.epsilon, dt))
    scale = inv * gamma if attrs.scale else inv
    centred = x - along(mean, xt.ndim, axis)
    g_centred = per_channel(g_out * centred)
    g_total = per_channel(g_out)
    dx = g_out * along(scale, xt.ndim, axis)
    dgamma = g_centred * inv if attrs.scale else None
    dbeta = g_total if attrs.center else None
    dmean = g_mean - g_total * scale
    # d/dvar (var + eps)^-1/2 = -1/2 inv^3
    dvar = g_var + g_centred * scale * scalar(-0.5, dt) * inv * inv
    return [dx, dgamma, dbeta, dmean, dvar]


def _copy(t: Tensor) -> Tensor:
    return compute(t.shape, t.dtype, lambda *i: t(*i))


def _channel_mean(x: Tensor, axis: int, term: Callable[[tuple[LExpr, ...]], LExpr]) -> Tensor:
    """The mean of ``term`` over every axis of ``x`` but ``axis``, per channel: a loop nest per
    channel (parallel over channels when the work pays) whose innermost loop is marked
    vectorized, which lets LLVM sum in lane-wise partial sums."""
    dt = x.dtype
    others = [a for a in range(x.ndim) if a != axis]
    count = int(np.prod([x.shape[a] for a in others], dtype=np.int64))
    zero = (Const(0),)

    def channel(o: tuple[LExpr, ...], write: WriteFn) -> Stmt:
        acc = Buffer("acc", (1,), dt, "local")
        loop_vars = {a: LVar(f"r{a}") for a in others}
        idx = tuple(o[0] if a == axis else loop_vars[a] for a in range(x.ndim))
        body: Stmt = Store(acc, zero, Binary("add", Load(acc, zero), term(idx)))
        for a in reversed(others):
            kind = "vectorized" if a == others[-1] else "serial"
            body = For(loop_vars[a], Const(0), Const(x.shape[a]), body, kind)
        return Allocate(acc, Seq((
            Store(acc, zero, oplib.dtype_const(0, dt)), body,
            write(o, Binary("div", Load(acc, zero), oplib.dtype_const(count, dt))))))

    return extern((x.shape[axis],), dt, lambda write: oplib.outer_nest(
        (x.shape[axis],), lambda o: channel(o, write), 2 * count))


def _batch_norm_training_lower(inputs: list[Tensor], attrs: BatchNormAttrs
                               ) -> tuple[Tensor, ...]:
    """Per channel, the mean and then the variance about it (two passes, as the reference),
    then the normalized values and the updated running statistics."""
    x, gamma, beta, running_mean, running_var = inputs
    axis = attrs.axis % x.ndim
    dt = x.dtype
    count = int(np.prod(x.shape, dtype=np.int64)) // x.shape[axis]
    mean = _channel_mean(x, axis, lambda i: x(*i))

    def squared(i: tuple[LExpr, ...]) -> LExpr:
        d = Binary("sub", x(*i), mean(i[axis]))
        return Binary("mul", d, d)

    var = _channel_mean(x, axis, squared)

    def channel_scale(c: LExpr) -> LExpr:
        inv = Binary("div", oplib.dtype_const(1, dt),
                     Unary("sqrt", Binary("add", var(c), oplib.dtype_const(attrs.epsilon, dt))))
        return Binary("mul", inv, gamma(c)) if attrs.scale else inv

    # one square root and division per channel, not per element: written into a buffer
    channels = x.shape[axis]
    scale = extern((channels,), dt, lambda write: oplib.loop_nest(
        (channels,), lambda o: write(o, channel_scale(o[0]))))

    def normalized(*i: LExpr) -> LExpr:
        c = i[axis]
        value = Binary("mul", Binary("sub", x(*i), mean(c)), scale(c))
        return Binary("add", value, beta(c)) if attrs.center else value

    m = attrs.momentum

    def running(old: Tensor, batch: Tensor, factor: float) -> Tensor:
        return compute(old.shape, dt, lambda c: Binary(
            "add", Binary("mul", oplib.dtype_const(1 - m, dt), old(c)),
            Binary("mul", oplib.dtype_const(m * factor, dt), batch(c))))

    return (compute(x.shape, dt, normalized), running(running_mean, mean, 1.0),
            running(running_var, var, count / (count - 1)))


def _batch_norm_lower(inputs: list[Tensor], attrs: BatchNormAttrs, out: Type
                      ) -> tuple[Tensor, ...]:
    if attrs.training:
        return _batch_norm_training_lower(inputs, attrs)
    # As the reference: scale = 1 / sqrt(var + eps) (* gamma); (x - mean) * scale (+ beta).
    x, gamma, beta, mean, var = inputs
    axis = attrs.axis % x.ndim
    dt = x.dtype

    def element(*i: LExpr) -> LExpr:
        c = (i[axis],)
        scale = Binary("div", oplib.dtype_const(1, dt),
                       Unary("sqrt", Binary("add", var(*c), oplib.dtype_const(attrs.epsilon, dt))))
        if attrs.scale:
            scale = Binary("mul", scale, gamma(*c))
        value = Binary("mul", Binary("sub", x(*i), mean(*c)), scale)
        return Binary("add", value, beta(*c)) if attrs.center else value

    return compute(x.shape, dt, element), _copy(mean), _copy(var)


batch_norm = register(
    "nn.batch_norm",
    inputs=BATCH_NORM_INPUTS,
    attrs_type=BatchNormAttrs,
    attrs=(
        Attr("axis", 1, kind="int", doc="the channel axis"),
        Attr("epsilon", 1e-5, kind="float", doc="added to the variance"),
        Attr("center", True, kind="bool", doc="add beta"),
        Attr("scale", True, kind="bool", doc="multiply by gamma"),
        Attr("training", False, kind="bool",
             doc="kiln extension: normalize with the batch's statistics and update the "
                 "running ones"),
        Attr("momentum", 0.1, kind="float",
             doc="kiln extension, training only: the weight of the batch's statistics in "
                 "the running ones (torch's)"),
    ),
    relation=_batch_norm_relation,
    compute=_batch_norm,
    pattern=OpPattern.OPAQUE,
    doc="(x - mean) / sqrt(var + eps) * gamma + beta per channel, from the moving statistics; "
    "a tuple (out, moving_mean, moving_var). With training=True, from the batch's statistics, "
    "and the moving ones come back updated with momentum (as torch).",
    gradient=_batch_norm_grad,
    lower=_batch_norm_lower,
)


LAYER_NORM_INPUTS = ("data", "gamma", "beta")


def _layer_norm_relation(arg_types: Sequence[Type], attrs: NormAttrs) -> Type | None:
    args = tensor_args(arg_types, LAYER_NORM_INPUTS)
    if args is None:
        return None
    data = args[0]
    require_dtype(data, "data", "float")
    same_dtype(args, LAYER_NORM_INPUTS)
    axis = normalize_axis(attrs.axis, data.ndim)
    _channel_vectors(data, axis, args[1:], LAYER_NORM_INPUTS[1:])
    return data


def _layer_norm(arrays: list[np.ndarray], attrs: NormAttrs) -> np.ndarray:
    x, gamma, beta = (np.asarray(a) for a in arrays)
    axis = normalize_axis(attrs.axis, x.ndim)
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        out = out * _along(gamma, x.ndim, axis)
    if attrs.center:
        out = out + _along(beta, x.ndim, axis)
    return as_array(out, x.dtype.name)


def _layer_norm_grad(c: Call, g: Expr) -> list[Expr | None]:
    # With xhat = (x - mu) * rstd along the axis and dxhat = g * gamma:
    # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    x, gamma, _ = c.args
    xt = gh.tensor_type(x)
    attrs = NormAttrs.view(c.attrs)
    axis = normalize_axis(attrs.axis, xt.ndim)
    eps = scalar(attrs.epsilon, xt.dtype)

    def mean(e: Expr) -> Expr:
        return call("mean", e, axis=[axis], keepdims=True)

    centred = x - mean(x)
    rstd = call("rsqrt", mean(centred * centred) + eps)
    xhat = centred * rstd
    dxhat = g * along(gamma, xt.ndim, axis) if attrs.scale else g
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dgamma = gh.sum_over_rows(g * xhat, x, axis) if attrs.scale else None
    dbeta = gh.sum_over_rows(g, x, axis) if attrs.center else None
    return [dx, dgamma, dbeta]


def _layer_norm_lower(inputs: list[Tensor], attrs: NormAttrs, out: Type) -> Tensor:
    """Per row along the axis: the mean, then the variance about it (two passes, as the
    reference), then the normalized values written through the epilogue. Each pass is a
    loop that LLVM vectorizes to the target's width (marked vectorized, which lets it sum in
    lane-wise partial sums); the last multiplies by the reciprocal of the deviation."""
    x, gamma, beta = inputs
    dt = x.dtype
    axis = attrs.axis % x.ndim
    n = x.shape[axis]
    rows = x.shape[:axis] + x.shape[axis + 1:]
    count, eps = oplib.dtype_const(n, dt), oplib.dtype_const(attrs.epsilon, dt)

    def row(o: tuple[LExpr, ...], write: WriteFn) -> Stmt:
        def scan(body: Callable[[tuple[LExpr, ...], LExpr], Stmt]) -> Stmt:
            k = LVar("k")
            return For(k, Const(0), Const(n), body((*o[:axis], k, *o[axis:]), k),
                       "vectorized")

        acc = Buffer("row", (1,), dt, "local")
        zero = (Const(0),)
        mean, std = LVar("mean", dt), LVar("inv_std", dt)

        def accumulate(value: Callable[[tuple[LExpr, ...]], LExpr]) -> Stmt:
            return Seq((Store(acc, zero, oplib.dtype_const(0, dt)),
                        scan(lambda i, k: Store(acc, zero, Binary("add", Load(acc, zero),
                                                                  value(i))))))

        def centred(i: tuple[LExpr, ...]) -> LExpr:
            return Binary("sub", x(*i), mean)

        def normalized(i: tuple[LExpr, ...], k: LExpr) -> LExpr:
            value = Binary("mul", centred(i), std)
            if attrs.scale:
                value = Binary("mul", value, gamma(k))
            return Binary("add", value, beta(k)) if attrs.center else value

        def deviation(var: LExpr) -> Stmt:
            return LetStmt(std, Binary("div", oplib.dtype_const(1, dt), Unary("sqrt", Binary(
                "add", Binary("div", var, count), eps))), scan(
                    lambda i, k: write(i, normalized(i, k))))

        if axis == x.ndim - 1 and isinstance(x, BufferTensor):
            # along memory: both sums as vector folds, their lanes combined as a tree (a
            # row's last vector step and in-order lanes had weighed as much as its FMAs)
            buf, lanes = x.buffer, lowering_target().lanes(dt)

            def vec(p: LExpr) -> LExpr:
                return Load(buf, (*o, p), lanes)

            def sq(v: LExpr) -> LExpr:
                return Binary("mul", v, v)

            def fold(vector_step: Callable[[LExpr, LExpr], LExpr],
                     scalar_step: Callable[[LExpr, LExpr], LExpr],
                     use: Callable[[LExpr], Stmt]) -> Stmt:
                return oplib.lane_fold(n, lanes, dt, oplib.dtype_const(0, dt), vector_step,
                                       "add", scalar_step, use, loops=True)

            def centred_vec(p: LExpr) -> LExpr:
                return Binary("sub", vec(p), Broadcast(mean, lanes))

            return fold(lambda a, p: Binary("add", a, vec(p)),
                        lambda t, q: Binary("add", t, Load(buf, (*o, q))),
                        lambda total: LetStmt(mean, Binary("div", total, count), fold(
                            lambda a, p: Binary("add", a, sq(centred_vec(p))),
                            lambda t, q: Binary("add", t, sq(Binary(
                                "sub", Load(buf, (*o, q)), mean))),
                            deviation)))
        return Allocate(acc, Seq((
            accumulate(lambda i: x(*i)),
            LetStmt(mean, Binary("div", Load(acc, zero), count), Seq((
                accumulate(lambda i: Binary("mul", centred(i), centred(i))),
                deviation(Load(acc, zero)),
            ))),
        )))

    return extern(x.shape, dt, lambda write: oplib.outer_nest(
        rows, lambda o: row(o, write), 3 * n))


layer_norm = register(
    "nn.layer_norm",
    inputs=LAYER_NORM_INPUTS,
    attrs_type=NormAttrs,
    attrs=(
        Attr("axis", -1, kind="int", doc="the axis normalized over"),
        Attr("epsilon", 1e-5, kind="float", doc="added to the variance"),
        Attr("center", True, kind="bool", doc="add beta"),
        Attr("scale", True, kind="bool", doc="multiply by gamma"),
    ),
    relation=_layer_norm_relation,
    compute=_layer_norm,
    pattern=OpPattern.OPAQUE,
    doc="(x - mean) / sqrt(var + eps) * gamma + beta, statistics taken along one axis.",
    gradient=_layer_norm_grad,
    lower=_layer_norm_lower,
)


class DropoutAttrs(Attrs):
    __slots__ = ()
    rate: float


def _dropout_relation(arg_types: Sequence[Type], attrs: DropoutAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_dtype(data, "data", "float")
    if not 0.0 <= attrs.rate < 1.0:
        raise TypeCheckError(f"dropout rate must lie in [0, 1), got {attrs.rate}")
    return TupleType((data, data))


def _dropout(arrays: list[np.ndarray], attrs: DropoutAttrs) -> tuple[np.ndarray, np.ndarray]:
    # Inference semantics: nothing is dropped, so the output is the input and the mask is all
    # ones. (Training-time dropout needs randomness, which the reference interpreter lacks.)
    x = np.asarray(arrays[0])
    return x.copy(), np.ones_like(x)


dropout = register(
    "nn.dropout",
    inputs=("data",),
    attrs_type=DropoutAttrs,
    attrs=(Attr("rate", 0.5, kind="float", doc="the fraction dropped in training"),),
    relation=_dropout_relation,
    compute=_dropout,
    pattern=OpPattern.OPAQUE,
    doc="Dropout as at inference: a tuple (data unchanged, a mask of ones).",
    gradient=lambda c, g: [gh.fields(g, 2)[0]],  # the identity, as at inference
    lower=lambda inputs, attrs, out: (
        _copy(inputs[0]),
        compute(inputs[0].shape, inputs[0].dtype,
                lambda *i: oplib.dtype_const(1, inputs[0].dtype))),
)

__all__ = ["BatchNormAttrs", "batch_norm", "dropout", "layer_norm"]
