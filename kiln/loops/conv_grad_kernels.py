"""The weight gradient of conv2d (nn.conv2d_backward_weight, NCHW / OIHW, one group, float32)
as one blocked GEMM over the forward convolution's phase planes.

``dW[o, c, ky, kx] = Σ over (n, y, x) of dY[n, o, y, x] · X[n, c, y·sh + ky·dh - top,
x·sw + kx·dw - left]``: a GEMM with M = output channels, N = the taps (c, ky, kx) and K = the
output pixels of all images, so that the sum over the batch runs in the micro-kernel's
registers (a GEMM per image added into dW was bound by that addition where an image has few
pixels: 7×7 × 512 channels, K = 49, dW 9.4 MB). Each image is copied once into the
zero-padded phase planes the forward implicit GEMM reads (kiln/loops/conv_kernels.py
`Planes`, or im2col rows for many stride phases), the images one after another: tap
(c, ky, kx) of pixel (n, y, x) is ``planes[tap(c, ky, kx) + offset(n, y, x)]``, with the
pixels' offsets in a table made once per call. B's packing (kiln/loops/gemm.py) reads, for
one pixel, every tap of a panel from that one offset; the planes' padding columns are never
read, so K has no padding. The adjoint is copied once into A's packed panels
(``dYp[tile][pixel][i]``, output channel ``tile·mr + i``), which the micro-kernel reads in
place, and the result goes out through the fused consumers from the GEMM's epilogue.

Where the input channels fill whole tiles of B and are few (`CHANNELS_LAST_MAX`), the data is
copied instead into a zero-padded channels-last image and the taps ordered (ky, kx, c): a
tile of B's row for one pixel is then nr consecutive floats of that image, which the
micro-kernel reads in place as it reads A, and nothing is packed per block. Where the
output channels are few (M = 64), packing B cost as much as the FMAs that use it.

With several images and a small gradient, the product's K is split between the threads
(`chunks`): each takes its share of the images, copies and packs them, and sums their pixels
into a gradient of its own, and the threads' gradients are added at the end. A split of M or
N had both threads stream all of the adjoint and the data from memory, and split 5 row tiles
or 5 column tiles 3 and 2. ResNet-18's layers at batch 8, 2 threads of a Sapphire
Rapids-class VM, both builds timed interleaved in one process, ms a call: the first layer
12.8 -> 10.3, 64 channels at 56² 8.4 -> 7.2, 128 at 28² 7.1 -> 6.5, the strided 64 -> 128
4.4 -> 3.9, the 1×1 downsampling 1.8 -> 1.1; the whole training step 365 -> 357.

It replaces the gradient written as a convolution of the transposed data with the
transposed adjoint as its kernel (kiln/op/nn/conv.py), which took three transposes and,
computed at the planes' width, mostly padding columns (a kernel of the output's size,
dilated by the stride): at ResNet-18's shapes, batch 8, 5 to 14 times slower.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.conv_kernels import PLANES_PARALLEL_MIN, Planes, conv_layout
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target
from kiln.loops.tunable import Space, overridden, site_key
from kiln.target import Target

# Up to this many input channels, B is read in place from a channels-last copy of the data
# (`_channels_last`); beyond, from packed panels of the phase planes. One thread, batch 8, on
# Zen 5 at ResNet-18's layers: 64 and 128 channels 1.1-1.3x faster in place, 256 even,
# 256 and 512 channels with 512 outputs 0.7-0.85x (a pixel's row of B is then 1-2 KiB from
# the next one's, and the packing's one copy per element is spread over 32 FMAs).
CHANNELS_LAST_MAX = 128


def usable(grad: Tensor, data: Tensor, groups: int, dtype: str) -> bool:
    """Whether `backward_weight` takes this call: float32 throughout, one group, no empty
    shape."""
    return (groups == 1 and g.supported(dtype) and grad.dtype == data.dtype == dtype
            and min(grad.shape + data.shape) > 0)


# A K block of the weight gradient's GEMM is at most this many L1s of B's micro-panel (kc
# pixels × nr taps): see `schedule`.
KC_L1S = 4


# The images' pixels are split between the threads (`chunks`) where each thread's share is
# at least this many pixels: the split adds a pass over the threads' gradients, a few loads
# per element against 2·K/threads FLOPs.
SPLIT_MIN_PIXELS = 512


def chunks(nimg: int, o: int, taps: int, k: int, target: Target) -> int:
    """Into how many chunks of images the product's K is split, one a thread: the target's
    cores, where the images share out evenly, each chunk has `SPLIT_MIN_PIXELS` pixels and
    the chunks' gradients fit L2 together; else 1 (the product is split over M or N)."""
    t = target.cores
    if t < 2 or nimg % t or k // t < SPLIT_MIN_PIXELS or t * o * taps * 4 > target.l2:
        return 1
    return t


def schedule(o: int, taps: int, k: int, target: Target) -> g.GemmSchedule:
    """The GEMM's knobs (M = output channels, N = taps, K = the pixels of all images): A is
    read in place, so a thread splitting N packs only its own panels of B. K is long and
    M, N small (ResNet's first layer: 64 × 147 × 100352 at batch 8), so each thread takes one
    block of N, not several: every block streams all of A (M × K) again.

    Where C, the weight gradient, does not fit in half of L2, K blocks up to `KC_L1S` L1s
    of B's micro-panel, not the half L1 of a GEMM's default: between two K blocks every tile
    of C goes out to a buffer and back, and C (up to 512 × 4608 floats, 9 MB) is then swept
    through memory again for each block, while a micro-panel past L1 still streams from L2
    in time. At ResNet-18's 512-channel 7x7 layer, batch 8 (K = 392 pixels), one block
    instead of four: 79-86 -> 111-113 GFLOP/s on one Sapphire Rapids core; the strided 256
    -> 512 layer 78-90 -> 102-114; 256 channels at 14x14 (K = 1568, two blocks instead of
    fourteen) 108-115 -> 112-117. A small C (the first layer's 64 × 147) keeps the default:
    its sweeps stay in cache, and longer blocks were slower there (65 -> 63)."""
    s = g.GemmSchedule.heuristic(1, o, taps, k, "float32", a_prepacked=True, target=target)
    if 2 * o * taps * 4 <= target.l2:
        return s
    cap = max(s.kc, KC_L1S * target.l1d // (s.nr * 4))
    fewest = -(-k // cap)
    # as many blocks as the fewest, or up to twice, where that makes them all of one length
    blocks = next((b for b in range(fewest, 2 * fewest + 1) if k % b == 0), fewest)
    kc = -(-k // blocks)
    return replace(s, kc=kc, unroll=g.unroll_for(kc))


def _rule(nimg: int, o: int, c: int, taps: int, k: int, tgt: Target
          ) -> tuple[bool, int, g.GemmSchedule]:
    """(whether B is read from a channels-last copy, the chunks of images, the GEMM's
    schedule): the rules' choices for these sizes."""
    split = chunks(nimg, o, taps, k, tgt)
    s = _split(schedule(o, taps, k // split, tgt), split, taps, tgt)
    if c % s.nr == 0 and c <= CHANNELS_LAST_MAX:
        return True, split, _split(g.GemmSchedule.heuristic(
            1, o, taps, k // split, "float32", a_prepacked=True, b_prepacked=True,
            target=tgt), split, taps, tgt)
    return False, split, s


def weight_key(grad_shape: Sequence[int], data_shape: Sequence[int], kernel: Sequence[int],
               strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> str:
    """The key naming a weight gradient's GEMM schedule in a tuning log (``padding``: top,
    left)."""
    return site_key("conv2d_backward_weight", grad=tuple(grad_shape), data=tuple(data_shape),
                    kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding[:2]),
                    dilation=tuple(dilation))


def weight_space(grad_shape: Sequence[int], data_shape: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 target: Target | None = None) -> Space:
    """The search space of `backward_weight`'s GEMM (its site): every knob of the GEMM's
    (kiln/loops/gemm.py `tile_space`) around the rules' schedule but the column tile ``nr``
    and the vector width, which choose between reading B from a channels-last copy and
    packing it (a tile of B is nr channels of one tap there). The knobs sum K in other
    blocks: results differ in the last bits, as the tuner's check allows."""
    tgt = lowering_target(target)
    nimg, o, oh, ow = (int(d) for d in grad_shape)
    c = int(data_shape[1])
    taps, k = c * int(kernel[0]) * int(kernel[1]), nimg * oh * ow
    _, split, rule = _rule(nimg, o, c, taps, k, tgt)
    key = weight_key(grad_shape, data_shape, kernel, strides, padding, dilation)
    knobs = g.tile_space(rule, split, o, taps, k // split, "float32", tgt, ("nr", "lanes"))
    return Space(key, knobs, g.tile_check(rule, "float32", tgt), g.tile_canonical(o, taps))


def backward_weight(grad: Tensor, data: Tensor, kernel: Sequence[int], strides: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], dtype: str,
                    target: Target | None = None) -> Tensor:
    """conv2d's weight gradient (O, C, kh, kw) of ``grad`` (N, O, OH, OW) and ``data``
    (N, C, H, W) as an extern tensor (see the module docstring); ``padding`` is (top, left)."""
    tgt = lowering_target(target)
    nimg, o, oh, ow = (int(d) for d in grad.shape)
    c = int(data.shape[1])
    kh, kw = int(kernel[0]), int(kernel[1])
    taps, k = c * kh * kw, nimg * oh * ow
    in_place, split, rule = _rule(nimg, o, c, taps, k, tgt)
    key = weight_key(grad.shape, data.shape, (kh, kw), strides, padding, dilation)
    s = overridden(replace(rule, key=key), lambda: weight_space(
        grad.shape, data.shape, (kh, kw), strides, padding, dilation, tgt), g.gemm_schedule)
    if in_place:
        return _channels_last(grad, data, (kh, kw), strides, padding, dilation, dtype, tgt,
                              split, s)
    geo = conv_layout(data.shape, (o, c, kh, kw), strides, padding, dilation,
                      (nimg, o, oh, ow))
    mr, kc = s.mr, s.kc
    kq = k // split  # the pixels of one chunk of images
    kpad = kc * -(-kq // kc)  # a chunk's rows of the adjoint's panels
    mt = -(-o // mr)
    cols = geo.cols
    per_image = geo.size(0)  # floats of one image's planes
    last = (nimg - 1) * per_image + (oh - 1) * cols + ow - 1  # the largest pixel offset
    planes = Buffer("planes", (max(nimg * per_image, last + geo.max_tap() + 1),), dtype,
                    "local")
    dyp = Buffer("dYp", (mt, kpad * split, mr), dtype, "local")
    pixels = Buffer("pixels", (k,), INDEX, "local")
    n, y, xx = Var("n"), Var("y"), Var("x")

    def tap_offset(col: Expr) -> Expr:
        if kh == kw == 1:
            return geo.tap(col, Const(0, INDEX), Const(0, INDEX))
        return geo.tap(col // (kh * kw), (col // kw) % kh, col % kw)

    def b(bt: Expr, kk: Expr, col: Expr) -> Expr:  # B[pixel kk of chunk bt, tap col]
        # the pixel's offset, the same for the whole row of B the packing copies (kk < kq:
        # the packing reads no K padding)
        return Load(planes, (tap_offset(col) + _pixel_offset(pixels, bt * kq + kk, last),))

    def a_panel(bt: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
        return Load(dyp, (tile, bt * kpad + kk, i))

    def unused(bt: Expr, i: Expr, p: Expr) -> Expr:
        raise AssertionError("the adjoint's panels are read in place")

    def at(i: Expr, j: Expr) -> tuple[Expr, ...]:  # dW's index of [o i, tap j]
        if kh == kw == 1:
            return (i, j, Const(0, INDEX), Const(0, INDEX))
        # (c, ky, kx) as j // (kh·kw), then r // kw and r % kw of the one r = j % (kh·kw):
        # the form in which the code generator joins the coordinates back into j
        # (`_rejoin`), so that a tile's row of dW, and the fused consumers' reads of
        # their operands at it (an optimizer's state), are vector accesses; as
        # (j // kw) % kh they were lane by lane, and a fused momentum update of a
        # 512x512x3x3 gradient took 3 ms more than the GEMM alone
        r = j % (kh * kw)
        return (i, j // (kh * kw), r // kw, r % kw)

    def emit(write: WriteFn) -> Stmt:
        pixel = (n * oh + y) * ow + xx
        # the images' planes one after another, and each pixel's offset in them
        if isinstance(geo, Planes):
            images: Stmt = For(n, Const(0), Const(nimg), geo.fill(
                data, n, planes, tgt, used=per_image, parallel=split == 1,
                at=n * per_image), "parallel" if split > 1 else "serial")
        else:  # im2col rows are filled from offset 0: one image at a time, then copied
            one = Buffer("image", (per_image,), dtype, "local")
            z = Var("z")
            copy = For(z, Const(0), Const(per_image), Store(planes, (n * per_image + z,), Load(
                one, (z,))), "vectorized")
            images = For(n, Const(0), Const(nimg), Allocate(one, Seq((
                geo.fill(data, n, one, tgt, parallel=split == 1), copy))),
                "parallel" if split > 1 else "serial")
        offsets = For(n, Const(0), Const(nimg), For(y, Const(0), Const(oh), For(
            xx, Const(0), Const(ow), Store(pixels, (pixel,), n * per_image + y * cols + xx),
            "vectorized")))
        parts = _parts(split, o, taps, dtype)
        prod = g.gemm(split, o, taps, kq, unused, b, _epilogue(write, at, parts), dtype, s,
                      a_panel=a_panel, target=tgt)
        return Allocate(planes, Allocate(dyp, Allocate(pixels, seq(
            images, offsets, *_zero_rows(dyp, kq, split), _adjoint(grad, dyp, kq, split, tgt),
            _summed(prod, write, at, parts)))))

    t = extern((o, c, kh, kw), dtype, emit)
    t.schedule = {**s.attrs(), "kernel": "conv2d backward weight",
                  "images": "split" if split > 1 else "serial"}
    return t


def _split(s: g.GemmSchedule, split: int, taps: int, tgt: Target) -> g.GemmSchedule:
    """The product's schedule ``s`` (one chunk's) with the chunks on the thread pool, each
    one a whole product: its columns in one block where a K block of them fits half of L2.
    A tuning log's knobs stay as they are."""
    if split == 1 or s.tuned:
        return s
    nc = s.nr * -(-taps // s.nr)
    return replace(s, parallel="batch", nc=nc if s.kc * nc * 4 <= tgt.l2 // 2 else s.nc)


def _parts(split: int, o: int, taps: int, dtype: str) -> Buffer | None:
    """The chunks' own gradients, where the product is split in chunks."""
    return Buffer("parts", (split, o, taps), dtype, "local") if split > 1 else None


def _epilogue(write: WriteFn, at: Callable[[Expr, Expr], tuple[Expr, ...]],
              parts: Buffer | None) -> Callable[[Expr, Expr, Expr, Expr], Stmt]:
    """The GEMM's store of C[i, j] for chunk bt: dW[at(i, j)] through the fused consumers,
    or, split in chunks, the chunk's own gradient (`_summed` adds them)."""
    if parts is None:
        return lambda bt, i, j, v: write(at(i, j), v)
    return lambda bt, i, j, v: Store(parts, (bt, i, j), v)


def _summed(prod: Stmt, write: WriteFn, at: Callable[[Expr, Expr], tuple[Expr, ...]],
            parts: Buffer | None) -> Stmt:
    """The product, then, split in chunks, their gradients added in chunk order (the same
    sums whatever the threads) and written to dW through the fused consumers."""
    if parts is None:
        return prod
    split, o, taps = parts.shape
    i, j = Var("i"), Var("j")
    total: Expr = Load(parts, (Const(0), i, j))
    for bt in range(1, split):
        total = Binary("add", total, Load(parts, (Const(bt), i, j)))
    kind = "parallel" if o * taps >= PARALLEL_MIN_ELEMENTS and o > 1 else "serial"
    added = For(i, Const(0), Const(o), For(j, Const(0), Const(taps), write(at(i, j), total),
                                           "vectorized"), kind)
    return Allocate(parts, Seq((prod, added)))


def _adjoint(grad: Tensor, dyp: Buffer, kq: int, split: int, tgt: Target) -> Stmt:
    """The adjoint copied into A's panels ``dyp[tile][chunk row][i]`` (output channel
    ``tile·mr + i``, each chunk's pixels from its own row ``chunk · kpad``), written in
    order (each panel's mr channels of a pixel side by side) and read as mr streams of
    pixels; the K padding is left as it is. Parallel over the images where the product is
    split in chunks (the threads' shares alike), else over the tiles."""
    nimg, o, oh, ow = (int(d) for d in grad.shape)
    mt, rows, mr = dyp.shape
    kpad = rows // split
    per = nimg // split
    n, y, xx, tile, i = Var("n"), Var("y"), Var("x"), Var("t"), Var("i")
    ch = tile * mr + i
    value = grad(n, ch if o % mr == 0 else Binary("min", ch, Const(o - 1, INDEX)), y, xx)
    if o % mr:
        value = Select(Binary("lt", ch, Const(o, INDEX)), value, Const(0.0, dyp.dtype))
    row = (n * oh + y) * ow + xx
    if split > 1:
        row = row + (n // per) * (kpad - kq)
    per_pixel = For(i, Const(0), Const(mr), Store(dyp, (tile, row, i), value), "unrolled")
    pixels = For(y, Const(0), Const(oh), For(xx, Const(0), Const(ow), per_pixel, "scalar"))
    if split > 1:
        return For(n, Const(0), Const(nimg), For(tile, Const(0), Const(mt), pixels),
                   "parallel")
    big = nimg * o * oh * ow >= PLANES_PARALLEL_MIN and tgt.cores > 1 and mt > 1
    return For(tile, Const(0), Const(mt), For(n, Const(0), Const(nimg), pixels),
               "parallel" if big else "serial")


def _channels_last(grad: Tensor, data: Tensor, kernel: tuple[int, int],
                   strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                   dtype: str, tgt: Target, split: int, s: g.GemmSchedule) -> Tensor:
    """`backward_weight` where the channels fill whole tiles of B (C a multiple of nr, every
    ResNet layer but the first): the data copied once into a zero-padded channels-last
    image, the taps ordered (ky, kx, c), so that B's row for one pixel is, tile by tile, nr
    consecutive floats of it, read in place by the micro-kernel like A's panels: no operand
    is packed (the planes' B took a copy per element, as many as the micro-kernel's FMAs
    where M is 64). ``split``: the chunks of images of `chunks`; ``s``: the GEMM's schedule
    (`_rule`'s, or a tuning log's)."""
    nimg, o, oh, ow = (int(d) for d in grad.shape)
    c = int(data.shape[1])
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilation
    top, left = int(padding[0]), int(padding[1])
    taps, k = c * kh * kw, nimg * oh * ow
    kq = k // split
    mr, nr, kc, lanes = s.mr, s.nr, s.kc, s.lanes or tgt.lanes(dtype)
    kpad, mt = kc * -(-kq // kc), -(-o // mr)
    hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    per_image = hp * wp * c
    last = (nimg - 1) * per_image + ((oh - 1) * sh * wp + (ow - 1) * sw) * c
    reach = ((kh - 1) * dh * wp + (kw - 1) * dw) * c + c + nr  # a tap's offset, bounded
    image = Buffer("nhwc", (max(nimg * per_image, last + reach),), dtype, "local")
    dyp = Buffer("dYp", (mt, kpad * split, mr), dtype, "local")
    pixels = Buffer("pixels", (kpad * split,), INDEX, "local")
    n, y, xx, ch = Var("n"), Var("y"), Var("x"), Var("c")

    def tap_base(t: Expr) -> Expr:  # where tile t's taps (ky, kx, c0 .. c0 + nr) start
        q, c0 = (t * nr) // c, (t * nr) % c
        return ((q // kw) * (dh * wp) + (q % kw) * dw) * c + c0

    def b_panel(bt: Expr, t: Expr, kk: Expr, lane: Expr) -> Expr:
        pixel = _pixel_offset(pixels, bt * kpad + kk, last)
        return Load(image, (pixel + tap_base(t) + lane,), lanes)

    def a_panel(bt: Expr, t: Expr, kk: Expr, row: Expr) -> Expr:
        return Load(dyp, (t, bt * kpad + kk, row))

    def unused(bt: Expr, r: Expr, q: Expr) -> Expr:
        raise AssertionError("both operands are read in place")

    def at(row: Expr, col: Expr) -> tuple[Expr, ...]:  # dW's index of [o row, tap col]
        q = col // c
        return (row, col % c, q // kw, q % kw)

    def emit(write: WriteFn) -> Stmt:
        spans = [None, None, oplib.window_span(oh, sh, kh, dh, top),
                 oplib.window_span(ow, sw, kw, dw, left)]
        value = oplib.guarded_read(data, [n, ch, y - top, xx - left], spans,
                                   Const(0.0, dtype))
        copy = For(n, Const(0), Const(nimg), For(y, Const(0), Const(hp), For(
            xx, Const(0), Const(wp), For(ch, Const(0), Const(c), Store(
                image, (n * per_image + (y * wp + xx) * c + ch,), value)))),
            "parallel" if nimg >= tgt.cores > 1 else "serial")
        # each pixel's offset in the image, a chunk's pixels from its own row (chunk ·
        # kpad); the K padding's are 0
        b, z = Var("b"), Var("z")
        row = (n * oh + y) * ow + xx
        if split > 1:
            row = row + (n // (nimg // split)) * (kpad - kq)
        pads = None
        if kpad > kq:
            pads = For(b, Const(0), Const(split), For(z, Const(kq), Const(kpad - kq), Store(
                pixels, (b * kpad + z,), Const(0, INDEX))))
        offsets = seq(pads, For(n, Const(0), Const(nimg), For(y, Const(0), Const(oh), For(
            xx, Const(0), Const(ow), Store(pixels, (row,), n * per_image + (
                y * (sh * wp) + xx * sw) * c), "vectorized"))))
        parts = _parts(split, o, taps, dtype)
        prod = g.gemm(split, o, taps, kq, unused, unused, _epilogue(write, at, parts), dtype,
                      s, a_panel=a_panel, b_panel=b_panel, target=tgt)
        return Allocate(image, Allocate(dyp, Allocate(pixels, seq(
            copy, offsets, *_zero_rows(dyp, kq, split), _adjoint(grad, dyp, kq, split, tgt),
            _summed(prod, write, at, parts)))))

    t = extern((o, c, kh, kw), dtype, emit)
    t.schedule = {**s.attrs(), "kernel": "conv2d backward weight", "input": "channels last",
                  "images": "split" if split > 1 else "serial"}
    return t


def _pixel_offset(pixels: Buffer, kk: Expr, last: int) -> Expr:
    """Pixel ``kk``'s offset from the table made once per call, clamped into [0, last] so
    that the verifier bounds the read (it cannot see the table's values)."""
    return Binary("max", Binary("min", Load(pixels, (kk,)), Const(last, INDEX)),
                  Const(0, INDEX))


def _zero_rows(buf: Buffer, start: int, split: int = 1) -> list[Stmt]:
    """Rows ``start`` on of each chunk's rows (``split`` chunks of equal length) of every
    panel of ``buf`` (tiles, rows, lanes) set to zeros."""
    tiles, rows, lanes = buf.shape
    per = rows // split
    if start >= per:
        return []
    t, b, r, i = Var("zt"), Var("zb"), Var("zr"), Var("zi")
    return [For(t, Const(0), Const(tiles), For(b, Const(0), Const(split), For(
        r, Const(start), Const(per - start), For(i, Const(0), Const(lanes), Store(
            buf, (t, b * per + r, i), Const(0.0, buf.dtype)), "vectorized"))))]
