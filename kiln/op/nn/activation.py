"""Activations: nn.relu, nn.leaky_relu, nn.softmax and nn.log_softmax."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.ir.attrs import Attrs
from kiln.ir.ty import Type
from kiln.op.common import as_array, normalize_axis, require_dtype, tensor_arg
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


relu = register(
    "nn.relu",
    inputs=("data",),
    relation=_relu_relation,
    compute=_relu,
    pattern=OpPattern.ELEMWISE,
    doc="max(x, 0) elementwise.",
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


softmax = register(
    "nn.softmax",
    inputs=("data",),
    attrs=(Attr("axis", -1, kind="int", doc="the axis that sums to one"),),
    relation=_float_relation,
    compute=_softmax,
    pattern=OpPattern.OPAQUE,
    doc="exp(x) / sum(exp(x)) along an axis, computed stably.",
)
log_softmax = register(
    "nn.log_softmax",
    inputs=("data",),
    attrs=(Attr("axis", -1, kind="int", doc="the axis normalized over"),),
    relation=_float_relation,
    compute=_log_softmax,
    pattern=OpPattern.OPAQUE,
    doc="log(softmax(x)) along an axis, computed stably.",
)

__all__ = ["leaky_relu", "log_softmax", "relu", "softmax"]
