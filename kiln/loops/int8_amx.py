"""An 8-bit convolution on AMX matrix tiles (`TileProduct`), for Targets with ``amx-int8``.

nn.conv2d_int8_tiled's fast path (kiln/op/nn/int8_tiled.py; alter-layout makes the call where
the Target has AMX). The input is laid out as the VNNI convolution lays it out
(kiln/loops/int8_conv.py): zero-padded phase planes (`Planes`) holding 4 input channels per
int32, in which every kernel tap is a shift. A K step of the product is one tap and 64 input
channels (16 channel groups): its B tile is 16 rows — the 16 channel groups, one plane apart
— of 16 consecutive output pixels at that tap (VNNI's layout, K/4 × N, read in place); its A
tile is 16 output channels × those 64 channels, from the weight packed at compile time as
16×16-int32 tiles in the same K order. Each `TileProduct` keeps 2×2 accumulators (32 output
channels × 32 pixels; 2×1 for an odd last tile of channels) in the tile registers over all
the K steps, then stores them to a buffer at the planes' width, from which the output
pixels are copied out through the lowering's ``write`` (the fused epilogue), as the VNNI
kernel does. The instruction is chosen from the dtypes (``tdpbssd``, ``tdpbsud``,
``tdpbusd``, ``tdpbuud``), so nothing is shifted.

Padding is exact: input channels past the last (to whole blocks of 64) read the last
channel again and meet zero weights, and output pixels past the last (to whole pairs of
16-pixel tiles) are computed and never copied out. The tap offsets come from a table made
once per call, taken modulo a power of two above the largest (a no-op) so the verifier
bounds every tile; the planes are allocated, not filled, out to that reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.loops import int8_gemm as q
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


@dataclass(frozen=True)
class TilePlan:
    """How `conv2d_tiled` runs a convolution: the planes (channel groups padded to whole
    blocks of 16), the blocks of 64 input channels, the 16-channel tiles of the output, the
    16-pixel tiles of the product's N (an even number), and the parallel loop ("n" over
    pairs of pixel tiles, "m" over pairs of channel tiles, or None)."""

    planes: Planes
    cblocks: int
    mtiles: int
    ntiles: int
    parallel: str | None

    @property
    def steps(self) -> int:
        """K steps: kernel taps × channel blocks."""
        kh, kw = self.planes.kernel
        return kh * kw * self.cblocks


def plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int,
         out_shape: Sequence[int], target: Target | None = None) -> TilePlan | None:
    """The plan for these shapes (``padding``: top, left), or None where the kernel does not
    apply: no AMX, channel groups, fewer than `MIN_CHANNELS` input channels, or more stride
    phases than `MAX_PHASES`."""
    t = lowering_target(target)
    oc, c, kh, kw = (int(d) for d in w_shape)
    if not usable(t) or groups != 1 or c < MIN_CHANNELS \
            or min(*x_shape, *w_shape, *out_shape) <= 0:
        return None
    cblocks = -(-c // BLOCK_CHANNELS)
    geo = Planes(cblocks * TILE_ROWS, int(x_shape[2]), int(x_shape[3]), (kh, kw),
                 (int(strides[0]), int(strides[1])), (int(dilation[0]), int(dilation[1])),
                 (int(padding[0]), int(padding[1])), (int(out_shape[2]), int(out_shape[3])))
    if geo.phases > MAX_PHASES:
        return None
    mtiles = -(-oc // TILE_ROWS)
    ntiles = -(-geo.columns // TILE_WORDS)
    ntiles += ntiles % 2
    parallel = None
    if t.cores > 1 and worth_parallel(oc * geo.columns * c * kh * kw // 16, t.cores):
        parallel = "n" if ntiles // 2 >= -(-mtiles // 2) else "m"
    return TilePlan(geo, cblocks, mtiles, ntiles, parallel)


def _tap(geo: Planes, group: int, ky: int, kx: int) -> int:
    offset = geo.tap(Const(group, INDEX), Const(ky, INDEX), Const(kx, INDEX))
    assert isinstance(offset, Const)  # constants fold as the formula is built
    return int(offset.value)


def conv2d_tiled(x: Tensor, wt: LBuffer, strides: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], out_shape: Sequence[int], kernel: Sequence[int],
                 weight_dtype: str, pad_value: int = 0,
                 target: Target | None = None) -> Tensor | None:
    """The convolution of ``x`` (NCHW, 8-bit, padded with ``pad_value``) by the tiles ``wt``
    (``(mtiles, steps, 16, 16)`` int32, kiln/op/nn/int8_tiled.py), int32; None where `plan`
    gives no plan or one whose tiles are not ``wt``'s."""
    tgt = lowering_target(target)
    nimg, oc, oh, ow = (int(d) for d in out_shape)
    kh, kw = int(kernel[0]), int(kernel[1])
    c = x.shape[1]
    chosen = plan(x.shape, (oc, c, kh, kw), strides, padding, dilation, 1, out_shape, tgt)
    if chosen is None or tuple(wt.shape) != (chosen.mtiles, chosen.steps, TILE_ROWS,
                                              TILE_WORDS):
        return None
    geo, steps, cblocks = chosen.planes, chosen.steps, chosen.cblocks
    mtiles, ntiles = chosen.mtiles, chosen.ntiles
    npad = ntiles * TILE_WORDS

    # K step s = (ky·kw + kx)·cblocks + cb: the tap of channel group 16·cb at (ky, kx)
    starts = [_tap(geo, TILE_ROWS * cb, ky, kx)
              for ky in range(kh) for kx in range(kw) for cb in range(cblocks)]
    span = 1 << max(max(starts), 1).bit_length()
    reach = (TILE_ROWS - 1) * geo.plane + npad  # a B tile's pixels past its first element
    used = geo.size(npad)
    planes = LBuffer("planes", (max(used, span + reach),), "int32", "local")
    taps = LBuffer("taps", (steps,), INDEX, "local")
    sums = LBuffer("sums", (mtiles * TILE_ROWS * npad,), "int32", "local")

    def quad(img: Expr, cc: Expr, y: Expr, xx: Expr) -> Expr:
        # channels 4·cc .. 4·cc + 3 of a pixel in one int32 (past the last: the last again,
        # which the weight's zero bytes multiply away)
        vals = [q.lane_byte(x(img, Binary("min", cc * 4 + k, Const(c - 1, INDEX)), y, xx),
                            False) for k in range(4)]
        return q.pack_lanes(vals, 8)

    def product(mp: Expr, np_: Expr, rows: int) -> Stmt:
        k = Var("k")
        off = Binary("floormod", Load(taps, (k,)), Const(span, INDEX))
        a = tuple(Load(wt, (mp * 2 + i, k, Const(0, INDEX), Const(0, INDEX)))
                  for i in range(rows))
        b = tuple(Load(planes, (off + (np_ * 2 + j) * TILE_WORDS,)) for j in range(2))
        cs = tuple(Load(sums, ((mp * 2 + i) * (TILE_ROWS * npad) + (np_ * 2 + j) * TILE_WORDS,))
                   for i in range(rows) for j in range(2))
        return TileProduct(k, Const(steps, INDEX), a, b, cs, TILE_WORDS, geo.plane, npad,
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
        value = Load(sums, (o * npad + y * geo.cols + xx,))
        out = For(o, Const(0), Const(oc), For(y, Const(0), Const(oh), For(
            xx, Const(0), Const(ow), write((img, o, y, xx), value), "vectorized")),
            "parallel" if oc * geo.columns >= PLANES_PARALLEL_MIN and tgt.cores > 1
            else "serial")
        table = Seq(tuple(Store(taps, (Const(i, INDEX),), Const(v, INDEX))
                          for i, v in enumerate(starts)))
        fill = geo.fill(quad, img, planes, tgt, used=used, pad=padding_word(pad_value, 4, False))
        images = For(img, Const(0), Const(nimg), Allocate(planes, Allocate(sums, Seq((
            fill, tiles, out)))))
        return Allocate(taps, Seq((table, images)))

    t = extern((nimg, oc, oh, ow), "int32", emit)
    t.schedule = {"kernel": "amx", "mtiles": mtiles, "ntiles": ntiles, "steps": steps,
                  "parallel": chosen.parallel, "input": "channel-group planes",
                  "prepacked": True}
    return t
