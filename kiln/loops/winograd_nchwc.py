"""Winograd's F(m×m, 3×3) on channel-blocked data (NCHW[b]c), for the convert-layout pass.

The products of kiln/loops/winograd.py turned around, so that every vector runs along
channels, which NCHW[b]c keeps contiguous:

    Mᵀ[ξ] (T × O) = Vᵀ[ξ] (T × C) · Uᵀ[ξ] (C × O)

1. the input, copied into a zero-padded image (so no tile tests a read), then transformed
   a tile and a block of b channels at a time into ``V[ξ][t][c]`` (vectors of channels);
2. the α² products by the packed GEMM (kiln/loops/gemm.py), parallel over ξ: A = Vᵀ read
   from V's rows, B = Uᵀ in B panels, packed once at compile time — the layout `pack_weight`
   of winograd.py makes with the GEMM's ``nr`` as its row tile, since the A panels of U and
   the B panels of Uᵀ are the same array;
3. the inverse transform, a tile and a block of b output channels at a time (Aᵀ M A), its
   m×m pixels written through the fused consumers as vectors of channels.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
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
from kiln.loops.schedule import lowering_target
from kiln.loops.winograd import _combine, _lets, matrices
from kiln.target import Target


def schedule(x_shape: Sequence[int], out_shape: Sequence[int], m: int,
             target: Target | None = None) -> g.GemmSchedule:
    """The GEMM of the α² products on blocked data (U's panels a constant, as B)."""
    c = int(x_shape[1]) * int(x_shape[4])
    _, o0, oh, ow, b = (int(d) for d in out_shape)
    tiles = -(-oh // m) * -(-ow // m)
    return g.GemmSchedule.default((m + 2) ** 2, tiles, o0 * b, c, "float32", b_prepacked=True,
                                  target=lowering_target(target))


def packed_shape(x_shape: Sequence[int], out_shape: Sequence[int], m: int
                 ) -> tuple[int, int, int, int]:
    """The shape of the panels `conv2d` reads: `winograd.pack_weight`'s with the GEMM's
    ``nr`` as its tile and K padded to the GEMM's K blocks."""
    s = schedule(x_shape, out_shape, m)
    c = int(x_shape[1]) * int(x_shape[4])
    kc, blocks = g.k_blocking(c)
    o = int(out_shape[1]) * int(out_shape[4])
    return (m + 2) ** 2, -(-o // s.nr), kc * blocks, s.nr


def _units(u: Var, outer: tuple[Var, int], inner: tuple[Var, int], body: Stmt) -> Stmt:
    """``body`` for every (outer, inner) pair as one parallel loop over the pairs: a block
    of channels and a row each. Over the blocks alone (4 of them at 64 channels) one core
    kept busy by another process left the whole stage waiting for the block its worker
    had claimed: a 64-channel 56² layer 0.6 → 4.4 ms."""
    (o, no), (i, ni) = outer, inner
    return For(u, Const(0), Const(no * ni), LetStmt(o, u // ni, LetStmt(i, u % ni, body)),
               "parallel")


def conv2d(x: Tensor, up: Buffer, m: int, padding: Sequence[int], out_shape: Sequence[int],
           target: Target | None = None) -> Tensor:
    """The Winograd convolution of NCHW[b]c ``x`` (3×3, stride 1, ``padding`` top and left)
    with U packed as `packed_shape` says, into NCHW[b]c ``out_shape`` (module docstring)."""
    tgt = lowering_target(target)
    nimg, o0s, oh, ow, b = (int(d) for d in out_shape)
    c0s, h, w = (int(d) for d in x.shape[1:4])
    c, o = c0s * b, o0s * b
    top, left = int(padding[0]), int(padding[1])
    alpha = m + 2
    pos = alpha * alpha
    th, tw = -(-oh // m), -(-ow // m)
    tiles = th * tw
    hp, wp = th * m + 2, tw * m + 2
    bt_m, _, at_m = matrices(m)
    s = schedule(x.shape, out_shape, m, tgt)
    lanes = s.lanes or tgt.lanes("float32")
    xp = Buffer("wxp", (c0s, hp, wp, b), "float32", "local")
    v = Buffer("wv", (pos, tiles, c), "float32", "local")
    mm = Buffer("wm", (pos, tiles, o), "float32", "local")
    spans = (None, None, (-top, hp - 1 - top), (-left, wp - 1 - left), None)

    def pad_input(img: Expr) -> Stmt:
        c0, yy, xx, c1 = Var("c0"), Var("y"), Var("x"), Var("c1")
        read = oplib.guarded_read(x, (img, c0, yy - top, xx - left, c1), spans,
                                  Const(0.0, "float32"))
        u = Var("u")
        row = For(xx, Const(0), Const(wp), For(c1, Const(0), Const(b), Store(
            xp, (c0, yy, xx, c1), read), "vectorized"), "rolled")
        return _units(u, (c0, c0s), (yy, hp), row)

    def input_transform() -> Stmt:
        c0, ty, tx = Var("c0"), Var("ty"), Var("tx")
        d = [[Load(xp, (c0, ty * m + i, tx * m + j, Const(0, INDEX)), b) for j in range(alpha)]
             for i in range(alpha)]
        binds: list[tuple[Var, Expr]] = []
        rows = []  # r[a][j] = Σ_i Bᵀ[a][i] d[i][j]; then V[a][b'] = Σ_j r[a][j] Bᵀ[b'][j]
        for a in range(alpha):
            names = [Var(f"r{a}_{j}", "float32", b) for j in range(alpha)]
            binds += [(names[j], _combine(bt_m[a], [d[i][j] for i in range(alpha)], b))
                      for j in range(alpha)]
            rows.append(names)
        t = ty * tw + tx
        stores = [Store(v, (Const(a * alpha + q, INDEX), t, c0 * b),
                        _combine(bt_m[q], rows[a], b))
                  for a in range(alpha) for q in range(alpha)]
        return _units(Var("u"), (c0, c0s), (ty, th), For(
            tx, Const(0), Const(tw), _lets(binds, Seq(tuple(stores))), "rolled"))

    def product() -> Stmt:
        def put(bt: Expr, i: Expr, j: Expr, value: Expr) -> Stmt:
            return Store(mm, (bt, i, j), value)

        return g.gemm(pos, tiles, o, c, lambda bt, i, p: Load(v, (bt, i, p)),
                      lambda bt, p, j: Const(0.0, "float32"), put, "float32", s,
                      b_panel=lambda bt, tile, kk, cc: Load(up, (bt, tile, kk, cc), lanes),
                      target=tgt)

    def output_transform(img: Expr, write: WriteFn) -> Stmt:
        o0, ty, tx = Var("o0"), Var("ty"), Var("tx")
        t = ty * tw + tx
        q = [[Load(mm, (Const(a * alpha + j, INDEX), t, o0 * b), b) for j in range(alpha)]
             for a in range(alpha)]
        binds: list[tuple[Var, Expr]] = []
        cols = []  # s[p][j] = Σ_a Aᵀ[p][a] q[a][j]; then Y[p][r] = Σ_j s[p][j] Aᵀ[r][j]
        for p in range(m):
            names = [Var(f"s{p}_{j}", "float32", b) for j in range(alpha)]
            binds += [(names[j], _combine(at_m[p], [q[a][j] for a in range(alpha)], b))
                      for j in range(alpha)]
            cols.append(names)
        ytile = Buffer("wy", (m * m, b), "float32", "local")
        stores = [Store(ytile, (Const(p * m + r, INDEX), Const(0, INDEX)),
                        _combine(at_m[r], cols[p], b)) for p in range(m) for r in range(m)]
        k, c1 = Var("k"), Var("c1")
        y, xx = ty * m + k // m, tx * m + k % m
        if oh % m or ow % m:  # the last tiles stick out: only the pixels of the output
            inside = Binary("and", Binary("lt", y, Const(oh, INDEX)),
                            Binary("lt", xx, Const(ow, INDEX)))
            y, xx = g.index_min(y, oh - 1), g.index_min(xx, ow - 1)
        else:
            inside = None
        one = For(c1, Const(0), Const(b), write((img, o0, y, xx, c1), Load(ytile, (k, c1))),
                  "vectorized")
        out = For(k, Const(0), Const(m * m), one if inside is None else IfThenElse(inside, one),
                  "rolled")
        tile = Allocate(ytile, _lets(binds, Seq((Seq(tuple(stores)), out))))
        return _units(Var("u"), (o0, o0s), (ty, th), For(tx, Const(0), Const(tw), tile,
                                                          "rolled"))

    def emit(write: WriteFn) -> Stmt:
        img = Var("n")
        one = Seq((pad_input(img), input_transform(), product(), output_transform(img, write)))
        return Allocate(xp, Allocate(v, Allocate(mm, For(img, Const(0), Const(nimg), one))))

    out = extern(tuple(out_shape), "float32", emit)
    out.schedule = {**s.attrs(), "algorithm": f"winograd F({m}x{m}, 3x3) NCHW{b}c",
                    "tiles": tiles}
    return out
