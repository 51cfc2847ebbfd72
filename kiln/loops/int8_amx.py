"""An 8-bit convolution on AMX matrix tiles (`TileProduct`), for Targets with ``amx-int8``.

nn.conv2d_int8_tiled's fast path (kiln/op/nn/int8_tiled.py; alter-layout makes the call where
the Target has AMX). A K step of the product is 16 int32 words of 4 bytes: its A tile is 16
output channels × those 64 K values, from the weight packed at compile time as 16×16-int32
tiles; its B tile is 16 rows (the step's words) of 16 consecutive output pixels (VNNI's
layout, K/4 × N). Each `TileProduct` keeps 2×2 accumulators (32 output channels × 32 pixels;
2×1 for an odd last tile of channels) in the tile registers over all the K steps, then
stores them to a buffer from which the output pixels are copied out through the lowering's
``write`` (the fused epilogue). The instruction is chosen from the dtypes (``tdpbssd``,
``tdpbsud``, ``tdpbusd``, ``tdpbuud``), so nothing is shifted. Two forms of K:

- **"channels"** (at least `MIN_CHANNELS` input channels): a word is 4 input channels at
  one tap, a step one tap and 64 channels. The input is laid out as the VNNI convolution
  lays it out (kiln/loops/int8_conv.py): zero-padded phase planes (`Planes`) holding 4
  channels per int32, in which every tap is a shift, so a B tile is read in place: its 16
  rows are 16 channel groups, a plane apart, of 16 pixels at the planes' width.
- **"taps"** (fewer channels: a network's stem, 3 channels by 7×7): a word is 4 neighbouring
  taps of one kernel row and channel (kx = 4q .. 4q + 3), which are 4 consecutive bytes of
  the padded input — one unaligned load. The words of every (channel, ky, q) for every
  output pixel are written once per call as rows of N (an im2col of words, N = the output
  pixels exactly), and a B tile is 16 of those rows.

Padding is exact: K words past the last (channels to whole blocks of 64, taps to whole
words, words to whole steps) meet zero weights, and output pixels past the last (to whole
pairs of 16-pixel tiles) are computed and never copied out. In the "channels" form the tap
offsets come from a table made once per call, taken modulo a power of two above the largest
(a no-op) so the verifier bounds every tile; the planes are allocated, not filled, out to
that reach.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.loops import int8_gemm as q
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.conv_kernels import MAX_PHASES, PLANES_PARALLEL_MIN, Planes
from kiln.loops.int8_conv import padding_word
from kiln.loops.ir import (
    INDEX,
    TILE_ROWS,
    TILE_WORDS,
    Allocate,
    Binary,
    Const,
    Expr,
    For,
    IfThenElse,
    Load,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Var,
)
from kiln.loops.ir import Buffer as LBuffer
from kiln.loops.schedule import lowering_target, worth_parallel
from kiln.target import Target

FEATURES = ("amx-tile", "amx-int8")
BLOCK_CHANNELS = 4 * TILE_ROWS  # input channels per K step: 16 groups of 4
MIN_CHANNELS = 32  # fewer: padding to 64 would be most of the work (the VNNI kernel instead)


def usable(target: Target | None = None) -> bool:
    """Whether ``target`` (default: the lowering's) has AMX's 8-bit tile products."""
    t = lowering_target(target)
    return all(t.has(f) for f in FEATURES)


FORMS = ("channels", "taps")


def tile_steps(form: str, channels: int, kernel: Sequence[int]) -> int:
    """K steps of 16 words (64 K values) of a convolution in ``form`` (module docstring):
    "channels", one tap and 64 input channels each; "taps", 16 words of 4 taps along a
    kernel row of one channel, the K words ordered (channel, ky, kx // 4)."""
    kh, kw = int(kernel[0]), int(kernel[1])
    if form == "channels":
        return kh * kw * -(-channels // BLOCK_CHANNELS)
    return -(-channels * kh * -(-kw // 4) // TILE_ROWS)


@dataclass(frozen=True)
class TilePlan:
    """How `conv2d_tiled` runs a convolution: its ``form`` (module docstring), the planes
    of the "channels" form (channel groups padded to whole blocks of 16), the K steps, the
    16-channel tiles of the output, the 16-pixel tiles of the product's N (an even number),
    and the parallel loop ("n" over pairs of pixel tiles, "m" over pairs of channel tiles,
    or None)."""

    form: str
    planes: Planes | None
    steps: int
    mtiles: int
    ntiles: int
    parallel: str | None


def plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int,
         out_shape: Sequence[int], target: Target | None = None) -> TilePlan | None:
    """The plan for these shapes (``padding``: top, left), or None where the kernel does not
    apply: no AMX, channel groups, more stride phases than `MAX_PHASES` ("channels" form,
    at least `MIN_CHANNELS` input channels) or a dilated kernel row ("taps" form, fewer)."""
    t = lowering_target(target)
    oc, c, kh, kw = (int(d) for d in w_shape)
    if not usable(t) or groups != 1 or min(*x_shape, *w_shape, *out_shape) <= 0:
        return None
    oh, ow = int(out_shape[2]), int(out_shape[3])
    geo: Planes | None = None
    if c >= MIN_CHANNELS:
        geo = Planes(-(-c // BLOCK_CHANNELS) * TILE_ROWS, int(x_shape[2]), int(x_shape[3]),
                     (kh, kw), (int(strides[0]), int(strides[1])),
                     (int(dilation[0]), int(dilation[1])), (int(padding[0]), int(padding[1])),
                     (oh, ow))
        if geo.phases > MAX_PHASES:
            return None
        form, columns = "channels", geo.columns
    elif int(dilation[1]) == 1:
        form, columns = "taps", oh * ow
    else:
        return None
    mtiles = -(-oc // TILE_ROWS)
    ntiles = -(-columns // TILE_WORDS)
    ntiles += ntiles % 2
    parallel = None
    if t.cores > 1 and worth_parallel(oc * columns * c * kh * kw // 16, t.cores):
        parallel = "n" if ntiles // 2 >= -(-mtiles // 2) else "m"
    return TilePlan(form, geo, tile_steps(form, c, (kh, kw)), mtiles, ntiles, parallel)


def _tap(geo: Planes, group: int, ky: int, kx: int) -> int:
    offset = geo.tap(Const(group, INDEX), Const(ky, INDEX), Const(kx, INDEX))
    assert isinstance(offset, Const)  # constants fold as the formula is built
    return int(offset.value)


@dataclass(frozen=True)
class _Source:
    """Where a form's B tiles come from: ``setup`` once per call (within ``owned``),
    ``fill(img)`` once per image (within ``per_image``), ``tile(k, t)`` the first word of
    pixel tile ``t`` at K step ``k`` (rows ``stride`` apart), and ``pitch``: how far apart
    two output rows' pixels are in the product's N."""

    owned: tuple[LBuffer, ...]
    setup: Stmt | None
    per_image: tuple[LBuffer, ...]
    fill: Callable[[Expr], Stmt]
    tile: Callable[[Expr, Expr], Load]
    stride: int
    pitch: int


def _channel_planes(x: Tensor, chosen: TilePlan, kernel: tuple[int, int], npad: int,
                    pad_value: int, tgt: Target) -> _Source:
    """The "channels" form: the VNNI kernel's phase planes, 4 channels a word, read in
    place; a K step's 16 rows are 16 channel groups at one tap, a plane apart."""
    geo = chosen.planes
    assert geo is not None  # the "channels" form has planes
    kh, kw = kernel
    c = x.shape[1]
    cblocks = geo.channels // TILE_ROWS
    # K step s = (ky·kw + kx)·cblocks + cb: the tap of channel group 16·cb at (ky, kx)
    starts = [_tap(geo, TILE_ROWS * cb, ky, kx)
              for ky in range(kh) for kx in range(kw) for cb in range(cblocks)]
    span = 1 << max(max(starts), 1).bit_length()
    reach = (TILE_ROWS - 1) * geo.plane + npad  # a B tile's pixels past its first element
    used = geo.size(npad)
    planes = LBuffer("planes", (max(used, span + reach),), "int32", "local")
    taps = LBuffer("taps", (len(starts),), INDEX, "local")

    def quad(img: Expr, cc: Expr, y: Expr, xx: Expr) -> Expr:
        # channels 4·cc .. 4·cc + 3 of a pixel in one int32 (past the last: the last again,
        # which the weight's zero bytes multiply away)
        vals = [q.lane_byte(x(img, Binary("min", cc * 4 + k, Const(c - 1, INDEX)), y, xx),
                            False) for k in range(4)]
        return q.pack_lanes(vals, 8)

    def tile(k: Expr, t: Expr) -> Load:
        off = Binary("floormod", Load(taps, (k,)), Const(span, INDEX))
        return Load(planes, (off + t * TILE_WORDS,))

    table = Seq(tuple(Store(taps, (Const(i, INDEX),), Const(v, INDEX))
                      for i, v in enumerate(starts)))
    return _Source((taps,), table, (planes,), lambda img: geo.fill(
        quad, img, planes, tgt, used=used, pad=padding_word(pad_value, 4, False)),
        tile, geo.plane, geo.cols)


def _tap_rows(x: Tensor, chosen: TilePlan, kernel: tuple[int, int], strides: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], out: tuple[int, int],
              npad: int, pad_value: int) -> _Source:
    """The "taps" form: a K word is 4 neighbouring taps of one kernel row and channel, so it
    is 4 consecutive bytes of the padded input (one unaligned load); the words of every
    (channel, ky, kx // 4) for every output pixel are written as rows of N (an im2col of
    words), a K step's 16 rows one row of N apart."""
    kh, kw = kernel
    (sh, sw), dh = (int(strides[0]), int(strides[1])), int(dilation[0])
    top, left = int(padding[0]), int(padding[1])
    oh, ow = out
    c = x.shape[1]
    nq = -(-kw // 4)
    hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + 4 * nq
    image = LBuffer("padded", (c, hp, wp), x.dtype, "local")
    rows = LBuffer("words", (chosen.steps * TILE_ROWS * npad,), "int32", "local")
    pad = Const(pad_value, x.dtype)

    def fill(img: Expr) -> Stmt:
        ch, r, col = Var("ci"), Var("r"), Var("col")
        spans = [None, None, (-top, hp - 1 - top), (-left, wp - 1 - left)]
        value = oplib.guarded_read(x, [img, ch, r - top, col - left], spans, pad)
        copy = For(ch, Const(0), Const(c), For(r, Const(0), Const(hp), For(
            col, Const(0), Const(wp), Store(image, (ch, r, col), value), "vectorized")))
        cc, ky, qq, y, xx = Var("c"), Var("ky"), Var("q"), Var("y"), Var("x")
        g = (cc * kh + ky) * nq + qq
        word = q.pack_lanes([q.lane_byte(Load(image, (cc, y * sh + ky * dh, xx * sw + qq * 4 + i)),
                                         False) for i in range(4)], 8)
        words = For(cc, Const(0), Const(c), For(ky, Const(0), Const(kh), For(
            qq, Const(0), Const(nq), For(y, Const(0), Const(oh), For(
                xx, Const(0), Const(ow), Store(rows, (g * npad + y * ow + xx,), word),
                "vectorized")))))
        return Seq((copy, words))

    return _Source((), None, (image, rows), fill,
                   lambda k, t: Load(rows, (k * (TILE_ROWS * npad) + t * TILE_WORDS,)),
                   npad, ow)


def conv2d_tiled(x: Tensor, wt: LBuffer, strides: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], out_shape: Sequence[int], kernel: Sequence[int],
                 weight_dtype: str, pad_value: int = 0, form: str = "channels",
                 target: Target | None = None) -> Tensor | None:
    """The convolution of ``x`` (NCHW, 8-bit, padded with ``pad_value``) by the tiles ``wt``
    (``(mtiles, steps, 16, 16)`` int32 in ``form``, kiln/op/nn/int8_tiled.py), int32; None
    where `plan` gives no plan, or one of another form or whose tiles are not ``wt``'s."""
    tgt = lowering_target(target)
    nimg, oc, oh, ow = (int(d) for d in out_shape)
    kh, kw = int(kernel[0]), int(kernel[1])
    c = x.shape[1]
    chosen = plan(x.shape, (oc, c, kh, kw), strides, padding, dilation, 1, out_shape, tgt)
    if chosen is None or chosen.form != form or tuple(wt.shape) != (
            chosen.mtiles, chosen.steps, TILE_ROWS, TILE_WORDS):
        return None
    steps, mtiles, ntiles = chosen.steps, chosen.mtiles, chosen.ntiles
    npad = ntiles * TILE_WORDS
    src = (_channel_planes(x, chosen, (kh, kw), npad, pad_value, tgt) if form == "channels"
           else _tap_rows(x, chosen, (kh, kw), strides, padding, dilation, (oh, ow), npad,
                          pad_value))
    sums = LBuffer("sums", (mtiles * TILE_ROWS * npad,), "int32", "local")

    def product(mp: Expr, np_: Expr, rows: int) -> Stmt:
        k = Var("k")
        a = tuple(Load(wt, (mp * 2 + i, k, Const(0, INDEX), Const(0, INDEX)))
                  for i in range(rows))
        b = tuple(src.tile(k, np_ * 2 + j) for j in range(2))
        cs = tuple(Load(sums, ((mp * 2 + i) * (TILE_ROWS * npad) + (np_ * 2 + j) * TILE_WORDS,))
                   for i in range(rows) for j in range(2))
        return TileProduct(k, Const(steps, INDEX), a, b, cs, TILE_WORDS, src.stride, npad,
                           weight_dtype, x.dtype)

    def block(mp: Expr, np_: Expr) -> Stmt:
        if mtiles % 2 == 0 or mtiles == 1:
            return product(mp, np_, min(mtiles, 2))
        return IfThenElse(Binary("lt", mp, Const(mtiles // 2, INDEX)), product(mp, np_, 2),
                          product(mp, np_, 1))

    def emit(write: WriteFn) -> Stmt:
        img = Var("n")
        mp, np_ = Var("mp"), Var("np")
        mpairs, npairs = -(-mtiles // 2), ntiles // 2
        if chosen.parallel == "m":
            tiles: Stmt = For(mp, Const(0), Const(mpairs), For(
                np_, Const(0), Const(npairs), block(mp, np_)), "parallel")
        else:
            tiles = For(np_, Const(0), Const(npairs), For(mp, Const(0), Const(mpairs),
                        block(mp, np_)), "parallel" if chosen.parallel else "serial")
        o, y, xx = Var("o"), Var("y"), Var("x")
        value = Load(sums, (o * npad + y * src.pitch + xx,))
        out = For(o, Const(0), Const(oc), For(y, Const(0), Const(oh), For(
            xx, Const(0), Const(ow), write((img, o, y, xx), value), "vectorized")),
            "parallel" if oc * npad >= PLANES_PARALLEL_MIN and tgt.cores > 1 else "serial")
        body: Stmt = Allocate(sums, Seq((src.fill(img), tiles, out)))
        for buf in src.per_image:
            body = Allocate(buf, body)
        stmt: Stmt = For(img, Const(0), Const(nimg), body)
        if src.setup is not None:
            stmt = Seq((src.setup, stmt))
        for buf in src.owned:
            stmt = Allocate(buf, stmt)
        return stmt

    t = extern((nimg, oc, oh, ow), "int32", emit)
    t.schedule = {"kernel": "amx", "form": form, "mtiles": mtiles, "ntiles": ntiles,
                  "steps": steps, "parallel": chosen.parallel, "prepacked": True}
    return t
