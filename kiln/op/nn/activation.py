"""Activations: nn.relu, nn.leaky_relu, nn.softmax and nn.log_softmax."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import Type
from kiln.loops import oplib
from kiln.loops.ir import Binary
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


relu = register(
    "nn.relu",
    inputs=("data",),
    relation=_relu_relation,
    compute=_relu,
    pattern=OpPattern.ELEMWISE,
    doc="max(x, 0) elementwise.",
    gradient=lambda c, g: [_positive_or(c, g, gh.zeros_like(g))],
    lower=oplib.unary(lambda x: Binary("max", x, oplib.dtype_const(0, x.dtype))),
)


def _float_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_dtype(data, "data", "float")
    if "axis" in attrs:
        normalize_axis(attrs.axis, data.ndim)  # type: ignore[arg-type]
    return data


def _leaky_relu(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    return as_array(np.where(x > 0, x, x * attrs.alpha), x.dtype.name)


leaky_relu = register(
    "nn.leaky_relu",
    inputs=("data",),
    attrs=(Attr("alpha", 0.25, kind="float", doc="the slope for negative inputs"),),
    relation=_float_relation,
    compute=_leaky_relu,
    pattern=OpPattern.ELEMWISE,
    doc="x where x > 0, else alpha * x.",
    gradient=lambda c, g: [
        _positive_or(c, g, g * scalar(c.attrs.alpha, gh.dtype(c)))  # type: ignore[arg-type]
    ],
)


def _softmax(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True))
        return as_array(e / np.sum(e, axis=attrs.axis, keepdims=True), x.dtype.name)


def _log_softmax(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=attrs.axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=attrs.axis, keepdims=True)
        return as_array(shifted - np.log(total), x.dtype.name)


def _softmax_grad(c: Call, g: Expr) -> list[Expr | None]:
    # y (g - sum(g y)) along the axis, with y the shared forward result
    inner = call("sum", g * c, axis=[c.attrs.axis], keepdims=True)
    return [c * (g - inner)]


def _log_softmax_grad(c: Call, g: Expr) -> list[Expr | None]:
    # g - softmax(x) sum(g) along the axis, with softmax(x) = exp(y)
    total = call("sum", g, axis=[c.attrs.axis], keepdims=True)
    return [g - call("exp", c) * total]


softmax = register(
    "nn.softmax",
    inputs=("data",),
    attrs=(Attr("axis", -1, kind="int", doc="the axis that sums to one"),),
    relation=_float_relation,
    compute=_softmax,
    pattern=OpPattern.OPAQUE,
    doc="exp(x) / sum(exp(x)) along an axis, computed stably.",
    gradient=_softmax_grad,
)
log_softmax = register(
    "nn.log_softmax",
    inputs=("data",),
    attrs=(Attr("axis", -1, kind="int", doc="the axis normalized over"),),
    relation=_float_relation,
    compute=_log_softmax,
    pattern=OpPattern.OPAQUE,
    doc="log(softmax(x)) along an axis, computed stably.",
    gradient=_log_softmax_grad,
)

__all__ = ["leaky_relu", "log_softmax", "relu", "softmax"]
