"""Fast kernels of nn.conv2d (NCHW data, OIHW weight): an implicit GEMM, and a direct
vectorized kernel for depthwise convolution.

The float32 path of the operator's ``lower=`` rule (kiln/op/nn/conv.py).

- **Implicit GEMM.** For each image and channel group, ``out[o, (y, x)] = W[o, (c, ky, kx)] ·
  X[(c, ky, kx), (y, x)]``: M = output channels of the group, N = output pixels, K = input
  channels of the group × kernel taps. The im2col matrix X is never built: the GEMM's B
  packing (kiln/loops/gemm.py) reads it straight from the input, padding as zeros, one
  kc×nc panel at a time; the epilogue writes each pixel through the fused consumers.
- **Depthwise** (one input channel per group, MobileNet's 3×3): a matrix product has
  nothing to block there, so each (image, channel) plane is copied once into a zero-padded
  local plane, and every output row is a vectorized loop over pixels summing the kernel's
  taps (stride 2 reads every other element; LLVM vectorizes that with shuffles).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.ir import (
    FMA,
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target
from kiln.target import Target

COPY_PARALLEL_MIN = 1 << 20  # elements of an input copy worth a parallel region


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


def implicit_gemm(x: Tensor, w: Tensor, strides: Sequence[int], padding: Sequence[int],
                  dilation: Sequence[int], groups: int, out_shape: Sequence[int], dtype: str,
                  a_packed: Buffer | None = None, target: Target | None = None) -> Tensor:
    """conv2d as a batch (images × groups) of GEMMs over im2col read on the fly.

    ``a_packed``, when given, holds the weight already in the GEMM's A panels, (groups,
    tiles, K padded, mr) as kiln/op/nn/packed.py lays it out; it is read in place (when its
    layout is the one this schedule takes; else ``w`` is read and packed as usual).
    """
    nimg, oc, oh, ow = out_shape
    o, cg, kh, kw = w.shape
    og = oc // groups
    (sh, sw), (dh, dw) = strides, dilation
    top, left = padding[0], padding[1]
    ylo, yhi = oplib.window_span(oh, sh, kh, dh, top)
    xlo, xhi = oplib.window_span(ow, sw, kw, dw, left)
    spans = [None, None, (ylo, yhi), (xlo, xhi)]
    zero = Const(0.0, dtype)
    m, n, k = og, oh * ow, cg * kh * kw
    batch = nimg * groups
    inside = ylo >= 0 and xlo >= 0 and yhi < x.shape[2] and xhi < x.shape[3]
    # With padding, each image is first copied into a zero-padded buffer (see `padded`),
    # and the product runs per image over the groups.
    tgt = lowering_target(target)
    schedule = g.GemmSchedule.default(batch if inside else groups, m, n, k, dtype,
                                      a_prepacked=a_packed is not None, target=tgt)
    if a_packed is not None and a_packed.shape != (groups, -(-m // schedule.mr),
                                                   schedule.kc * g.k_blocking(k, tgt)[1],
                                                   schedule.mr):
        a_packed = None

    def panel(grp_of: Callable[[Expr], Expr]) -> g.PanelFn | None:
        if a_packed is None:
            return None
        buf = a_packed
        return lambda bt, tile, kk, i: Load(buf, (grp_of(bt), tile, kk, i))

    def image_group(bt: Expr) -> tuple[Expr, Expr]:
        if groups == 1:
            return bt, Const(0, INDEX)
        return bt // groups, bt % groups

    def taps(p: Expr) -> tuple[Expr, Expr, Expr]:
        if kh == kw == 1:
            return p, Const(0, INDEX), Const(0, INDEX)
        return p // (kh * kw), (p // kw) % kh, p % kw

    def pixel(j: Expr) -> tuple[Expr, Expr]:
        if oh == 1:
            return Const(0, INDEX), j
        return j // ow, j % ow

    def a(bt: Expr, i: Expr, p: Expr) -> Expr:
        _, grp = image_group(bt)
        ci, ky, kx = taps(p)
        return w(grp * og + i, ci, ky, kx)

    def b(bt: Expr, p: Expr, j: Expr) -> Expr:
        img, grp = image_group(bt)
        ci, ky, kx = taps(p)
        y, xx = pixel(j)
        at = [img, grp * cg + ci, y * sh + ky * dh - top, xx * sw + kx * dw - left]
        return oplib.guarded_read(x, at, spans, zero)

    def put_for(img_of: Callable[[Expr], tuple[Expr, Expr]], write: WriteFn) -> g.WriteFn:
        def put(bt: Expr, i: Expr, j: Expr, v: Expr) -> Stmt:
            img, grp = img_of(bt)
            y, xx = pixel(j)
            return write((img, grp * og + i, y, xx), v)
        return put

    def emit(write: WriteFn) -> Stmt:
        if inside:
            return g.gemm(batch, m, n, k, a, b, put_for(image_group, write), dtype, schedule,
                          a_panel=panel(lambda bt: image_group(bt)[1]), target=tgt)
        return padded(write)

    def padded(write: WriteFn) -> Stmt:
        # The input image copied once into a zero-padded buffer: the im2col reads of the
        # packing then need no bounds tests.
        c = x.shape[1]
        xp = Buffer("xpad", (c, yhi - ylo + 1, xhi - xlo + 1), dtype, "local")
        img, ci = Var("n"), Var("ci")
        # serial: a parallel region costs more than copying (but for large images)
        copy_kind = "parallel" if xp.size >= COPY_PARALLEL_MIN and tgt.cores > 1 else "serial"
        copy = For(ci, Const(0), Const(c), padded_copy(
            x, (img, ci), xp, (ci,), (ylo, yhi), (xlo, xhi)), copy_kind)

        def grp_of(bt: Expr) -> tuple[Expr, Expr]:
            return img, bt

        def bp(bt: Expr, p: Expr, j: Expr) -> Expr:
            c0, ky, kx = taps(p)
            y, xx = pixel(j)
            return Load(xp, (bt * cg + c0, y * sh + ky * dh, xx * sw + kx * dw))

        prod = g.gemm(groups, m, n, k, a, bp, put_for(grp_of, write), dtype, schedule,
                      a_panel=panel(lambda bt: bt), target=tgt)
        return For(img, Const(0), Const(nimg), Allocate(xp, Seq((copy, prod))))

    t = extern(tuple(out_shape), dtype, emit)
    t.schedule = {**schedule.attrs(), "a_prepacked": a_packed is not None}
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
