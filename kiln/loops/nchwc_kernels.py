"""Fast kernels of nn.contrib_conv2d_NCHWc: float32 convolution on channel-blocked tensors.

The convert-layout pass (kiln/transform/convert_layout.py) runs a CNN's convolutions in
``NCHW[b]c`` (b = the Target's vector lanes): the element of channel ``c0·b + c1`` at
``[n, c0, y, x, c1]``, so that a vector of b output channels of one pixel is contiguous.
Two kernels take such calls:

- **Direct** (`conv_nchwc`, groups = 1): a register tile of T output pixels × J blocks of
  output channels (the GEMM's 14 × 2 vectors on AVX-512, `tile_shape`). Each step of the
  reduction (an input channel at a kernel tap) broadcasts T input pixels, loads J weight
  vectors of the ``OIHW[bi]i[bo]o`` weight and does T·J FMAs; the input is read where it
  is, nothing copied or packed. A tile at a row's end, whose windows leave the image (the
  padding), has its kernel columns' loops apart, each over the pixels that column reads
  inside; the rows at the top and bottom have code of their own; a 1×1 stride-1
  convolution without padding may tile the image's pixels as one flat row.
- **Depthwise** (`depthwise_nchwc`, one channel per group): each output pixel is a vector of
  b channels summed over the taps, read straight from the input (the NCHW kernels copy each
  channel's plane first, kiln/loops/conv_kernels.py), a tile of pixels at a time.

The data may also be plain NCHW (a stem whose 3 channels do not block): its channels are
then blocks of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kiln.loops import gemm as g
from kiln.loops.compute import BufferTensor, Tensor, WriteFn
from kiln.loops.ir import (
    CHUNKS_PER_THREAD,
    FMA,
    INDEX,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Const,
    Expr,
    For,
    IfThenElse,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.oplib import windows_inside
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target, worth_parallel
from kiln.loops.tunable import Space, current_overrides, ordered, override, site_key
from kiln.target import Target

# Where a tile's blocks of weight do not fit half of L1, the bytes of a weight vector (read
# from L2) that each pixel of the tile may take at most: 16, so T ≥ 4 on AVX-512 (2 on
# AVX2). A row of 9 or 10 pixels took tiles of 3 pixels by 8 blocks (24 accumulators: 8
# weight vectors from L2 a step for 24 FMAs), which ran 1.3-2.4× slower than 9 by 2 or 5
# by 4 (two 3×3 layers alternated on a 2-core Xeon with AVX-512: 256 channels at 9×9
# 0.901 ms against 0.638, 512 at 10×10 7.81 against 3.25, 384 at 10×10 3.07 against 1.89).
MAX_WEIGHT_BYTES_A_PIXEL = 16


def tile_shape(pixels: int, out_blocks: int, block: int, target: Target,
               k: int = 0) -> tuple[int, int]:
    """(T, J): the pixels and the blocks of output channels of `conv_nchwc`'s register
    tile, with as many accumulator registers as the GEMM's micro-kernel keeps
    (`gemm.register_tile`; 28 on AVX-512, 12 on AVX2; a block wider than a vector takes
    several). J divides the blocks; the most registers in use win, then the fewest loads a
    step (T broadcasts and J weight vectors: 7 pixels of 4 blocks load 11 times for 28
    FMAs, 14 of 2 load 16 times). Where J blocks of a reduction of ``k`` would not fit half
    of L1, T is at least `MAX_WEIGHT_BYTES_A_PIXEL`'s share of a vector where the row has
    the pixels: each weight vector, then read from L2, feeds T FMAs."""
    mr, nr = g.register_tile(target)
    lanes = target.lanes("float32")
    budget = mr * (nr // lanes)
    per_block = -(-block // lanes)
    fewest = min(pixels, max(1, lanes * 4 // MAX_WEIGHT_BYTES_A_PIXEL))
    best = (0, 0, 1, 1)
    for j in range(1, budget // per_block + 1):
        if out_blocks % j:
            continue
        most = min(pixels, budget // (j * per_block))
        if most < fewest and 4 * k * j * block > target.l1d // 2:
            continue
        t = -(-pixels // -(-pixels // most))  # the row's tiles as even as they can be
        best = max(best, (t * j * per_block, -(t + j * per_block), t, j))
    return best[2], best[3]


def nchwc_key(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int]) -> str:
    """The key naming a blocked direct convolution's register tile in a tuning log (the
    shapes as the kernel sees them: x NCHW[bi]c or NCHW, w OIHW[bi]i[bo]o, out
    NCHW[bo]c; padding top and left)."""
    return site_key("conv2d_nchwc", x=tuple(x_shape), w=tuple(w_shape),
                    strides=tuple(strides), padding=tuple(padding[:2]),
                    dilation=tuple(dilation), out=tuple(out_shape))


def _form(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
          padding: Sequence[int], out_shape: Sequence[int], target: Target
          ) -> tuple[bool, int, tuple[int, int]]:
    """(flat, the pixels a tile may cover, the rule's (T, J)) of a direct convolution: a
    1×1 stride-1 convolution without padding tiles the flattened pixels where that fills
    more registers than a row's tiles (a 7-pixel row of 10 blocks: 14 pixels of 2 blocks,
    not 4 of 5); elsewhere rows, whose pixels' addresses are a constant apart."""
    _, oblocks, oh, ow, bo = (int(d) for d in out_shape)
    kh, kw = int(w_shape[2]), int(w_shape[3])
    h, wd = int(x_shape[2]), int(x_shape[3])
    k = int(w_shape[1]) * int(w_shape[4]) * kh * kw  # a block's reduction
    geometry = (kh, kw, int(strides[0]), int(strides[1]), int(padding[0]), int(padding[1]))
    flat = geometry == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd) and _used(
        tile_shape(oh * ow, oblocks, bo, target, k)) > _used(
        tile_shape(ow, oblocks, bo, target, k))
    pixels = oh * ow if flat else ow
    return flat, pixels, tile_shape(pixels, oblocks, bo, target, k)


def space(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
          padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
          target: Target | None = None) -> Space:
    """The register tiles `conv_nchwc` may take (the rule's first): ``pixels`` T and
    ``blocks`` J, J dividing the output's blocks and the T·J accumulators fitting the
    registers the GEMM's micro-kernel keeps; and ``chunks``, the pieces a thread the
    parallel loop over rows is cut into (not one: a busy core would hold up the rest)."""
    tgt = lowering_target(target)
    _, oblocks, _, _, bo = (int(d) for d in out_shape)
    _, most, (t, j) = _form(x_shape, w_shape, strides, padding, out_shape, tgt)
    mr, nr = g.register_tile(tgt)
    budget = mr * (nr // tgt.lanes("float32"))
    per_block = -(-bo // tgt.lanes("float32"))
    blocks = ordered(j, [v for v in range(1, budget // per_block + 1) if oblocks % v == 0])
    pixels = ordered(t, list(range(1, min(most, budget) + 1)))
    chunks = ordered(CHUNKS_PER_THREAD, [2, 8, 16] if tgt.cores > 1 else [])

    iblocks, kh, kw, bi = (int(d) for d in w_shape[1:5])
    parallel = worth_parallel(math.prod(int(d) for d in out_shape) * iblocks * bi * kh * kw,
                              tgt.cores)

    def check(knobs: Mapping[str, Any]) -> bool:
        return int(knobs["pixels"]) * int(knobs["blocks"]) * per_block <= budget

    def canonical(knobs: Mapping[str, Any]) -> Any:  # a serial loop has no chunks
        return (knobs["pixels"], knobs["blocks"], knobs["chunks"] if parallel else None)

    return Space(nchwc_key(x_shape, w_shape, strides, padding, dilation, out_shape),
                 (("pixels", pixels), ("blocks", blocks), ("chunks", chunks)), check,
                 canonical)


def chosen_tile(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
                target: Target | None = None) -> tuple[int, int, int, bool]:
    """(T, J, chunks, tuned) of `conv_nchwc`: the knobs the enclosing `overrides_scope`
    gives this site (a tuning log's; ``tuned`` when they differ from the rule's), else
    `tile_shape`'s register tile and the pool's default chunks."""
    tgt = lowering_target(target)
    _, _, rule = _form(x_shape, w_shape, strides, padding, out_shape, tgt)
    default = (*rule, CHUNKS_PER_THREAD)
    if current_overrides() is None:
        return (*default, False)
    knobs = override(space(x_shape, w_shape, strides, padding, dilation, out_shape, tgt))
    if knobs is None:
        return (*default, False)
    chosen = (int(knobs["pixels"]), int(knobs["blocks"]), int(knobs["chunks"]))
    return (*chosen, chosen != default)


def _used(tile: tuple[int, int]) -> int:
    t, j = tile
    return t * j


def _write_out(out: Buffer, jb: int, place: Callable[[Expr], tuple[Expr, Expr]],
               write: WriteFn, img: Expr, ot: Expr) -> Stmt:
    """A tile's sums (row r of ``out``: pixel r // J, block r % J of those from ot·J) out
    through the fused consumers: one loop over the rows around one vector loop, not a
    vector loop for each (a 7×7 stem's 28-row tiles made 420 loops for LLVM to vectorize:
    10 s to compile the layer)."""
    r, c1 = Var("r"), Var("c1")
    y, xx = place(r // jb)
    return For(r, Const(0), Const(out.shape[0]), For(c1, Const(0), Const(out.shape[1]), write(
        (img, ot * jb + r % jb, y, xx, c1), Load(out, (r, c1))), "vectorized"), "rolled")


def _taps(o: int, stride: int, taps: int, dilation: int, pad: int, size: int) -> list[int]:
    """The taps of output position ``o`` whose input lies inside an axis of ``size``."""
    return [k for k in range(taps) if 0 <= o * stride + k * dilation - pad < size]


def _row(ow: int, per: int, inside: tuple[int, int],
         tile: Callable[[Expr, list[bool]], Stmt]) -> Stmt:
    """A row of ``ow`` output pixels in tiles of ``per`` at fixed columns: ``tile(first
    column, edges)`` for each (``edges[t]``: whether pixel t's window leaves the image's
    columns, ``inside`` = [x0, x1) those that do not), a run of tiles inside as one loop."""
    x0, x1 = inside
    parts: list[Stmt] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            k = Var("tx")
            parts.append(For(k, Const(0), Const(len(run)), tile(k * per + run[0],
                                                                  [False] * per)))
            run.clear()

    for c0 in range(0, ow, per):
        count = min(per, ow - c0)
        if count == per and x0 <= c0 and c0 + count <= x1:
            run.append(c0)
            continue
        flush()
        parts.append(tile(Const(c0, INDEX), [not x0 <= c0 + t < x1 for t in range(count)]))
    flush()
    return Seq(tuple(parts))


def _rows(oy: Expr, oh: int, inside: tuple[int, int], kh: int,
          row: Callable[[Expr, list[int]], Stmt], taps: Callable[[int], list[int]]) -> Stmt:
    """Output row ``oy`` of ``oh``: ``row(y, kernel rows)`` — rows whose windows stay inside
    the image's rows (``inside`` = [y0, y1)) share code with all ``kh`` kernel rows, each
    other row (a few at the top and bottom) has its own with ``taps(row)``, the kernel rows
    that fall inside."""
    y0, y1 = inside
    # (the shared rows' y clamped to them: no value changes, but the verifier's interval
    # arithmetic then bounds every read)
    clamped = Binary("max", Binary("min", oy, Const(y1 - 1, INDEX)), Const(y0, INDEX))
    body = row(clamped, list(range(kh))) if y1 > y0 else Seq(())
    for r in [r for r in range(oh) if not y0 <= r < y1]:
        body = IfThenElse(Binary("eq", oy, Const(r, INDEX)), row(Const(r, INDEX), taps(r)), body)
    return body


def conv_nchwc(x: Tensor, w: BufferTensor, strides: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], out_shape: Sequence[int], write: WriteFn,
               tile_size: tuple[int, int], target: Target | None = None,
               chunks: int = CHUNKS_PER_THREAD) -> Stmt:
    """The direct convolution (module docstring): x ``NCHW[bi]c`` (or NCHW), w
    ``OIHW[bi]i[bo]o``, the result ``NCHW[bo]c`` of ``out_shape`` through ``write``.

    A parallel iteration is one output row of one tile of channel blocks (or, 1×1 at stride
    1 without padding, one tile of the flattened pixels). A row's tiles start at fixed
    columns, so only the pixels whose windows leave the image's columns test their taps
    (a run of tiles between them is one loop), and the rows at the top and bottom (a few)
    have code of their own with the kernel rows that fall inside. ``tile_size`` is (T, J)
    and ``chunks`` the parallel loop's pieces a thread, `chosen_tile`'s."""
    tgt = lowering_target(target)
    nimg, oblocks, oh, ow, bo = (int(d) for d in out_shape)
    iblocks, kh, kw, bi = (int(d) for d in w.shape[1:5])
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left = int(padding[0]), int(padding[1])
    h, wd = int(x.shape[2]), int(x.shape[3])
    flat = _form(x.shape, w.shape, strides, padding, out_shape, tgt)[0]
    t_max, jb = tile_size
    otiles = oblocks // jb
    img, ot = Var("n"), Var("ot")

    def tile(place: Callable[[Expr], tuple[Expr, Expr]], edges: list[bool],
             rows: list[int], first: int | None = None) -> Stmt:
        # pixel t of the tile at output (y, x) = place(t); edges[t]: a kernel column of its
        # window falls outside the image; the kernel rows ``rows``; J blocks of channels
        # from ot·J. A tile with edges (at column ``first``) has the channels' loop apart
        # for its kernel columns, each over the pixels that column reads inside the image,
        # not a tested read for every step (a select, then a broadcast from a register:
        # ResNet-18's 7×7 layers, whose tiles all have edges, took 0.70-0.75 of the time
        # that way; the whole model 0.94, its build 7.3 → 9.1 s)
        count = len(edges)
        acc = Buffer("acc", (count * jb, bo), "float32", "local")
        init = Seq(tuple(Store(acc, (Const(r), Const(0)), Broadcast(Const(0.0, "float32"), bo))
                         for r in range(count * jb)))
        i0, ky, i1 = Var("i0"), Var("ky"), Var("i1")
        # a block's channels in a rolled loop of `STEP_UNROLL` steps unrolled, the taps'
        # loops rolled: the kernel's code stays small
        unroll = next(u for u in (STEP_UNROLL, 2, 1) if bi % u == 0)

        def channels(kx: Expr, pixels: list[int]) -> Stmt:
            # the channels' loop at kernel column kx for ``pixels`` of the tile
            bvs = [Var(f"b{j}", "float32", bo) for j in range(jb)]
            avs = {t: Var(f"a{t}", "float32") for t in pixels}
            step: Stmt = Seq(tuple(
                Store(acc, (Const(t * jb + j), Const(0)), FMA(
                    Broadcast(avs[t], bo), bvs[j],
                    Load(acc, (Const(t * jb + j), Const(0)), bo)))
                for t in pixels for j in range(jb)))
            for t in reversed(pixels):
                y, xx = place(Const(t, INDEX))
                at = [img, i0, y * sh + ky * dh - top, xx * sw + kx * dw - left,
                      i1][:len(x.shape)]
                step = LetStmt(avs[t], x(*at), step)
            for j in reversed(range(jb)):
                step = LetStmt(bvs[j], Load(w.buffer, (ot * jb + j, i0, ky, kx, i1, Const(0)),
                                            bo), step)
            i1o, i1i = Var("i1o"), Var("i1i")
            return For(i1o, Const(0), Const(bi // unroll), For(
                i1i, Const(0), Const(unroll), LetStmt(i1, i1o * unroll + i1i, step),
                "unrolled"), "rolled")

        if any(edges):
            assert first is not None  # `_row` places a tile with edges at a fixed column
            # consecutive kernel columns that read the same pixels share a rolled loop
            groups: list[tuple[int, int, list[int]]] = []
            for col in range(kw):
                pixels = [t for t in range(count)
                          if 0 <= (first + t) * sw + col * dw - left < wd]
                if groups and groups[-1][2] == pixels:
                    groups[-1] = (groups[-1][0], col + 1, pixels)
                else:
                    groups.append((col, col + 1, pixels))
            parts = []
            for k0, k1, pixels in groups:
                if not pixels:
                    continue
                kx = Var("kx")
                parts.append(channels(Const(k0, INDEX), pixels) if k1 - k0 == 1
                             else For(kx, Const(k0), Const(k1 - k0), channels(kx, pixels),
                                      "rolled"))
            taps: Stmt = Seq(tuple(parts))
        else:
            kx = Var("kx")
            taps = For(kx, Const(0), Const(kw), channels(kx, list(range(count))), "rolled")
        reduction = For(i0, Const(0), Const(iblocks), For(ky, Const(rows[0]), Const(len(rows)),
                                                          taps, "rolled"), "rolled") \
            if rows else Seq(())
        out = Buffer("otile", (count * jb, bo), "float32", "local")
        spill = Seq(tuple(Store(out, (Const(r), Const(0)), Load(acc, (Const(r), Const(0)), bo))
                          for r in range(count * jb)))
        return Allocate(acc, Allocate(out, Seq((init, reduction, spill,
                                                _write_out(out, jb, place, write, img, ot)))))

    flops = nimg * oblocks * bo * oh * ow * iblocks * bi * kh * kw
    if flat:
        # one tile of the flattened pixels per iteration: full tiles, then the rest
        full, rest = divmod(oh * ow, t_max)
        tiles = full + (1 if rest else 0)
        u, k = Var("u"), Var("k")

        def flat_tile(first: Expr, count: int) -> Stmt:
            return tile(lambda t: ((first + t) // ow, (first + t) % ow), [False] * count, [0])

        body: Stmt = flat_tile(k * t_max, t_max) if full else flat_tile(Const(0, INDEX), rest)
        if full and rest:
            body = IfThenElse(Binary("lt", k, Const(full, INDEX)), body,
                              flat_tile(Const(full * t_max, INDEX), rest))
        nest = LetStmt(ot, u // tiles, LetStmt(k, u % tiles, body))
        units = otiles * tiles
    else:
        oy = Var("oy")
        per = -(-ow // -(-ow // t_max))

        body = _rows(oy, oh, windows_inside(h, sh, kh, dh, top, oh), kh,
                     lambda y, ys: _row(ow, per, windows_inside(wd, sw, kw, dw, left, ow),
                                        lambda first, edges: tile(
                                            lambda t: (y, first + t), edges, ys,
                                            int(first.value) if isinstance(first, Const)
                                            else None)),
                     lambda r: _taps(r, sh, kh, dh, top, h))
        u = Var("u")
        # u = (ot, oy): a tile of channels' rows together (its weight stays in cache)
        nest = LetStmt(ot, u // oh, LetStmt(oy, u % oh, body))
        units = otiles * oh
    kind = "parallel" if worth_parallel(flops, tgt.cores) and units > 1 else "serial"
    return For(img, Const(0), Const(nimg), For(u, Const(0), Const(units), nest, kind, chunks))


# steps of `conv_nchwc`'s reduction unrolled in its loop over a block's channels. Built and
# run both ways in one process (Emerald Rapids, 2 threads): MobileNetV2 at 224² compiled in
# 19.0 s with a block's 16 steps unrolled, 6.8 s with 4, 3.5 s rolled, and ran 2.65 /
# 2.66 / 2.75 ms; ResNet-18 17.2 / 4.7 / 2.6 s and 12.4 / 11.9 / 14.9 ms
STEP_UNROLL = 4
DEPTHWISE_TILE = 8  # output pixels `depthwise_nchwc` computes at once, by default
DEPTHWISE_TILES = (2, 4, 6, 8, 10, 12, 14, 16)  # the tuner's values


def _row_tile(ow: int, most: int) -> int:
    """The pixels of a row's tiles for tiles of at most ``most``: as even as they can be."""
    return -(-ow // -(-ow // min(ow, most)))


def depthwise_key(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int],
                  out_shape: Sequence[int]) -> str:
    """The key naming a blocked depthwise convolution's schedule in a tuning log (the shapes
    as the kernel sees them: x and out NCHW[b]c, w OIHW1i[b]o; padding top and left)."""
    return site_key("depthwise_nchwc", x=tuple(x_shape), w=tuple(w_shape),
                    strides=tuple(strides), padding=tuple(padding[:2]),
                    dilation=tuple(dilation), out=tuple(out_shape))


def _depthwise_parallel(out_shape: Sequence[int], w_shape: Sequence[int], target: Target
                        ) -> bool:
    # memory-bound: parallel from as little work as `conv_kernels.depthwise`'s planes
    nimg, blocks, oh, ow, b = (int(d) for d in out_shape)
    work = nimg * blocks * b * oh * ow * int(w_shape[2]) * int(w_shape[3])
    return work >= PARALLEL_MIN_ELEMENTS and target.cores > 1 and blocks * oh > 1


def depthwise_space(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
                    target: Target | None = None) -> Space:
    """The knobs of `depthwise_nchwc` (the rule's first): ``pixels``, the most a tile of a
    row holds (`DEPTHWISE_TILES` up to the row's width), and ``chunks``, the pieces a
    thread the parallel loop over (block, row) is cut into (not one). MobileNetV2's
    depthwise layers, memory-bound, ran within 1 % of each other in tiles of 4 to 16."""
    tgt = lowering_target(target)
    ow = int(out_shape[3])
    pixels = ordered(DEPTHWISE_TILE, [t for t in DEPTHWISE_TILES if t <= max(ow, 2)])
    chunks = ordered(CHUNKS_PER_THREAD, [2, 8, 16] if tgt.cores > 1 else [])
    parallel = _depthwise_parallel(out_shape, w_shape, tgt)

    def canonical(knobs: Mapping[str, Any]) -> Any:  # the tile a row takes; a serial loop
        return (_row_tile(ow, int(knobs["pixels"])), knobs["chunks"] if parallel else None)

    return Space(depthwise_key(x_shape, w_shape, strides, padding, dilation, out_shape),
                 (("pixels", pixels), ("chunks", chunks)), None, canonical)


def depthwise_schedule(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int],
                       out_shape: Sequence[int], target: Target | None = None
                       ) -> tuple[int, int, bool]:
    """(most pixels a tile, chunks, tuned) of `depthwise_nchwc`: the knobs the enclosing
    `overrides_scope` gives this site (a tuning log's), else the defaults."""
    default = (DEPTHWISE_TILE, CHUNKS_PER_THREAD)
    if current_overrides() is None:
        return (*default, False)
    knobs = override(depthwise_space(x_shape, w_shape, strides, padding, dilation, out_shape,
                                     target))
    if knobs is None:
        return (*default, False)
    chosen = (int(knobs["pixels"]), int(knobs["chunks"]))
    return (*chosen, chosen != default)


def depthwise_nchwc(x: BufferTensor, w: BufferTensor, strides: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
                    write: WriteFn, target: Target | None = None,
                    most_pixels: int = DEPTHWISE_TILE, chunks: int = CHUNKS_PER_THREAD) -> Stmt:
    """Depthwise convolution (module docstring): x and the result ``NCHW[b]c``, w
    ``OIHW1i[b]o``. A parallel iteration is one output row of one channel block, in tiles
    of at most ``most_pixels`` (`depthwise_schedule`'s; ``chunks`` the parallel loop's pieces
    a thread): the block's kernel taps are vectors held across the row, and
    each input vector a tile reads is loaded once for all the tile's pixels whose windows
    hold it (a stride-1 3×3 tile of 8 pixels: 30 loads for 72 FMAs). Rows and columns at
    the borders are laid out as in `conv_nchwc`, their taps outside the image left out."""
    tgt = lowering_target(target)
    nimg, blocks, oh, ow, b = (int(d) for d in out_shape)
    kh, kw = int(w.shape[2]), int(w.shape[3])
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left = int(padding[0]), int(padding[1])
    h, wd = int(x.shape[2]), int(x.shape[3])
    img, c0, oy = Var("n"), Var("c0"), Var("oy")
    zero = Const(0, INDEX)
    taps = {(ky, kx): Var(f"w{ky}_{kx}", "float32", b) for ky in range(kh) for kx in range(kw)}

    def tile(y: Expr, first: Expr, edges: list[bool], rows: list[int]) -> Stmt:
        count = len(edges)
        acc = Buffer("acc", (count, b), "float32", "local")
        sums: list[Expr | None] = [None] * count
        lets: list[tuple[Var, Expr]] = []
        for ky in rows:
            row = y * sh + (ky * dh - top)
            loaded: dict[int, Var] = {}
            for t in range(count):
                for kx in range(kw):
                    if edges[t] and not _column_inside(first, t, sw, kx * dw - left, wd):
                        continue
                    col = t * sw + kx * dw - left  # past the tile's first pixel's column
                    if col not in loaded:
                        loaded[col] = Var(f"x{ky}_{len(loaded)}", "float32", b)
                        lets.append((loaded[col], Load(x.buffer, (
                            img, c0, row, first * sw + col, zero), b)))
                    prod, wt, before = loaded[col], taps[(ky, kx)], sums[t]
                    sums[t] = Binary("mul", wt, prod) if before is None else FMA(wt, prod,
                                                                                 before)
        stores = [Store(acc, (Const(t), Const(0)),
                        total if total is not None else Broadcast(Const(0.0, "float32"), b))
                  for t, total in enumerate(sums)]
        compute: Stmt = Seq(tuple(stores))
        for v, e in reversed(lets):
            compute = LetStmt(v, e, compute)
        return Allocate(acc, Seq((compute, _write_out(acc, 1, lambda t: (y, first + t), write,
                                                      img, c0))))

    per = _row_tile(ow, most_pixels)
    body = _rows(oy, oh, windows_inside(h, sh, kh, dh, top, oh), kh,
                 lambda y, ys: _row(ow, per, windows_inside(wd, sw, kw, dw, left, ow),
                                    lambda first, edges: tile(y, first, edges, ys)),
                 lambda r: _taps(r, sh, kh, dh, top, h))
    for (ky, kx), v in reversed(list(taps.items())):
        body = LetStmt(v, Load(w.buffer, (c0, zero, Const(ky), Const(kx), zero, zero), b), body)
    u = Var("u")
    nest = LetStmt(c0, u // oh, LetStmt(oy, u % oh, body))
    kind = "parallel" if _depthwise_parallel(out_shape, w.shape, tgt) else "serial"
    return For(img, Const(0), Const(nimg), For(u, Const(0), Const(blocks * oh), nest, kind,
                                               chunks))


def _column_inside(first: Expr, t: int, stride: int, offset: int, size: int) -> bool:
    """Whether output column ``first + t`` (``first`` a constant: a border tile's) reads
    inside an axis of ``size`` at ``column · stride + offset``."""
    assert isinstance(first, Const)
    at = (int(first.value) + t) * stride + offset
    return 0 <= at < size
