"""qnn.conv2d: a convolution of 8-bit integers less their zero points, summed in int32.

Relay's signature: (data, kernel, input_zero_point, kernel_zero_point, input_scale,
kernel_scale) with nn.conv2d's attributes; the kernel's zero point and scale are scalars or
have one entry per output channel. Padding pads with the *input zero point* (the real value
0), as TVM's canonicalization does. kiln takes NCHW data and OIHW kernels.

The canonical form (TVM's, term by term) pads the data with its zero point, then

    conv(x, w)  -  zp_w[o] * windowsum(x)  -  zp_x * sum_{c,kh,kw} w[o]  +  zp_x zp_w[o] C kh kw

where ``conv(x, w)`` is an ``nn.conv2d`` of the raw 8-bit operands accumulating in int32 (the
integer conv kernels) and windowsum the sum of the data under each window (a convolution with a
kernel of ones, one output per group). Terms of a constant zero zero point are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from kiln import op as kop
from kiln.errors import TypeCheckError
from kiln.ir.expr import Call, Constant, Expr, const
from kiln.ir.ty import TensorType, Type
from kiln.op.common import tensor_args
from kiln.op.nn.conv import Conv2DAttrs
from kiln.op.qnn.common import (
    along_expr,
    canonical,
    check_param,
    is_zero,
    require_quantized,
    to_int8,
)
from kiln.op.registry import Attr, OpPattern, get, register

EIGHT_BIT = ("int8", "uint8")


def _schema() -> tuple[Attr, ...]:
    """nn.conv2d's attributes, with the accumulator int32 by default."""
    return tuple(dataclasses.replace(a, default="int32") if a.name == "out_dtype" else a
                 for a in get("nn.conv2d").attrs)


def _relation(arg_types: Sequence[Type], attrs: Conv2DAttrs) -> Type | None:
    args = tensor_args(arg_types[:2], ("data", "kernel"))
    if args is None:
        return None
    data, kernel = args
    require_quantized(data, "qnn.conv2d: data", EIGHT_BIT)
    require_quantized(kernel, "qnn.conv2d: kernel", EIGHT_BIT)
    if attrs.out_dtype != "int32":
        raise TypeCheckError(f"qnn.conv2d: out_dtype must be int32 (the accumulator), not "
                             f"{attrs.out_dtype}")
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or \
            attrs.out_layout not in ("", "NCHW"):
        raise TypeCheckError(f"qnn.conv2d: kiln takes NCHW data and OIHW kernels, not "
                             f"{attrs.data_layout} and {attrs.kernel_layout}")
    out = get("nn.conv2d").relation([data, kernel], attrs)
    check_param(arg_types[2], "input zero point", "int32", None, 0, allow_vector=False)
    check_param(arg_types[3], "kernel zero point", "int32", kernel, 0)
    check_param(arg_types[4], "input scale", "float32", None, 0, allow_vector=False)
    check_param(arg_types[5], "kernel scale", "float32", kernel, 0)
    return out


def _compute(arrays: list[np.ndarray], attrs: Conv2DAttrs) -> np.ndarray:
    zx = int(np.asarray(arrays[2]).reshape(()))
    x = np.asarray(arrays[0]).astype(np.int64) - zx
    w = np.asarray(arrays[1]).astype(np.int64)
    zw = np.asarray(arrays[3], np.int64).reshape(-1)
    w = w - zw.reshape(-1, 1, 1, 1) if zw.size > 1 else w - zw[0]
    top, left, bottom, right = attrs.padding
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))  # zero: the zero point
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), g = attrs.strides, attrs.dilation, attrs.groups
    oh = (h - (kh - 1) * dh - 1) // sh + 1
    ow = (wd - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    per = o // g
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                      j * dw: j * dw + (ow - 1) * sw + 1: sw]  # (n, c, oh, ow)
            for grp in range(g):
                xs = patch[:, grp * cg:(grp + 1) * cg]
                ws = w[grp * per:(grp + 1) * per, :, i, j]  # (per, cg)
                out[:, grp * per:(grp + 1) * per] += np.einsum("nchw,oc->nohw", xs, ws)
    return out.astype(np.int32)


@canonical("qnn.conv2d")
def _canonical(c: Call, types: Sequence[TensorType]) -> Expr:
    attrs = Conv2DAttrs.view(c.attrs)
    data, kernel = types[0], types[1]
    zx = along_expr(c.args[2], types[2], 0, 1)
    x = c.args[0]
    mixed = (data.dtype, kernel.dtype) == ("uint8", "int8")  # VNNI's own pair: kept
    if not mixed:
        x, zx = to_int8(x, data, zx)
    w, zw = to_int8(c.args[1], kernel, c.args[3])
    o, cg, kh, kw = kernel.static_shape
    top, left, bottom, right = attrs.padding
    padding = [0, 0, 0, 0]
    if is_zero(zx):  # zeros: the convolution's own padding (its kernel pads in place)
        padding = [top, left, bottom, right]
    elif top or left or bottom or right:
        x = kop.nn.pad(x, [[0, 0], [0, 0], [top, bottom], [left, right]],
                       kop.cast(zx, dtype="uint8" if mixed else "int8"))
    window = dict(strides=attrs.strides, dilation=attrs.dilation, groups=attrs.groups)
    y: Expr = kop.nn.conv2d(x, w, padding=padding, channels=attrs.channels,
                            kernel_size=attrs.kernel_size, out_dtype="int32", **window)
    zw_o = along_expr(zw, types[3], 1, 4) if types[3].ndim else zw  # (1, o, 1, 1) or scalar
    if not is_zero(zw):  # zp_w[o] * the sum of x under each window (of its group)
        # One channel of window sums; with groups, one per output channel (each sums its group).
        ones = Constant(np.ones((o if attrs.groups > 1 else 1, cg, kh, kw), np.int32))
        sums = kop.nn.conv2d(kop.cast(x, dtype="int32"), ones, padding=padding,
                             out_dtype="int32", **window)
        y = kop.subtract(y, kop.multiply(zw_o, sums))
    if not is_zero(zx):  # zp_x * the sum of each output channel's kernel
        wsum = kop.sum(kop.cast(w, dtype="int32"), axis=[1, 2, 3], keepdims=True)
        y = kop.subtract(y, kop.multiply(zx, kop.reshape(wsum, newshape=[1, o, 1, 1])))
        if not is_zero(zw):
            y = kop.add(y, kop.multiply(kop.multiply(zx, zw_o), const(cg * kh * kw, "int32")))
    return y


conv2d = register(
    "qnn.conv2d",
    inputs=("data", "kernel", "input_zero_point", "kernel_zero_point", "input_scale",
            "kernel_scale"),
    attrs_type=Conv2DAttrs,
    attrs=_schema(),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="2-D convolution of 8-bit integers less their zero points, summed in int32.",
    differentiable=False,
)

__all__ = ["conv2d"]
