"""Shape-changing nn operators: nn.pad and nn.batch_flatten."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, const
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.op.common import dim_product, shape_str, tensor_arg
from kiln.op.registry import Attr, OpPattern, register

PAD_MODES = ("constant", "edge", "reflect")


def _pad_width(value: object, where: str) -> tuple[tuple[int, int], ...]:
    """An `Attr` convert: one (before, after) pair of non-negative ints per dimension."""
    if not isinstance(value, tuple):
        value = (value,)  # reported below as not a pair
    pairs = []
    for p in value:
        if (
            not isinstance(p, tuple)
            or len(p) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
        ):
            raise Error(
                f"{where} must be (before, after) pairs of non-negative integers, got {value!r}"
            )
        pairs.append(p)
    return tuple(pairs)


def _pad_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    value = tensor_arg(arg_types[1], "pad_value")
    if data is None or value is None:
        return None
    if value.ndim != 0:
        raise TypeCheckError(f"pad_value must be a scalar, but has shape {shape_str(value.shape)}")
    widths = attrs.pad_width
    if len(widths) != data.ndim:  # type: ignore[arg-type]
        raise TypeCheckError(
            f"pad_width gives {len(widths)} (before, after) pairs but data of shape "  # type: ignore
            f"{shape_str(data.shape)} has {data.ndim} dimensions"
        )
    if attrs.pad_mode not in PAD_MODES:
        raise TypeCheckError(
            f"pad_mode must be one of {', '.join(PAD_MODES)}, got {attrs.pad_mode!r}"
        )
    shape: list[Dim] = []
    for axis, (d, (before, after)) in enumerate(zip(data.shape, widths, strict=True)):  # type: ignore
        if isinstance(d, int) and max(before, after) > 0:
            # edge copies the border element; reflect mirrors without repeating it
            limit = {"constant": None, "edge": 1, "reflect": max(before, after) + 1}[attrs.pad_mode]
            if limit is not None and d < limit:
                raise TypeCheckError(
                    f"{attrs.pad_mode} padding of ({before}, {after}) needs dimension {axis} of "
                    f"data of shape {shape_str(data.shape)} to be at least {limit}"
                )
        if isinstance(d, int):
            shape.append(d + before + after)
        else:
            shape.append(d if before == after == 0 else ANY)
    return TensorType(tuple(shape), data.dtype)


def _pad(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    if attrs.pad_mode == "constant":
        with np.errstate(invalid="ignore"):
            fill = np.asarray(arrays[1]).astype(x.dtype)
        return np.pad(x, attrs.pad_width, constant_values=fill)
    return np.pad(x, attrs.pad_width, mode=attrs.pad_mode)  # type: ignore[call-overload]


_pad_op = register(
    "nn.pad",
    inputs=("data", "pad_value"),
    attrs=(
        Attr("pad_width", kind="any", convert=_pad_width, doc="(before, after) for each dimension"),
        Attr("pad_mode", "constant", kind="str", doc="constant, edge or reflect"),
    ),
    relation=_pad_relation,
    compute=_pad,
    pattern=OpPattern.INJECTIVE,
    doc="data padded on each side of each axis (pad_value is converted to data's dtype).",
)


def pad(
    data: object, pad_width: object, pad_value: object = 0.0, pad_mode: str = "constant"
) -> Call:
    """``nn.pad(data, pad_width, pad_value=0.0, pad_mode="constant")`` as Relay's Python API."""
    if not isinstance(pad_value, Expr):
        pad_value = const(pad_value)
    return _pad_op(data, pad_value, pad_width=pad_width, pad_mode=pad_mode)


def _batch_flatten_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    if data.ndim == 0:
        raise TypeCheckError("batch_flatten needs a tensor of rank >= 1, but data is a scalar")
    rest = data.shape[1:]
    flat = rest[0] if len(rest) == 1 else dim_product(rest)
    return TensorType((data.shape[0], flat), data.dtype)


batch_flatten = register(
    "nn.batch_flatten",
    inputs=("data",),
    relation=_batch_flatten_relation,
    compute=lambda arrays, attrs: np.reshape(
        arrays[0], (np.shape(arrays[0])[0], int(np.prod(np.shape(arrays[0])[1:])))
    ),
    pattern=OpPattern.INJECTIVE,
    doc="Each item of the batch flattened: shape (N, d1 * d2 * ...).",
)

__all__ = ["batch_flatten", "pad"]
