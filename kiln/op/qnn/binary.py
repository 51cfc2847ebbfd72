"""qnn.add and qnn.mul: elementwise arithmetic of quantized tensors, as TVM canonicalizes it.

    add: requantize(lhs -> output scale, zero point 0, int32)
         + requantize(rhs -> output scale, zero point 0, int32) + output zero point, clipped
    mul: requantize((lhs - zp_lhs) * (rhs - zp_rhs), scale lhs_scale * rhs_scale (float32)
                    -> output scale and zero point)

Requantization is int64 fixed point with UPWARD rounding (TVM's default). Operands broadcast
as numpy's; scales and zero points are scalars or vectors along ``lhs_axis`` / ``rhs_axis``.
The result has the dtype of the operands; the scales must be constants to compile.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import op as kop
from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, const
from kiln.ir.ty import TensorType, Type
from kiln.op.common import broadcast_shape, normalize_axis, tensor_args
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
)
from kiln.op.registry import Attr, OpPattern, register

INPUTS = ("lhs", "rhs", "lhs_scale", "lhs_zero_point", "rhs_scale", "rhs_zero_point",
          "output_scale", "output_zero_point")


class QBinaryAttrs(Attrs):
    __slots__ = ()
    lhs_axis: int
    rhs_axis: int


def _relation(name: str):  # noqa: ANN202 - a relation factory
    def relation(arg_types: Sequence[Type], attrs: QBinaryAttrs) -> Type | None:
        args = tensor_args(arg_types[:2], ("lhs", "rhs"))
        if args is None:
            return None
        lhs, rhs = args
        require_quantized(lhs, f"{name}: lhs", ("int8", "uint8", "int32"))
        if rhs.dtype != lhs.dtype:
            raise TypeCheckError(f"{name}: lhs and rhs must have one dtype, but have "
                                 f"{lhs.dtype} and {rhs.dtype}")
        shape = broadcast_shape(lhs.shape, rhs.shape)
        la = normalize_axis(attrs.lhs_axis, lhs.ndim) if lhs.ndim else 0
        ra = normalize_axis(attrs.rhs_axis, rhs.ndim) if rhs.ndim else 0
        check_param(arg_types[2], "lhs scale", "float32", lhs, la)
        check_param(arg_types[3], "lhs zero point", "int32", lhs, la)
        check_param(arg_types[4], "rhs scale", "float32", rhs, ra)
        check_param(arg_types[5], "rhs zero point", "int32", rhs, ra)
        check_param(arg_types[6], "output scale", "float32", None, 0, allow_vector=False)
        check_param(arg_types[7], "output zero point", "int32", None, 0, allow_vector=False)
        return TensorType(shape, lhs.dtype)

    return relation


def _axes(arrays: list[np.ndarray], attrs: QBinaryAttrs) -> tuple[int, int]:
    lhs, rhs = np.asarray(arrays[0]), np.asarray(arrays[1])
    return (attrs.lhs_axis % lhs.ndim if lhs.ndim else 0,
            attrs.rhs_axis % rhs.ndim if rhs.ndim else 0)


def _add(arrays: list[np.ndarray], attrs: QBinaryAttrs) -> np.ndarray:
    la, ra = _axes(arrays, attrs)
    lhs, rhs, ls, lz, rs, rz, os_, oz = (np.asarray(a) for a in arrays)
    zero = np.zeros((), np.int32)
    a = requantize_np(lhs, ls, lz, os_, zero, la, "UPWARD", "int32").astype(np.int64)
    b = requantize_np(rhs, rs, rz, os_, zero, ra, "UPWARD", "int32").astype(np.int64)
    lo, hi = qrange(lhs.dtype.name)
    return np.clip(a + b + int(oz.reshape(())), lo, hi).astype(lhs.dtype)


def _mul(arrays: list[np.ndarray], attrs: QBinaryAttrs) -> np.ndarray:
    la, ra = _axes(arrays, attrs)
    lhs, rhs, ls, lz, rs, rz, os_, oz = (np.asarray(a) for a in arrays)
    a = lhs.astype(np.int64) - along(lz.astype(np.int64), la, lhs.ndim)
    b = rhs.astype(np.int64) - along(rz.astype(np.int64), ra, rhs.ndim)
    product = (a * b).astype(np.int32)
    scale = (np.asarray(ls, np.float32) * np.asarray(rs, np.float32)).astype(np.float32)
    # A per-channel product scale follows the operand that carries it.
    if np.asarray(ls).size > 1:
        axis = la + product.ndim - lhs.ndim
    else:
        axis = ra + product.ndim - rhs.ndim
    return requantize_np(product, scale, np.zeros((), np.int32), os_, oz, axis, "UPWARD",
                         lhs.dtype.name)


def _types(types: Sequence[TensorType], attrs: QBinaryAttrs) -> tuple[int, int]:
    lhs, rhs = types[0], types[1]
    return (normalize_axis(attrs.lhs_axis, lhs.ndim) if lhs.ndim else 0,
            normalize_axis(attrs.rhs_axis, rhs.ndim) if rhs.ndim else 0)


@canonical("qnn.add")
def _add_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = QBinaryAttrs.view(c.attrs)
    la, ra = _types(types, attrs)
    lhs, rhs, ls, lz, rs, rz, os_, oz = c.args
    out_scale = constant_value(os_, "the output scale", "qnn.add")
    zero = const(0, "int32")
    a = requantize_expr(lhs, types[0], constant_value(ls, "lhs scale", "qnn.add"),
                        along_expr(lz, types[3], la, types[0].ndim), out_scale, zero, la,
                        "UPWARD", "int32")
    b = requantize_expr(rhs, types[1], constant_value(rs, "rhs scale", "qnn.add"),
                        along_expr(rz, types[5], ra, types[1].ndim), out_scale, zero, ra,
                        "UPWARD", "int32")
    v = kop.add(a, b)
    if not is_zero(oz):
        v = kop.add(v, along_expr(oz, types[7], 0, 1))
    dtype = types[0].dtype
    if dtype == "int32":
        return v
    lo, hi = qrange(dtype)
    return kop.cast(kop.clip(v, a_min=float(lo), a_max=float(hi)), dtype=dtype)


@canonical("qnn.mul")
def _mul_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = QBinaryAttrs.view(c.attrs)
    la, ra = _types(types, attrs)
    lhs, rhs, ls, lz, rs, rz, os_, oz = c.args
    a = kop.cast(lhs, dtype="int32")
    if not is_zero(lz):
        a = kop.subtract(a, along_expr(lz, types[3], la, types[0].ndim))
    b = kop.cast(rhs, dtype="int32")
    if not is_zero(rz):
        b = kop.subtract(b, along_expr(rz, types[5], ra, types[1].ndim))
    product = kop.multiply(a, b)
    ls_v = constant_value(ls, "lhs scale", "qnn.mul")
    rs_v = constant_value(rs, "rhs scale", "qnn.mul")
    scale = (np.asarray(ls_v, np.float32) * np.asarray(rs_v, np.float32)).astype(np.float32)
    ndim = max(types[0].ndim, types[1].ndim)
    axis = la + ndim - types[0].ndim if np.asarray(ls_v).size > 1 else ra + ndim - types[1].ndim
    product_type = TensorType(broadcast_shape(types[0].shape, types[1].shape), "int32")
    return requantize_expr(product, product_type, scale, const(0, "int32"),
                           constant_value(os_, "the output scale", "qnn.mul"),
                           along_expr(oz, types[7], 0, 1), axis, "UPWARD", types[0].dtype)


_ATTRS = (
    Attr("lhs_axis", -1, kind="int", doc="the channel axis of lhs's per-channel scale"),
    Attr("rhs_axis", -1, kind="int", doc="the channel axis of rhs's per-channel scale"),
)

add = register(
    "qnn.add",
    inputs=INPUTS,
    attrs_type=QBinaryAttrs,
    attrs=_ATTRS,
    relation=_relation("qnn.add"),
    compute=_add,
    pattern=OpPattern.BROADCAST,
    doc="The sum of two quantized tensors, in the output's scale and zero point.",
    differentiable=False,
)

mul = register(
    "qnn.mul",
    inputs=INPUTS,
    attrs_type=QBinaryAttrs,
    attrs=_ATTRS,
    relation=_relation("qnn.mul"),
    compute=_mul,
    pattern=OpPattern.BROADCAST,
    doc="The product of two quantized tensors, in the output's scale and zero point.",
    differentiable=False,
)

__all__ = ["add", "mul"]
