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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import Any

from kiln.loops import int8_gemm as q
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.conv_kernels import CHUNKS_PER_THREAD, MAX_PHASES, Planes
from kiln.loops.int8_conv import padding_word
from kiln.loops.ir import (
    INDEX,
    TILE_FEATURES,
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
from kiln.loops.linear_kernels import split_index
from kiln.loops.schedule import lowering_target, worth_parallel
from kiln.loops.tunable import Space, ordered, overridden, site_key
from kiln.target import Target

BLOCK_CHANNELS = 4 * TILE_ROWS  # input channels per K step: 16 groups of 4
MIN_CHANNELS = 32  # fewer: padding to 64 would be most of the work (the VNNI kernel instead)


def usable(target: Target | None = None) -> bool:
    """Whether ``target`` (default: the lowering's) has AMX's 8-bit tile products."""
    t = lowering_target(target)
    return all(t.has(f) for f in TILE_FEATURES)


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


BLOCK_PIXELS = 2 * TILE_WORDS  # a block: two tiles of pixels
BAND_BYTES = 256 * 1024  # a band's B words and sums, kept in a core's L2


@dataclass(frozen=True)
class _Band:
    """The work of one thread at a time: output rows [u·rows, u·rows + rows) (fewer in the
    last band) of every output channel, or — by channel pair (``by_m``, deep layers with
    few pixels) — every row of channels 32·u .. 32·u + 31. Its pixels are the product's
    columns from ``u·rows·pitch`` (0 by channel pair), in ``blocks`` blocks of 32 (the last
    one past the band's pixels), ``width`` = 32·blocks columns."""

    rows: int
    blocks: int
    units: int
    by_m: bool

    @property
    def width(self) -> int:
        return self.blocks * BLOCK_PIXELS


@dataclass(frozen=True)
class _Source:
    """Where a form's B tiles come from: ``setup`` once per call (within ``owned``),
    ``fill(img)`` once per image (within ``per_image``), ``words`` words per pixel that
    ``band_words(buf, y0, count)`` writes for output rows y0 .. y0 + count - 1 into ``buf``
    (rows of ``width`` words; None: none), ``tile(k, col, buf)`` the first word of the
    16 pixels from product column ``col`` (from the band's first) at K step k, rows
    ``stride`` apart (None: the band's width), and ``pitch``: how far apart two output
    rows' pixels are in the product's columns."""

    owned: tuple[LBuffer, ...]
    setup: Stmt | None
    per_image: tuple[LBuffer, ...]
    fill: Callable[[Expr], Stmt]
    words: int
    band_words: Callable[[LBuffer, Expr, Expr, int], Stmt] | None
    tile: Callable[[Expr, Expr, Expr, LBuffer | None, int], Load]
    stride: int | None
    pitch: int


def _channel_planes(x: Tensor, chosen: TilePlan, kernel: tuple[int, int], last: int,
                    pad_value: int, tgt: Target) -> _Source:
    """The "channels" form: the VNNI kernel's phase planes, 4 channels a word, read in
    place; a K step's 16 rows are 16 channel groups at one tap, a plane apart. ``last``:
    the product column past every column a band reads."""
    geo = chosen.planes
    assert geo is not None  # the "channels" form has planes
    kh, kw = kernel
    c = x.shape[1]
    cblocks = geo.channels // TILE_ROWS
    # K step s = (ky·kw + kx)·cblocks + cb: the tap of channel group 16·cb at (ky, kx)
    starts = [_tap(geo, TILE_ROWS * cb, ky, kx)
              for ky in range(kh) for kx in range(kw) for cb in range(cblocks)]
    span = 1 << max(max(starts), 1).bit_length()
    reach = (TILE_ROWS - 1) * geo.plane + last  # a B tile's pixels past its first element
    used = geo.size(last)
    planes = LBuffer("planes", (max(used, span + reach),), "int32", "local")
    taps = LBuffer("taps", (len(starts),), INDEX, "local")

    def quad(img: Expr, cc: Expr, y: Expr, xx: Expr) -> Expr:
        # channels 4·cc .. 4·cc + 3 of a pixel in one int32 (past the last: the last again,
        # which the weight's zero bytes multiply away)
        vals = [q.lane_byte(x(img, Binary("min", cc * 4 + k, Const(c - 1, INDEX)), y, xx),
                            False) for k in range(4)]
        return q.pack_lanes(vals, 8)

    def tile(k: Expr, start: Expr, col: Expr, buf: LBuffer | None, width: int) -> Load:
        off = Binary("floormod", Load(taps, (k,)), Const(span, INDEX))
        return Load(planes, (off + start + col,))

    table = Seq(tuple(Store(taps, (Const(i, INDEX),), Const(v, INDEX))
                      for i, v in enumerate(starts)))
    return _Source((taps,), table, (planes,), lambda img: geo.fill(
        quad, img, planes, tgt, used=used, pad=padding_word(pad_value, 4, False)),
        0, None, tile, geo.plane, geo.cols)


def _tap_rows(x: Tensor, chosen: TilePlan, kernel: tuple[int, int], strides: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], out: tuple[int, int],
              pad_value: int) -> _Source:
    """The "taps" form: a K word is 4 neighbouring taps of one kernel row and channel, so it
    is 4 consecutive bytes of the padded input. Each call pads the input once (bytes) and
    makes every 4-byte window of it a word (contiguous vector loads); each band copies the
    words of every (channel, ky, kx // 4) for its pixels into rows (one int32 load a word,
    ``sw`` apart: interleaved loads), 16 rows a K step for its B tiles."""
    kh, kw = kernel
    (sh, sw), dh = (int(strides[0]), int(strides[1])), int(dilation[0])
    top, left = int(padding[0]), int(padding[1])
    oh, ow = out
    c = x.shape[1]
    nq = -(-kw // 4)
    hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + 4 * nq
    image = LBuffer("padded", (c, hp, wp + 3), x.dtype, "local")
    windows = LBuffer("windows", (c, hp, wp), "int32", "local")
    pad = Const(pad_value, x.dtype)

    def fill(img: Expr) -> Stmt:
        ch, r, col = Var("ci"), Var("r"), Var("col")
        spans = [None, None, (-top, hp - 1 - top), (-left, wp + 2 - left)]
        value = oplib.guarded_read(x, [img, ch, r - top, col - left], spans, pad)
        copy = For(ch, Const(0), Const(c), For(r, Const(0), Const(hp), For(
            col, Const(0), Const(wp + 3), Store(image, (ch, r, col), value), "vectorized")))
        ch, r, col = Var("ci"), Var("r"), Var("col")
        window = q.pack_lanes([q.lane_byte(Load(image, (ch, r, col + i)), False)
                               for i in range(4)], 8)
        return Seq((copy, For(ch, Const(0), Const(c), For(r, Const(0), Const(hp), For(
            col, Const(0), Const(wp), Store(windows, (ch, r, col), window), "vectorized")))))

    def band_words(buf: LBuffer, y0: Expr, count: Expr, width: int) -> Stmt:
        cc, ky, qq, y, xx = Var("c"), Var("ky"), Var("q"), Var("y"), Var("x")
        g = (cc * kh + ky) * nq + qq
        row = Binary("min", y0 + y, Const(oh - 1, INDEX))  # a no-op: y < count
        word = Load(windows, (cc, row * sh + ky * dh, xx * sw + qq * 4))
        return For(cc, Const(0), Const(c), For(ky, Const(0), Const(kh), For(
            qq, Const(0), Const(nq), For(y, Const(0), count, For(
                xx, Const(0), Const(ow), Store(buf, (g * width + y * ow + xx,), word),
                "vectorized")))))

    def tile(k: Expr, start: Expr, col: Expr, buf: LBuffer | None, width: int) -> Load:
        assert buf is not None  # this form's bands have words
        return Load(buf, (k * (TILE_ROWS * width) + col,))

    return _Source((), None, (image, windows), fill, chosen.steps * TILE_ROWS, band_words,
                   tile, None, ow)


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
    steps, mtiles = chosen.steps, chosen.mtiles
    mpairs = -(-mtiles // 2)
    pitch = chosen.planes.cols if chosen.planes is not None else ow  # taps: no padding columns
    # The work goes in bands, each on one thread: its B words (the "taps" form), then all
    # its tile products back to back (the tile unit idles between short bursts: a product
    # and an epilogue per block took several times the sum of their times), then its
    # epilogue, whole output rows read from its sums with no test per pixel (vector code).
    words = chosen.steps * TILE_ROWS if form == "taps" else 0
    by_m = chosen.parallel == "m" and form == "channels"
    held = 2 * TILE_ROWS if by_m else mpairs * 2 * TILE_ROWS  # output channels a band holds
    if by_m:
        band = _Band(oh, -(-oh * pitch // BLOCK_PIXELS), mpairs, True)
    else:
        rows = max(1, min(oh, BAND_BYTES // (4 * pitch * (held + words))))
        if chosen.parallel:
            rows = max(1, min(rows, -(-oh // (CHUNKS_PER_THREAD * tgt.cores))))
        band = _Band(rows, -(-rows * pitch // BLOCK_PIXELS), -(-oh // rows), False)
    width = band.width
    last = band.units * band.rows * pitch + width  # past every product column a band reads
    src = (_channel_planes(x, chosen, (kh, kw), last, pad_value, tgt) if form == "channels"
           else _tap_rows(x, chosen, (kh, kw), strides, padding, dilation, (oh, ow),
                          pad_value))
    stride = src.stride if src.stride is not None else width
    sums = LBuffer("sums", (held * width,), "int32", "local")
    bwords = LBuffer("words", (words * width,), "int32", "local") if words else None

    def product(mp: Expr, start: Expr, blk: Expr, o0: Expr, count: int) -> Stmt:
        k = Var("k")
        a = tuple(Load(wt, (mp * 2 + i, k, Const(0, INDEX), Const(0, INDEX)))
                  for i in range(count))
        b = tuple(src.tile(k, start, blk * BLOCK_PIXELS + j * TILE_WORDS, bwords, width)
                  for j in range(2))
        cs = tuple(Load(sums, ((o0 + i * TILE_ROWS) * width + blk * BLOCK_PIXELS
                               + j * TILE_WORDS,))
                   for i in range(count) for j in range(2))
        return TileProduct(k, Const(steps, INDEX), a, b, cs, TILE_WORDS, stride, width,
                           weight_dtype, x.dtype)

    def products(mp: Expr, start: Expr, blk: Expr, o0: Expr) -> Stmt:
        if mtiles % 2 == 0 or mtiles == 1:
            return product(mp, start, blk, o0, min(mtiles, 2))
        return IfThenElse(Binary("lt", mp, Const(mtiles // 2, INDEX)),
                          product(mp, start, blk, o0, 2), product(mp, start, blk, o0, 1))

    def unit(write: WriteFn, img: Expr, u: Expr) -> Stmt:
        if band.by_m:
            y0: Expr = Const(0, INDEX)
            count: Expr = Const(oh, INDEX)
        else:
            y0 = u * band.rows
            count = Binary("min", Const(band.rows, INDEX), Const(oh, INDEX) - y0)
        start = y0 * pitch  # the band's first product column
        blocks = (count * pitch + (BLOCK_PIXELS - 1)) // BLOCK_PIXELS
        stmts: list[Stmt] = []
        if src.band_words is not None and bwords is not None:
            stmts.append(src.band_words(bwords, y0, count, width))
        blk, mb = Var("b"), Var("mb")
        if band.by_m:
            stmts.append(For(blk, Const(0), blocks, products(u, start, blk, Const(0, INDEX))))
        else:
            stmts.append(For(blk, Const(0), blocks, For(mb, Const(0), Const(mpairs), products(
                mb, start, blk, mb * (2 * TILE_ROWS)))))
        o, y, xx = Var("o"), Var("y"), Var("x")
        o_first = u * (2 * TILE_ROWS) if band.by_m else Const(0, INDEX)
        channels = Binary("min", Const(held, INDEX), Const(oc, INDEX) - o_first)
        ch = Binary("min", o_first + o, Const(oc - 1, INDEX))  # a no-op: o < channels
        row = Binary("min", y0 + y, Const(oh - 1, INDEX))  # a no-op: y < count
        value = Load(sums, (o * width + (y * pitch + xx),))
        stmts.append(For(o, Const(0), channels, For(y, Const(0), count, For(
            xx, Const(0), Const(ow), write((img, ch, row, xx), value), "vectorized"))))
        body: Stmt = Allocate(sums, Seq(tuple(stmts)))
        return Allocate(bwords, body) if bwords is not None else body

    def emit(write: WriteFn) -> Stmt:
        img, u = Var("n"), Var("u")
        tiles = For(u, Const(0), Const(band.units), unit(write, img, u),
                    "parallel" if chosen.parallel else "serial")
        per_image: Stmt = Seq((src.fill(img), tiles))
        for buf in src.per_image:
            per_image = Allocate(buf, per_image)
        stmt: Stmt = For(img, Const(0), Const(nimg), per_image)
        if src.setup is not None:
            stmt = Seq((src.setup, stmt))
        for buf in src.owned:
            stmt = Allocate(buf, stmt)
        return stmt

    t = extern((nimg, oc, oh, ow), "int32", emit)
    t.schedule = {"kernel": "amx", "form": form, "mtiles": mtiles, "steps": steps,
                  "parallel": chosen.parallel, "band_rows": band.rows, "by_channels": band.by_m,
                  "prepacked": True}
    return t


# --- dense ---------------------------------------------------------------------------------

UNIT_BYTES = 512 * 1024  # a unit's A rows and B columns, kept in a core's L2
# Where one pair of row tiles and one of column tiles take at most this (K ≤ 1024 bytes), a
# unit is just those: a 32×32 block. Against units of up to 4 pairs by the columns that fill
# UNIT_BYTES, on the Emerald Rapids VM (int8 × int8, constant weight, alternated): 0.51-0.99
# of the time on 7 shapes of K 512-1024, 1 and 2 threads (1024³ 0.77, 128×3072×768 0.69,
# 256×2048×512 0.56); at K 2048 0.93-1.11 and at K 3072-4096 1.04-1.25, where the big units
# stay.
SMALL_UNIT_BYTES = 64 * 1024


@dataclass(frozen=True)
class DenseUnits:
    """How `dense_tiled` cuts its product: pairs of row tiles (``mb``) by pairs of column
    tiles (``nb``) a unit, and the chunks a thread of its parallel loop over units. A
    tuning site (``key``, `dense_space`); the weight's tiles do not depend on it."""

    mb: int
    nb: int
    chunks: int = CHUNKS_PER_THREAD
    key: str | None = None
    tuned: bool = False

    @staticmethod
    def default(m: int, units: int, k: int, a_dtype: str, b_dtype: str) -> DenseUnits:
        """The rule's units (one 32×32 block where K is short, `SMALL_UNIT_BYTES`; else
        up to 4 pairs of row tiles by the column pairs that fill `UNIT_BYTES`), or the knobs
        the enclosing `overrides_scope` gives its key (a tuning log's)."""
        base = replace(_dense_rule(m, units, k), key=dense_key(m, units, k, a_dtype, b_dtype))
        return overridden(base, lambda: dense_space(m, units, k, a_dtype, b_dtype),
                          _dense_apply)


def _pairs(n: int, per_tile: int) -> int:
    """Pairs of tiles of ``per_tile`` that cover ``n`` (the last pair may be one tile)."""
    tiles = -(-n // per_tile)
    return -(-tiles // 2)


def _dense_rule(m: int, units: int, k: int) -> DenseUnits:
    steps = -(-k // (4 * TILE_WORDS))
    mpairs, npairs = _pairs(m, TILE_ROWS), _pairs(units, TILE_WORDS)
    if 2 * (2 * TILE_ROWS * 4 * steps * TILE_WORDS) <= SMALL_UNIT_BYTES:
        return DenseUnits(1, 1)
    mb = min(mpairs, 4)
    nb = max(1, min(npairs, UNIT_BYTES // (2 * TILE_ROWS * 4 * steps * TILE_WORDS) - mb))
    return DenseUnits(mb, nb)


def dense_key(m: int, units: int, k: int, a_dtype: str, b_dtype: str) -> str:
    """The key naming `dense_tiled`'s units in a tuning log."""
    return site_key("amx_dense", m=m, n=units, k=k, a=a_dtype, b=b_dtype)


def _dense_knobs(u: DenseUnits) -> dict[str, Any]:
    return {"mb": u.mb, "nb": u.nb, "chunks": u.chunks}


def _dense_apply(base: DenseUnits, knobs: Mapping[str, Any]) -> DenseUnits:
    u = replace(base, mb=int(knobs["mb"]), nb=int(knobs["nb"]), chunks=int(knobs["chunks"]))
    return replace(u, tuned=_dense_knobs(u) != _dense_knobs(base))


def dense_space(m: int, units: int, k: int, a_dtype: str, b_dtype: str,
                target: Target | None = None) -> Space:
    """The knobs of `dense_tiled` (the rule's first): 1 to 8 pairs of row tiles and 1 to
    32 pairs of column tiles a unit, A and B of a unit within a core's L2, and 2 to 16
    chunks a thread. Each tile's sum runs over K in the same order whatever the unit:
    the results are exact and the same."""
    t = lowering_target(target)
    base = _dense_rule(m, units, k)
    d = _dense_knobs(base)
    mpairs, npairs = _pairs(m, TILE_ROWS), _pairs(units, TILE_WORDS)
    pair_bytes = 2 * TILE_ROWS * 4 * -(-k // (4 * TILE_WORDS)) * TILE_WORDS
    cap = max((base.mb + base.nb) * pair_bytes, t.l2 // 2)
    knobs = (("mb", ordered(d["mb"], [x for x in (1, 2, 3, 4, 6, 8) if x <= mpairs])),
             ("nb", ordered(d["nb"], [x for x in (1, 2, 4, 8, 16, 32) if x <= npairs])),
             ("chunks", ordered(d["chunks"], [2, 8, 16] if t.cores > 1 else [])))

    def check(kn: Mapping[str, Any]) -> bool:
        return (int(kn["mb"]) + int(kn["nb"])) * pair_bytes <= cap

    def canonical(kn: Mapping[str, Any]) -> Any:
        units_ = -(-mpairs // int(kn["mb"])) * -(-npairs // int(kn["nb"]))
        return (kn["mb"], kn["nb"], kn["chunks"] if units_ > 1 and t.cores > 1 else None)

    return Space(dense_key(m, units, k, a_dtype, b_dtype), knobs, check, canonical)


def dense_usable(m: int, units: int, k: int, target: Target | None = None) -> bool:
    """Whether an 8-bit dense of these sizes takes `dense_tiled` on ``target``: AMX, and
    enough of it for tiles (a batch-1 dense keeps the dot-product kernel)."""
    return usable(target) and m >= 8 and units >= 16 and k >= 32


def dense_tiled(x: Tensor, wt: LBuffer, units: int, out_shape: Sequence[int],
                weight_dtype: str, target: Target | None = None) -> Tensor | None:
    """``x @ W.T`` in int32 for 8-bit ``x`` (..., K) and W's tiles ``wt`` (``(NT, S, 16,
    16)`` int32, kiln/op/nn/int8_tiled.py: word (r, c) of tile (t, s) holds W[16t + c, 64s +
    4r .. 64s + 4r + 3]). Each call packs x's rows as words (4 consecutive K values each,
    rows of S·16 words: the A tiles), then units (`DenseUnits`: pairs of row tiles by pairs
    of column tiles) do their tile products back to back and their epilogue rows, on the
    thread pool. None where `dense_usable` says no or ``wt`` is not
    these tiles."""
    tgt = lowering_target(target)
    lead = tuple(x.shape[:-1])
    m, k = prod(lead), x.shape[-1]
    steps = -(-k // (4 * TILE_WORDS))
    ntiles, mtiles = -(-units // TILE_WORDS), -(-m // TILE_ROWS)
    if not dense_usable(m, units, k, tgt) or tuple(wt.shape) != (ntiles, steps, TILE_ROWS,
                                                                 TILE_WORDS):
        return None
    mpairs, npairs = -(-mtiles // 2), -(-ntiles // 2)
    row_words = steps * TILE_WORDS
    unit = DenseUnits.default(m, units, k, x.dtype, weight_dtype)
    mb, nb = min(unit.mb, mpairs), min(unit.nb, npairs)
    munits, nunits = -(-mpairs // mb), -(-npairs // nb)
    words = LBuffer("rows", (mpairs * 2 * TILE_ROWS * row_words,), "int32", "local")
    width = nb * 2 * TILE_WORDS
    sums = LBuffer("sums", (mb * 2 * TILE_ROWS * width,), "int32", "local")
    kw = -(-k // 4)  # words that hold K values (the rest of a row meets zero weights)

    def product(mp: Expr, np_: Expr, i0: Expr, j0: Expr, rows: int, cols: int) -> Stmt:
        kk = Var("k")
        a = tuple(Load(words, ((mp * 2 + i) * (TILE_ROWS * row_words) + kk * TILE_WORDS,))
                  for i in range(rows))
        b = tuple(Load(wt, (np_ * 2 + j, kk, Const(0, INDEX), Const(0, INDEX)))
                  for j in range(cols))
        cs = tuple(Load(sums, ((i0 + i * TILE_ROWS) * width + j0 + j * TILE_WORDS,))
                   for i in range(rows) for j in range(cols))
        return TileProduct(kk, Const(steps, INDEX), a, b, cs, row_words, TILE_WORDS, width,
                           x.dtype, weight_dtype)

    def products(mp: Expr, np_: Expr, i0: Expr, j0: Expr) -> Stmt:
        def cols_of(rows: int) -> Stmt:
            if ntiles % 2 == 0 or ntiles == 1:
                return product(mp, np_, i0, j0, rows, min(ntiles, 2))
            return IfThenElse(Binary("lt", np_, Const(ntiles // 2, INDEX)),
                              product(mp, np_, i0, j0, rows, 2),
                              product(mp, np_, i0, j0, rows, 1))
        if mtiles % 2 == 0 or mtiles == 1:
            return cols_of(min(mtiles, 2))
        return IfThenElse(Binary("lt", mp, Const(mtiles // 2, INDEX)), cols_of(2), cols_of(1))

    def emit(write: WriteFn) -> Stmt:
        row, w4 = Var("m"), Var("w")
        vals = [q.lane_byte(x(*split_index(row, lead),
                              Binary("min", w4 * 4 + i, Const(k - 1, INDEX))), False)
                for i in range(4)]  # past K: the last again, times zero weights
        pack = For(row, Const(0), Const(m), For(w4, Const(0), Const(kw), Store(
            words, (row * row_words + w4,), q.pack_lanes(vals, 8)), "vectorized"),
            "parallel" if worth_parallel(m * k * 4, tgt.cores) and tgt.cores > 1 else "serial")
        u, mi, ni = Var("u"), Var("mi"), Var("ni")
        mu, nu = u // nunits, u % nunits
        mp = Binary("min", mu * mb + mi, Const(mpairs - 1, INDEX))  # a no-op: mi < count
        np_ = Binary("min", nu * nb + ni, Const(npairs - 1, INDEX))
        mcount = Binary("min", Const(mb, INDEX), Const(mpairs, INDEX) - mu * mb)
        ncount = Binary("min", Const(nb, INDEX), Const(npairs, INDEX) - nu * nb)
        tiles = For(mi, Const(0), mcount, For(ni, Const(0), ncount, products(
            mp, np_, mi * (2 * TILE_ROWS), ni * (2 * TILE_WORDS))))
        r, c = Var("r"), Var("c")
        first_row, first_col = mu * (mb * 2 * TILE_ROWS), nu * width
        rows = Binary("min", Const(mb * 2 * TILE_ROWS, INDEX), Const(m, INDEX) - first_row)
        cols = Binary("min", Const(width, INDEX), Const(units, INDEX) - first_col)
        at_row = Binary("min", first_row + r, Const(m - 1, INDEX))  # no-ops: r < rows
        at_col = Binary("min", first_col + c, Const(units - 1, INDEX))  # and c < cols
        out = For(r, Const(0), rows, For(c, Const(0), cols, write(
            (*split_index(at_row, lead), at_col), Load(sums, (r * width + c,))), "vectorized"))
        work = For(u, Const(0), Const(munits * nunits), Allocate(sums, Seq((tiles, out))),
                   "parallel" if tgt.cores > 1 and munits * nunits > 1 else "serial",
                   unit.chunks)
        return Allocate(words, Seq((pack, work)))

    t = extern(tuple(out_shape), "int32", emit)
    t.schedule = {"kernel": "amx", "mtiles": mtiles, "ntiles": ntiles, "steps": steps,
                  "unit": (mb, nb), "chunks": unit.chunks, "key": unit.key,
                  "tuned": unit.tuned, "prepacked": True}
    return t
