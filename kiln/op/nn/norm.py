"""Normalization: nn.batch_norm, nn.layer_norm, and nn.dropout.

The references compute what a model does at inference: batch_norm normalizes with the
moving statistics it is given (and returns them unchanged), and dropout is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import TensorType, TupleType, Type
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


def _batch_norm_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, BATCH_NORM_INPUTS)
    if args is None:
        return None
    data = args[0]
    require_dtype(data, "data", "float")
    same_dtype(args, BATCH_NORM_INPUTS)
    axis = normalize_axis(attrs.axis, data.ndim)  # type: ignore[arg-type]
    vector = _channel_vectors(data, axis, args[1:], BATCH_NORM_INPUTS[1:])
    return TupleType((data, vector, vector))


def _batch_norm(arrays: list[np.ndarray], attrs: Attrs) -> tuple[np.ndarray, ...]:
    x, gamma, beta, mean, var = (np.asarray(a) for a in arrays)
    axis = normalize_axis(attrs.axis, x.ndim)  # type: ignore[arg-type]
    scale = 1 / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        scale = scale * gamma
    out = (x - _along(mean, x.ndim, axis)) * _along(scale, x.ndim, axis)
    if attrs.center:
        out = out + _along(beta, x.ndim, axis)
    return as_array(out, x.dtype.name), mean.copy(), var.copy()


batch_norm = register(
    "nn.batch_norm",
    inputs=BATCH_NORM_INPUTS,
    attrs=(
        Attr("axis", 1, kind="int", doc="the channel axis"),
        Attr("epsilon", 1e-5, kind="float", doc="added to the variance"),
        Attr("center", True, kind="bool", doc="add beta"),
        Attr("scale", True, kind="bool", doc="multiply by gamma"),
    ),
    relation=_batch_norm_relation,
    compute=_batch_norm,
    pattern=OpPattern.OPAQUE,
    doc="(x - mean) / sqrt(var + eps) * gamma + beta per channel, from the moving statistics; "
    "a tuple (out, moving_mean, moving_var).",
)


LAYER_NORM_INPUTS = ("data", "gamma", "beta")


def _layer_norm_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, LAYER_NORM_INPUTS)
    if args is None:
        return None
    data = args[0]
    require_dtype(data, "data", "float")
    same_dtype(args, LAYER_NORM_INPUTS)
    axis = normalize_axis(attrs.axis, data.ndim)  # type: ignore[arg-type]
    _channel_vectors(data, axis, args[1:], LAYER_NORM_INPUTS[1:])
    return data


def _layer_norm(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, gamma, beta = (np.asarray(a) for a in arrays)
    axis = normalize_axis(attrs.axis, x.ndim)  # type: ignore[arg-type]
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        out = out * _along(gamma, x.ndim, axis)
    if attrs.center:
        out = out + _along(beta, x.ndim, axis)
    return as_array(out, x.dtype.name)


layer_norm = register(
    "nn.layer_norm",
    inputs=LAYER_NORM_INPUTS,
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
)


def _dropout_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_dtype(data, "data", "float")
    if not 0.0 <= attrs.rate < 1.0:  # type: ignore[operator]
        raise TypeCheckError(f"dropout rate must lie in [0, 1), got {attrs.rate}")
    return TupleType((data, data))


def _dropout(arrays: list[np.ndarray], attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    # Inference semantics: nothing is dropped, so the output is the input and the mask is all
    # ones. (Training-time dropout needs randomness, which the reference interpreter lacks.)
    x = np.asarray(arrays[0])
    return x.copy(), np.ones_like(x)


dropout = register(
    "nn.dropout",
    inputs=("data",),
    attrs=(Attr("rate", 0.5, kind="float", doc="the fraction dropped in training"),),
    relation=_dropout_relation,
    compute=_dropout,
    pattern=OpPattern.OPAQUE,
    doc="Dropout as at inference: a tuple (data unchanged, a mask of ones).",
)

__all__ = ["batch_norm", "dropout", "layer_norm"]
