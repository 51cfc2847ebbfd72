"""qnn.dense and qnn.batch_matmul: 8-bit operands, int32 sums, zero points subtracted.

    dense(x, w)[.., n] = sum_k (x[.., k] - zp_x) * (w[n, k] - zp_w[n])

The scales are carried for the caller (Relay's signature: the result is int32 in the scale
input_scale * kernel_scale, which a following requantize or dequantize uses). The canonical
form expands the product, as TVM's does, so the big term is an integer GEMM of the raw 8-bit
operands (``nn.dense(.., out_dtype="int32")``, the int8 kernels) and the rest are cheap sums:

    sum x*w  -  zp_w * sum_k x  -  zp_x * sum_k w  +  K * zp_x * zp_w

uint8 operands enter the GEMM as int8 (x - 128, with the zero point moved by 128: exact).
A term whose zero point is a constant 0 is left out (ONNX Runtime's weights are symmetric).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import op as kop
from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, const
from kiln.ir.ty import TensorType, Type
from kiln.op.common import check_dims_equal, require_rank, shape_str, tensor_args, unify_dim
from kiln.op.qnn.common import (
    along,
    along_expr,
    canonical,
    check_param,
    is_zero,
    require_quantized,
    to_int8,
)
from kiln.op.registry import Attr, OpPattern, register

EIGHT_BIT = ("int8", "uint8")


def _check_out(out_dtype: str, opname: str) -> str:
    if out_dtype not in ("", "int32"):
        raise TypeCheckError(f"{opname}: out_dtype must be int32 (the accumulator), not "
                             f"{out_dtype}")
    return "int32"


# --- qnn.dense --------------------------------------------------------------------------------


class QDenseAttrs(Attrs):
    __slots__ = ()
    units: int | None
    out_dtype: str


def _dense_relation(arg_types: Sequence[Type], attrs: QDenseAttrs) -> Type | None:
    args = tensor_args(arg_types[:2], ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    require_quantized(data, "qnn.dense: data", EIGHT_BIT)
    require_quantized(weight, "qnn.dense: weight", EIGHT_BIT)
    if data.ndim < 1:
        raise TypeCheckError("qnn.dense: data must have at least one dimension")
    require_rank(weight, "qnn.dense: weight (units, in)", 2)
    units, k = weight.shape
    check_dims_equal(data.shape[-1], k,
                     f"qnn.dense: data of shape {shape_str(data.shape)} and weight of shape "
                     f"{shape_str(weight.shape)} disagree on the reduction dimension")
    if attrs.units is not None:
        check_dims_equal(attrs.units, units, f"qnn.dense: units={attrs.units} but weight has "
                                             f"{units}")
        units = unify_dim(units, attrs.units)
    check_param(arg_types[2], "input zero point", "int32", None, 0, allow_vector=False)
    check_param(arg_types[3], "kernel zero point", "int32", weight, 0)
    check_param(arg_types[4], "input scale", "float32", None, 0, allow_vector=False)
    check_param(arg_types[5], "kernel scale", "float32", weight, 0)
    return TensorType((*data.shape[:-1], units), _check_out(attrs.out_dtype, "qnn.dense"))


def _dense(arrays: list[np.ndarray], attrs: QDenseAttrs) -> np.ndarray:
    x = np.asarray(arrays[0]).astype(np.int64) - np.asarray(arrays[2], np.int64).reshape(())
    w = np.asarray(arrays[1]).astype(np.int64) - along(np.asarray(arrays[3], np.int64), 0, 2)
    return np.matmul(x, w.T).astype(np.int32)


@canonical("qnn.dense")
def _dense_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    data, weight = types[0], types[1]
    x, w, zx, zw = c.args[0], c.args[1], c.args[2], c.args[3]
    zx = along_expr(zx, types[2], 0, 1)
    x, zx = to_int8(x, data, zx)
    w, zw = to_int8(w, weight, along_expr(zw, types[3], 0, 1))
    y: Expr = kop.nn.dense(x, w, out_dtype="int32")
    k = weight.shape[1]
    if not is_zero(zw):  # zp_w[n] * sum_k x[.., k]
        y = kop.subtract(y, kop.multiply(zw, kop.sum(kop.cast(x, dtype="int32"), axis=[-1],
                                                      keepdims=True)))
    if not is_zero(zx):  # zp_x * sum_k w[n, k]
        y = kop.subtract(y, kop.multiply(zx, kop.sum(kop.cast(w, dtype="int32"), axis=[1])))
        if not is_zero(zw):
            y = kop.add(y, kop.multiply(kop.multiply(zx, zw), const(k, "int32")))
    return y


dense = register(
    "qnn.dense",
    inputs=("data", "weight", "input_zero_point", "kernel_zero_point", "input_scale",
            "kernel_scale"),
    attrs_type=QDenseAttrs,
    attrs=(
        Attr("units", None, kind="int", optional=True, doc="the number of output units"),
        Attr("out_dtype", "int32", kind="dtype", doc="the accumulator dtype (int32)"),
    ),
    relation=_dense_relation,
    compute=_dense,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ weight.T of 8-bit integers less their zero points, summed in int32.",
    differentiable=False,
)


# --- qnn.batch_matmul -------------------------------------------------------------------------


class QBatchMatmulAttrs(Attrs):
    __slots__ = ()
    out_dtype: str
    transpose_a: bool
    transpose_b: bool


def _batch_matmul_relation(arg_types: Sequence[Type], attrs: QBatchMatmulAttrs) -> Type | None:
    args = tensor_args(arg_types[:2], ("x", "y"))
    if args is None:
        return None
    x, y = args
    require_quantized(x, "qnn.batch_matmul: x", EIGHT_BIT)
    require_quantized(y, "qnn.batch_matmul: y", EIGHT_BIT)
    require_rank(x, "qnn.batch_matmul: x", 3)
    require_rank(y, "qnn.batch_matmul: y", 3)
    b1, m, k1 = (x.shape[0], x.shape[2], x.shape[1]) if attrs.transpose_a else x.shape
    b2, k2, n = (y.shape[0], y.shape[2], y.shape[1]) if attrs.transpose_b else y.shape
    check_dims_equal(b1, b2, f"qnn.batch_matmul: x of shape {shape_str(x.shape)} and y of "
                             f"shape {shape_str(y.shape)} have different batch sizes")
    check_dims_equal(k1, k2, f"qnn.batch_matmul: x of shape {shape_str(x.shape)} and y of "
                             f"shape {shape_str(y.shape)} disagree on the reduction dimension")
    for i, what in ((2, "x zero point"), (3, "y zero point")):
        check_param(arg_types[i], what, "int32", None, 0, allow_vector=False)
    for i, what in ((4, "x scale"), (5, "y scale")):
        check_param(arg_types[i], what, "float32", None, 0, allow_vector=False)
    return TensorType((unify_dim(b1, b2), m, n), _check_out(attrs.out_dtype, "qnn.batch_matmul"))


def _batch_matmul(arrays: list[np.ndarray], attrs: QBatchMatmulAttrs) -> np.ndarray:
    x = np.asarray(arrays[0]).astype(np.int64) - np.asarray(arrays[2], np.int64).reshape(())
    y = np.asarray(arrays[1]).astype(np.int64) - np.asarray(arrays[3], np.int64).reshape(())
    if attrs.transpose_a:
        x = x.transpose(0, 2, 1)
    if attrs.transpose_b:
        y = y.transpose(0, 2, 1)
    return np.matmul(x, y).astype(np.int32)


@canonical("qnn.batch_matmul")
def _batch_matmul_canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = QBatchMatmulAttrs.view(c.attrs)
    tx, ty = types[0], types[1]
    x, zx = to_int8(c.args[0], tx, along_expr(c.args[2], types[2], 0, 1))
    y, zy = to_int8(c.args[1], ty, along_expr(c.args[3], types[3], 0, 1))
    out: Expr = kop.nn.batch_matmul(x, y, out_dtype="int32", transpose_a=attrs.transpose_a,
                                    transpose_b=attrs.transpose_b)
    k = tx.shape[1] if attrs.transpose_a else tx.shape[2]
    x_k, y_k = (1 if attrs.transpose_a else 2), (2 if attrs.transpose_b else 1)
    if not is_zero(zy):  # zp_y * sum_k x: (b, m, 1)
        sx = kop.sum(kop.cast(x, dtype="int32"), axis=[x_k], keepdims=True)
        if attrs.transpose_a:
            sx = kop.transpose(sx, axes=[0, 2, 1])
        out = kop.subtract(out, kop.multiply(zy, sx))
    if not is_zero(zx):  # zp_x * sum_k y: (b, 1, n)
        sy = kop.sum(kop.cast(y, dtype="int32"), axis=[y_k], keepdims=True)
        if attrs.transpose_b:
            sy = kop.transpose(sy, axes=[0, 2, 1])
        out = kop.subtract(out, kop.multiply(zx, sy))
        if not is_zero(zy):
            out = kop.add(out, kop.multiply(kop.multiply(zx, zy), const(k, "int32")))
    return out


batch_matmul = register(
    "qnn.batch_matmul",
    inputs=("x", "y", "x_zero_point", "y_zero_point", "x_scale", "y_scale"),
    attrs_type=QBatchMatmulAttrs,
    attrs=(
        Attr("out_dtype", "int32", kind="dtype", doc="the accumulator dtype (int32)"),
        Attr("transpose_a", False, kind="bool", doc="x is (batch, k, m)"),
        Attr("transpose_b", True, kind="bool", doc="y is (batch, n, k), Relay's default"),
    ),
    relation=_batch_matmul_relation,
    compute=_batch_matmul,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Batched x @ y of 8-bit integers less their zero points, summed in int32.",
    differentiable=False,
)

__all__ = ["batch_matmul", "dense"]
