"""nn.conv2d_int8_tiled: an 8-bit conv2d whose constant weight is packed in AMX tiles.

Where the Target has AMX's 8-bit tile products (``amx-int8``), the alter-layout pass
(kiln/transform/alter_layout.py) turns ``nn.conv2d(x, W, out_dtype="int32")`` of a constant
8-bit OIHW weight (one channel group, NCHW data) into ``nn.conv2d_int8_tiled(x, Wt)``, which
kiln/loops/int8_amx.py computes on matrix tiles.

``Wt`` is int32 of shape ``(MT, S, 16, 16)``: MT = ⌈channels / 16⌉ tiles of 16 output
channels by S K steps of 16 words, each word 4 bytes of the weight (lowest first; zero past
the weight). ``form`` says which 4 (kiln.loops.int8_amx.tile_steps gives S):

- ``"channels"``: step ``s = (ky·kw + kx)·CB + cb`` (CB = ⌈input channels / 64⌉) is one tap
  and a block of 64 input channels; word ``Wt[t, s, r, w]`` holds
  ``W[16·t + r, 64·cb + 4·w + i, ky, kx]`` for i = 0..3;
- ``"taps"``: word ``g = 16·s + w`` is ``(c·kh + ky)·NQ + q`` (NQ = ⌈kw / 4⌉) and holds
  ``W[16·t + r, c, ky, 4·q + i]``.

``pad_value`` is what the data is padded with, as for ``nn.conv2d_int8_packed`` (alter-layout
folds a quantized input's zero-point pad into it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor
from kiln.loops.int8_amx import FORMS, tile_steps
from kiln.loops.ir import INDEX, Binary, Cast, Const
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import as_array, check_dims_equal, require_rank, shape_str, tensor_args
from kiln.op.nn.conv import Conv2DAttrs
from kiln.op.nn.int8_packed import EIGHT_BIT, _lane, _padded, padded_conv_reference
from kiln.op.registry import Attr, OpPattern, register

ROWS, WORDS, BLOCK = 16, 16, 64  # a tile: 16 rows of 16 int32; 64 input channels a K step


def _words(w: np.ndarray, form: str) -> np.ndarray:
    """The K words of each output channel of an OIHW ``w``: (o, words, 4), in ``form``'s
    order, zero past the weight."""
    o, c, kh, kw = w.shape
    if form == "channels":
        cb = -(-c // BLOCK)
        padded = np.zeros((o, cb * BLOCK, kh, kw), dtype=np.int64)
        padded[:, :c] = w
        # (o, cb, w, i, ky, kx) -> (o, ky, kx, cb, w, i)
        return padded.reshape(o, cb, WORDS, 4, kh, kw).transpose(0, 4, 5, 1, 2, 3).reshape(
            o, -1, 4)
    nq = -(-kw // 4)
    padded = np.zeros((o, c, kh, nq * 4), dtype=np.int64)
    padded[..., :kw] = w
    return padded.reshape(o, c * kh * nq, 4)


def pack_tiled_conv_weight(w: np.ndarray, form: str = "channels") -> np.ndarray:
    """An OIHW 8-bit ``W`` as the tiles described in the module docstring."""
    o, c, kh, kw = w.shape
    mt, steps = -(-o // ROWS), tile_steps(form, c, (kh, kw))
    words = np.zeros((mt * ROWS, steps * WORDS, 4), dtype=np.int64)
    got = _words(w, form)
    words[:o, :got.shape[1]] = got
    bytes_ = (words & 255).astype(np.uint8).reshape(mt, ROWS, steps, WORDS, 4)
    tiles = np.ascontiguousarray(bytes_.transpose(0, 2, 1, 3, 4))  # (t, s, r, w, i)
    return tiles.view("<i4").astype(np.int32).reshape(mt, steps, ROWS, WORDS)


def unpack_tiled_conv_weight(wt: np.ndarray, channels: int, in_channels: int,
                             kernel: Sequence[int], dtype: str,
                             form: str = "channels") -> np.ndarray:
    """The OIHW weight of ``dtype`` held in the tiles ``wt``."""
    mt, steps, _, _ = wt.shape
    kh, kw = kernel
    raw = np.ascontiguousarray(wt).astype("<i4").view(np.uint8)
    words = raw.reshape(mt, steps, ROWS, WORDS, 4).transpose(0, 2, 1, 3, 4).reshape(
        mt * ROWS, steps * WORDS, 4)[:channels]
    if form == "channels":
        cb = -(-in_channels // BLOCK)
        w = words[:, :kh * kw * cb * WORDS].reshape(channels, kh, kw, cb, WORDS, 4).transpose(
            0, 3, 4, 5, 1, 2).reshape(channels, cb * BLOCK, kh, kw)[:, :in_channels]
    else:
        nq = -(-kw // 4)
        w = words[:, :in_channels * kh * nq].reshape(channels, in_channels, kh, nq * 4)[
            ..., :kw]
    return w.view(np.int8).astype(dtype) if dtype == "int8" else w.astype(dtype)


def _check_tiles(data: TensorType, weight: TensorType, weight_dtype: str) -> None:
    """What both tiled operators ask of their data and weight."""
    if data.dtype not in EIGHT_BIT or weight_dtype not in EIGHT_BIT:
        raise TypeCheckError(f"data ({data.dtype}) and weight_dtype ({weight_dtype}) "
                             "must be int8 or uint8")
    if weight.dtype != "int32":
        raise TypeCheckError(f"the tiled weight must be int32 tiles, not {weight.dtype}")


class Conv2DInt8TiledAttrs(Conv2DAttrs):
    __slots__ = ()
    weight_dtype: str
    pad_value: int
    form: str


def _relation(arg_types: Sequence[Type], attrs: Conv2DInt8TiledAttrs) -> Type | None:
    from kiln.op.nn.conv import _conv2d_relation

    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    _check_tiles(data, weight, attrs.weight_dtype)
    if attrs.out_dtype != "int32":
        raise TypeCheckError(f"out_dtype must be int32, got {attrs.out_dtype!r}")
    if attrs.groups != 1:
        raise TypeCheckError(f"nn.conv2d_int8_tiled has one channel group, not {attrs.groups}")
    info = np.iinfo(data.dtype)
    if not info.min <= attrs.pad_value <= info.max:
        raise TypeCheckError(f"pad_value {attrs.pad_value} is not a {data.dtype} value")
    if attrs.channels is None or attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_int8_tiled needs its channels and kernel_size")
    if attrs.form not in FORMS:
        raise TypeCheckError(f"form must be one of {', '.join(FORMS)}, not {attrs.form!r}")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "tiled weight (tiles, steps, 16, 16)", 4)
    dims = [d for d in (*weight.shape, data.shape[1]) if isinstance(d, int)]
    if len(dims) < 5:
        return None
    mt, steps, rows, words, c = dims
    kh, kw = attrs.kernel_size
    if (mt, steps, rows, words) != (-(-attrs.channels // ROWS),
                                    tile_steps(attrs.form, c, (kh, kw)), ROWS, WORDS):
        raise TypeCheckError(
            f"a tiled weight of shape {shape_str(weight.shape)} cannot hold {attrs.channels} "
            f"output channels of {c}×{kh}×{kw} taps in 16×16 tiles of form {attrs.form!r}")
    oihw = TensorType((attrs.channels, c, kh, kw), attrs.weight_dtype)
    return _conv2d_relation([data, oihw], attrs)


def _compute(arrays: list[np.ndarray], attrs: Conv2DInt8TiledAttrs) -> np.ndarray:
    x, wt = np.asarray(arrays[0]), np.asarray(arrays[1])
    assert attrs.channels is not None and attrs.kernel_size is not None  # the relation's
    w = unpack_tiled_conv_weight(wt, attrs.channels, x.shape[1], attrs.kernel_size,
                                 attrs.weight_dtype, attrs.form)
    return padded_conv_reference(x, w, attrs, attrs.pad_value)


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
                                  attrs.pad_value, attrs.form)
        if t is not None:
            return t
    # A plain convolution reading the tiles (a Target without AMX)
    if attrs.pad_value:
        top, left, bottom, right = attrs.padding
        x = _padded(x, (top, left, bottom, right), Const(attrs.pad_value, x.dtype))
        attrs = attrs.with_(padding=(0, 0, 0, 0))
    kh, kw = kernel
    c = x.shape[1]
    cb, nq = -(-c // BLOCK), -(-kw // 4)

    def element(o: LExpr, ch: LExpr, ky: LExpr, kx: LExpr) -> LExpr:
        if attrs.form == "channels":
            step, w, byte = (ky * kw + kx) * cb + ch // BLOCK, (ch % BLOCK) // 4, ch % 4
        else:
            g = (ch * kh + ky) * nq + kx // 4
            step, w, byte = g // WORDS, g % WORDS, kx % 4
        word = wt(o // ROWS, step, o % ROWS, w)
        return Cast(attrs.weight_dtype, _lane(word, byte, 4, attrs.weight_dtype))

    w = compute((channels, c, kh, kw), attrs.weight_dtype, element)
    return _conv2d_lower([x, w], attrs, out_type)


def _attrs() -> tuple[Attr, ...]:
    from kiln.op.nn.conv import conv2d

    return (*conv2d.attrs,
            Attr("weight_dtype", "int8", kind="dtype", doc="the tiled weight's int8 or uint8"),
            Attr("pad_value", 0, kind="int", doc="what the data is padded with (kiln's)"),
            Attr("form", "channels", kind="str",
                 doc="K words of 4 channels at a tap (channels) or 4 taps of a row (taps)"))


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


# --- nn.dense_int8_tiled ---------------------------------------------------------------------


def pack_tiled_dense_weight(w: np.ndarray) -> np.ndarray:
    """An 8-bit dense weight ``W`` (units, K) as AMX B tiles ``(NT, S, 16, 16)`` int32: word
    (r, c) of tile (t, s) holds the 4 bytes ``W[16·t + c, 64·s + 4·r + i]`` (zero past W)."""
    units, k = w.shape
    nt, steps = -(-units // WORDS), -(-k // BLOCK)
    padded = np.zeros((nt * WORDS, steps * BLOCK), dtype=np.int64)
    padded[:units, :k] = w
    bytes_ = (padded & 255).astype(np.uint8).reshape(nt, WORDS, steps, ROWS, 4)
    tiles = np.ascontiguousarray(bytes_.transpose(0, 2, 3, 1, 4))  # (t, s, r, c, i)
    return tiles.view("<i4").astype(np.int32).reshape(nt, steps, ROWS, WORDS)


def unpack_tiled_dense_weight(wt: np.ndarray, units: int, k: int, dtype: str) -> np.ndarray:
    """The (units, K) weight of ``dtype`` held in the tiles ``wt``."""
    nt, steps, _, _ = wt.shape
    raw = np.ascontiguousarray(wt).astype("<i4").view(np.uint8).reshape(nt, steps, ROWS,
                                                                          WORDS, 4)
    w = raw.transpose(0, 3, 1, 2, 4).reshape(nt * WORDS, steps * BLOCK)[:units, :k]
    return w.view(np.int8).astype(dtype) if dtype == "int8" else w.astype(dtype)


class DenseInt8TiledAttrs(Attrs):
    __slots__ = ()
    units: int
    k: int
    weight_dtype: str


def _dense_relation(arg_types: Sequence[Type], attrs: DenseInt8TiledAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    _check_tiles(data, weight, attrs.weight_dtype)
    require_rank(weight, "tiled weight (tiles, steps, 16, 16)", 4)
    if data.ndim < 1:
        raise TypeCheckError("data must have at least one dimension, but is a scalar")
    check_dims_equal(data.shape[-1], attrs.k,
                     f"data of shape {shape_str(data.shape)} has not k={attrs.k} inputs")
    want = (-(-attrs.units // WORDS), -(-attrs.k // BLOCK), ROWS, WORDS)
    if all(isinstance(d, int) for d in weight.shape) and tuple(weight.shape) != want:
        raise TypeCheckError(f"a tiled weight of shape {shape_str(weight.shape)} cannot hold "
                             f"{attrs.units} units of {attrs.k} inputs in 16×16 tiles")
    return TensorType((*data.shape[:-1], attrs.units), "int32")


def _dense_compute(arrays: list[np.ndarray], attrs: DenseInt8TiledAttrs) -> np.ndarray:
    x, wt = np.asarray(arrays[0]), np.asarray(arrays[1])
    w = unpack_tiled_dense_weight(wt, attrs.units, attrs.k, attrs.weight_dtype)
    return as_array(np.matmul(x.astype(np.int64), w.astype(np.int64).T), "int32")


def _dense_lower(inputs: list, attrs: DenseInt8TiledAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_amx
    from kiln.loops.compute import reduce

    out = oplib.out_tensor_type(out_type)
    x, wt = inputs
    if isinstance(wt, BufferTensor) and min(x.shape) > 0:
        t = int8_amx.dense_tiled(x, wt.buffer, attrs.units, out.static_shape,
                                 attrs.weight_dtype)
        if t is not None:
            return t

    def weight(j: LExpr, p: LExpr) -> LExpr:  # the tiles read as W (a Target without AMX)
        word = wt(j // WORDS, p // BLOCK, (p % BLOCK) // 4, j % WORDS)
        return _lane(word, p % 4, 4, attrs.weight_dtype)

    def body(o: tuple, r: tuple) -> LExpr:
        return Binary("mul", Cast(INDEX, x(*o[:-1], r[0])), weight(o[-1], r[0]))

    return reduce(out.static_shape, "int32", (attrs.k,), "add", body, Const(0, INDEX),
                  lambda v, o: Cast("int32", v), INDEX)


dense_int8_tiled = register(
    "nn.dense_int8_tiled",
    inputs=("data", "weight"),
    attrs_type=DenseInt8TiledAttrs,
    attrs=(
        Attr("units", kind="int", doc="output size (the tiles are padded)"),
        Attr("k", kind="int", doc="inputs per unit (the tiles pad K to 64)"),
        Attr("weight_dtype", "int8", kind="dtype", doc="the tiled weight's int8 or uint8"),
    ),
    relation=_dense_relation,
    compute=_dense_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ W.T in int32 with an 8-bit W packed in AMX B tiles: see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_dense_lower),
)
