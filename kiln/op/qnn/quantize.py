"""qnn.quantize, qnn.dequantize and qnn.requantize: moving between float and integer domains.

    quantize:    q = clip(round(x / scale) + zero_point, qmin, qmax)      (float32 arithmetic)
    dequantize:  x = float32(int32(q) - zero_point) * scale
    requantize:  q' = clip(fixed_point(q - zp_in, scale_in / scale_out) + zp_out, qmin, qmax)

``round`` in quantize is TVM's (halves away from zero) unless ``rounding="HALF_TO_EVEN"`` — a
kiln attribute, default "HALF_AWAY", that the ONNX importer sets because ONNX's QuantizeLinear
rounds halves to even. Requantize is TVM's int64 fixed point: the ratio of the float32 scales
in double becomes a Q31 multiplier and a shift, and the product is rounded ``UPWARD`` (halves
toward +inf; "None" means this, TVM's default) or ``TONEAREST`` (halves away from zero).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import op as kop
from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, Type
from kiln.op import grad_helpers as gh
from kiln.op.common import normalize_axis, tensor_arg
from kiln.op.qnn.common import (
    along,
    along_expr,
    canonical,
    check_param,
    constant_value,
    is_zero,
    qrange,
    requantize_expr,
    requantize_np,
    require_quantized,
    rounding_mode,
)
from kiln.op.registry import Attr, OpPattern, register

QUANTIZE_ROUNDINGS = ("HALF_AWAY", "HALF_TO_EVEN")


def _axis(data: TensorType, axis: int) -> int:
    return normalize_axis(axis, data.ndim) if data.ndim else 0


# --- qnn.quantize -----------------------------------------------------------------------------


class QuantizeAttrs(Attrs):
    __slots__ = ()
    axis: int
    out_dtype: str
    rounding: str


def _quantize_relation(arg_types: Sequence[Type], attrs: QuantizeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    if data.dtype != "float32":
        raise TypeCheckError(f"qnn.quantize: data must have dtype float32, but has dtype "
                             f"{data.dtype}")
    axis = _axis(data, attrs.axis)
    check_param(arg_types[1], "output scale", "float32", data, axis)
    check_param(arg_types[2], "output zero point", "int32", data, axis)
    if attrs.out_dtype not in ("int8", "uint8", "int16", "uint16", "int32"):
        raise TypeCheckError(f"qnn.quantize: out_dtype must be int8, uint8, int16, uint16 or "
                             f"int32, not {attrs.out_dtype}")
    if attrs.rounding not in QUANTIZE_ROUNDINGS:
        raise TypeCheckError(f"qnn.quantize: rounding must be HALF_AWAY or HALF_TO_EVEN, not "
                             f"{attrs.rounding!r}")
    return TensorType(data.shape, attrs.out_dtype)


def _round_np(v: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "HALF_TO_EVEN":
        return np.rint(v)
    return np.trunc(v) + np.where(np.abs(v - np.trunc(v)) >= 0.5, np.sign(v), 0).astype(v.dtype)


def _quantize(arrays: list[np.ndarray], attrs: QuantizeAttrs) -> np.ndarray:
    x = np.asarray(arrays[0], np.float32)
    a = attrs.axis % x.ndim if x.ndim else 0
    scale = along(np.asarray(arrays[1], np.float32), a, x.ndim)
    zp = along(np.asarray(arrays[2], np.int32), a, x.ndim).astype(np.float32)
    with np.errstate(all="ignore"):
        v = _round_np((x / scale).astype(np.float32), attrs.rounding) + zp
    lo, hi = qrange(attrs.out_dtype)
    return np.clip(v, lo, hi).astype(attrs.out_dtype)


@canonical("qnn.quantize")
def _quantize_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = QuantizeAttrs.view(c.attrs)
    data = types[0]
    a = _axis(data, attrs.axis)
    x, scale, zp = c.args
    v: Expr = kop.divide(x, along_expr(scale, types[1], a, data.ndim))
    v = kop.nearbyint(v) if attrs.rounding == "HALF_TO_EVEN" else kop.round(v)
    if not is_zero(zp):
        v = kop.add(v, kop.cast(along_expr(zp, types[2], a, data.ndim), dtype="float32"))
    lo, hi = qrange(attrs.out_dtype)
    return kop.cast(kop.clip(v, a_min=float(lo), a_max=float(hi)), dtype=attrs.out_dtype)


def _quantize_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Straight-through: round is taken as the identity, so d q / d x = 1 / scale.
    attrs = QuantizeAttrs.view(c.attrs)
    data, scale = gh.tensor_type(c.args[0]), gh.tensor_type(c.args[1])
    a = _axis(data, attrs.axis)
    gx = kop.divide(kop.cast(g, dtype="float32"), along_expr(c.args[1], scale, a, data.ndim))
    return [gx, None, None]


quantize = register(
    "qnn.quantize",
    inputs=("data", "output_scale", "output_zero_point"),
    attrs_type=QuantizeAttrs,
    attrs=(
        Attr("axis", -1, kind="int", doc="the channel axis of per-channel scales"),
        Attr("out_dtype", "int8", kind="dtype", doc="the integer dtype of the result"),
        Attr("rounding", "HALF_AWAY", kind="str",
             doc="HALF_AWAY (TVM's round) or HALF_TO_EVEN (ONNX QuantizeLinear); kiln's"),
    ),
    relation=_quantize_relation,
    compute=_quantize,
    pattern=OpPattern.ELEMWISE,
    doc="float32 to integers: clip(round(x / scale) + zero_point).",
    gradient=_quantize_grad,
)


# --- qnn.dequantize ---------------------------------------------------------------------------


class DequantizeAttrs(Attrs):
    __slots__ = ()
    axis: int
    out_dtype: str


def _dequantize_relation(arg_types: Sequence[Type], attrs: DequantizeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_quantized(data, "qnn.dequantize: data", ("int8", "uint8", "int16", "uint16", "int32"))
    axis = _axis(data, attrs.axis)
    check_param(arg_types[1], "input scale", "float32", data, axis)
    check_param(arg_types[2], "input zero point", "int32", data, axis)
    if attrs.out_dtype != "float32":
        raise TypeCheckError(f"qnn.dequantize: out_dtype must be float32, not {attrs.out_dtype}")
    return TensorType(data.shape, attrs.out_dtype)


def _dequantize(arrays: list[np.ndarray], attrs: DequantizeAttrs) -> np.ndarray:
    q = np.asarray(arrays[0]).astype(np.int64)
    a = attrs.axis % q.ndim if q.ndim else 0
    scale = along(np.asarray(arrays[1], np.float32), a, q.ndim)
    zp = along(np.asarray(arrays[2], np.int64), a, q.ndim)
    return ((q - zp).astype(np.int32).astype(np.float32) * scale).astype(np.float32)


@canonical("qnn.dequantize")
def _dequantize_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = DequantizeAttrs.view(c.attrs)
    data = types[0]
    a = _axis(data, attrs.axis)
    q, scale, zp = c.args
    v = kop.cast(q, dtype="int32") if data.dtype != "int32" else q
    if not is_zero(zp):
        v = kop.subtract(v, along_expr(zp, types[2], a, data.ndim))
    return kop.multiply(kop.cast(v, dtype="float32"), along_expr(scale, types[1], a, data.ndim))


dequantize = register(
    "qnn.dequantize",
    inputs=("data", "input_scale", "input_zero_point"),
    attrs_type=DequantizeAttrs,
    attrs=(
        Attr("axis", -1, kind="int", doc="the channel axis of per-channel scales"),
        Attr("out_dtype", "float32", kind="dtype", doc="the float dtype of the result"),
    ),
    relation=_dequantize_relation,
    compute=_dequantize,
    pattern=OpPattern.ELEMWISE,
    doc="Integers to float32: (q - zero_point) * scale.",
    # Like cast from an integer dtype: no gradient flows into integers.
    differentiable=False,
)


# --- qnn.requantize ---------------------------------------------------------------------------


class RequantizeAttrs(Attrs):
    __slots__ = ()
    axis: int
    rounding: str
    compute_dtype: str
    out_dtype: str


def _requantize_relation(arg_types: Sequence[Type], attrs: RequantizeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    require_quantized(data, "qnn.requantize: data")
    axis = _axis(data, attrs.axis)
    check_param(arg_types[1], "input scale", "float32", data, axis)
    check_param(arg_types[2], "input zero point", "int32", data, axis)
    check_param(arg_types[3], "output scale", "float32", data, axis)
    check_param(arg_types[4], "output zero point", "int32", data, axis)
    rounding_mode(attrs.rounding)
    if attrs.compute_dtype not in ("None", "int64"):
        raise TypeCheckError(f"qnn.requantize: kiln computes in int64 (compute_dtype \"None\" or "
                             f"\"int64\", TVM's default), not {attrs.compute_dtype!r}")
    if not dtype_of(attrs.out_dtype).is_integer:
        raise TypeCheckError(f"qnn.requantize: out_dtype must be an integer dtype, not "
                             f"{attrs.out_dtype}")
    return TensorType(data.shape, attrs.out_dtype)


def _requantize(arrays: list[np.ndarray], attrs: RequantizeAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    a = attrs.axis % x.ndim if x.ndim else 0
    return requantize_np(x, arrays[1], arrays[2], arrays[3], arrays[4], a,
                         rounding_mode(attrs.rounding), attrs.out_dtype)


@canonical("qnn.requantize")
def _requantize_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = RequantizeAttrs.view(c.attrs)
    data = types[0]
    a = _axis(data, attrs.axis)
    x, in_scale, in_zp, out_scale, out_zp = c.args
    return requantize_expr(
        x, data, constant_value(in_scale, "the input scale", "qnn.requantize"),
        along_expr(in_zp, types[2], a, data.ndim),
        constant_value(out_scale, "the output scale", "qnn.requantize"),
        along_expr(out_zp, types[4], a, data.ndim), a, rounding_mode(attrs.rounding),
        attrs.out_dtype)


requantize = register(
    "qnn.requantize",
    inputs=("data", "input_scale", "input_zero_point", "output_scale", "output_zero_point"),
    attrs_type=RequantizeAttrs,
    attrs=(
        Attr("axis", -1, kind="int", doc="the channel axis of per-channel scales"),
        Attr("rounding", "None", kind="str", doc="None (= UPWARD), UPWARD or TONEAREST"),
        Attr("compute_dtype", "None", kind="str", doc="None (= int64) or int64"),
        Attr("out_dtype", "int8", kind="dtype", doc="the integer dtype of the result"),
    ),
    relation=_requantize_relation,
    compute=_requantize,
    pattern=OpPattern.ELEMWISE,
    doc="Integers in one scale and zero point to another, in TVM's int64 fixed point.",
    differentiable=False,
)

__all__ = ["dequantize", "quantize", "requantize"]
