"""nn.dense_int8_packed: a constant 8-bit dense weight packed ahead of time for the int8 GEMM.

The int8 GEMM (kiln/loops/int8_gemm.py) packs the weight of an 8-bit ``nn.dense`` into
int32 panels on every call. When the weight is a constant, the alter-layout pass
(kiln/transform/alter_layout.py) does it once at compile time: ``nn.dense(x, W,
out_dtype="int32")`` becomes ``nn.dense_int8_packed(x, Wp)`` and the kernel reads the panels
straight from the constant, column sums included.

``Wp`` is int32 of shape ``(NT, KG + 1, NR)``: for column tile t, lane group p < KG and
column j, ``Wp[t, p, j]`` packs ``W[t·NR + j, g·p + q]`` for q < g, lowest first — g = 4
bytes (the VNNI forms) or g = 2 int16 (the others; ``group``) — zero where the column or
the K index is past the weight; ``Wp[t, KG, j]`` is the column's sum Σₚ W[t·NR + j, p] (for
int8 × int8 on VNNI, whose epilogue subtracts 128 times it).

``nn.conv2d_int8_packed(x, Wp)`` does the same for an 8-bit ``nn.conv2d`` (NCHW, OIHW,
``out_dtype="int32"``): ``Wp`` is int32 of shape ``(groups, MT, KQ + 1, MR)``, the weight
as the A operand of the convolution's int8 GEMM (kiln/loops/int8_conv.py). Input channels
are taken ``g`` (``group``) at a time at one kernel tap: lane group ``p = (c·kh + ky)·kw +
kx`` (``c`` < KQ / (kh·kw) = ⌈channels of a group / g⌉) of row ``i`` of M tile ``t`` packs
``W[t·MR + i, g·c + q, ky, kx]`` for q < g, zero past the weight; ``Wp[., t, KQ, i]`` is the
row's sum over all its taps (the correction for an input shifted by +128). Its
``pad_value`` (a kiln attribute; 0 by default, as for nn.conv2d) is what the data is padded
with: alter-layout folds an ``nn.pad`` of a constant (a quantized input's zero point) into
the convolution, whose kernel then pads as it copies its input, for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, reduce
from kiln.loops.ir import INDEX, Binary, Cast, Const, Select
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import as_array, check_dims_equal, require_rank, shape_str, tensor_args
from kiln.op.nn.conv import Conv2DAttrs
from kiln.op.registry import Attr, OpPattern, register

EIGHT_BIT = ("int8", "uint8")


def pack_int8_weight(w: np.ndarray, nr: int, group: int) -> np.ndarray:
    """``W`` (units, K) of int8 or uint8 as the panels described in the module docstring."""
    units, k = w.shape
    tiles, kg = -(-units // nr), -(-k // group)
    lane = np.int8 if group == 4 else np.int16  # the bits each value takes in a lane
    padded = np.zeros((tiles * nr, kg * group), dtype=np.int64)
    padded[:units, :k] = w
    values = padded.astype(lane) if group == 2 else (padded & 255).astype(np.uint8)
    words = np.ascontiguousarray(values).view("<i4").reshape(tiles * nr, kg)
    sums = padded.sum(axis=1).astype(np.int32).reshape(tiles * nr, 1)
    rows = np.concatenate([words.astype(np.int32), sums], axis=1)  # (tiles·nr, kg + 1)
    return np.ascontiguousarray(rows.reshape(tiles, nr, kg + 1).transpose(0, 2, 1))


def unpack_int8_weight(wp: np.ndarray, units: int, k: int, dtype: str, group: int
                       ) -> np.ndarray:
    """The (units, K) weight of ``dtype`` held in panels ``wp``."""
    tiles, kp, nr = wp.shape
    words = np.ascontiguousarray(wp[:, :kp - 1, :].transpose(0, 2, 1)).astype("<i4")
    lane = np.int8 if group == 4 else np.int16
    values = words.view(lane).reshape(tiles * nr, (kp - 1) * group)
    return values[:units, :k].astype(dtype)


def _lane(word: LExpr, q: LExpr, group: int, dtype: str) -> LExpr:
    """Value ``q`` of a packed int32 lane (int64): its bits (8 or 16, ``group`` values a
    lane) from 8q (16q), sign-extended unless ``dtype`` is uint8."""
    bits = 32 // group
    scale: LExpr = Const(2 ** (bits * (group - 1)), INDEX)
    for s in reversed(range(group - 1)):
        scale = Select(Binary("eq", q, Const(s, INDEX)), Const(2 ** (bits * s), INDEX), scale)
    v = (Cast(INDEX, word) // scale) % (2 ** bits)
    if dtype != "uint8":
        v = Select(Binary("ge", v, Const(2 ** (bits - 1), INDEX)), v - 2 ** bits, v)
    return v


def _check_packed(data: TensorType, weight: TensorType, weight_dtype: str, group: int) -> None:
    """The checks every packed 8-bit operator makes of its data, panels and attributes."""
    if data.dtype not in EIGHT_BIT or weight_dtype not in EIGHT_BIT:
        raise TypeCheckError(f"data ({data.dtype}) and weight_dtype ({weight_dtype}) "
                             "must be int8 or uint8")
    if weight.dtype != "int32":
        raise TypeCheckError(f"the packed weight must be int32 panels, not {weight.dtype}")
    if group not in (2, 4):
        raise TypeCheckError(f"group must be 2 or 4, got {group}")


class DenseInt8PackedAttrs(Attrs):
    __slots__ = ()
    units: int
    k: int
    weight_dtype: str
    group: int


def _relation(arg_types: Sequence[Type], attrs: DenseInt8PackedAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    _check_packed(data, weight, attrs.weight_dtype, attrs.group)
    require_rank(weight, "packed weight (tiles, groups + 1, lanes)", 3)
    if data.ndim < 1:
        raise TypeCheckError("data must have at least one dimension, but is a scalar")
    check_dims_equal(data.shape[-1], attrs.k,
                     f"data of shape {shape_str(data.shape)} has not k={attrs.k} inputs")
    tiles, kp, nr = weight.shape
    if isinstance(tiles, int) and isinstance(kp, int) and isinstance(nr, int):
        if kp != -(-attrs.k // attrs.group) + 1 or not (tiles - 1) * nr < attrs.units \
                <= tiles * nr:
            raise TypeCheckError(
                f"packed weight of shape {shape_str(weight.shape)} cannot hold {attrs.units} "
                f"units of {attrs.k} inputs in groups of {attrs.group}")
    return TensorType((*data.shape[:-1], attrs.units), "int32")


def _compute(arrays: list[np.ndarray], attrs: DenseInt8PackedAttrs) -> np.ndarray:
    x, wp = np.asarray(arrays[0]), np.asarray(arrays[1])
    w = unpack_int8_weight(wp, attrs.units, attrs.k, attrs.weight_dtype, attrs.group)
    return as_array(np.matmul(x.astype(np.int64), w.astype(np.int64).T), "int32")


def _lower(inputs: list, attrs: DenseInt8PackedAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_kernels

    out = oplib.out_tensor_type(out_type)
    x, wp = inputs
    if isinstance(wp, BufferTensor) and min(x.shape) > 0:
        t = int8_kernels.dense_prepacked(x, wp.buffer, attrs.units, out.static_shape,
                                         attrs.weight_dtype, attrs.group)
        if t is not None:
            return t
    # A plain reduction reading the panels (a layout this build would not have chosen)
    nr, group = wp.shape[2], attrs.group

    def weight(j: LExpr, p: LExpr) -> LExpr:
        return _lane(wp(j // nr, p // group, j % nr), p % group, group, attrs.weight_dtype)

    def body(o: tuple, r: tuple) -> LExpr:
        return Binary("mul", Cast(INDEX, x(*o[:-1], r[0])), weight(o[-1], r[0]))

    return reduce(out.static_shape, "int32", (attrs.k,), "add", body, Const(0, INDEX),
                  lambda v, o: Cast("int32", v), INDEX)


dense_int8_packed = register(
    "nn.dense_int8_packed",
    inputs=("data", "weight"),
    attrs_type=DenseInt8PackedAttrs,
    attrs=(
        Attr("units", kind="int", doc="output size (the panels are padded)"),
        Attr("k", kind="int", doc="inputs per unit (the panels pad K to whole groups)"),
        Attr("weight_dtype", "int8", kind="dtype", doc="the packed weight's int8 or uint8"),
        Attr("group", 4, kind="int", doc="values per int32 lane: 4 bytes or 2 int16"),
    ),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ W.T in int32 with an 8-bit W packed in int8 GEMM panels: see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_lower),
)


# --- nn.conv2d_int8_packed ---------------------------------------------------------------------


def pack_int8_conv_weight(w: np.ndarray, groups: int, mr: int, group: int) -> np.ndarray:
    """An OIHW 8-bit ``W`` as the A panels of the module docstring."""
    o, cg, kh, kw = w.shape
    og, cq = o // groups, -(-cg // group)
    tiles = -(-og // mr)
    padded = np.zeros((groups, tiles * mr, cq * group, kh, kw), dtype=np.int64)
    padded[:, :og, :cg] = w.reshape(groups, og, cg, kh, kw)
    lane = np.int16 if group == 2 else np.uint8
    values = (padded & 255).astype(lane) if group == 4 else padded.astype(lane)
    # (groups, rows, cq, g, kh, kw) -> (groups, rows, cq, kh, kw, g): a lane's values last
    values = values.reshape(groups, tiles * mr, cq, group, kh, kw).transpose(0, 1, 2, 4, 5, 3)
    words = np.ascontiguousarray(values).view("<i4").reshape(groups, tiles * mr, cq * kh * kw)
    sums = padded.sum(axis=(2, 3, 4)).astype(np.int32)[..., None]
    rows = np.concatenate([words.astype(np.int32), sums], axis=2)  # (groups, rows, KQ + 1)
    return np.ascontiguousarray(rows.reshape(groups, tiles, mr, -1).transpose(0, 1, 3, 2))


def unpack_int8_conv_weight(wp: np.ndarray, channels: int, in_per_group: int,
                            kernel: Sequence[int], dtype: str, group: int) -> np.ndarray:
    """The OIHW weight of ``dtype`` held in the panels ``wp``."""
    groups, tiles, kq1, mr = wp.shape
    kh, kw = kernel
    cq = (kq1 - 1) // (kh * kw)
    words = np.ascontiguousarray(wp[:, :, :kq1 - 1, :].transpose(0, 1, 3, 2)).astype("<i4")
    lane = np.int8 if group == 4 else np.int16
    values = words.view(lane).reshape(groups, tiles * mr, cq, kh, kw, group)
    values = values.transpose(0, 1, 2, 5, 3, 4).reshape(groups, tiles * mr, cq * group, kh, kw)
    og = channels // groups
    w = values[:, :og, :in_per_group].reshape(channels, in_per_group, kh, kw)
    return w.astype(np.int64).astype(dtype) if dtype != "uint8" else \
        (w.astype(np.int64) & 255).astype(dtype)


class Conv2DInt8PackedAttrs(Conv2DAttrs):
    __slots__ = ()
    weight_dtype: str
    group: int
    pad_value: int


def _conv_relation(arg_types: Sequence[Type], attrs: Conv2DInt8PackedAttrs) -> Type | None:
    from kiln.op.nn.conv import _conv2d_relation

    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    _check_packed(data, weight, attrs.weight_dtype, attrs.group)
    if attrs.out_dtype != "int32":
        raise TypeCheckError(f"out_dtype must be int32, got {attrs.out_dtype!r}")
    info = np.iinfo(data.dtype)
    if not info.min <= attrs.pad_value <= info.max:
        raise TypeCheckError(f"pad_value {attrs.pad_value} is not a {data.dtype} value")
    if attrs.channels is None or attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_int8_packed needs its channels and kernel_size")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "packed weight (groups, tiles, taps + 1, lanes)", 4)
    channels, (kh, kw) = attrs.channels, attrs.kernel_size
    dims = [d for d in (*weight.shape, data.shape[1]) if isinstance(d, int)]
    if len(dims) < 5:
        return None
    groups, tiles, kq1, mr, c = dims
    if groups != attrs.groups or c % groups or channels % groups:
        raise TypeCheckError(f"a packed weight of shape {shape_str(weight.shape)} does not "
                             f"fit groups={attrs.groups} over {c} channels")
    og, cg = channels // groups, c // groups
    if not (tiles - 1) * mr < og <= tiles * mr or kq1 != -(-cg // attrs.group) * kh * kw + 1:
        raise TypeCheckError(
            f"a packed weight of shape {shape_str(weight.shape)} cannot hold {channels} output "
            f"channels of {cg}×{kh}×{kw} taps in lanes of {attrs.group}")
    oihw = TensorType((channels, cg, kh, kw), attrs.weight_dtype)
    return _conv2d_relation([data, oihw], attrs)


def _conv_compute(arrays: list[np.ndarray], attrs: Conv2DInt8PackedAttrs) -> np.ndarray:
    x, wp = np.asarray(arrays[0]), np.asarray(arrays[1])
    channels, kernel = attrs.channels, attrs.kernel_size
    assert channels is not None and kernel is not None  # the relation requires both
    w = unpack_int8_conv_weight(wp, channels, x.shape[1] // attrs.groups, kernel,
                                attrs.weight_dtype, attrs.group)
    return padded_conv_reference(x, w, attrs, attrs.pad_value)


def padded_conv_reference(x: np.ndarray, w: np.ndarray, attrs: Conv2DAttrs,
                          pad_value: int) -> np.ndarray:
    """conv2d's reference for data padded with ``pad_value`` (a packed 8-bit convolution's
    attribute) rather than zero."""
    from kiln.op.nn.conv import _conv2d

    if pad_value:
        top, left, bottom, right = attrs.padding
        x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)),
                   constant_values=pad_value)
        attrs = attrs.with_(padding=(0, 0, 0, 0))
    return _conv2d([x, w], attrs)


def _conv_lower(inputs: list, attrs: Conv2DInt8PackedAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_conv
    from kiln.loops.compute import compute
    from kiln.op.nn.conv import _conv2d_lower

    out = oplib.out_tensor_type(out_type)
    x, wp = inputs
    channels, kernel = attrs.channels, attrs.kernel_size
    assert channels is not None and kernel is not None  # the relation requires both
    if isinstance(wp, BufferTensor) and min(x.shape) > 0:
        t = int8_conv.conv2d_prepacked(x, wp.buffer, attrs.strides, attrs.padding[:2],
                                       attrs.dilation, out.static_shape, kernel,
                                       attrs.weight_dtype, attrs.group, attrs.pad_value)
        if t is not None:
            return t
    if attrs.pad_value:  # the padding made explicit for the plain convolution below
        top, left, bottom, right = attrs.padding
        x = _padded(x, (top, left, bottom, right), Const(attrs.pad_value, x.dtype))
        attrs = attrs.with_(padding=(0, 0, 0, 0))
    groups, _, _, mr = wp.shape
    kh, kw = kernel
    cg, og, g = x.shape[1] // groups, channels // groups, attrs.group

    def element(o: LExpr, c: LExpr, ky: LExpr, kx: LExpr) -> LExpr:
        # the OIHW weight read out of its panels
        r, p = o % og, ((c // g) * kh + ky) * kw + kx
        v = _lane(wp(o // og, r // mr, p, r % mr), c % g, g, attrs.weight_dtype)
        return Cast(attrs.weight_dtype, v)

    w = compute((channels, cg, kh, kw), attrs.weight_dtype, element)
    return _conv2d_lower([x, w], attrs, out_type)


def _padded(x: Tensor, pads: tuple[int, int, int, int], value: LExpr) -> Tensor:
    """NCHW ``x`` padded by (top, left, bottom, right) with ``value``."""
    from kiln.loops.compute import compute

    top, left, bottom, right = pads
    n, c, h, w = x.shape
    spans = [None, None, (-top, h - 1 + bottom), (-left, w - 1 + right)]
    return compute((n, c, h + top + bottom, w + left + right), x.dtype,
                   lambda i, ch, y, xx: oplib.guarded_read(x, [i, ch, y - top, xx - left],
                                                           spans, value))


def _conv_attrs() -> tuple[Attr, ...]:
    from kiln.op.nn.conv import conv2d

    return (*conv2d.attrs,
            Attr("weight_dtype", "int8", kind="dtype", doc="the packed weight's int8 or uint8"),
            Attr("group", 4, kind="int", doc="values per int32 lane: 4 bytes or 2 int16"),
            Attr("pad_value", 0, kind="int", doc="what the data is padded with (kiln's)"))


conv2d_int8_packed = register(
    "nn.conv2d_int8_packed",
    inputs=("data", "weight"),
    attrs_type=Conv2DInt8PackedAttrs,
    attrs=_conv_attrs(),
    relation=_conv_relation,
    compute=_conv_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="8-bit nn.conv2d (out_dtype int32) with its OIHW weight packed in the int8 GEMM's "
        "panels (groups, tiles, taps + 1, lanes): see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_conv_lower),
)
