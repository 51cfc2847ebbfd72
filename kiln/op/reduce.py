"""Reductions: sum, mean, prod, max, min, all, any, argmax and argmin (Relay's reduce.cc).

Every reduction takes ``axis`` (None or an empty list: all axes; negative axes count from the
end), ``keepdims`` (reduced axes stay as size 1) and ``exclude`` (reduce the axes *not*
listed). Results keep the input dtype, except argmax/argmin (int32, as TVM) and all/any (bool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import Dim, TensorType, Type
from kiln.op.common import (
    as_array,
    is_int,
    normalize_axis,
    require_dtype,
    tensor_arg,
    trunc_divide,
)
from kiln.op.registry import Attr, OpDef, OpPattern, register


def reduce_axes(ndim: int, axis: Sequence[int] | None, exclude: bool) -> tuple[int, ...]:
    """The sorted axes a reduction runs over; a TypeCheckError for bad or repeated axes."""
    if not axis:
        return tuple(range(ndim))
    axes = [normalize_axis(a, ndim) for a in axis]
    if len(set(axes)) != len(axes):
        raise TypeCheckError(f"axis {list(axis)} names the same dimension twice")
    if exclude:
        return tuple(i for i in range(ndim) if i not in axes)
    return tuple(sorted(axes))


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """The shape left after reducing ``axes``: size 1 there with keepdims, else dropped."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


REDUCE_ATTRS = (
    Attr("axis", None, kind="ints", optional=True, doc="the axes to reduce; None means all"),
    Attr("keepdims", False, kind="bool", doc="keep reduced axes as size-1 dimensions"),
    Attr("exclude", False, kind="bool", doc="reduce the axes not listed in axis instead"),
)
ARG_REDUCE_ATTRS = (
    Attr("axis", None, kind="ints", optional=True, doc="the axes to reduce; None means all"),
    Attr("keepdims", False, kind="bool", doc="keep reduced axes as size-1 dimensions"),
    Attr("select_last_index", False, kind="bool", doc="on ties, give the last index"),
    Attr("exclude", False, kind="bool", doc="reduce the axes not listed in axis instead"),
)


def _reduce_relation(
    kind: str, result_dtype: str | None = None
) -> Callable[[Sequence[Type], Attrs], Type | None]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
        data = tensor_arg(arg_types[0], "data")
        if data is None:
            return None
        require_dtype(data, "data", kind)
        axes = reduce_axes(data.ndim, attrs.axis, attrs.exclude)  # type: ignore[arg-type]
        shape = reduced_shape(data.shape, axes, attrs.keepdims)  # type: ignore[arg-type]
        return TensorType(shape, result_dtype or data.dtype)

    return relation


def _reduction(
    name: str,
    fn: Callable[..., object],
    doc: str,
    *,
    kind: str = "numeric",
    result_dtype: str | None = None,
    differentiable: bool = True,
) -> OpDef:
    """Register a reduction computing ``fn(x, axis=axes, keepdims=keepdims)``."""

    def compute(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        x = np.asarray(arrays[0])
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)  # type: ignore[arg-type]
        try:
            with np.errstate(all="ignore"):
                out = fn(x, axis=axes, keepdims=attrs.keepdims)
        except ValueError:  # numpy: a max or min over no elements
            raise EvalError(f"{name} over an empty axis of a tensor of shape {x.shape}") from None
        return as_array(out, result_dtype or x.dtype.name)

    return register(
        name,
        inputs=("data",),
        attrs=REDUCE_ATTRS,
        relation=_reduce_relation(kind, result_dtype),
        compute=compute,
        pattern=OpPattern.COMM_REDUCE,
        doc=doc,
        differentiable=differentiable,
    )


def _sum(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)  # no promotion of ints


def _prod(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if not is_int(x.dtype.name):
        return np.mean(x, axis=axis, keepdims=keepdims)
    # Integer mean is the (wrapping) sum divided by the count, truncated, as TVM computes it.
    count = math.prod(x.shape[a] for a in axis)
    if count == 0:
        raise EvalError(f"mean of no elements (a tensor of shape {x.shape})")
    return trunc_divide(_sum(x, axis, keepdims), np.asarray(count, x.dtype))


sum_ = _reduction("sum", _sum, "Sum of the elements over the given axes.")
mean = _reduction("mean", _mean, "Arithmetic mean over the given axes (integers truncate).")
prod = _reduction("prod", _prod, "Product of the elements over the given axes.")
max_ = _reduction("max", np.max, "Largest element over the given axes.")
min_ = _reduction("min", np.min, "Smallest element over the given axes.")
all_ = _reduction(
    "all",
    np.all,
    "True where every element over the axes is true.",
    kind="bool",
    differentiable=False,
)
any_ = _reduction(
    "any",
    np.any,
    "True where some element over the axes is true.",
    kind="bool",
    differentiable=False,
)


# --- argmax, argmin -----------------------------------------------------------------------


def _arg_reduction(name: str, fn: Callable[..., np.ndarray], doc: str) -> OpDef:
    """Register argmax or argmin: the index, flattened over the reduced axes, as int32."""

    def compute(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        x = np.asarray(arrays[0])
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)  # type: ignore[arg-type]
        kept = [i for i in range(x.ndim) if i not in axes]
        n = math.prod(x.shape[a] for a in axes)
        if n == 0:
            raise EvalError(f"{name} over an empty axis of a tensor of shape {x.shape}")
        # Bring the reduced axes to the end and flatten them into one, in row-major order.
        flat = np.transpose(x, kept + list(axes)).reshape([x.shape[i] for i in kept] + [n])
        if attrs.select_last_index:
            index = n - 1 - fn(flat[..., ::-1], axis=-1)
        else:
            index = fn(flat, axis=-1)
        if attrs.keepdims:
            index = np.reshape(index, reduced_shape(x.shape, axes, True))
        return as_array(index, "int32")

    return register(
        name,
        inputs=("data",),
        attrs=ARG_REDUCE_ATTRS,
        relation=_reduce_relation("numeric", "int32"),
        compute=compute,
        pattern=OpPattern.COMM_REDUCE,
        doc=doc,
        differentiable=False,
    )


argmax = _arg_reduction("argmax", np.argmax, "Index (int32) of the largest element over the axes.")
argmin = _arg_reduction("argmin", np.argmin, "Index (int32) of the smallest element over the axes.")

__all__ = ["all_", "any_", "argmax", "argmin", "max_", "mean", "min_", "prod", "sum_"]
