"""The adjoint of 2-D max pooling (nn.max_pool2d_grad, NCHW) as one pass over the windows of
each (batch, channel) plane, the planes in parallel.

Each window's out_grad goes to its first largest element in row-major tap order (a NaN
counts as largest, the first NaN winning; taps in the padding read -inf and never win a
place in the data), as the numpy reference's ``argmax`` chooses. A window's winner is found
without branches: the taps in order, each a compare and selects of the running maximum and
of the winner's offset in the plane, so that the loop over a row of windows vectorizes (its
reads, ``stride`` apart, become LLVM's interleaved loads). The winners' offsets of one row of
windows go to a small buffer, and a scalar loop then adds each window's out_grad into a
zeroed local plane at its offset, in window order (overlapping windows add in sequence on
one thread: the sums are those of the reference's scatter, bit for bit). The plane is then
written out through the fused consumers.

Windows whose taps all lie inside the data (rows and columns in `_interior`) read without
bounds tests; the others read through a clamp and a select of -inf, and a winner in the
padding (only the first tap, when no tap beats -inf) is marked -1 and adds nothing.

It replaces a loop per window over its taps with a branch per tap on the running maximum
into one-element local buffers: on ResNet-18's stem pool (8x64x112x112, 3x3, stride 2, pad
1), 81 -> 10-15 ms a call (exe.profile) on a loaded 2-core Sapphire Rapids, the interior
loop 8 windows a vector.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Cast,
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
from kiln.loops.schedule import NestSchedule, loop_nest

# The offsets of the winners are int32 in the vector loop (as wide as float32's lanes).
OFFSET = "int32"


class PoolGeometry:
    """Where the taps of window (oy, ox) read a plane of ``hw``: row ``oy * sh + ry * dh - top``,
    column ``ox * sw + rx * dw - left``."""

    def __init__(self, kernel: tuple[int, int], strides: tuple[int, int],
                 dilation: tuple[int, int], top_left: tuple[int, int], hw: tuple[int, int],
                 out_hw: tuple[int, int]) -> None:
        (self.kh, self.kw), (self.sh, self.sw), (self.dh, self.dw) = kernel, strides, dilation
        self.top, self.left = top_left
        (self.h, self.w), (self.oh, self.ow) = hw, out_hw

    def _interior(self, out: int, s: int, k: int, d: int, pad: int, size: int) -> tuple[int, int]:
        """The window positions [lo, hi) along an axis whose taps are all inside [0, size)."""
        lo = min(out, -(-pad // s))
        hi = (size - 1 + pad - (k - 1) * d) // s + 1
        return lo, max(lo, min(out, hi))

    def rows(self) -> tuple[int, int]:
        return self._interior(self.oh, self.sh, self.kh, self.dh, self.top, self.h)

    def cols(self) -> tuple[int, int]:
        return self._interior(self.ow, self.sw, self.kw, self.dw, self.left, self.w)


def _winner(geo: PoolGeometry, x: Tensor, bc: tuple[Expr, ...], oy: Expr, ox: Expr,
            guarded: bool, use: Callable[[Expr], Stmt]) -> Stmt:
    """``use(offset)`` with the plane offset of window (oy, ox)'s winner (-1: in the padding).

    A chain of lets, one per tap: the running maximum and the winner's row and column
    offsets (relative to the window's corner), each a select on "this tap is better"."""
    dt = x.dtype
    y0 = oy * geo.sh - geo.top
    x0 = ox * geo.sw - geo.left
    spans = [None, None, oplib.window_span(geo.oh, geo.sh, geo.kh, geo.dh, geo.top),
             oplib.window_span(geo.ow, geo.sw, geo.kw, geo.dw, geo.left)]
    taps = [(ry, rx) for ry in range(geo.kh) for rx in range(geo.kw)]

    def read(ry: int, rx: int) -> Expr:
        at = [bc[0], bc[1], y0 + ry * geo.dh, x0 + rx * geo.dw]
        if not guarded:
            return x(*at)
        return oplib.guarded_read(x, at, spans, Const(float("-inf"), dt))

    def place(dy: Expr, dx: Expr) -> Stmt:
        offset = dy * Const(geo.w, OFFSET) + dx
        if not guarded:
            return use(offset)
        y, xx = y0 + Cast(INDEX, dy), x0 + Cast(INDEX, dx)
        inside = oplib.all_of([Binary("ge", y, Const(0)), Binary("lt", y, Const(geo.h)),
                               Binary("ge", xx, Const(0)), Binary("lt", xx, Const(geo.w))])
        assert inside is not None  # four conditions
        return use(Select(inside, offset, Const(-1, OFFSET)))

    # The first tap starts the chain: after it, the running maximum is its value (-inf
    # or not) and it is the winner, as from a start of -inf and the first tap's place.
    best, dy, dx = Var("best", dt), Var("dy", OFFSET), Var("dx", OFFSET)
    lets: list[tuple[Var, Expr]] = [(best, read(0, 0)), (dy, Const(0, OFFSET)),
                                    (dx, Const(0, OFFSET))]
    for k, (ry, rx) in enumerate(taps[1:], 1):
        v, better = Var(f"v{k}", dt), Var(f"better{k}", "bool")
        nan_first = Binary("and", Binary("ne", v, v), Binary("eq", best, best))
        lets += [(v, read(ry, rx)), (better, Binary("or", Binary("gt", v, best), nan_first))]
        was = best, dy, dx
        best, dy, dx = Var(f"best{k}", dt), Var(f"dy{k}", OFFSET), Var(f"dx{k}", OFFSET)
        lets += [(best, Select(better, v, was[0])),
                 (dy, Select(better, Const(ry * geo.dh, OFFSET), was[1])),
                 (dx, Select(better, Const(rx * geo.dw, OFFSET), was[2]))]
    stmt = place(dy, dx)
    for var, value in reversed(lets):
        stmt = LetStmt(var, value, stmt)
    return stmt


def max_pool2d_grad(g: Tensor, x: Tensor, geo: PoolGeometry, write: WriteFn) -> Stmt:
    """The statement writing max pooling's adjoint of ``g`` over data ``x`` through ``write``."""
    dt = x.dtype
    plane = Buffer("plane", (geo.h * geo.w,), dt, "local")
    winners = Buffer("winners", (geo.ow,), OFFSET, "local")
    (r_lo, r_hi), (c_lo, c_hi) = geo.rows(), geo.cols()
    inner = NestSchedule(None, 0)

    def plane_of(bc: tuple[Expr, ...]) -> Stmt:
        b, c = bc[0], bc[1]

        def row(oy: Var, interior: bool) -> Stmt:
            def pick(start: int, end: int, guarded: bool) -> For:
                ox = Var("ox")
                return For(ox, Const(start), Const(end - start), _winner(
                    geo, x, bc, oy, ox, guarded, lambda offset: Store(winners, (ox,), offset)),
                    "serial" if guarded else "vectorized")

            if interior:
                picks = [pick(0, c_lo, True), pick(c_lo, c_hi, False), pick(c_hi, geo.ow, True)]
            else:
                picks = [pick(0, geo.ow, True)]
            at, ox = Var("at", OFFSET), Var("ox")
            corner = (oy * geo.sh - geo.top) * geo.w + ox * geo.sw - geo.left
            spot = (oplib.clamp(corner + Cast(INDEX, at), 0, geo.h * geo.w - 1),)
            add = Store(plane, spot, Binary("add", Load(plane, spot), g(b, c, oy, ox)))
            scatter = For(ox, Const(0), Const(geo.ow), LetStmt(
                at, Load(winners, (ox,)), IfThenElse(Binary("ge", at, Const(0, OFFSET)), add)))
            return Seq((*[p for p in picks if not _empty(p)], scatter))

        def rows(start: int, end: int, interior: bool) -> For:
            oy = Var("oy")
            return For(oy, Const(start), Const(end - start), row(oy, interior))

        loops = [rows(0, r_lo, False), rows(r_lo, r_hi, True), rows(r_hi, geo.oh, False)]
        zero = oplib.dtype_const(0, dt)
        return Allocate(plane, Allocate(winners, Seq((
            loop_nest((geo.h * geo.w,), lambda p: Store(plane, p, zero), inner, names="z"),
            *[r for r in loops if not _empty(r)],
            loop_nest((geo.h, geo.w), lambda p: write(
                (b, c, *p), Load(plane, (p[0] * geo.w + p[1],))),
                NestSchedule(None, 1), names="y"),
        ))))

    work = geo.h * geo.w * 2 + geo.oh * geo.ow * (geo.kh * geo.kw + 1)
    return oplib.outer_nest(x.shape[:2], plane_of, work)


def _empty(loop: For) -> bool:
    return isinstance(loop.extent, Const) and loop.extent.value == 0
