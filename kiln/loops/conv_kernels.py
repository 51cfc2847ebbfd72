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
  (alter-layout). The epilogue writes each pixel through the fused consumers. On a Zen 5
  core (AVX-512) a 64-channel 56×56 3×3 convolution went from 85 GFLOP/s (B packed from
  the image element by element) to 200 (two cores: 390).
- **Depthwise** (one input channel per group, MobileNet's 3×3): a matrix product has
  nothing to block there, so each (image, channel) plane is copied once into a zero-padded
  local plane, and every output row is a vectorized loop over pixels summing the kernel's
  taps (stride 2 reads every other element; LLVM vectorizes that with shuffles).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kiln.errors import InternalError
from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
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
    IfThenElse,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target
from kiln.target import Target

PLANES_PARALLEL_MIN = 1 << 16  # floats of input planes worth a parallel copy
CHUNKS_PER_THREAD = 4  # blocks of the product per thread, for the pool to balance


def conv2d(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], groups: int, out_shape: Sequence[int], dtype: str,
           target: Target | None = None) -> Tensor:
    """The convolution as an extern tensor (see the module docstring), scheduled for
    ``target`` (default: the lowering's)."""
    tgt = lowering_target(target)
    c = x.shape[1]
    cg = w.shape[1]
    if cg == 1 and groups == c and groups > 1:
        t = extern(tuple(out_shape), dtype, lambda write: depthwise(
            x, w, strides, padding, dilation, out_shape, write, tgt))
        t.schedule = {"kernel": "depthwise",
                      "parallel": _depthwise_parallel(out_shape, w.shape, tgt)}
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

    def fill(self, x: Tensor, img: Expr, out: Buffer, target: Target) -> Stmt:
        """The planes of image ``img`` of ``x`` written to ``out``: every interior row a
        plain (vectorizable) copy, the borders and the tail zeros; no bounds test per element."""
        (sh, sw), (top, left) = self.strides, self.padding
        rows, cols, plane = self.rows, self.cols, self.plane
        ch = Var("ci")

        def zero(start: Expr, count: int) -> list[Stmt]:
            if count <= 0:
                return []
            i = Var("z")
            return [For(i, Const(0), Const(count), Store(out, (start + i,), Const(0.0, out.dtype)),
                        "vectorized")]

        stmts: list[Stmt] = []
        for py in range(sh):
            for px in range(sw):
                base = ((py * sw + px) * self.channels + ch) * plane
                # plane row pr holds input row pr·sh + py - top; column pc, pc·sw + px - left
                r0, r1 = max(0, -((py - top) // sh)), min(rows - 1, (self.height - 1 + top - py) // sh)
                c0, c1 = max(0, -((px - left) // sw)), min(cols - 1, (self.width - 1 + left - px) // sw)
                if r1 < r0 or c1 < c0:
                    stmts += zero(base, plane)
                    continue
                pr, i = Var("pr"), Var("px")
                row = base + pr * cols
                copy = For(i, Const(0), Const(c1 - c0 + 1), Store(out, (row + (c0 + i),), x(
                    img, ch, pr * sh + (py - top), (c0 + i) * sw + (px - left))), "vectorized")
                interior = For(pr, Const(r0), Const(r1 - r0 + 1), Seq(tuple(
                    zero(row, c0) + [copy] + zero(row + (c1 + 1), cols - 1 - c1))))
                stmts += zero(base, r0 * cols) + [interior] + zero(
                    base + (r1 + 1) * cols, (rows - 1 - r1) * cols)
        planes = self.phases * self.channels * plane
        kind = "parallel" if (planes >= PLANES_PARALLEL_MIN and target.cores > 1
                              and self.channels > 1) else "serial"
        body = For(ch, Const(0), Const(self.channels), Seq(tuple(stmts)), kind)
        return Seq(tuple([body] + zero(Const(planes, INDEX), out.size - planes)))


def gemm_schedule(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], groups: int,
                  out_shape: Sequence[int], a_prepacked: bool = True,
                  target: Target | None = None) -> g.GemmSchedule:
    """The GEMM schedule of `implicit_gemm` (alter-layout packs the weight for it).

    Neither operand is copied per block when the weight is prepacked (B is read in place
    from the planes), so the parallel loop runs over whichever of M and N has more tiles, in
    blocks small enough that the pool hands out several per thread: a thread that is
    descheduled then holds up a small share, not half of the product.
    """
    tgt = lowering_target(target)
    geo = Planes.of(x_shape, w_shape, strides, padding, dilation, out_shape)
    _, cg, kh, kw = w_shape
    m, n, k = int(out_shape[1]) // groups, geo.columns, cg * kh * kw
    s = g.GemmSchedule.default(groups, m, n, k, "float32", a_prepacked=a_prepacked,
                               b_prepacked=True, target=tgt)
    if s.parallel not in ("m", "n"):
        return s
    mt, nt = -(-m // s.mr), -(-n // s.nr)
    chunks = CHUNKS_PER_THREAD * tgt.cores
    if nt >= mt or not a_prepacked:
        tnb = max(1, min(s.nc // s.nr, -(-nt // chunks)))
        return replace(s, parallel="n", nc=tnb * s.nr)
    tmb = max(1, min(s.mc // s.mr, -(-mt // chunks)))
    return replace(s, parallel="m", mc=tmb * s.mr)


def implicit_gemm(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], groups: int, out_shape: Sequence[int], dtype: str,
                  a_packed: Buffer | None = None, target: Target | None = None) -> Tensor:
    """conv2d as a batch (groups) of GEMMs per image whose B operand is read in place from
    the input's phase planes (see `Planes` and the module docstring).

    ``a_packed``, when given, holds the weight already in the GEMM's A panels, (groups,
    tiles, K padded, mr) as kiln/op/nn/packed.py lays it out; it is read in place (when its
    layout is the one this schedule takes; else ``w`` is read and packed as usual).
    """
    tgt = lowering_target(target)
    nimg, oc, oh, ow = out_shape
    _, cg, kh, kw = w.shape
    og = oc // groups
    geo = Planes.of(x.shape, w.shape, strides, padding, dilation, out_shape)
    m, n, k = og, geo.columns, cg * kh * kw
    schedule = gemm_schedule(x.shape, w.shape, strides, padding, dilation, groups, out_shape,
                             a_prepacked=a_packed is not None, target=tgt)
    mr, nr, kc = schedule.mr, schedule.nr, schedule.kc
    lanes = schedule.lanes or tgt.lanes(dtype)
    nk = g.k_blocking(k, tgt, dtype)[1]
    if a_packed is not None and a_packed.shape != (groups, -(-m // mr), kc * nk, mr):
        a_packed = None
    slots = -(-n // nr) * nr  # columns the product computes, the last tile's padding included
    img = Var("n")
    view: Buffer | None = None  # TODO in place
    planes = view if view is not None else Buffer("planes", (geo.size(slots),), dtype, "local")

    def taps(p: Expr) -> tuple[Expr, Expr, Expr]:
        if kh == kw == 1:
            return p, Const(0, INDEX), Const(0, INDEX)
        return p // (kh * kw), (p // kw) % kh, p % kw

    def a(bt: Expr, i: Expr, p: Expr) -> Expr:
        ci, ky, kx = taps(p)
        return w(bt * og + i, ci, ky, kx)

    def b_panel(bt: Expr, tile: Expr, kk: Expr, c: Expr) -> Expr:
        exact = kc * nk == k
        ci, ky, kx = taps(kk if exact else g._min(kk, k - 1))
        start = geo.tap(bt * cg + ci, ky, kx) + tile * nr + c
        if view is not None:
            start = img * geo.image_size + start
        value: Expr = Load(planes, (start,), lanes)
        if not exact:  # the K padding of the last block reads zeros, whatever the data
            value = Select(Broadcast(Binary("lt", kk, Const(k, INDEX)), lanes), value,
                           Broadcast(Const(0.0, dtype), lanes))
        return value

    def a_panel(bt: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
        assert a_packed is not None
        return Load(a_packed, (bt, tile, kk, i))

    def emit(write: WriteFn) -> Stmt:
        def put(bt: Expr, i: Expr, j: Expr, v: Expr) -> Stmt:
            if oh == 1:
                y, xx = Const(0, INDEX), j
            else:
                y, xx = j // geo.cols, j % geo.cols
            if geo.cols == ow:
                return write((img, bt * og + i, y, xx), v)
            # the columns between output rows are thrown away (the clamp only tells the
            # verifier what the test already says)
            return IfThenElse(Binary("lt", xx, Const(ow, INDEX)),
                              write((img, bt * og + i, y, g._min(xx, ow - 1)), v))

        def unused(bt: Expr, p: Expr, j: Expr) -> Expr:
            raise InternalError("conv2d's GEMM reads B through its panels")

        prod = g.gemm(groups, m, n, k, a, unused, put, dtype, schedule,
                      a_panel=a_panel if a_packed is not None else None, b_panel=b_panel,
                      target=tgt)
        if view is not None:
            return For(img, Const(0), Const(nimg), prod)
        return For(img, Const(0), Const(nimg), Allocate(planes, Seq((
            geo.fill(x, img, planes, tgt), prod))))

    t = extern(tuple(out_shape), dtype, emit)
    t.schedule = {**schedule.attrs(), "a_prepacked": a_packed is not None,
                  "b": "in place" if view is not None else "phase planes"}
    return t


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
    if sw == 1:
        plane = Buffer("plane", (1, yhi - ylo + 1, xhi - xlo + 1), dtype, "local")
        copy = padded_copy(x, (img, cin), plane, (Const(0, INDEX),), (ylo, yhi), (xlo, xhi))
    else:
        plane, copy = _phase_planes(x, (img, cin), (ylo, yhi), (xlo, xhi), sw,
                                    ow + (kw - 1) * dw // sw)
    oy, ox = Var("oy"), Var("ox")
    total: Expr | None = None
    for ky in range(kh):
        for kx in range(kw):
            # padded column ox·sw + kx·dw, in phase plane (kx·dw) % sw at ox + (kx·dw) // sw
            tap = Load(plane, (Const(kx * dw % sw, INDEX), oy * sh + (ky * dh - top - ylo),
                               ox + kx * dw // sw))
            wt = w(ch, Const(0, INDEX), Const(ky, INDEX), Const(kx, INDEX))
            total = Binary("mul", wt, tap) if total is None else FMA(wt, tap, total)
    assert total is not None
    v = Var("dw", dtype)
    rows = For(oy, Const(0), Const(oh), For(ox, Const(0), Const(ow), LetStmt(
        v, total, write((img, ch, oy, ox), v)), "vectorized"))
    body = Allocate(plane, Seq((copy, rows)))
    kind = "parallel" if _depthwise_parallel(out_shape, w.shape, target) else "serial"
    return For(img, Const(0), Const(nimg), For(ch, Const(0), Const(oc), body, kind))


def _phase_planes(x: Tensor, plane_of: tuple[Expr, Expr], rows: tuple[int, int],
                  cols: tuple[int, int], sw: int, width: int) -> tuple[Buffer, Stmt]:
    """The zero-padded plane split by column phase for a stride of ``sw``: padded column c
    lands at ``[c % sw, row, c // sw]``, so that a strided window reads contiguously."""
    (ylo, yhi), (xlo, _) = rows, cols
    h, w = x.shape[2], x.shape[3]
    out = Buffer("plane", (sw, yhi - ylo + 1, width), x.dtype, "local")
    ph, py, px = Var("ph"), Var("py"), Var("px")
    zero = Const(0.0, x.dtype)
    stmts: list[Stmt] = [For(ph, Const(0), Const(sw), For(py, Const(0), Const(out.shape[1]), For(
        px, Const(0), Const(width), Store(out, (ph, py, px), zero), "vectorized")))]
    y0, y1 = max(ylo, 0), min(yhi, h - 1)
    for phase in range(sw):
        # image column (i·sw + phase) + xlo, for the i inside the image and the plane
        first = max(0, -((xlo + phase) // sw))
        last = min(width - 1, (w - 1 - xlo - phase) // sw)
        if y1 < y0 or last < first:
            continue
        y, i = Var("y"), Var("i")
        inner = For(i, Const(first), Const(last - first + 1), Store(
            out, (Const(phase, INDEX), y - ylo, i), x(*plane_of, y, i * sw + (phase + xlo))),
            "vectorized")
        stmts.append(For(y, Const(y0), Const(y1 - y0 + 1), inner))
    return out, Seq(tuple(stmts))


def _depthwise_parallel(out_shape: Sequence[int], w_shape: Sequence[int],
                        target: Target | None = None) -> bool:
    nimg, oc, oh, ow = out_shape
    return (nimg * oc * oh * ow * w_shape[2] * w_shape[3] >= PARALLEL_MIN_ELEMENTS and oc >= 2
            and lowering_target(target).cores > 1)


def padded_copy(x: Tensor, plane_of: tuple[Expr, Expr], out: Buffer, prefix: tuple[Expr, ...],
                rows: tuple[int, int], cols: tuple[int, int]) -> Stmt:
    """``out[prefix, y - rows[0], x - cols[0]] = x[plane_of, y, x]`` for y in ``rows`` and
    x in ``cols`` (inclusive), zero outside the image: zeros first, then the image's rows
    copied with plain contiguous (vectorizable) loops, no per-element bounds tests."""
    (ylo, yhi), (xlo, xhi) = rows, cols
    h, w = x.shape[2], x.shape[3]
    zero = Const(0.0, out.dtype)
    py, px = Var("py"), Var("px")
    fill = For(py, Const(0), Const(out.shape[-2]), For(
        px, Const(0), Const(out.shape[-1]), Store(out, (*prefix, py, px), zero), "vectorized"))
    y0, y1, x0, x1 = max(ylo, 0), min(yhi, h - 1), max(xlo, 0), min(xhi, w - 1)
    if y1 < y0 or x1 < x0:
        return fill
    y, xx = Var("y"), Var("x")
    inner = For(xx, Const(x0), Const(x1 - x0 + 1), Store(
        out, (*prefix, y - ylo, xx - xlo), x(*plane_of, y, xx)), "vectorized")
    return Seq((fill, For(y, Const(y0), Const(y1 - y0 + 1), inner)))
