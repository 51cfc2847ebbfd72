"""qnn.concatenate: quantized tensors joined along an axis, each requantized to the output's
scale and zero point first (TVM's canonicalization: an input already in them is only cast).

Relay's signature: (data, input_scales, input_zero_points, output_scale, output_zero_point)
with ``axis``; data, input_scales and input_zero_points are tuples (one entry per input).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import op as kop
from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, Tuple, TupleGetItem
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.op.common import is_known
from kiln.op.qnn.common import (
    canonical,
    check_param,
    constant_value,
    requantize_expr,
    requantize_np,
    require_quantized,
)
from kiln.op.registry import Attr, OpPattern, get, register


class QConcatenateAttrs(Attrs):
    __slots__ = ()
    axis: int


def _fields(t: Type, what: str) -> tuple[Type, ...] | None:
    if not is_known(t):
        return None
    if not isinstance(t, TupleType):
        raise TypeCheckError(f"qnn.concatenate: {what} must be a tuple, not {t}")
    return t.fields


def _relation(arg_types: Sequence[Type], attrs: QConcatenateAttrs) -> Type | None:
    data = _fields(arg_types[0], "data")
    scales = _fields(arg_types[1], "input_scales")
    zps = _fields(arg_types[2], "input_zero_points")
    if data is None or scales is None or zps is None:
        return None
    for name, group in (("input_scales", scales), ("input_zero_points", zps)):
        if len(group) != len(data):
            raise TypeCheckError(f"qnn.concatenate: {len(data)} inputs but {len(group)} "
                                 f"{name}")
    out = get("concatenate").relation([arg_types[0]], attrs)
    if out is None:
        return None
    assert isinstance(out, TensorType)  # concatenate's relation makes a tensor
    require_quantized(out, "qnn.concatenate: data", ("int8", "uint8", "int32"))
    for i, (s, z) in enumerate(zip(scales, zps, strict=True)):
        check_param(s, f"input scale {i}", "float32", None, 0, allow_vector=False)
        check_param(z, f"input zero point {i}", "int32", None, 0, allow_vector=False)
    check_param(arg_types[3], "output scale", "float32", None, 0, allow_vector=False)
    check_param(arg_types[4], "output zero point", "int32", None, 0, allow_vector=False)
    return out


def _same(s: np.ndarray, z: np.ndarray, os_: np.ndarray, oz: np.ndarray) -> bool:
    return bool(np.float32(s).reshape(-1)[0] == np.float32(os_).reshape(-1)[0]
                and int(np.asarray(z).reshape(-1)[0]) == int(np.asarray(oz).reshape(-1)[0]))


def _compute(arrays: list, attrs: QConcatenateAttrs) -> np.ndarray:
    data, scales, zps, os_, oz = arrays
    parts = []
    for x, s, z in zip(data, scales, zps, strict=True):
        x = np.asarray(x)
        if _same(s, z, os_, oz):
            parts.append(x)
        else:
            parts.append(requantize_np(x, s, z, os_, oz, 0, "UPWARD", x.dtype.name))
    return np.concatenate(parts, axis=attrs.axis)


def _item(e: Expr, i: int) -> Expr:
    return e.fields[i] if isinstance(e, Tuple) else TupleGetItem(e, i)


@canonical("qnn.concatenate")
def _canonical(c: Call, types: Sequence[Type]) -> Expr:
    attrs = QConcatenateAttrs.view(c.attrs)
    data, scales, zps, os_, oz = c.args
    data_t = types[0]
    assert isinstance(data_t, TupleType)  # checked by the relation
    out_scale = constant_value(os_, "the output scale", "qnn.concatenate")
    out_zp = constant_value(oz, "the output zero point", "qnn.concatenate")
    parts: list[Expr] = []
    for i, t in enumerate(data_t.fields):
        assert isinstance(t, TensorType)
        x = _item(data, i)
        s = constant_value(_item(scales, i), f"input scale {i}", "qnn.concatenate")
        z = constant_value(_item(zps, i), f"input zero point {i}", "qnn.concatenate")
        if _same(s, z, out_scale, out_zp):
            parts.append(x)
        else:
            parts.append(requantize_expr(x, t, s, _item(zps, i), out_scale, oz, 0, "UPWARD",
                                         t.dtype))
    return kop.concatenate(Tuple(tuple(parts)), axis=attrs.axis)


concatenate = register(
    "qnn.concatenate",
    inputs=("data", "input_scales", "input_zero_points", "output_scale",
            "output_zero_point"),
    attrs_type=QConcatenateAttrs,
    attrs=(Attr("axis", 0, kind="int", doc="the axis to join along"),),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.INJECTIVE,
    doc="Quantized tensors requantized to one scale and zero point, then concatenated.",
    differentiable=False,
)

__all__ = ["concatenate"]
