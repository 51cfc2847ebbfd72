"""nn.conv2d_int8_tiled: an 8-bit conv2d whose constant weight is packed in AMX tiles.

Where the Target has AMX's 8-bit tile products (``amx-int8``), the alter-layout pass
(kiln/transform/alter_layout.py) turns ``nn.conv2d(x, W, out_dtype="int32")`` of a constant
8-bit OIHW weight (one channel group, NCHW data of at least 32 channels) into
``nn.conv2d_int8_tiled(x, Wt)``, which kiln/loops/int8_amx.py computes on matrix tiles.

``Wt`` is int32 of shape ``(MT, S, 16, 16)``: MT = ⌈channels / 16⌉ tiles of 16 output
channels, S = kh · kw · CB K steps (CB = ⌈input channels / 64⌉). Step ``s = (ky·kw + kx)·CB
+ cb`` of tile ``t`` is the A tile of that tap and block of 64 input channels: its word
``Wt[t, s, r, w]`` holds the 4 bytes ``W[16·t + r, 64·cb + 4·w + i, ky, kx]`` (i = 0..3,
lowest first; zero past the weight). ``pad_value`` is what the data is padded with, as for
``nn.conv2d_int8_packed`` (alter-layout folds a quantized input's zero-point pad into it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor
from kiln.loops.ir import Cast, Const
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import require_rank, shape_str, tensor_args
from kiln.op.nn.conv import Conv2DAttrs
from kiln.op.nn.int8_packed import EIGHT_BIT, _lane, _padded
from kiln.op.registry import Attr, OpPattern, register

ROWS, WORDS, BLOCK = 16, 16, 64  # a tile: 16 rows of 16 int32; 64 input channels a K step


def pack_tiled_conv_weight(w: np.ndarray) -> np.ndarray:
    """An OIHW 8-bit ``W`` as the tiles described in the module docstring."""
    o, c, kh, kw = w.shape
    mt, cb = -(-o // ROWS), -(-c // BLOCK)
    padded = np.zeros((mt * ROWS, cb * BLOCK, kh, kw), dtype=np.int64)
    padded[:o, :c] = w
    bytes_ = (padded & 255).astype(np.uint8)
    # (t, r, cb, w, i, ky, kx) -> (t, ky, kx, cb, r, w, i): the 4 bytes of a word last
    tiles = bytes_.reshape(mt, ROWS, cb, WORDS, 4, kh, kw).transpose(0, 5, 6, 2, 1, 3, 4)
    words = np.ascontiguousarray(tiles).view("<i4").astype(np.int32)
    return np.ascontiguousarray(words.reshape(mt, kh * kw * cb, ROWS, WORDS))


def unpack_tiled_conv_weight(wt: np.ndarray, channels: int, in_channels: int,
                             kernel: Sequence[int], dtype: str) -> np.ndarray:
    """The OIHW weight of ``dtype`` held in the tiles ``wt``."""
    mt, steps, _, _ = wt.shape
    kh, kw = kernel
    cb = steps // (kh * kw)
    raw = np.ascontiguousarray(wt).astype("<i4").view(np.uint8)  # (mt, S, 16, 64)
    tiles = raw.reshape(mt, kh, kw, cb, ROWS, WORDS, 4).transpose(0, 4, 3, 5, 6, 1, 2)
    w = tiles.reshape(mt * ROWS, cb * BLOCK, kh, kw)[:channels, :in_channels]
    return w.view(np.int8).astype(dtype) if dtype == "int8" else w.astype(dtype)


class Conv2DInt8TiledAttrs(Conv2DAttrs):
    __slots__ = ()
    weight_dtype: str
    pad_value: int


def _relation(arg_types: Sequence[Type], attrs: Conv2DInt8TiledAttrs) -> Type | None:
    from kiln.op.nn.conv import _conv2d_relation

    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    if data.dtype not in EIGHT_BIT or attrs.weight_dtype not in EIGHT_BIT:
        raise TypeCheckError(f"data ({data.dtype}) and weight_dtype ({attrs.weight_dtype}) "
                             "must be int8 or uint8")
    if weight.dtype != "int32":
        raise TypeCheckError(f"the tiled weight must be int32 tiles, not {weight.dtype}")
    if attrs.out_dtype != "int32":
        raise TypeCheckError(f"out_dtype must be int32, got {attrs.out_dtype!r}")
    if attrs.groups != 1:
        raise TypeCheckError(f"nn.conv2d_int8_tiled has one channel group, not {attrs.groups}")
    info = np.iinfo(data.dtype)
    if not info.min <= attrs.pad_value <= info.max:
        raise TypeCheckError(f"pad_value {attrs.pad_value} is not a {data.dtype} value")
    if attrs.channels is None or attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_int8_tiled needs its channels and kernel_size")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "tiled weight (tiles, steps, 16, 16)", 4)
    dims = [d for d in (*weight.shape, data.shape[1]) if isinstance(d, int)]
    if len(dims) < 5:
        return None
    mt, steps, rows, words, c = dims
    kh, kw = attrs.kernel_size
    if (mt, steps, rows, words) != (-(-attrs.channels // ROWS), kh * kw * -(-c // BLOCK),
                                    ROWS, WORDS):
        raise TypeCheckError(
            f"a tiled weight of shape {shape_str(weight.shape)} cannot hold {attrs.channels} "
            f"output channels of {c}×{kh}×{kw} taps in 16×16 tiles of 64 channels")
    oihw = TensorType((attrs.channels, c, kh, kw), attrs.weight_dtype)
    return _conv2d_relation([data, oihw], attrs)


def _compute(arrays: list[np.ndarray], attrs: Conv2DInt8TiledAttrs) -> np.ndarray:
    from kiln.op.nn.conv import _conv2d

    x, wt = np.asarray(arrays[0]), np.asarray(arrays[1])
    assert attrs.channels is not None and attrs.kernel_size is not None  # the relation's
    w = unpack_tiled_conv_weight(wt, attrs.channels, x.shape[1], attrs.kernel_size,
                                 attrs.weight_dtype)
    if attrs.pad_value:
        top, left, bottom, right = attrs.padding
        x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)),
                   constant_values=attrs.pad_value)
        attrs = attrs.with_(padding=(0, 0, 0, 0))
    return _conv2d([x, w], attrs)


def _lower(inputs: list, attrs: Conv2DInt8TiledAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_amx
    from kiln.loops.compute import compute
    from kiln.op.nn.conv import _conv2d_lower

    out = oplib.out_tensor_type(out_type)
    x, wt = inputs
    channels, kernel = attrs.channels, attrs.kernel_size
    assert channels is not None and kernel is not None  # the relation requires both
    if isinstance(wt, BufferTensor) and min(x.shape) > 0:
        t = int8_amx.conv2d_tiled(x, wt.buffer, attrs.strides, attrs.padding[:2],
                                  attrs.dilation, out.static_shape, kernel, attrs.weight_dtype,
                                  attrs.pad_value)
        if t is not None:
            return t
    # A plain convolution reading the tiles (a Target without AMX)
    if attrs.pad_value:
        top, left, bottom, right = attrs.padding
        x = _padded(x, (top, left, bottom, right), Const(attrs.pad_value, x.dtype))
        attrs = attrs.with_(padding=(0, 0, 0, 0))
    kh, kw = kernel
    c = x.shape[1]
    cb = -(-c // BLOCK)

    def element(o: LExpr, ch: LExpr, ky: LExpr, kx: LExpr) -> LExpr:
        step = (ky * kw + kx) * cb + ch // BLOCK
        word = wt(o // ROWS, step, o % ROWS, (ch % BLOCK) // 4)
        return Cast(attrs.weight_dtype, _lane(word, ch % 4, 4, attrs.weight_dtype))

    w = compute((channels, c, kh, kw), attrs.weight_dtype, element)
    return _conv2d_lower([x, w], attrs, out_type)


def _attrs() -> tuple[Attr, ...]:
    from kiln.op.nn.conv import conv2d

    return (*conv2d.attrs,
            Attr("weight_dtype", "int8", kind="dtype", doc="the tiled weight's int8 or uint8"),
            Attr("pad_value", 0, kind="int", doc="what the data is padded with (kiln's)"))


conv2d_int8_tiled = register(
    "nn.conv2d_int8_tiled",
    inputs=("data", "weight"),
    attrs_type=Conv2DInt8TiledAttrs,
    attrs=_attrs(),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="8-bit nn.conv2d (out_dtype int32, one group) with its OIHW weight packed in 16×16 "
        "int32 tiles for AMX (tiles, steps, 16, 16): see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_lower),
)
