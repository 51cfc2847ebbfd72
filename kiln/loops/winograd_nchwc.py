"""Winograd's F(m×m, 3×3) on channel-blocked data (NCHW[b]c), for the convert-layout pass.

The products of kiln/loops/winograd.py turned around, so that every vector runs along
channels, which NCHW[b]c keeps contiguous:

    Mᵀ[ξ] (T × O) = Vᵀ[ξ] (T × C) · Uᵀ[ξ] (C × O)

1. the input transformed a tile and a block of b channels at a time into ``V[ξ][t][c]``
   (vectors of channels), read where it is: the tiles whose windows lie inside the image
   as they are, those at its edges with each read tested (a zero-padded copy of the input
   first took 9 % of a 64-channel 56² layer);
2. the α² products by the packed GEMM (kiln/loops/gemm.py), parallel over ξ: A = Vᵀ read
   in place from V's rows (a tile's channels contiguous: packing A panels first took
   another 10 % of that layer), B = Uᵀ in B panels, packed once at compile time — the
   layout `pack_weight` of winograd.py makes with the GEMM's ``nr`` as its row tile, since
   the A panels of U and the B panels of Uᵀ are the same array;
3. the inverse transform, a tile and a block of b output channels at a time (Aᵀ M A), its
   m×m pixels written through the fused consumers as vectors of channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, WriteFn, extern
from kiln.loops.ir import (
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
from kiln.loops.schedule import lowering_target
from kiln.loops.tunable import Space, overridden, site_key
from kiln.loops.winograd import _combine, _lets, matrices
from kiln.target import Target


def key(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
        m: int) -> str:
    """The key naming a blocked Winograd convolution's products in a tuning log (blocked
    shapes; padding: top, left)."""
    return site_key("winograd_nchwc", x=tuple(int(d) for d in x_shape),
                    out=tuple(int(d) for d in out_shape),
                    padding=tuple(int(d) for d in padding[:2]), m=m)


def _products(x_shape: Sequence[int], out_shape: Sequence[int], m: int
              ) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the products: positions, tiles, out channels, in channels."""
    c = int(x_shape[1]) * int(x_shape[4])
    _, o0, oh, ow, b = (int(d) for d in out_shape)
    return (m + 2) ** 2, -(-oh // m) * -(-ow // m), o0 * b, c


def _heuristic(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
               m: int, target: Target) -> g.GemmSchedule:
    batch, tiles, o, c = _products(x_shape, out_shape, m)
    base = g.GemmSchedule.heuristic(batch, tiles, o, c, "float32", b_prepacked=True,
                                    target=target)
    return replace(base, key=key(x_shape, out_shape, padding, m))


def space(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
          target: Target | None = None) -> Space:
    """The search space of the products (`kiln.loops.gemm.tile_space`): the K blocking
    fixed (U is padded to `k_blocking`'s blocks), every other knob free — convert-layout
    packs U with the ``nr`` the same overrides give, and A is V read in place whatever
    its ``mr``."""
    t = lowering_target(target)
    batch, tiles, o, c = _products(x_shape, out_shape, m)
    base = _heuristic(x_shape, out_shape, padding, m, t)
    return Space(base.key or "", g.tile_space(base, batch, tiles, o, c, "float32", t, ("kc",)),
                 g.tile_check(base, "float32", t), g.tile_canonical(tiles, o))


def schedule(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
             target: Target | None = None) -> g.GemmSchedule:
    """The GEMM of the α² products on blocked data (U's panels a constant, as B): the knobs
    the enclosing `overrides_scope` gives its key (a tuning log's), else the rule's."""
    t = lowering_target(target)
    return overridden(_heuristic(x_shape, out_shape, padding, m, t),
                      lambda: space(x_shape, out_shape, padding, m, t), g.gemm_schedule)


def packed_shape(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
                 m: int) -> tuple[int, int, int, int]:
    """The shape of the panels `conv2d` reads: `winograd.pack_weight`'s with the GEMM's
    ``nr`` as its tile and K padded to the GEMM's K blocks."""
    s = schedule(x_shape, out_shape, padding, m)
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


def conv2d(x: BufferTensor, up: Buffer, m: int, padding: Sequence[int],
           out_shape: Sequence[int], target: Target | None = None) -> Tensor:
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
    bt_m, _, at_m = matrices(m)
    s = schedule(x.shape, out_shape, padding, m, tgt)
    lanes = s.lanes or tgt.lanes("float32")
    v = Buffer("wv", (pos, tiles, c), "float32", "local")
    mm = Buffer("wm", (pos, tiles, o), "float32", "local")
    data = x.buffer

    def input_transform(img: Expr) -> Stmt:
        c0, ty, tx = Var("c0"), Var("ty"), Var("tx")
        # a tile whose window lies inside the image reads it as it is (its tile row and
        # column clamped to those: no value changes, but the verifier's interval
        # arithmetic then bounds every read), one at an edge tests its reads
        ty0, ty1 = oplib.windows_inside(h, m, alpha, 1, top, th)
        tx0, tx1 = oplib.windows_inside(w, m, alpha, 1, left, tw)
        inner_y = Binary("max", Binary("min", ty, Const(ty1 - 1, INDEX)), Const(ty0, INDEX))
        inner_x = Binary("max", Binary("min", tx, Const(tx1 - 1, INDEX)), Const(tx0, INDEX))
        zero = Broadcast(Const(0.0, "float32"), b)
        edge_spans = (None, None, (-top, (th - 1) * m + alpha - 1 - top),
                      (-left, (tw - 1) * m + alpha - 1 - left), None)
        plain: list[list[Expr]] = [
            [Load(data, (img, c0, inner_y * m + (i - top), inner_x * m + (j - left),
                         Const(0, INDEX)), b) for j in range(alpha)] for i in range(alpha)]
        tested = [[oplib.guarded_read(x, (img, c0, ty * m + (i - top), tx * m + (j - left),
                                          Const(0, INDEX)), edge_spans, zero,
                                      read=lambda at: Load(data, tuple(at), b))
                   for j in range(alpha)] for i in range(alpha)]
        t = ty * tw + tx
        inside = Binary("and", Binary("and", Binary("ge", ty, Const(ty0, INDEX)),
                                      Binary("lt", ty, Const(ty1, INDEX))),
                        Binary("and", Binary("ge", tx, Const(tx0, INDEX)),
                               Binary("lt", tx, Const(tx1, INDEX))))
        body = IfThenElse(inside, transformed(plain, c0, t), transformed(tested, c0, t)) \
            if ty1 > ty0 and tx1 > tx0 else transformed(tested, c0, t)
        return _units(Var("u"), (c0, c0s), (ty, th), For(tx, Const(0), Const(tw), body,
                                                          "rolled"))

    def transformed(d: list[list[Expr]], c0: Expr, t: Expr) -> Stmt:
        """V's α² vectors of tile t, channels of block c0, from its window's ``d``."""
        binds: list[tuple[Var, Expr]] = []
        rows = []  # r[a][j] = Σ_i Bᵀ[a][i] d[i][j]; then V[a][b'] = Σ_j r[a][j] Bᵀ[b'][j]
        for a in range(alpha):
            names = [Var(f"r{a}_{j}", "float32", b) for j in range(alpha)]
            binds += [(names[j], _combine(bt_m[a], [d[i][j] for i in range(alpha)], b))
                      for j in range(alpha)]
            rows.append(names)
        stores = [Store(v, (Const(a * alpha + q, INDEX), t, c0 * b),
                        _combine(bt_m[q], rows[a], b))
                  for a in range(alpha) for q in range(alpha)]
        return _lets(binds, Seq(tuple(stores)))

    def product() -> Stmt:
        def put(bt: Expr, i: Expr, j: Expr, value: Expr) -> Stmt:
            return Store(mm, (bt, i, j), value)

        def a_panel(bt: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
            # Vᵀ's rows read in place, a tile's channels contiguous (the last row tile's
            # rows past the tiles repeat the last: their sums are never written)
            row = tile * s.mr + i
            return Load(v, (bt, row if tiles % s.mr == 0 else g.index_min(row, tiles - 1),
                            kk))

        # (packed after all where the K blocks would pad C: the padding must read zeros)
        unpacked = g.k_blocking(c, tgt)
        return g.gemm(pos, tiles, o, c, lambda bt, i, p: Load(v, (bt, i, p)),
                      lambda bt, p, j: Const(0.0, "float32"), put, "float32", s,
                      a_panel=a_panel if unpacked[0] * unpacked[1] == c else None,
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
        one = Seq((input_transform(img), product(), output_transform(img, write)))
        return Allocate(v, Allocate(mm, For(img, Const(0), Const(nimg), one)))

    out = extern(tuple(out_shape), "float32", emit)
    out.schedule = {**s.attrs(), "algorithm": f"winograd F({m}x{m}, 3x3) NCHW{b}c",
                    "tiles": tiles}
    return out
