"""Fast kernels of nn.conv2d (NCHW data, OIHW weight): an implicit GEMM, and a direct
vectorized kernel for depthwise convolution.

The float32 path of the operator's ``lower=`` rule (kiln/op/nn/conv.py).

- **Implicit GEMM.** For each image and channel group, ``out[o, (y, x)] = W[o, (c, ky, kx)] ·
  X[(c, ky, kx), (y, x)]``: M = output channels of the group, N = output pixels, K = input
  channels of the group × kernel taps. The im2col matrix X is never built, nor packed: the
  image is copied once into zero-padded phase planes (`Planes`) in which every tap is a
  shift, so the GEMM's micro-kernel (kiln/loops/gemm.py) loads its B vectors straight from
  them — no per-element index arithmetic, no bounds tests, no copy per block of the
  product. The weight is the A operand, packed at compile time when it is a constant
  (alter-layout), or B when pixels are the rows (`ConvPlan`); with more than `MAX_PHASES`
  stride phases the input is laid out as im2col rows instead (`Im2col`). The epilogue
  writes each pixel through the fused consumers. On one Zen 5 core (AVX-512), side by side,
  a 64-channel 56×56 3×3 convolution went from 52 GFLOP/s (B packed from the image element
  by element) to 186 (200–205 in quiet minutes).
- **Several images, the weight an input** (a training step's forward and backward-data
  convolutions): the kernel packs the weight once per call into the panels alter-layout makes
  of a constant one, and, where the images split evenly between the threads, runs each
  image's product on one thread (`_images_split`) instead of splitting every product in
  blocks. ResNet-18's layers at batch 8, 2 threads of a Sapphire Rapids-class VM, against
  the weight packed per block with the products split: 64 channels at 56² 204 → 255-289
  GFLOP/s (torch's oneDNN 181-198), 128 at 28² 263 → 309-330, 256 at 14² 241 → 312. On
  maps of at most `FOLD_MAX_PIXELS` pixels the images' pixels are instead the rows of one
  product (`_folded_plan`), so each panel of the weight serves every image: 512 at 7²
  170 → 264-288 (oneDNN 283-328).
- **Depthwise** (one input channel per group, MobileNet's 3×3): a matrix product has
  nothing to block there, so each (image, channel) plane is copied once into a zero-padded
  local plane, and every output row is a vectorized loop over pixels summing the kernel's
  taps (stride 2 reads every other element; LLVM vectorizes that with shuffles). On small
  maps, where a row is shorter than half a vector, the channel goes into its own `Planes`
  instead and the taps are summed in one vectorized loop over the plane's flat pixels
  (`depthwise_flat`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import InternalError
from kiln.ir.dtype import dtype_of
from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, WriteFn, extern
from kiln.loops.ir import (
    FMA,
    INDEX,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Const,
    Expr,
    For,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
    seq,
    subexpressions,
)
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target, worth_parallel
from kiln.loops.tunable import Space, current_overrides, override, site_key
from kiln.target import Target

PLANES_PARALLEL_MIN = 1 << 16  # floats of input planes worth a parallel copy
# `depthwise_flat` where this many output rows fit in a vector (7×7 maps on AVX-512: 44 ->
# 23 us for 960 channels; at 14×14, stride 1, the row kernel was faster)
DEPTHWISE_FLAT_ROWS = 2
CHUNKS_PER_THREAD = 4  # blocks of the product per thread, for the pool to balance
# ... where the blocks split N (output channels): each reads its own part of the weight and
# only the input again, so finer blocks cost little (`_finer`)
N_CHUNKS_PER_THREAD = 8


def conv2d(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], groups: int, out_shape: Sequence[int], dtype: str,
           target: Target | None = None) -> Tensor:
    """The convolution as an extern tensor (see the module docstring), scheduled for
    ``target`` (default: the lowering's)."""
    tgt = lowering_target(target)
    c = x.shape[1]
    cg = w.shape[1]
    if cg == 1 and groups == c and groups > 1:
        flat = (out_shape[3] * DEPTHWISE_FLAT_ROWS <= tgt.lanes(dtype)
                 and strides[0] * strides[1] <= MAX_PHASES)
        parallel = _depthwise_parallel(out_shape, w.shape, tgt)
        if not flat and direct_usable(x, w.shape, strides, dilation, tgt):
            t = extern(tuple(out_shape), dtype, lambda write: depthwise_direct(
                x, w, strides, padding, out_shape, write, tgt))
            t.schedule = {"kernel": "depthwise direct", "parallel": parallel}
            return t
        kernel = depthwise_flat if flat else depthwise
        t = extern(tuple(out_shape), dtype, lambda write: kernel(
            x, w, strides, padding, dilation, out_shape, write, tgt))
        t.schedule = {"kernel": "depthwise flat" if flat else "depthwise",
                      "parallel": parallel}
        return t
    return implicit_gemm(x, w, strides, padding, dilation, groups, out_shape, dtype,
                         target=tgt)


@dataclass(frozen=True)
class Planes:
    """The input of a convolution laid out so that every tap of the kernel is a shift.

    The zero-padded input is split by stride phase: padded row ``r`` and column ``c`` of
    channel ``ch`` go to plane ``(r % sh, c % sw)`` at ``[ch, r // sh, c // sw]``, every plane
    ``rows`` × ``cols`` (``cols`` = the output width plus the kernel's reach), stored
    ``[phase][channel][row][col]`` contiguously. Output pixel (y, x) is then column
    ``j = y·cols + x`` of the product, and tap (ch, ky, kx) reads ``planes[tap(ch, ky, kx) +
    j]``: for a fixed tap, consecutive pixels are consecutive floats, across row ends too. The
    ``cols - ow`` columns between two output rows are computed and thrown away (3 % of a
    56×56 3×3 convolution). With stride 1 there is one phase: the padded image itself.
    """

    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]
    padding: tuple[int, int]  # top, left
    out: tuple[int, int]

    @staticmethod
    def of(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int]) -> Planes:
        return Planes(int(x_shape[1]), int(x_shape[2]), int(x_shape[3]),
                      (int(w_shape[2]), int(w_shape[3])), (int(strides[0]), int(strides[1])),
                      (int(dilation[0]), int(dilation[1])), (int(padding[0]), int(padding[1])),
                      (int(out_shape[2]), int(out_shape[3])))

    @property
    def phases(self) -> int:
        return self.strides[0] * self.strides[1]

    @property
    def rows(self) -> int:
        return self.out[0] + (self.kernel[0] - 1) * self.dilation[0] // self.strides[0]

    @property
    def cols(self) -> int:
        return self.out[1] + (self.kernel[1] - 1) * self.dilation[1] // self.strides[1]

    @property
    def columns(self) -> int:
        """N of the product: output rows of ``cols`` pixels, the last one ``ow`` long."""
        return (self.out[0] - 1) * self.cols + self.out[1]

    @property
    def plane(self) -> int:
        return self.rows * self.cols

    @property
    def channel_stride(self) -> int:
        """How far apart two channels' taps are (within a phase)."""
        return self.plane

    def tap(self, channel: Expr, ky: Expr, kx: Expr) -> Expr:
        """Where tap (channel, ky, kx) of output pixel 0 is read."""
        (sh, sw), (dh, dw) = self.strides, self.dilation
        ry, rx = ky * dh if dh != 1 else ky, kx * dw if dw != 1 else kx
        if sh == sw == 1:
            return (channel * self.rows + ry) * self.cols + rx
        phase = (ry % sh) * sw + rx % sw
        return ((phase * self.channels + channel) * self.rows + ry // sh) * self.cols + rx // sw

    def max_tap(self) -> int:
        """A bound of `tap` taking each part at its largest on its own, as the loop-IR
        verifier bounds it (the phase and the row within it are not both largest at once)."""
        (sh, sw), (dh, dw), (kh, kw) = self.strides, self.dilation, self.kernel
        phase = (min(sh - 1, (kh - 1) * dh)) * sw + min(sw - 1, (kw - 1) * dw)
        return (((phase * self.channels + self.channels - 1) * self.rows + (kh - 1) * dh // sh)
                * self.cols + (kw - 1) * dw // sw)

    def size(self, slots: int) -> int:
        """Floats of the planes, with zeros after them for the reads of the last tile's
        padding columns (``slots``: the columns the product computes)."""
        return max(self.phases * self.channels * self.plane, self.max_tap() + slots)

    def fill(self, x: Callable[..., Expr], img: Expr, out: Buffer, target: Target,
             zero_first: bool = False, used: int | None = None, pad: int = 0,
             parallel: bool = True, at: Expr | int = 0) -> Stmt:
        """The planes of image ``img`` of ``x`` written to ``out``: every interior row a
        plain (vectorizable) copy, the borders and the tail zeros; no bounds test per element.
        With ``zero_first``, all of ``out`` is zeroed in one loop before the rows are copied
        (cheaper than per-row border loops for small planes). ``used``: the floats of ``out``
        that are ever read (default all), the rest left as it is. ``pad``: the value of the
        padding instead of zero (an int8 convolution's shifted zero). ``parallel=False``: the
        copy stays on one thread (the caller's loop over images is the parallel one). ``at``:
        where in ``out`` the planes start (several images' planes one after another)."""
        used = out.size if used is None else min(used, out.size)
        (sh, sw), (top, left) = self.strides, self.padding
        rows, cols, plane = self.rows, self.cols, self.plane
        ch = Var("ci")
        padding = Const(pad if pad else 0.0, out.dtype)

        def shifted(index: Expr) -> Expr:
            return index if isinstance(at, int) and at == 0 else at + index

        def zero(start: Expr, count: int) -> list[Stmt]:
            if count <= 0:
                return []
            i = Var("z")
            return [For(i, Const(0), Const(count), Store(out, (shifted(start + i),), padding),
                        "vectorized")]

        # the phases some tap reads (a 1×1 kernel of stride 2 reads one of the four): the
        # others are left unwritten, their place only read by the columns past the last
        # pixel, whose results are thrown away
        (dh, dw), (kh, kw) = self.dilation, self.kernel
        read = {((ky * dh) % sh, (kx * dw) % sw) for ky in range(kh) for kx in range(kw)}
        stmts: list[Stmt] = []
        for py in range(sh):
            for px in range(sw):
                if (py, px) not in read:
                    continue
                base = ((py * sw + px) * self.channels + ch) * plane
                # plane row pr holds input row pr·sh + py - top; column pc, pc·sw + px - left
                r0 = max(0, -((py - top) // sh))
                r1 = min(rows - 1, (self.height - 1 + top - py) // sh)
                c0 = max(0, -((px - left) // sw))
                c1 = min(cols - 1, (self.width - 1 + left - px) // sw)
                if r1 < r0 or c1 < c0:
                    stmts += [] if zero_first else zero(base, plane)
                    continue
                pr, i = Var("pr"), Var("px")
                row = base + pr * cols
                copy = For(i, Const(0), Const(c1 - c0 + 1), Store(out, (shifted(
                    row + (c0 + i)),), x(img, ch, pr * sh + (py - top), (c0 + i) * sw + (
                        px - left))), "vectorized")
                if zero_first:
                    stmts.append(For(pr, Const(r0), Const(r1 - r0 + 1), copy))
                    continue
                interior = For(pr, Const(r0), Const(r1 - r0 + 1), Seq(tuple(
                    zero(row, c0) + [copy] + zero(row + (c1 + 1), cols - 1 - c1))))
                stmts += zero(base, r0 * cols) + [interior] + zero(
                    base + (r1 + 1) * cols, (rows - 1 - r1) * cols)
        planes = self.phases * self.channels * plane
        kind = _copy_kind(planes, self.channels, target) if parallel else "serial"
        body = For(ch, Const(0), Const(self.channels), Seq(tuple(stmts)), kind)
        if zero_first:
            return Seq(tuple(zero(Const(0, INDEX), used) + [body]))
        return Seq(tuple([body] + zero(Const(planes, INDEX), used - planes)))


MAX_PHASES = 4  # stride phases beyond which the input is laid out as im2col (`Im2col`)


@dataclass(frozen=True)
class Im2col:
    """The input as an im2col matrix, one row of ``oh·ow`` pixels per tap (channel, ky, kx):
    for strides with more phases than `MAX_PHASES` (a ViT's 16×16 patches, stride 16: 256
    phases, each a set of loops to compile, where the patch rows are short anyway). The same
    interface as `Planes`: tap (c, ky, kx) of pixel j is at ``tap(c, ky, kx) + j``, with no
    padding columns (``cols`` = the output width), filled with a bounds test per element."""

    planes: Planes

    @property
    def out(self) -> tuple[int, int]:
        return self.planes.out

    @property
    def cols(self) -> int:
        return self.planes.out[1]

    @property
    def rows(self) -> int:
        return self.planes.out[0]

    @property
    def columns(self) -> int:
        return self.planes.out[0] * self.planes.out[1]

    @property
    def channel_stride(self) -> int:
        kh, kw = self.planes.kernel
        return kh * kw * self.columns

    def tap(self, channel: Expr, ky: Expr, kx: Expr) -> Expr:
        kh, kw = self.planes.kernel
        return ((channel * kh + ky) * kw + kx) * self.columns

    def max_tap(self) -> int:
        return (self.planes.channels * self.planes.kernel[0] * self.planes.kernel[1] - 1) \
            * self.columns

    def size(self, slots: int) -> int:
        return self.max_tap() + max(slots, self.columns)

    def fill(self, x: Callable[..., Expr], img: Expr, out: Buffer, target: Target,
             zero_first: bool = False, used: int | None = None,
             parallel: bool = True) -> Stmt:
        assert isinstance(x, Tensor)  # a whole input (one channel only for depthwise)
        g_ = self.planes
        (kh, kw), (sh, sw), (dh, dw), (top, left) = g_.kernel, g_.strides, g_.dilation, g_.padding
        oh, ow = g_.out
        ch, ky, kx, oy, ox = Var("ci"), Var("ky"), Var("kx"), Var("oy"), Var("ox")
        y, xx = oy * sh + (ky * dh - top), ox * sw + (kx * dw - left)
        spans = [None, None, oplib.window_span(oh, sh, kh, dh, top),
                 oplib.window_span(ow, sw, kw, dw, left)]
        value = oplib.guarded_read(x, [img, ch, y, xx], spans, Const(0.0, out.dtype))
        at = self.tap(ch, ky, kx) + oy * ow + ox
        body = For(ky, Const(0), Const(kh), For(kx, Const(0), Const(kw), For(
            oy, Const(0), Const(oh), For(ox, Const(0), Const(ow), Store(out, (at,), value),
                                         "vectorized"))))
        total = self.max_tap() + self.columns
        kind = _copy_kind(total, g_.channels, target) if parallel else "serial"
        z = Var("z")
        used = out.size if used is None else min(used, out.size)
        tail = For(z, Const(total), Const(used - total), Store(out, (z,), Const(
            0.0, out.dtype)), "vectorized")
        rows = For(ch, Const(0), Const(g_.channels), body, kind)
        return Seq((rows, tail)) if used > total else rows


def _copy_kind(floats: int, channels: int, target: Target) -> str:
    """The loop over channels that copies an image into its layout: parallel when large."""
    big = floats >= PLANES_PARALLEL_MIN and target.cores > 1 and channels > 1
    return "parallel" if big else "serial"


def conv_layout(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int],
                out_shape: Sequence[int]) -> Planes | Im2col:
    """How `implicit_gemm` lays out the input: phase planes, or im2col for many phases."""
    planes = Planes.of(x_shape, w_shape, strides, padding, dilation, out_shape)
    return planes if planes.phases <= MAX_PHASES else Im2col(planes)


TRANSPOSED_MIN_K = 1024  # K from which pixels may be the GEMM's rows (see `ConvPlan`)
ROWS_MIN_K = 128  # ... and below it, for a kernel of several taps, from this K (`_rows_pay`)


@dataclass(frozen=True)
class ConvPlan:
    """How `implicit_gemm` maps a convolution onto the GEMM (alter-layout packs for it).

    ``pixels="columns"``: out[o, j] = W[o, :] · planes[:, j], the weight the A operand (its
    panels ``lanes`` = mr output channels wide), pixels the columns at the planes' padded
    width. ``pixels="rows"``: outᵀ[j, o] = planesᵀ[j, :] · Wᵀ[:, o], pixels the rows in tiles of
    ``mr`` that never cross an output row unevenly (``rows_per_tile`` whole rows, or
    ``tiles_per_row`` tiles in one), so no padding column is computed, and the weight the B
    operand (panels ``lanes`` = nr channels wide). The second wins on small images with many
    channels (7×7 × 512: 49 of the 64 columns of the first are real pixels, every row of
    the second); its epilogue writes channels apart, which costs only where K is large.
    """

    pixels: str
    schedule: g.GemmSchedule
    rows_per_tile: int = 1
    tiles_per_row: int = 1

    @property
    def lanes(self) -> int:
        """Output channels per panel of the packed weight."""
        return self.schedule.mr if self.pixels == "columns" else self.schedule.nr


def conv_plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], groups: int,
              out_shape: Sequence[int], prepacked: bool = True,
              target: Target | None = None, serial: bool = False) -> ConvPlan:
    """The plan of `implicit_gemm` for these shapes (see `ConvPlan`).

    Neither operand is copied per block when the weight is prepacked (the planes are read
    in place), so the parallel loop runs over whichever of M and N has more tiles, in blocks
    small enough that the pool hands out several per thread: a thread that is descheduled
    then holds up a small share, not half of the product.

    The plan's GEMM knobs are those the enclosing `overrides_scope` gives its key
    (`conv_key`: a tuning log's, checked against `conv_space`), else the rule's.
    """
    tgt = lowering_target(target)
    base = _heuristic_plan(x_shape, w_shape, strides, padding, dilation, groups, out_shape,
                           prepacked, tgt, serial)
    key = conv_key(x_shape, w_shape, strides, padding, dilation, groups, out_shape, prepacked)
    base = replace(base, schedule=replace(base.schedule, key=key))
    if current_overrides() is None:
        return base
    knobs = override(_plan_space(base, x_shape, w_shape, groups, out_shape, prepacked, tgt,
                                 strides, padding, dilation))
    return base if knobs is None else replace(base, schedule=g.gemm_schedule(base.schedule,
                                                                             knobs))


def conv_key(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int], groups: int,
             out_shape: Sequence[int], prepacked: bool) -> str:
    """The key naming a convolution's implicit GEMM in a tuning log (padding: top, left)."""
    return site_key("conv2d", x=tuple(x_shape), w=tuple(w_shape), strides=tuple(strides),
                    padding=tuple(padding[:2]), dilation=tuple(dilation), groups=groups,
                    out=tuple(out_shape), prepacked=prepacked)


def _plan_space(plan: ConvPlan, x_shape: Sequence[int], w_shape: Sequence[int], groups: int,
                out_shape: Sequence[int], prepacked: bool, target: Target,
                strides: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int]) -> Space:
    s = plan.schedule
    _, cg, kh, kw = w_shape
    k, og = cg * kh * kw, int(out_shape[1]) // groups
    oh, ow = int(out_shape[2]), int(out_shape[3])
    if plan.pixels == "rows":
        m, n = oh * ow, og
        fixed: tuple[str, ...] = ("mr",)  # whole output rows per tile (`_pixel_rows`)
    else:
        geo = conv_layout(x_shape, w_shape, strides, padding, dilation, out_shape)
        m, n, fixed = og, geo.columns, ()
    knobs = g.tile_space(s, groups, m, n, k, "float32", target, (*fixed, "lanes"))
    if prepacked:
        # alter-layout pads K to k_blocking's blocks: a K block whose blocks cover that
        # length exactly reads the same panels (576 = 3 × 192 = 4 × 144 = 6 × 96)
        kp = s.kc * -(-k // s.kc)
        knobs = tuple((name, tuple(v for v in values if name != "kc" or v * -(-k // v) == kp))
                      for name, values in knobs)
    key = s.key or conv_key(x_shape, w_shape, strides, padding, dilation, groups, out_shape,
                            prepacked)
    return Space(key, knobs, g.tile_check(s, "float32", target), g.tile_canonical(m, n))


def conv_space(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], groups: int,
               out_shape: Sequence[int], prepacked: bool = True,
               target: Target | None = None) -> Space:
    """The search space of a convolution's implicit GEMM (`conv_plan`'s site): the knobs
    of its GEMM (kiln/loops/gemm.py `tile_space`) for the plan the rule picks; pixels as
    rows keep their tile height (whole output rows), a prepacked weight its K blocking."""
    tgt = lowering_target(target)
    plan = _heuristic_plan(x_shape, w_shape, strides, padding, dilation, groups, out_shape,
                           prepacked, tgt)
    return _plan_space(plan, x_shape, w_shape, groups, out_shape, prepacked, tgt, strides,
                       padding, dilation)


def _heuristic_plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], groups: int,
                    out_shape: Sequence[int], prepacked: bool, tgt: Target,
                    serial: bool = False) -> ConvPlan:
    geo = conv_layout(x_shape, w_shape, strides, padding, dilation, out_shape)
    _, cg, kh, kw = w_shape
    og, k = int(out_shape[1]) // groups, cg * kh * kw
    oh, ow = geo.out
    threads = 1 if serial else None
    rows = _pixel_rows(oh, ow, g.register_tile(tgt)[0])
    if rows is not None and prepacked and _rows_pay(k, og, kh, kw, tgt):
        mr, per_tile, per_row = rows
        lanes = tgt.lanes("float32")
        nr = 2 * lanes
        s = g.GemmSchedule.heuristic(groups, oh * ow, og, k, "float32", threads,
                                     b_prepacked=True, target=tgt)
        s = replace(s, mr=mr, nr=nr, mc=mr * max(1, s.mc // s.mr), nc=nr * max(1, s.nc // s.nr))
        return ConvPlan("rows", s if serial else _finer(s, oh * ow, og, tgt), per_tile, per_row)
    m, n = og, geo.columns
    s = g.GemmSchedule.heuristic(groups, m, n, k, "float32", threads, a_prepacked=prepacked,
                                 b_prepacked=True, target=tgt)
    if serial or (not prepacked and s.parallel == "m"):
        return ConvPlan("columns", s)  # each M block packs its own share of the weight
    return ConvPlan("columns", _finer(s, m, n, tgt))


def _rows_pay(k: int, og: int, kh: int, kw: int, target: Target) -> bool:
    """Whether pixels as the GEMM's rows (`ConvPlan`) beat pixels as columns: where K is
    large (`TRANSPOSED_MIN_K`), or for a kernel of several taps with K of at least
    `ROWS_MIN_K` whose channels fill their panels of B at least 7/8. Its epilogue writes
    each pixel's channels apart, which a short K does not pay for.

    Measured in the models (`exe.profile`, 2 threads, a Sapphire Rapids-class VM), rows
    against columns, µs a call: ResNet-18's 7×7 stem 994 against 1354, its 64-channel 3×3
    864 against 1145, the stride-2 3×3 to 128 channels 551 against 679 (a run's kernels
    9.8 → 8.4 ms). But every 1×1 of MobileNetV2 was slower as rows (24→144 at 56²: 274
    against 212; 32→192 at 28²: 123 against 72), as was its 3→32 3×3 stem (K = 27: 342
    against 319)."""
    if k >= TRANSPOSED_MIN_K:
        return True
    nr = 2 * target.lanes("float32")
    full = 8 * og >= 7 * (-(-og // nr) * nr)
    return kh * kw > 1 and k >= ROWS_MIN_K and full


def _finer(s: g.GemmSchedule, m: int, n: int, target: Target) -> g.GemmSchedule:
    """``s`` parallel over the longer of M and N, in about `CHUNKS_PER_THREAD` blocks per
    thread, or `N_CHUNKS_PER_THREAD` for blocks of N. ResNet-18's 512-channel 7×7 layers at
    batch 1, 2 threads, interleaved: blocks of 32 channels against 64, 3×3 stride 1
    0.72–0.77 → 0.69–0.76 ms, stride 2 0.41–0.44 → 0.39 (a K block's panel of 32 channels,
    256 × 32 floats, is 32 KiB: L1 holds it while the block's pixel tiles pass over it, and
    not two). Blocks of M each read all of B, and finer ones were slower: the 128-channel
    28² 0.60 → 0.66. Each block reads all of the operand along the other axis (B, K×N, for blocks
    of M), so splitting the longer axis has every block read the smaller operand: pixels as
    rows of a 14×14 map with 256 channels (M = 196, N = 256) split over M read the whole
    2.4 MB weight in each of 7 blocks, past L2, and ran 10-15 % slower than split over N."""
    if s.parallel not in ("m", "n"):
        return s
    mt, nt = -(-m // s.mr), -(-n // s.nr)
    chunks = CHUNKS_PER_THREAD * target.cores
    threads = max(target.cores, 1)
    if (n >= m and nt >= threads) or mt < threads:
        chunks = N_CHUNKS_PER_THREAD * target.cores
        return replace(s, parallel="n", nc=max(1, min(s.nc // s.nr, -(-nt // chunks))) * s.nr)
    return replace(s, parallel="m", mc=max(1, min(s.mc // s.mr, -(-mt // chunks))) * s.mr)


def _pixel_rows(oh: int, ow: int, mr_max: int) -> tuple[int, int, int] | None:
    """(mr, whole output rows per tile, tiles per output row) for pixels as the GEMM's rows:
    a tile of ``q`` whole rows (``q·ow`` ≤ mr_max, the fewest rows wasted at the end), or
    ``ow`` split evenly into tiles of mr_max/2 to mr_max pixels; None if neither fits."""
    if ow <= mr_max:
        best = min(range(1, mr_max // ow + 1), key=lambda q: (-(-oh // q) * q - oh, -q))
        return best * ow, best, 1
    for mr in range(mr_max, max(3, mr_max // 2) - 1, -1):
        if ow % mr == 0:
            return mr, 1, ow // mr
    return None


def implicit_gemm(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], groups: int, out_shape: Sequence[int], dtype: str,
                  w_packed: Buffer | None = None, target: Target | None = None) -> Tensor:
    """conv2d as a batch (groups) of GEMMs per image reading the input's phase planes in
    place (see `Planes`, `ConvPlan` and the module docstring).

    ``w_packed``, when given, holds the weight already in panels, (groups, tiles, K padded,
    lanes) as kiln/op/nn/packed.py lays it out, for the plan `conv_plan` makes; it is read in
    place (when its layout is that plan's; else ``w`` is read and packed as usual).
    """
    tgt = lowering_target(target)
    nimg, oc, oh, ow = out_shape
    _, cg, kh, kw = w.shape
    og = oc // groups
    geo = conv_layout(x.shape, w.shape, strides, padding, dilation, out_shape)
    k = cg * kh * kw
    plan = conv_plan(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                     prepacked=w_packed is not None, target=tgt)
    schedule = plan.schedule
    mr, nr, kc = schedule.mr, schedule.nr, schedule.kc
    lanes = schedule.lanes or tgt.lanes(dtype)
    if w_packed is not None and w_packed.shape != (groups, -(-og // plan.lanes),
                                                   kc * -(-k // kc), plan.lanes):
        w_packed = None
        plan = conv_plan(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                         prepacked=False, target=tgt)
    # A weight that is an input (training) and serves several images is packed once per
    # call into the panels alter-layout makes of a constant one; each image's product then
    # reads it in place, and may take pixels as rows.
    pack_here = w_packed is None and nimg > 1
    if pack_here:
        plan = conv_plan(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                         prepacked=True, target=tgt)
    # Small maps with several images: the images' pixels are the rows of one product, so
    # that each panel of the weight serves all of them (`_folded_plan`)
    folded = _folded_plan(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                          tgt) if w_packed is not None or pack_here else None
    if folded is not None:
        plan = folded
    # Images split evenly between the threads: each image's product on one thread, not
    # every product split in blocks (64 channels are 5 row tiles: 3 and 2 per thread).
    by_image = folded is None and _images_split(nimg, tgt.cores) and worth_parallel(
        nimg * oc * oh * ow * k, tgt.cores)
    if by_image:
        plan = conv_plan(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                         prepacked=w_packed is not None or pack_here, target=tgt, serial=True)
        plan = replace(plan, schedule=replace(plan.schedule, parallel=None))
    # A 1×1 convolution of stride 1 without padding: the image is B as it is (`_pointwise`)
    pointwise = _pointwise(w.shape, strides, padding, plan) and folded is None
    if pointwise:
        plan = replace(plan, schedule=_pointwise_schedule(
            plan.schedule, groups, og, oh * ow, k, w_packed is not None or pack_here, by_image,
            tgt))
    schedule = plan.schedule
    mr, nr, kc = schedule.mr, schedule.nr, schedule.kc
    nk = -(-k // kc)  # the product's K blocks (a tuned kc may differ from k_blocking's)
    if pack_here:
        w_packed = Buffer("wpack", (groups, -(-og // plan.lanes), kc * nk, plan.lanes), dtype,
                          "local")
    rows = plan.pixels == "rows"
    exact = kc * nk == k
    img = Var("n")

    def taps(p: Expr) -> tuple[Expr, Expr, Expr]:
        if kh == kw == 1:
            return p, Const(0, INDEX), Const(0, INDEX)
        return p // (kh * kw), (p // kw) % kh, p % kw

    def weight(bt: Expr, o: Expr, p: Expr) -> Expr:  # W[group bt, channel o, (c, ky, kx) p]
        ci, ky, kx = taps(p)
        return w(bt * og + o, ci, ky, kx)

    def tap_of(kk: Expr) -> Expr:  # where (c, ky, kx) = kk of group 0 reads pixel 0
        ci, ky, kx = taps(kk if exact else g.index_min(kk, k - 1))
        return geo.tap(ci, ky, kx)

    # The micro-kernel's step p reads tap kk: its offset from a table made once per call
    # (the div/mod chain of (c, ky, kx) cost some 50 integer instructions a step beside 28
    # FMAs on a 7×7 stride-2 kernel). The offset taken modulo ``span``, a power of two above
    # every offset, changes nothing and lets the verifier bound the read: one `and` a step
    # (a clamp to [0, max] was five instructions, beside 12 FMAs on AVX2); the planes are
    # allocated, not filled, that far. A group's channels are its first channel's plus a
    # stride.
    tap_table = Buffer("taps", (kc * nk,), INDEX, "local")
    group_stride = cg * geo.channel_stride
    high = geo.max_tap() - (groups - 1) * group_stride
    span = 1 << max(high, 1).bit_length()
    reach_taps = span - 1 + (groups - 1) * group_stride  # what the verifier bounds a tap by

    def tap_at(bt: Expr, kk: Expr) -> Expr:
        at: Expr = Binary("floormod", Load(tap_table, (kk,)), Const(span, INDEX))
        return at if groups == 1 else at + bt * group_stride

    def packed(bt: Expr, tile: Expr, kk: Expr, c: Expr, width: int = 1) -> Expr:
        assert w_packed is not None
        return Load(w_packed, (bt, tile, kk, c), width)

    image_floats = geo.size(0)  # one image's planes, where the images are folded

    def pixel_offset(tile: Any, i: int) -> Any:
        """Where row i of M tile ``tile`` (pixels as rows) is in a plane (an index
        expression, or an int for an int tile); folded, in its image's planes."""
        if folded is not None:
            r = tile * plan.rows_per_tile + i // ow  # a row of all the images' output rows
            return (r // oh) * image_floats + (r % oh) * geo.cols + i % ow
        if plan.tiles_per_row == 1:
            q = plan.rows_per_tile
            return (tile * q + i // ow) * geo.cols + i % ow
        per = plan.tiles_per_row
        return (tile // per) * geo.cols + (tile % per) * mr + i

    if folded is not None:
        last = -(-(nimg * oh * ow) // mr) - 1  # its rows past the last image are read too
        reach = max(pixel_offset(last, i) for i in range(mr))
        used = image_floats
        size = max(nimg * image_floats, reach_taps + reach + 1)
    elif rows:
        last = -(-(oh * ow) // mr) - 1  # the last M tile's rows past the image are read too
        reach = max(pixel_offset(last, i) for i in range(mr))
        used = max(geo.size(0), geo.max_tap() + reach + 1)
        size = max(used, reach_taps + reach + 1)
    else:
        slots = -(-geo.columns // nr) * nr  # the last tile's padding columns too
        used = geo.size(slots)
        size = max(used, reach_taps + slots)
    planes = Buffer("planes", (size,), dtype, "local")

    def guard_k(kk: Expr, value: Expr, width: int) -> Expr:
        if exact:
            return value
        # the K padding of the last block reads zeros, whatever the data
        zero: Expr = Const(0.0, dtype)
        cond: Expr = Binary("lt", kk, Const(k, INDEX))
        if width > 1:
            cond, zero = Broadcast(cond, width), Broadcast(zero, width)
        return Select(cond, value, zero)

    def plane_columns(bt: Expr, tile: Expr, kk: Expr, c: Expr) -> Expr:
        # pixels as columns: nr/L vectors of consecutive pixels of one tap
        return guard_k(kk, Load(planes, (tap_at(bt, kk) + tile * nr + c,), lanes), lanes)

    def plane_rows(bt: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
        # pixels as rows: one pixel of one tap, broadcast by the micro-kernel
        assert isinstance(i, Const)
        return guard_k(kk, Load(planes, (tap_at(bt, kk) + pixel_offset(tile, int(i.value)),)), 1)

    def emit(write: WriteFn) -> Stmt:
        # Pixels as rows with fused consumers on a large map: the product's results go to a
        # local image first, then through the consumers channel by channel (`_staged`)
        staged = Buffer("staged", (oc, oh * ow), dtype, "local") if (
            rows and by_image and oh * ow >= STAGE_MIN_PIXELS
            and _reads_maps(write, dtype)) else None

        def put(bt: Expr, i: Expr, j: Expr, v: Expr) -> Stmt:
            if folded is not None:  # i a pixel of all the images' outputs
                return write((i // (oh * ow), bt * og + j, (i % (oh * ow)) // ow, i % ow), v)
            if staged is not None:
                return Store(staged, (bt * og + j, i), v)
            if rows:  # i a pixel of the output, j a channel of the group
                return write((img, bt * og + j, i // ow, i % ow), v)
            # pixels as columns, at the planes' width: ``grid`` below, unless it is the
            # output's (the address of (j // ow, j % ow) is j again: vector stores)
            if oh == 1:
                return write((img, bt * og + i, Const(0, INDEX), j), v)
            return write((img, bt * og + i, j // geo.cols, j % geo.cols), v)

        grid = None
        if not rows and geo.cols != ow:
            grid = g.Grid(geo.cols, ow, oh, lambda bt, i, y, xx, v: write(
                (img, bt * og + i, y, xx), v))

        def unused(bt: Expr, p: Expr, j: Expr) -> Expr:
            raise InternalError("conv2d's GEMM reads the planes in place")

        if rows:
            prod = g.gemm(groups, (nimg if folded is not None else 1) * oh * ow, og, k, unused,
                          lambda bt, p, j: weight(bt, j, p), put, dtype, schedule,
                          a_panel=plane_rows,
                          b_panel=(lambda bt, t, kk, c: packed(bt, t, kk, c, lanes))
                          if w_packed is not None else None, target=tgt,
                          down_columns="unrolled" if folded is not None else True)
        elif pointwise:  # B packed per block from the image (pixel j at row j // ow)
            prod = g.gemm(groups, og, oh * ow, k, weight,
                          lambda bt, p, j: x(img, bt * cg + p, j // ow, j % ow), put, dtype,
                          schedule, a_panel=packed if w_packed is not None else None,
                          target=tgt)
        else:
            prod = g.gemm(groups, og, geo.columns, k, weight, unused, put, dtype, schedule,
                          a_panel=packed if w_packed is not None else None,
                          b_panel=plane_columns, target=tgt, grid=grid)
        if pointwise:  # the image is read as it is: no planes, no table of taps
            images: Stmt = For(img, Const(0), Const(nimg), prod,
                               "parallel" if by_image else "serial")
        elif folded is not None:
            assert isinstance(geo, Planes)
            big = tgt.cores > 1 and nimg * image_floats >= PLANES_PARALLEL_MIN
            images = Allocate(planes, Seq((For(img, Const(0), Const(nimg), geo.fill(
                x, img, planes, tgt, used=used, parallel=False, at=img * image_floats),
                "parallel" if big else "serial"), prod)))
        else:
            if staged is not None:
                prod = Allocate(staged, Seq((prod, _staged(staged, img, ow, write))))
            images = For(img, Const(0), Const(nimg), Allocate(planes, Seq((
                geo.fill(x, img, planes, tgt, used=used, parallel=not by_image), prod))),
                "parallel" if by_image else "serial")
        kk = Var("kk")
        table = None if pointwise else For(kk, Const(0), Const(kc * nk), Store(
            tap_table, (kk,), tap_of(kk)))
        pack = None
        if pack_here:
            assert w_packed is not None
            pack = _pack_weight(w_packed, weight, og, k)
        body = seq(table, pack, images)
        if pack_here:
            assert w_packed is not None
            body = Allocate(w_packed, body)
        return body if pointwise else Allocate(tap_table, body)

    t = extern(tuple(out_shape), dtype, emit)
    t.schedule = {**schedule.attrs(), "pixels": plan.pixels,
                  "prepacked": w_packed is not None and not pack_here,
                  "weight": "packed per call" if pack_here else "packed ahead"
                  if w_packed is not None else "packed per block",
                  "images": "rows" if folded is not None else "parallel" if by_image
                  else "serial",
                  "input": "packed per block" if pointwise else "im2col"
                  if isinstance(geo, Im2col) else "phase planes"}
    return t


# Pixels as rows, the fused consumers run on a staged copy of an image's results from this
# many output pixels (`_staged`).
STAGE_MIN_PIXELS = 256


def _reads_maps(write: WriteFn, dtype: str) -> bool:
    """Whether a consumer fused after the kernel (in ``write``) reads a tensor along the
    output's pixels (a residual, a mask), not only per channel (a bias)."""
    y, x = Var("y"), Var("x")
    zero = Const(0, INDEX)
    stmt = write((zero, zero, y, x), Var("probe", dtype))
    values: list[Expr] = []
    while isinstance(stmt, LetStmt):
        values.append(stmt.value)
        stmt = stmt.body
    if not isinstance(stmt, Store):
        return False
    return any(isinstance(e, Load) and e.buffer is not stmt.buffer
               and any(v is y or v is x for i in e.indices for v in subexpressions(i))
               for value in (*values, stmt.value) for e in subexpressions(value))


def _staged(staged: Buffer, img: Expr, ow: int, write: WriteFn) -> Stmt:
    """Image ``img``'s results, staged as (channel, pixel), through the fused consumers one
    channel at a time, along its pixels.

    Pixels as rows, a tile's epilogue writes 14 pixels of each of 32 channels: with a
    consumer that reads a tensor of the output's shape (the relu's mask in the data adjoint
    of a training step), that is 32 streams read and 32 written, more than the prefetchers
    follow. ResNet-18's data adjoint of the 64-channel 56² layer at batch 8 with
    ``where(x > 0, conv, 0)`` fused, both builds interleaved in one process: 6.88 -> 6.05 ms
    at 2 threads, 14.2 -> 11.9 at 1 (the convolution alone: 5.4-5.8); 128 channels at 28²
    even. Only where each image runs on one thread (the staged pass is that thread's) and a
    consumer reads a map: at batch 1 (ResNet-18's bias, relu and residual), staging was 4 %
    slower."""
    c, p = Var("c"), Var("p")
    channels, pixels = staged.shape
    return For(c, Const(0), Const(channels), For(p, Const(0), Const(pixels), write(
        (img, c, p // ow, p % ow), Load(staged, (c, p))), "vectorized"))


def _pointwise(w_shape: Sequence[int], strides: Sequence[int], padding: Sequence[int],
               plan: ConvPlan) -> bool:
    """Whether `implicit_gemm` takes the image itself as B: a 1×1 kernel of stride 1 without
    padding, pixels as columns. Its channel planes are then B's rows, already in place, so
    the GEMM packs B per block from the image like any matrix (`g.gemm`'s ``pack_b``) instead
    of reading an identical copy in `Planes` whose every K step is a row 12 KB away (144
    rows of a 56×56 map: more streams than the prefetcher follows). The copy was a parallel
    loop of its own, too: a second fork and join per call. MobileNetV2's 1×1 layers, two
    threads of a Sapphire Rapids-class VM, µs a call against the planes: 144→24 at 56²
    240 → 122, 24→144 155 → 118, 576→96 at 14² 150 → 110, 384→64 83 → 54; at 7² about
    even (960→320 162 against 170, 320→1280 190 against 178); the whole model
    (`benchmarks/peers.py`'s MobileNetV2, both builds timed interleaved in one process)
    5.40 → 4.96 ms."""
    _, _, kh, kw = w_shape
    return (kh == kw == 1 and tuple(strides) == (1, 1) and not any(padding)
            and plan.pixels == "columns")


def _pointwise_schedule(s: g.GemmSchedule, groups: int, og: int, n: int, k: int,
                        prepacked: bool, by_image: bool, tgt: Target) -> g.GemmSchedule:
    """``s`` (the columns plan's tile, which a prepacked weight's panels follow) with the
    blocks and parallel loop of a product whose B is packed per block: over N, each block
    packs only its own columns. A tuned schedule stays as the tuning log gives it."""
    if s.tuned:
        return s
    h = g.GemmSchedule.heuristic(groups, og, n, k, "float32", 1 if by_image else None,
                                 a_prepacked=prepacked, b_prepacked=False, target=tgt)
    s = replace(s, nc=h.nc, parallel=None if by_image else h.parallel)
    return _finer(s, og, n, tgt) if s.parallel == "n" else s


FOLD_MAX_PIXELS = 64  # output pixels of an image up to which the images are folded


def _folded_plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], groups: int,
                 out_shape: Sequence[int], tgt: Target) -> ConvPlan | None:
    """Pixels as rows with every image's pixels in one product (the images' planes one after
    another, a tile of whole output rows of any image), for a packed weight where an image
    has at most `FOLD_MAX_PIXELS` pixels and pixels as rows pay (`_rows_pay`); else None.
    Image by image, a 7×7 map is 49 rows, one or two tiles: each panel of the weight (9.4 MB
    at 512 channels) streamed from memory for a few FMAs per element, every image again.
    ResNet-18's 512-channel 3×3 layer, batch 8, 2 threads of a Sapphire Rapids-class VM:
    234-250 -> 264-274 GFLOP/s (torch's oneDNN 283-288)."""
    nimg, oc, oh, ow = (int(d) for d in out_shape)
    _, cg, kh, kw = w_shape
    og, k = oc // groups, cg * kh * kw
    geo = conv_layout(x_shape, w_shape, strides, padding, dilation, out_shape)
    if nimg < 2 or oh * ow > FOLD_MAX_PIXELS or not isinstance(geo, Planes) \
            or not _rows_pay(k, og, kh, kw, tgt):
        return None
    rows = _pixel_rows(nimg * oh, ow, g.register_tile(tgt)[0])
    if rows is None or rows[2] != 1:
        return None
    mr, per_tile, _ = rows
    nr = 2 * tgt.lanes("float32")
    m = nimg * oh * ow
    # All the rows in one block of A where they fit a quarter of L2, and each thread one
    # block of the weight's columns: 264-274 GFLOP/s above; split over the rows instead, 261;
    # in blocks of two column tiles for the pool (`_finer`), 241-245.
    s = g.GemmSchedule.heuristic(groups, m, og, k, "float32", 1, b_prepacked=True, target=tgt)
    nt = -(-og // nr)
    parallel = None
    if worth_parallel(groups * m * og * k, tgt.cores) and nt >= tgt.cores:
        parallel = "n"
    s = replace(s, mr=mr, nr=nr, mc=mr * max(1, s.mc // s.mr),
                nc=nr * (-(-nt // tgt.cores) if parallel else max(1, s.nc // s.nr)),
                parallel=parallel, key=conv_key(x_shape, w_shape, strides, padding, dilation,
                                                groups, out_shape, True))
    return ConvPlan("rows", s, per_tile, 1)


def _images_split(images: int, cores: int) -> bool:
    """Whether ``images`` share out evenly enough between ``cores`` threads (the pool hands
    out one image at a time): a multiple of them, or at least four per thread."""
    return cores > 1 and images >= cores and (images % cores == 0 or images >= 4 * cores)


def _pack_weight(out: Buffer, weight: Callable[[Expr, Expr, Expr], Expr], og: int,
                 k: int) -> Stmt:
    """``out[g, t, p, i] = W[g·og + t·L + i, p]`` (zero past the channels and past K): the
    panels kiln/op/nn/packed.py's `pack_conv_weight` makes, from ``weight(g, o, p)``."""
    groups, tiles, kp, lanes = out.shape
    gi, t, p, i = Var("g"), Var("t"), Var("p"), Var("i")
    o = t * lanes + i
    conds: list[Expr] = []
    if tiles * lanes != og:
        conds.append(Binary("lt", o, Const(og, INDEX)))
        o = g.index_min(o, og - 1)
    pk: Expr = p
    if kp != k:
        conds.append(Binary("lt", p, Const(k, INDEX)))
        pk = g.index_min(p, k - 1)
    value = g.guarded(weight(gi, o, pk), conds, out.dtype)
    kind = "parallel" if groups == 1 and tiles > 1 and out.size >= PARALLEL_MIN_ELEMENTS \
        else "serial"
    return For(gi, Const(0), Const(groups), For(t, Const(0), Const(tiles), For(
        p, Const(0), Const(kp), For(i, Const(0), Const(lanes), Store(out, (gi, t, p, i), value),
                                    "unrolled"), "scalar"), kind))


def depthwise(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int], out_shape: Sequence[int], write: WriteFn,
              target: Target | None = None) -> Stmt:
    """Depthwise conv2d (output channel o reads input channel o // multiplier); LLVM
    vectorizes its pixel loops to the target's width."""
    nimg, oc, oh, ow = out_shape
    _, _, kh, kw = w.shape
    mult = oc // x.shape[1]
    (sh, sw), (dh, dw) = strides, dilation
    top, left = padding[0], padding[1]
    dtype = x.dtype
    ylo, yhi = oplib.window_span(oh, sh, kh, dh, top)
    xlo, xhi = oplib.window_span(ow, sw, kw, dw, left)
    img, ch = Var("n"), Var("c")
    cin = ch if mult == 1 else ch // mult
    width = ow + (kw - 1) * dw // sw if sw != 1 else xhi - xlo + 1
    band = _band_rows(oh, sh, kh, dh, sw * width * dtype_of(dtype).itemsize,
                      lowering_target(target))

    def rows_of(r0: int, r1: int) -> Stmt:
        # output rows [r0, r1) from a plane of just the input rows they read
        lo, hi = r0 * sh + ylo, (r1 - 1) * sh + (kh - 1) * dh - top
        if sw == 1:
            plane = Buffer("plane", (1, hi - lo + 1, width), dtype, "local")
            copy = padded_copy(x, (img, cin), plane, (Const(0, INDEX),), (lo, hi), (xlo, xhi))
        else:
            plane, copy = _phase_planes(x, (img, cin), (lo, hi), (xlo, xhi), sw, width)
        oy, ox = Var("oy"), Var("ox")
        total: Expr | None = None
        for ky in range(kh):
            for kx in range(kw):
                # padded column ox·sw + kx·dw, in phase plane (kx·dw) % sw at ox + (kx·dw) // sw
                tap = Load(plane, (Const(kx * dw % sw, INDEX), oy * sh + (ky * dh - top - lo),
                                   ox + kx * dw // sw))
                wt = w(ch, Const(0, INDEX), Const(ky, INDEX), Const(kx, INDEX))
                total = Binary("mul", wt, tap) if total is None else FMA(wt, tap, total)
        assert total is not None
        v = Var("dw", dtype)
        rows = For(oy, Const(r0), Const(r1 - r0), For(ox, Const(0), Const(ow), LetStmt(
            v, total, write((img, ch, oy, ox), v)), "vectorized"))
        return Allocate(plane, Seq((copy, rows)))

    body = Seq(tuple(rows_of(r, min(r + band, oh)) for r in range(0, oh, band)))
    kind = "parallel" if _depthwise_parallel(out_shape, w.shape, target) else "serial"
    return For(img, Const(0), Const(nimg), For(ch, Const(0), Const(oc), body, kind))


def _band_rows(oh: int, sh: int, kh: int, dh: int, row_bytes: int, target: Target) -> int:
    """Output rows `depthwise` computes from one copy of the input rows they read: all of
    them where a channel's plane fits in L1, else bands whose plane fits in a quarter of it
    (each band copies the rows its window shares with the next once more).

    MobileNetV2's 96-channel stride-2 layer at 112² has a 51 KB plane (two column phases),
    past the 48 KB L1 of the Emerald Rapids VM: copied whole, its rows were read back
    from L2."""
    whole = ((oh - 1) * sh + (kh - 1) * dh + 1) * row_bytes
    if whole <= target.l1d:
        return oh
    rows_in = max(1, target.l1d // 4 // row_bytes)
    return max(1, min(oh, (rows_in - (kh - 1) * dh) // sh))


def direct_usable(x: Tensor, w_shape: Sequence[int], strides: Sequence[int],
                  dilation: Sequence[int], target: Target) -> bool:
    """Whether `depthwise_direct` takes this depthwise convolution: its input a buffer, a
    kernel of at most 3×3, stride 1, no dilation, and a channel's zero-padded plane larger
    than the Target's L1 (so that `depthwise`'s copy of it would spill to L2).

    In MobileNetV2, 2 threads of the Emerald Rapids VM (L1d 48 KiB; the model's kernels
    profiled, both kernels built and alternated in one process), against the copied
    planes: 32 channels at 112² (a 52 KB plane) 117 → 81 and 111 → 80 µs in two runs; but
    144 at 56² (13 KB) 110 → 98 then 93 → 99, 192 at 28² 82 → 100 and 384 at 14² 105 → 121
    (the border's tested taps weigh more on short rows), and stride 2, which LLVM reads as
    interleaved loads, slower everywhere (96 channels at 112²: 190 → 238)."""
    plane = (int(x.shape[2]) + 2) * (int(x.shape[3]) + 2) * dtype_of(x.dtype).itemsize
    return (isinstance(x, BufferTensor) and int(w_shape[2]) <= 3 and int(w_shape[3]) <= 3
            and tuple(dilation) == (1, 1) and tuple(int(v) for v in strides) == (1, 1)
            and plane > target.l1d)


def depthwise_direct(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
                     out_shape: Sequence[int], write: WriteFn,
                     target: Target | None = None) -> Stmt:
    """Depthwise conv2d reading the input where it is, no plane copied (`direct_usable`).

    Output pixels whose whole window lies inside the image (all but a border a pixel or
    two wide) read their taps straight from the input, a vector of pixels at a time; the
    border's pixels test each tap and read zero outside. `depthwise` first copies each
    channel's zero-padded plane and then reads it: the input goes through the caches
    twice, and a core's copy and its arithmetic take turns. (The strides of 2 that the
    body could express are left to `depthwise`: see `direct_usable`.)"""
    nimg, oc, oh, ow = (int(d) for d in out_shape)
    _, _, kh, kw = (int(d) for d in w.shape)
    h, wd = int(x.shape[2]), int(x.shape[3])
    mult = oc // int(x.shape[1])
    sh, sw = int(strides[0]), int(strides[1])
    top, left = int(padding[0]), int(padding[1])
    img, ch = Var("n"), Var("c")
    cin = ch if mult == 1 else ch // mult

    def inside_range(size: int, stride: int, taps: int, pad: int, out: int) -> tuple[int, int]:
        # outputs o with o·stride - pad >= 0 and o·stride + taps - 1 - pad <= size - 1
        lo = -(-pad // stride)
        hi = (size - taps + pad) // stride + 1
        return min(max(lo, 0), out), min(max(hi, lo, 0), out)

    y0, y1 = inside_range(h, sh, kh, top, oh)
    x0, x1 = inside_range(wd, sw, kw, left, ow)
    row_span = oplib.window_span(oh, sh, kh, 1, top)  # the input rows and columns read
    col_span = oplib.window_span(ow, sw, kw, 1, left)

    def total(oy: Expr, ox: Expr, checked: bool) -> Expr:
        acc: Expr | None = None
        for ky in range(kh):
            for kx in range(kw):
                row, col = oy * sh + (ky - top), ox * sw + (kx - left)
                tap = oplib.guarded_read(x, (img, cin, row, col), (None, None, row_span, col_span),
                                         Const(0.0, x.dtype)) if checked else x(img, cin, row, col)
                wt = w(ch, Const(0, INDEX), Const(ky, INDEX), Const(kx, INDEX))
                acc = Binary("mul", wt, tap) if acc is None else FMA(wt, tap, acc)
        assert acc is not None
        return acc

    def pixels(oy: Expr, lo: int, hi: int, checked: bool, kind: str) -> list[Stmt]:
        if hi <= lo:
            return []
        ox = Var("ox")
        v = Var("dw", x.dtype)
        return [For(ox, Const(lo), Const(hi - lo), LetStmt(
            v, total(oy, ox, checked), write((img, ch, oy, ox), v)), kind)]

    oy = Var("oy")
    inner = Seq(tuple(pixels(oy, 0, x0, True, "serial") + pixels(oy, x0, x1, False, "vectorized")
                      + pixels(oy, x1, ow, True, "serial")))
    rows: list[Stmt] = []
    if y1 > y0:
        rows.append(For(oy, Const(y0), Const(y1 - y0), inner))
    for lo, hi in ((0, y0), (y1, oh)):
        if hi > lo:
            by = Var("oy")
            rows.append(For(by, Const(lo), Const(hi - lo), Seq(tuple(
                pixels(by, 0, ow, True, "serial")))))
    kind = "parallel" if _depthwise_parallel(out_shape, w.shape, target) else "serial"
    return For(img, Const(0), Const(nimg), For(ch, Const(0), Const(oc), Seq(tuple(rows)),
                                                kind))


def depthwise_flat(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
                   dilation: Sequence[int], out_shape: Sequence[int], write: WriteFn,
                   target: Target | None = None) -> Stmt:
    """Depthwise conv2d on small maps (two output rows fit in a vector), a block of channels
    at a time: each channel's image copied into its own `Planes`, where every tap is a shift,
    the sum of the taps one vectorized loop over the plane's flat pixels (the padding
    columns between rows computed too), then the output rows copied out through the
    epilogue.

    Each step runs over the whole block before the next starts (`flat_block`): one channel
    at a time, the taps' vector loads read the plane that the copy had stored a few
    instructions before, in narrower pieces, and waited for those stores to reach the cache
    (store-to-load forwarding fails on such overlaps), and the epilogue's reads of the sums
    likewise."""
    nimg, oc, oh, ow = out_shape
    dtype = x.dtype
    mult = oc // x.shape[1]
    kh, kw = w.shape[2], w.shape[3]
    block = flat_block(oc, lowering_target(target).cores)
    geo = Planes(block, x.shape[2], x.shape[3], (kh, kw), (int(strides[0]), int(strides[1])),
                 (int(dilation[0]), int(dilation[1])), (int(padding[0]), int(padding[1])),
                 (oh, ow))
    img, blk, k = Var("n"), Var("cb"), Var("k")
    n = geo.columns
    planes = Buffer("plane", (geo.size(n),), dtype, "local")
    sums = Buffer("sums", (block, n), dtype, "local")
    zero = Const(0, INDEX)
    ch = blk * block + k
    j = Var("j")
    total: Expr | None = None
    for ky in range(kh):
        for kx in range(kw):
            tap = Load(planes, (geo.tap(k, Const(ky, INDEX), Const(kx, INDEX)) + j,))
            wt = w(ch, zero, Const(ky, INDEX), Const(kx, INDEX))
            total = Binary("mul", wt, tap) if total is None else FMA(wt, tap, total)
    assert total is not None
    compute = For(k, Const(0), Const(block), For(j, Const(0), Const(n), Store(
        sums, (k, j), total), "vectorized"))
    oy, ox = Var("oy"), Var("ox")
    out = For(k, Const(0), Const(block), For(oy, Const(0), Const(oh), For(
        ox, Const(0), Const(ow), write((img, ch, oy, ox), Load(sums, (k, oy * geo.cols + ox))),
        "vectorized")))
    channels = _Channels(x, blk * block, mult)
    body = Allocate(planes, Allocate(sums, Seq((
        geo.fill(channels, img, planes, lowering_target(target), zero_first=True,
                 parallel=False),
        compute, out))))
    kind = "parallel" if _depthwise_parallel(out_shape, w.shape, target) else "serial"
    return For(img, Const(0), Const(nimg), For(blk, Const(0), Const(oc // block), body, kind))


FLAT_BLOCKS = (16, 8, 4, 2, 1)  # channels per block of `depthwise_flat` (`flat_block`)


def flat_block(channels: int, cores: int = 1) -> int:
    """The channels `depthwise_flat` runs a step over at once: the largest of `FLAT_BLOCKS`
    that divides ``channels`` into at least one block per core (the blocks are what the
    threads share out), else 1."""
    return next(b for b in FLAT_BLOCKS if channels % b == 0 and channels // b >= cores
                or b == 1)


class _Channels:
    """Channels ``first``, ``first + 1``, ... of the output, as the image `Planes.fill`
    reads: its channel k is input channel (first + k) // multiplier of ``x``."""

    def __init__(self, x: Tensor, first: Expr, multiplier: int) -> None:
        self.x, self.first, self.multiplier = x, first, multiplier

    def __call__(self, img: Expr, ch: Expr, y: Expr, xx: Expr) -> Expr:
        c = self.first + ch
        return self.x(img, c if self.multiplier == 1 else c // self.multiplier, y, xx)


def _phase_planes(x: Tensor, plane_of: tuple[Expr, Expr], rows: tuple[int, int],
                  cols: tuple[int, int], sw: int, width: int) -> tuple[Buffer, Stmt]:
    """The zero-padded plane split by column phase for a stride of ``sw``: padded column c
    lands at ``[c % sw, row, c // sw]``, so that a strided window reads contiguously.

    Row by row, each phase's loop reads the image row (LLVM deinterleaves pairs of
    vectors), the later phases from L1, and only the padding is zeroed. Phase by phase over
    the whole plane, all of it zeroed first, the second phase had read the plane again from
    L2 and the plane was stored twice: the copy was half of a stride-2 depthwise
    convolution's time (96 channels at 112²). One loop storing every phase compiled to
    8-lane gathers."""
    (ylo, yhi), (xlo, _) = rows, cols
    h, w = x.shape[2], x.shape[3]
    out = Buffer("plane", (sw, yhi - ylo + 1, width), x.dtype, "local")
    y0, y1 = max(ylo, 0), min(yhi, h - 1)
    # image column (i·sw + phase) + xlo, for the i inside the image and the plane
    spans = []
    for phase in range(sw):
        first = min(width, max(0, -((xlo + phase) // sw)))
        spans.append((first, max(first - 1, min(width - 1, (w - 1 - xlo - phase) // sw))))
    if y1 < y0:
        return out, _zero(out, (0, out.shape[1]), (0, width))
    y = Var("y")
    row: list[Stmt] = []
    for phase, (first, last) in enumerate(spans):
        i = Var("i")
        if last >= first:
            row.append(For(i, Const(first), Const(last - first + 1), Store(
                out, (Const(phase, INDEX), y - ylo, i),
                x(*plane_of, y, i * sw + (phase + xlo))), "vectorized"))
        row += [_zero_run(out, phase, y - ylo, a, b - a)
                for a, b in ((0, first), (last + 1, width)) if b > a]
    stmts: list[Stmt] = [For(y, Const(y0), Const(y1 - y0 + 1), Seq(tuple(row)))]
    stmts += [_zero(out, band, (0, width)) for band in ((0, y0 - ylo),
                                                         (y1 - ylo + 1, out.shape[1]))
              if band[1] > band[0]]
    return out, Seq(tuple(stmts))


def _zero_run(out: Buffer, phase: int, row: Expr, first: int, count: int) -> Stmt:
    """Zeros at ``out[phase, row, first : first + count]``."""
    i = Var("z")
    return For(i, Const(first), Const(count), Store(
        out, (Const(phase, INDEX), row, i), Const(0.0, out.dtype)), "vectorized")


def _zero(out: Buffer, rows: tuple[int, int], cols: tuple[int, int]) -> Stmt:
    """Zeros in rows ``[rows[0], rows[1])`` and columns ``[cols[0], cols[1])`` of every
    leading index of the 3-d buffer ``out``."""
    ph, py, px = Var("ph"), Var("py"), Var("px")
    return For(ph, Const(0), Const(out.shape[0]), For(py, Const(rows[0]), Const(
        rows[1] - rows[0]), For(px, Const(cols[0]), Const(cols[1] - cols[0]), Store(
            out, (ph, py, px), Const(0.0, out.dtype)), "vectorized")))


def _depthwise_parallel(out_shape: Sequence[int], w_shape: Sequence[int],
                        target: Target | None = None) -> bool:
    nimg, oc, oh, ow = out_shape
    return (nimg * oc * oh * ow * w_shape[2] * w_shape[3] >= PARALLEL_MIN_ELEMENTS and oc >= 2
            and lowering_target(target).cores > 1)


def padded_copy(x: Tensor, plane_of: tuple[Expr, Expr], out: Buffer, prefix: tuple[Expr, ...],
                rows: tuple[int, int], cols: tuple[int, int]) -> Stmt:
    """``out[prefix, y - rows[0], x - cols[0]] = x[plane_of, y, x]`` for y in ``rows`` and
    x in ``cols`` (inclusive), zero outside the image: the image's rows copied with plain
    contiguous (vectorizable) loops, no per-element bounds tests, and only the padding
    around them zeroed (zeroing the whole plane first stored it twice)."""
    (ylo, yhi), (xlo, xhi) = rows, cols
    h, w = x.shape[2], x.shape[3]
    zero = Const(0.0, out.dtype)
    height, width = out.shape[-2], out.shape[-1]

    def fill(r0: int, r1: int, c0: int, c1: int) -> Stmt | None:
        if r1 <= r0 or c1 <= c0:
            return None
        py, px = Var("py"), Var("px")
        return For(py, Const(r0), Const(r1 - r0), For(px, Const(c0), Const(c1 - c0), Store(
            out, (*prefix, py, px), zero), "vectorized"))

    y0, y1, x0, x1 = max(ylo, 0), min(yhi, h - 1), max(xlo, 0), min(xhi, w - 1)
    if y1 < y0 or x1 < x0:
        whole = fill(0, height, 0, width)
        assert whole is not None
        return whole
    y, xx = Var("y"), Var("x")
    row: list[Stmt] = [For(xx, Const(x0), Const(x1 - x0 + 1), Store(
        out, (*prefix, y - ylo, xx - xlo), x(*plane_of, y, xx)), "vectorized")]
    for c0, c1 in ((0, x0 - xlo), (x1 - xlo + 1, width)):
        if c1 > c0:
            px = Var("px")
            row.append(For(px, Const(c0), Const(c1 - c0), Store(
                out, (*prefix, y - ylo, px), zero), "vectorized"))
    stmts: list[Stmt] = [For(y, Const(y0), Const(y1 - y0 + 1), Seq(tuple(row)))]
    stmts += [f for f in (fill(0, y0 - ylo, 0, width), fill(y1 - ylo + 1, height, 0, width))
              if f is not None]
    return Seq(tuple(stmts))
