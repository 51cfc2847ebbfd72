"""3×3 convolutions of stride 1 by Winograd's minimal filtering, F(m×m, 3×3).

The output is cut into m×m tiles (the last of a row or column may stick out past its end:
those pixels are computed and dropped). Each tile needs an α×α patch of the padded input
(α = m + 2) and gives its m×m results as ``Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A`` (Lavin & Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016): a tile costs α² multiplies per
input channel and output channel instead of 9·m². Summed over the input channels, the
products are α² independent GEMMs, one per position ξ of the α×α grid:

    M[ξ] (O × T) = U[ξ] (O × C) · V[ξ] (C × T)

with U = G g Gᵀ the transformed weight (computed once, at compile time, by alter-layout:
kiln/transform/alter_layout.py; `pack_weight` lays it in the GEMM's A panels), V = Bᵀ d B
the transformed input tiles and T the number of tiles. So the kernel (`conv2d`) is three
stages in one loop nest, each parallel over the threads:

1. the input, copied into column phases (padded element (y, q·m + r) at [y, r, q]), so the
   α×α patches of a vector of consecutive tiles are consecutive loads, then transformed a
   vector of tiles at a time into V[ξ][c][t];
2. the α² products by the packed GEMM (kiln/loops/gemm.py), parallel over ξ, U read in
   place from its panels and V in place as B (vectors of consecutive tiles);
3. the inverse transform, per output channel a vector of tiles at a time into a local image
   in column phases, then written out row by row through the consumers fused after the
   convolution (a bias, a residual, relu) as any kernel's write.

F(4×4, 3×3) does 36 multiplies per tile and channel pair where the direct convolution does
144 (4×), F(2×2, 3×3) 16 where it does 36 (2.25×); the transforms are O(α²) per tile and
channel, not per channel pair. The cost is precision: F(4, 3)'s transforms have entries
up to 5 and ±1/24, so the result's error grows to about 1e-6 of its magnitude (float32
direct convolution: about 1e-7), and memory: U is α²/9 times the weight (4× for F(4, 3)),
which is why a layer with many channels on a small map (ResNet's 512 channels at 7×7,
9.4 MB of weight) stays with the direct kernel (`choose`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from contextvars import ContextVar
from dataclasses import replace
from fractions import Fraction

import numpy as np

from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.ir import (
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
)
from kiln.loops.schedule import lowering_target
from kiln.loops.tunable import (
    Space,
    current_overrides,
    ordered,
    overridden,
    override,
    recording,
    site_key,
)
from kiln.target import Target

TILES = (4, 2)  # output tile sizes m this kernel has transforms for, the preferred first


def _points(m: int) -> list[Fraction]:
    """The interpolation points of F(m, 3): 0, ±1, ±2, ±1/2, ... (and ∞, implicit)."""
    pts = [Fraction(0)]
    candidates = [Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2),
                  Fraction(-1, 2)]
    pts += candidates[:m]
    return pts


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Bᵀ (α×α), G (α×3), Aᵀ (m×α)) of F(m, 3), α = m + 2, from the Toom-Cook construction
    with the points `_points` and ∞, in exact rationals (then float64)."""
    r = 3
    alpha = m + r - 1
    pts = _points(m)  # alpha - 1 finite points; the last row/column is the point at infinity
    n = alpha - 1
    # Aᵀ: row i evaluates the output polynomial coefficient i at each point: p^i; ∞ -> [i == m-1]
    at = [[pts[j] ** i for j in range(n)] + [Fraction(1 if i == m - 1 else 0)]
          for i in range(m)]
    # G: the filter polynomial at each point, divided by the Lagrange denominator
    # ∏_{k≠j}(p_j - p_k); ∞ -> the filter's top coefficient
    den = []
    for j in range(n):
        d = Fraction(1)
        for k in range(n):
            if k != j:
                d *= pts[j] - pts[k]
        den.append(d)
    gm = [[pts[j] ** i / den[j] for i in range(r)] for j in range(n)]
    gm.append([Fraction(0)] * (r - 1) + [Fraction(1)])
    # Bᵀ: row j holds the coefficients of ∏_{k≠j}(x - p_k) (the Lagrange numerators); the
    # row of ∞ those of ∏_k (x - p_k)
    def poly(roots: list[Fraction]) -> list[Fraction]:
        c = [Fraction(1)]
        for root in roots:
            nxt = [Fraction(0)] * (len(c) + 1)
            for i, v in enumerate(c):
                nxt[i] -= root * v
                nxt[i + 1] += v
            c = nxt
        return c

    bt = []
    for j in range(n):
        c = poly([pts[k] for k in range(n) if k != j])
        bt.append(c + [Fraction(0)] * (alpha - len(c)))
    bt.append(poly(pts))
    return (np.array(bt, dtype=np.float64), np.array(gm, dtype=np.float64),
            np.array(at, dtype=np.float64))


def transform_weight(w: np.ndarray, m: int) -> np.ndarray:
    """U = G g Gᵀ of each OIHW 3×3 filter: (α², O, C) float32, ξ = row·α + column."""
    _, gm, _ = matrices(m)
    u = np.einsum("ai,ocij,bj->aboc", gm, w.astype(np.float64), gm)
    alpha = m + 2
    return np.ascontiguousarray(u.reshape(alpha * alpha, *w.shape[:2]).astype(np.float32))


def pack_weight(w: np.ndarray, m: int, mr: int, kp: int) -> np.ndarray:
    """U of OIHW ``w`` in the GEMM's A panels: (α², ⌈O/mr⌉, kp, mr), zero padded."""
    u = transform_weight(w, m)
    pos, o, c = u.shape
    tiles = -(-o // mr)
    padded = np.zeros((pos, tiles * mr, kp), dtype=np.float32)
    padded[:, :o, :c] = u
    return np.ascontiguousarray(padded.reshape(pos, tiles, mr, kp).transpose(0, 1, 3, 2))


def tile_of(packed_shape: Sequence[int]) -> int | None:
    """m of a packed weight of shape (α², tiles, kp, mr) (None: no F(m, 3) has that α²)."""
    for m in TILES:
        if packed_shape[0] == (m + 2) ** 2:
            return m
    return None


def winograd_key(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
                 m: int) -> str:
    """The key naming a Winograd convolution's products in a tuning log (padding: top,
    left; the weight is (out channels, in channels, 3, 3))."""
    return site_key("winograd", x=tuple(x_shape), out=tuple(out_shape),
                    padding=tuple(padding[:2]), m=m)


def _products(x_shape: Sequence[int], out_shape: Sequence[int], m: int
              ) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the products: positions, out channels, tiles, in channels."""
    _, o, oh, ow = (int(d) for d in out_shape)
    return (m + 2) ** 2, o, -(-oh // m) * -(-ow // m), int(x_shape[1])


def _heuristic(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
               m: int, target: Target) -> g.GemmSchedule:
    batch, mm, n, k = _products(x_shape, out_shape, m)
    base = g.GemmSchedule.heuristic(batch, mm, n, k, "float32", a_prepacked=True,
                                    b_prepacked=True, target=target)
    return replace(base, key=winograd_key(x_shape, out_shape, padding, m))


def space(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
          target: Target | None = None) -> Space:
    """The search space of the products (`kiln.loops.gemm.tile_space`): every knob free,
    the register tile's height and the K blocking too, since alter-layout packs U for the
    schedule the same overrides give."""
    t = lowering_target(target)
    batch, mm, n, k = _products(x_shape, out_shape, m)
    base = _heuristic(x_shape, out_shape, padding, m, t)
    return Space(base.key or "", g.tile_space(base, batch, mm, n, k, "float32", t, ("lanes",)),
                 g.tile_check(base, "float32", t), g.tile_canonical(mm, n))


def schedule(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
             target: Target | None = None) -> g.GemmSchedule:
    """The GEMM of the α² products (U's panels are a constant; V is read in place): the
    knobs the enclosing `overrides_scope` gives its key (a tuning log's), else the rule's."""
    t = lowering_target(target)
    return overridden(_heuristic(x_shape, out_shape, padding, m, t),
                      lambda: space(x_shape, out_shape, padding, m, t), g.gemm_schedule)


def packed_shape(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
                 m: int) -> tuple[int, ...]:
    """The shape of the panels `conv2d` reads for these shapes (`pack_weight`'s for the
    GEMM `schedule` gives): a weight of another shape takes the direct kernel."""
    s = schedule(x_shape, out_shape, padding, m)
    c = int(x_shape[1])
    return ((m + 2) ** 2, -(-int(out_shape[1]) // s.mr), s.kc * -(-c // s.kc), s.mr)


# Where it pays (see `choose`): at least this many tiles per product, and the transformed
# weight at most this many bytes. With fewer tiles each weight is read for too few pixels:
# on ResNet-18 (2 threads) F(2×2) at 7×7 (16 tiles) made the model 1.42× slower, F(4×4) at
# 14×14 1.18×; 96 channels at 16×16 in F(4×4) (16 tiles) took 1.04× F(2×2)'s time. With 25
# (two layers alternated, 2-core Xeon with AVX-512), F(4×4) at 20×20 against F(2×2): 64
# channels 0.97, 96 0.82, 128 0.84, 256 0.77; F(2×2) at 10×10 against the direct kernel:
# 64 channels 0.83, 384 0.55, 512 1.03. (The bound was 48, fitted on ResNet-18, whose
# layers have 16 tiles or 49 and more.) The weight's bound came from ResNet's 256 channels
# at 14×14 (F(2×2): 4.2 MB; the model 15.8 → 14.7 ms, Emerald Rapids) and was 5 MiB, which
# left VGG's wide layers direct; two of each layer alternated (`benchmarks/conv_layers.py`
# has three), the same Xeon, time over the direct kernel's: 512 channels at 14×14 F(2×2)
# (16.8 MB) 0.50, 384 at 14×14 0.50; at 28×28 F(4×4) 256 channels (9.4 MB) 0.68 of
# F(2×2)'s time, 320 (14.7 MB) 0.68, 384 (21.2 MB) 0.76, 448 (28.9 MB) 1.00, 512 (37.7 MB)
# 1.22 — there F(2×2) (16.8 MB) takes 0.54 of the direct kernel's.
MIN_TILES = 24
MAX_WEIGHT_BYTES = 24 << 20
# The tiles may stick out of the output's bottom and right (their extra pixels computed and
# dropped) by at most this share of its area: a 64-channel 3×3 at 55×55 in F(4×4), 3.7 %
# more pixels, 0.578 → 0.474 ms against the direct kernel, 128 at 27×27 (7.5 %) 0.576 →
# 0.447, 96 at 35×35 0.551 → 0.398, 256 at 13×13 in F(2×2) (16 %) 0.557 → 0.507; 256 at
# 13×13 in F(4×4) (51 %) 0.579 and 512 at 7×7 in F(2×2) (31 %, 16.8 MB of U) 0.759
# against 0.669 were slower (2 threads, the Emerald Rapids VM, interleaved).
MAX_OVERHANG = 0.2


def choose(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int,
           out_shape: Sequence[int]) -> int | None:
    """The tile size m for a Winograd convolution of these shapes, or None for the direct
    kernel: a 3×3 kernel, stride 1, no dilation, one group, tiles that cover the output
    without sticking out by more than `MAX_OVERHANG` of it, enough tiles to feed the
    products (`MIN_TILES`: 512 channels at 7×7 would read 16/9 of the weight for 16 tiles)
    and a transformed weight that is not too large (`MAX_WEIGHT_BYTES`: read from memory on
    every call; 512 channels at 28×28 take F(2×2), not F(4×4)'s 37.7 MB)."""
    if not _takes(w_shape, strides, padding, dilation, groups, out_shape):
        return None
    _, o, oh, ow = (int(d) for d in out_shape)
    c = int(w_shape[1])
    for m in TILES:
        alpha = m + 2
        th, tw = -(-oh // m), -(-ow // m)
        if th * tw < MIN_TILES or th * tw * m * m > (1 + MAX_OVERHANG) * oh * ow:
            continue
        if alpha * alpha * o * c * 4 > MAX_WEIGHT_BYTES:
            continue
        return m
    return None


def _takes(w_shape: Sequence[int], strides: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], groups: int, out_shape: Sequence[int]) -> bool:
    """Whether this kernel can compute the convolution at all (whether it pays is
    `choose`'s question): 3×3, stride 1, no dilation, one group, padding of at most 2 and
    at least 8 channels in and out."""
    return (tuple(w_shape[2:]) == (3, 3) and tuple(strides) == (1, 1)
            and tuple(dilation) == (1, 1) and groups == 1 and len(out_shape) == 4
            and 0 <= min(padding[:2]) and max(padding[:2]) <= 2
            and min(int(w_shape[0]), int(w_shape[1])) >= 8)


# The spaces of the convolutions `chosen` meets inside `recorded_algorithms` (kiln.tune's)
_SEEN: ContextVar[list[Space] | None] = ContextVar("kiln_winograd_algorithms", default=None)


def algorithm_space(x_shape: Sequence[int], w_shape: Sequence[int], padding: Sequence[int],
                    out_shape: Sequence[int]) -> Space:
    """How a convolution `_takes` may run, a knob of the whole model (kiln.tune times the
    model built each way): ``m`` = 4 or 2, Winograd's F(m×m, 3×3), or 0, the direct kernel
    — `choose`'s first. Its key, ``conv_algorithm x=... w=... padding=... out=...``, names
    the NCHW shapes, so every layer of those shapes takes the same."""
    rule = choose(x_shape, w_shape, (1, 1), padding, (1, 1), 1, out_shape)
    key = site_key("conv_algorithm", x=tuple(x_shape), w=tuple(w_shape),
                   padding=tuple(padding), out=tuple(out_shape))
    return Space(key, (("m", ordered(rule or 0, [0, *TILES])),))


def chosen(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int,
           out_shape: Sequence[int]) -> int | None:
    """The tile size the convolution runs in (None: the direct kernel): the one a tuning
    log gives its `algorithm_space` in the enclosing `overrides_scope`, else `choose`'s.
    Inside `recorded_algorithms` its space is noted."""
    rule = choose(x_shape, w_shape, strides, padding, dilation, groups, out_shape)
    seen = _SEEN.get()
    if (current_overrides() is None and seen is None) \
            or not _takes(w_shape, strides, padding, dilation, groups, out_shape):
        return rule
    space = algorithm_space(x_shape, w_shape, padding, out_shape)
    if seen is not None:
        seen.append(space)
    knobs = override(space)
    return rule if knobs is None else int(knobs["m"]) or None


def recorded_algorithms() -> ContextManager[list[Space]]:
    """The `algorithm_space` of each convolution `chosen` decides inside the block (once
    per decision: a key may come more than once)."""
    return recording(_SEEN)


def _combine(coeffs: np.ndarray, values: Sequence[Expr], lanes: int = 1) -> Expr:
    """Σ coeffs[i] · values[i] as an expression (of ``lanes``-wide vectors), zero
    coefficients skipped, ±1 unscaled."""
    def const(c: float) -> Expr:
        k = Const(c, "float32")
        return k if lanes == 1 else Broadcast(k, lanes)

    total: Expr | None = None
    for c, v in zip(coeffs, values):
        if c == 0:
            continue
        term = v if abs(c) == 1 else Binary("mul", const(float(abs(c))), v)
        if total is None:
            total = term if c > 0 else Binary("sub", const(0.0), term)
        else:
            total = Binary("add" if c > 0 else "sub", total, term)
    return total if total is not None else const(0.0)


def _lets(binds: list[tuple[Var, Expr]], body: Stmt) -> Stmt:
    for var, value in reversed(binds):
        body = LetStmt(var, value, body)
    return body


def conv2d(x: Tensor, u: Buffer, m: int, padding: Sequence[int], out_shape: Sequence[int],
           dtype: str = "float32", target: Target | None = None) -> Tensor:
    """The Winograd convolution of NCHW ``x`` (3×3 kernel, stride 1, ``padding`` top and left)
    with the transformed weight ``u`` in A panels (`pack_weight`) into ``out_shape`` (see the
    module docstring): tiles of m × m, the last of each row and column cut where the output
    ends (the padding past the input reads zeros)."""
    tgt = lowering_target(target)
    nimg, o, oh, ow = (int(d) for d in out_shape)
    c_in, h, w = (int(d) for d in x.shape[1:])
    top, left = int(padding[0]), int(padding[1])
    alpha = m + 2
    pos = alpha * alpha
    th, tw = -(-oh // m), -(-ow // m)  # the last tiles of a row or column may stick out
    tiles = th * tw
    bt_m, _, at_m = matrices(m)
    s = schedule(x.shape, out_shape, padding, m, tgt)
    lanes = s.lanes or tgt.lanes(dtype)
    # the input in column phases: phases[c, y, r, q] = padded input at (y, q·m + r), so the
    # column j of tile tx's patch is phases[.., j % m, tx + j // m], and a vector of tiles
    # reads consecutive elements
    blocks = -(-tw // lanes)  # vectors of tiles a row
    q_len = blocks * lanes + 1
    hp = th * m + 2  # the padded rows the tiles cover
    phases = Buffer("wphases", (c_in, hp, m, q_len), dtype, "local")
    # V's columns: whole B panels, and room for the last row's last vector
    tp = -(-max(tiles, (th - 1) * tw + blocks * lanes) // s.nr) * s.nr
    v = Buffer("wv", (pos, c_in, tp), dtype, "local")
    mm = Buffer("wm", (pos, o, tp), dtype, "local")
    zero = Const(0.0, dtype)

    def phase_input(img: Expr) -> Stmt:
        c, y, r, q = Var("c"), Var("y"), Var("r"), Var("q")
        sy, sx = y - top, q * m + r - left
        inside = Binary("and", Binary("and", Binary("ge", sy, Const(0, INDEX)),
                                      Binary("lt", sy, Const(h, INDEX))),
                        Binary("and", Binary("ge", sx, Const(0, INDEX)),
                               Binary("lt", sx, Const(w, INDEX))))
        read = x(img, c, oplib.clamp(sy, 0, h - 1), oplib.clamp(sx, 0, w - 1))
        fill = For(q, Const(0), Const(q_len), Store(phases, (c, y, r, q),
                                                    Select(inside, read, zero)), "vectorized")
        return For(c, Const(0), Const(c_in), For(y, Const(0), Const(hp), For(
            r, Const(0), Const(m), fill)), "parallel")

    def input_transform() -> Stmt:
        # a vector of `lanes` tiles of row ty at a time; lanes past the row's tiles write
        # the next row's first columns (written again after) or V's spare columns
        c, ty, tb = Var("c"), Var("ty"), Var("tb")
        d = [[Load(phases, (c, ty * m + i, Const(j % m, INDEX), tb * lanes + j // m), lanes)
              for j in range(alpha)] for i in range(alpha)]
        binds: list[tuple[Var, Expr]] = []
        # rows first: r[a][j] = Σ_i Bᵀ[a][i] d[i][j]; then V[a][b] = Σ_j r[a][j] Bᵀ[b][j]
        rows = []
        for a in range(alpha):
            names = [Var(f"r{a}_{j}", dtype, lanes) for j in range(alpha)]
            binds += [(names[j], _combine(bt_m[a], [d[i][j] for i in range(alpha)], lanes))
                      for j in range(alpha)]
            rows.append(names)
        t = ty * tw + tb * lanes
        stores = [Store(v, (Const(a * alpha + b, INDEX), c, t),
                        _combine(bt_m[b], rows[a], lanes))
                  for a in range(alpha) for b in range(alpha)]
        body = _lets(binds, Seq(tuple(stores)))
        loop = For(c, Const(0), Const(c_in), For(ty, Const(0), Const(th), For(
            tb, Const(0), Const(blocks), body)), "parallel")
        # V's columns past those the last row's vectors wrote: zeros, so that the products
        # compute finite values there (columns of M whose results are dropped)
        p, cc, j = Var("p"), Var("c"), Var("j")
        written = max(tiles, (th - 1) * tw + blocks * lanes)
        if written == tp:
            return loop
        rest = For(p, Const(0), Const(pos), For(cc, Const(0), Const(c_in), For(
            j, Const(written), Const(tp - written), Store(v, (p, cc, j), zero), "vectorized")))
        return Seq((loop, rest))

    def product() -> Stmt:
        def put(bt: Expr, i: Expr, j: Expr, value: Expr) -> Stmt:
            return Store(mm, (bt, i, j), value)

        def never(bt: Expr, p: Expr, j: Expr) -> Expr:
            raise AssertionError("the Winograd products read their operands in place")

        return g.gemm(pos, o, tiles, c_in, never, never, put, dtype, s,
                      a_panel=lambda bt, tile, kk, i: Load(u, (bt, tile, kk, i)),
                      b_panel=lambda bt, tile, kk, cc: Load(v, (bt, kk, tile * s.nr + cc),
                                                            lanes),
                      target=tgt)

    def output_transform(img: Expr, write: WriteFn) -> Stmt:
        # per output channel: a vector of tiles at a time into a local image in column
        # phases (consecutive stores), then the image out through the consumers row by row
        # (consecutive writes; the reads from the local image are gathers from L1)
        oc, ty, tb = Var("o"), Var("ty"), Var("tb")
        staged = Buffer("wout", (th * m, m, q_len), dtype, "local")
        t = ty * tw + tb * lanes
        q = [[Load(mm, (Const(a * alpha + b, INDEX), oc, t), lanes) for b in range(alpha)]
             for a in range(alpha)]
        binds: list[tuple[Var, Expr]] = []
        cols = []  # s[p][b] = Σ_a Aᵀ[p][a] q[a][b]
        for p in range(m):
            names = [Var(f"s{p}_{b}", dtype, lanes) for b in range(alpha)]
            binds += [(names[b], _combine(at_m[p], [q[a][b] for a in range(alpha)], lanes))
                      for b in range(alpha)]
            cols.append(names)
        stores = [Store(staged, (ty * m + p, Const(r, INDEX), tb * lanes),
                        _combine(at_m[r], cols[p], lanes)) for p in range(m) for r in range(m)]
        tiles_out = For(ty, Const(0), Const(th), For(tb, Const(0), Const(blocks), _lets(
            binds, Seq(tuple(stores)))))
        y, xx = Var("y"), Var("x")
        out_rows = For(y, Const(0), Const(oh), For(xx, Const(0), Const(ow), write(
            (img, oc, y, xx), Load(staged, (y, xx % m, xx // m))), "vectorized"))
        return For(oc, Const(0), Const(o), Allocate(staged, Seq((tiles_out, out_rows))),
                   "parallel")

    def emit(write: WriteFn) -> Stmt:
        img = Var("n")
        one = Seq((phase_input(img), input_transform(), product(), output_transform(img, write)))
        return Allocate(phases, Allocate(v, Allocate(mm, For(img, Const(0), Const(nimg), one))))

    out = extern((nimg, o, oh, ow), dtype, emit)
    out.schedule = {**s.attrs(), "algorithm": f"winograd F({m}x{m}, 3x3)", "tiles": tiles}
    return out
