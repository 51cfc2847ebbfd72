"""An 8-bit convolution that reads its input in place: channel-interleaved phase planes and a
weight packed at compile time.

nn.conv2d_int8_packed's fast path (kiln/op/nn/int8_packed.py; alter-layout makes the call).
The float convolution's implicit GEMM (kiln/loops/conv_kernels.py) reads the input through
zero-padded phase planes in which every kernel tap is a shift, so its B operand is never
packed. The int8 GEMM (kiln/loops/int8_gemm.py) wants ``g`` consecutive K values in each
32-bit lane (g = 4 bytes for ``vpdpbusd``, 2 int16 for ``vpmaddwd``), so here the planes hold
``g`` input channels per int32 — ``(channel group c, row, column)`` packs channels
``g·c .. g·c + g - 1`` at that pixel — and K runs over (channel group, ky, kx). Output pixel
``j`` (at the planes' padded width) of tap ``(c, ky, kx)`` is then int32 ``tap(c, ky, kx) + j``
of the planes: one vector load gives the B lanes of 16 consecutive pixels, and the weight's
lanes (packed at compile time in the same K order) are broadcast as A. Packing the
input costs one pass over it, where packing im2col columns cost one per tap, with index
arithmetic per element.

``vpdpbusd`` multiplies unsigned by signed bytes. uint8 data with an int8 weight (or int8
data with a uint8 weight) use it as they are. int8 data with an int8 weight is shifted into
uint8 (``x + 128``, the planes' padding shifted alike), and each output channel's
sum loses ``128 · Σ W[o]``, the weight row's sum packed beside its panels: exact modulo 2³²
as the int32 sums. Without VNNI the lanes hold the int16 values (``vpmaddwd``).

The product's int32 results go to a buffer at the planes' width, and the output pixels are
copied out of it through the lowering's ``write`` (the fused epilogue: requantization),
vectorized along each output row; the padding columns are never written out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kiln.loops import int8_gemm as q
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.conv_kernels import CHUNKS_PER_THREAD, MAX_PHASES, PLANES_PARALLEL_MIN, Planes
from kiln.loops.ir import INDEX, Allocate, Binary, Const, Expr, For, Load, Seq, Stmt, Store, Var
from kiln.loops.ir import Buffer as LBuffer
from kiln.loops.schedule import lowering_target
from kiln.loops.tunable import Space, overridden, site_key
from kiln.target import Target

# The lowest register tile height `_shorter` gives a convolution on VNNI to pad its output
# channels less: 8 rows of 2 vectors keep 16 vpdpbusd in flight, 10 loads for 16 of them.
# Alternated in one process on a 2-core Zen 4 (znver4), tiles of 8 against the rule's 14:
# ResNet-18's int8 layers 0.81-0.96 of their time (each moving by up to 0.08 from run to
# run), kiln.quantize's whole ResNet-18 0.89-0.90 (0.93 with one core busy). Int8 dense
# layers of 64 to 1024 rows took 1.09-1.21 of their time in tiles of 8 (B streams once a
# row tile), so the dense rule keeps its height.
MR_FEWEST = 8


def padding_word(value: int, group: int, shift: bool) -> int:
    """The int32 of the planes' padding: ``group`` lanes of ``value`` (bytes, shifted by
    +128 when the data is; or int16), as a signed 32-bit value."""
    lane = ((value + 128) & 255 if shift else value & 255) if group == 4 else value & 0xFFFF
    bits = 32 // group
    word = sum(lane << (bits * k) for k in range(group))
    return word - (1 << 32) if word >= 1 << 31 else word


def conv_form(data_dtype: str, weight_dtype: str, target: Target | None = None
              ) -> tuple[int, bool]:
    """(values per int32 lane, whether the data is shifted by +128) for an 8-bit
    convolution of ``data_dtype`` by ``weight_dtype`` on ``target``."""
    t = lowering_target(target)
    lanes = t.lanes("int32")
    pair = q._ordered(weight_dtype, data_dtype)
    if q.dot_form(t.features, lanes, *pair) == "vnni":
        return 4, False
    if (data_dtype, weight_dtype) == ("int8", "int8") \
            and q.dot_form(t.features, lanes, "uint8", "int8") == "vnni":
        return 4, True
    return 2, False


@dataclass(frozen=True)
class Int8ConvPlan:
    """How `conv2d_prepacked` runs a convolution: its planes, the GEMM's schedule, the
    values per lane and whether the data is shifted (what alter-layout packs the weight
    for)."""

    planes: Planes
    schedule: q.Int8Schedule
    group: int
    shift: bool


def plan(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int,
         out_shape: Sequence[int], data_dtype: str, weight_dtype: str,
         target: Target | None = None) -> Int8ConvPlan | None:
    """The plan for these shapes (``padding``: top, left), or None where the kernel does
    not apply: channel groups, or more stride phases than `MAX_PHASES`. Its schedule is a
    tuning site (`conv_key`, `space`): the knobs the enclosing `overrides_scope` gives its
    key, where it gives some."""
    tgt = lowering_target(target)
    oc, c, kh, kw = (int(d) for d in w_shape)
    if groups != 1 or min(*x_shape, *w_shape, *out_shape) <= 0:
        return None
    group, shift = conv_form(data_dtype, weight_dtype, tgt)
    geo = Planes(-(-c // group), int(x_shape[2]), int(x_shape[3]), (kh, kw),
                 (int(strides[0]), int(strides[1])), (int(dilation[0]), int(dilation[1])),
                 (int(padding[0]), int(padding[1])), (int(out_shape[2]), int(out_shape[3])))
    if geo.phases > MAX_PHASES:
        return None
    b_dtype = "uint8" if shift else data_dtype
    s = q.Int8Schedule.default(1, oc, geo.columns, geo.channels * kh * kw * group,
                               weight_dtype, b_dtype, target=tgt)
    if (4 if s.form == "vnni" else 2) != group or s.shift:
        return None  # not reached: conv_form chose the lanes of this schedule's form
    key = conv_key(x_shape, w_shape, strides, padding, dilation, out_shape, data_dtype,
                   weight_dtype)
    base = replace(_finer(_shorter(s, oc), oc, geo.columns, tgt), key=key)
    k = geo.channels * kh * kw * group
    chosen = overridden(base, lambda: q.space_around(base, key, 1, oc, geo.columns, k, tgt),
                        q.apply_knobs)
    return Int8ConvPlan(geo, chosen, group, shift)


def conv_key(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
             data_dtype: str, weight_dtype: str) -> str:
    """The key naming an 8-bit convolution's schedule in a tuning log (``padding``: top,
    left; the bottom and right follow from the output's size)."""
    return site_key("int8_conv", x=tuple(x_shape), w=tuple(w_shape), strides=tuple(strides),
                    padding=tuple(padding[:2]), dilation=tuple(dilation),
                    out=tuple(out_shape), a=data_dtype, b=weight_dtype)


def space(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
          padding: Sequence[int], dilation: Sequence[int], out_shape: Sequence[int],
          data_dtype: str, weight_dtype: str, target: Target | None = None) -> Space | None:
    """The search space of the convolution `plan` schedules (None where it has no plan)."""
    from kiln.loops.tunable import overrides_scope

    tgt = lowering_target(target)
    with overrides_scope(None):
        chosen = plan(x_shape, w_shape, strides, padding, dilation, 1, out_shape, data_dtype,
                      weight_dtype, tgt)
    if chosen is None:
        return None
    oc, _, kh, kw = (int(d) for d in w_shape)
    s = chosen.schedule
    k = chosen.planes.channels * kh * kw * chosen.group
    return q.space_around(s, s.key or "", 1, oc, chosen.planes.columns, k, tgt)


def _shorter(s: q.Int8Schedule, m: int) -> q.Int8Schedule:
    """``s`` (VNNI) with the tile height from `MR_FEWEST` up to the rule's that pads the
    ``m`` output channels with the fewest rows (ties: the taller): 8 for a ResNet's 64·2ⁱ
    channels, where 14 computed 70 rows for 64, 266 for 256."""
    if s.form != "vnni" or m <= s.mr:
        return s
    mr = min(range(min(MR_FEWEST, s.mr), s.mr + 1), key=lambda r: (-(-m // r) * r, -r))
    return replace(s, mr=mr, mc=max(1, s.mc // mr) * mr)  # blocks of about as many rows


def _finer(s: q.Int8Schedule, m: int, n: int, target: Target) -> q.Int8Schedule:
    """``s`` parallel over the axis with more tiles, in about `CHUNKS_PER_THREAD` blocks a
    thread, as the float convolution's: neither operand is packed per block, so small blocks
    cost nothing, and a thread that is descheduled holds up a small share of the product,
    not half of it (one block a thread was the schedule's choice)."""
    if s.parallel not in ("m", "n"):
        return s
    mt, nt = -(-m // s.mr), -(-n // s.nr)
    chunks = CHUNKS_PER_THREAD * target.cores
    if nt >= mt:
        return replace(s, parallel="n", nc=max(1, min(s.nc // s.nr, -(-nt // chunks))) * s.nr,
                       m_blocks=1)
    return replace(s, parallel="m", mc=max(1, min(s.mc // s.mr, -(-mt // chunks))) * s.mr,
                   m_blocks=1)


def conv2d_prepacked(x: Tensor, wp: LBuffer, strides: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], out_shape: Sequence[int],
                     kernel: Sequence[int], weight_dtype: str, group: int,
                     pad_value: int = 0, target: Target | None = None) -> Tensor | None:
    """The convolution of ``x`` (NCHW, 8-bit, padded with ``pad_value``) by the panels
    ``wp`` (module docstring), int32; None where `plan` gives no plan or one whose panels
    are not ``wp``'s."""
    tgt = lowering_target(target)
    groups, _, kq1, mr = wp.shape
    nimg, oc, oh, ow = (int(d) for d in out_shape)
    kh, kw = int(kernel[0]), int(kernel[1])
    c = x.shape[1]
    chosen = plan(x.shape, (oc, c, kh, kw), strides, padding, dilation, groups, out_shape,
                  x.dtype, weight_dtype, tgt)
    if chosen is None or chosen.group != group or chosen.schedule.mr != mr \
            or kq1 != chosen.planes.channels * kh * kw + 1:
        return None
    geo, s, shift = chosen.planes, chosen.schedule, chosen.shift
    kq = geo.channels * kh * kw
    n = geo.columns
    b_dtype = "uint8" if shift else x.dtype
    nr, lanes = s.nr, s.lanes
    bits = 32 // group

    # tap p = (c, ky, kx) of pixel 0, from a table made once per call; taken modulo a power
    # of two above every offset (changing nothing) so the verifier bounds the read
    taps = LBuffer("taps", (kq,), INDEX, "local")
    span = 1 << max(geo.max_tap(), 1).bit_length()
    slots = -(-n // nr) * nr
    used = geo.size(slots)
    planes = LBuffer("planes", (max(used, span - 1 + slots),), "int32", "local")
    result = LBuffer("sums", (oc, n), "int32", "local")

    def tap_of(p: Expr) -> Expr:
        if kh == kw == 1:
            return geo.tap(p, Const(0, INDEX), Const(0, INDEX))
        return geo.tap(p // (kh * kw), (p // kw) % kh, p % kw)

    def quad(img: Expr, cc: Expr, y: Expr, xx: Expr) -> Expr:
        # channels g·cc .. g·cc + g - 1 of a pixel in one int32 (past the last channel: the
        # last again, which the weight's zero lanes multiply away)
        vals = []
        for k in range(group):
            ch = Binary("min", cc * group + k, Const(c - 1, INDEX)) if c % group else \
                cc * group + k
            v = x(img, ch, y, xx)
            vals.append(q.lane_byte(v, shift) if group == 4 else q.lane_int16(v))
        return q.pack_lanes(vals, bits)

    def b_panel(bt: Expr, tile: Expr, p: Expr, cc: Expr) -> Expr:
        at = Binary("floormod", Load(taps, (p,)), Const(span, INDEX))
        return Load(planes, (at + tile * nr + cc,), lanes)

    def a_panel(bt: Expr, tile: Expr, p: Expr, i: Expr) -> Expr:
        return Load(wp, (Const(0, INDEX), tile, p, i))

    def emit(write: WriteFn) -> Stmt:
        img = Var("n")
        gemm = q.int8_gemm(1, oc, n, kq * group, _unread, _unread,
                           lambda bt, i, j, v: Store(result, (i, j), v),
                           weight_dtype, b_dtype, s, tgt, b_panel=b_panel, a_panel=a_panel)
        o, y, xx = Var("o"), Var("y"), Var("x")
        value: Expr = Load(result, (o, y * geo.cols + xx))
        if shift:
            row_sum = Load(wp, (Const(0, INDEX), o // mr, Const(kq, INDEX), o % mr))
            value = Binary("sub", value, Binary("mul", row_sum, Const(128, "int32")))
        out = For(o, Const(0), Const(oc), For(y, Const(0), Const(oh), For(
            xx, Const(0), Const(ow), write((img, o, y, xx), value), "vectorized")),
            "parallel" if oc * n >= PLANES_PARALLEL_MIN and tgt.cores > 1 else "serial")
        p = Var("p")
        table = For(p, Const(0), Const(kq), Store(taps, (p,), tap_of(p)))
        fill = geo.fill(quad, img, planes, tgt, used=used,
                        pad=padding_word(pad_value, group, shift))
        images = For(img, Const(0), Const(nimg), Allocate(planes, Allocate(result, Seq((
            fill, gemm, out)))))
        return Allocate(taps, Seq((table, images)))

    t = extern((nimg, oc, oh, ow), "int32", emit)
    t.schedule = {**s.attrs(), "input": "channel-group planes", "prepacked": True,
                  "shifted": shift}
    return t


def _unread(bt: Expr, i: Expr, p: Expr) -> Expr:
    raise AssertionError("the int8 convolution reads both operands from their panels")
