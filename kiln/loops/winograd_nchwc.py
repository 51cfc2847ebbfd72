"""Winograd's F(m×m, 3×3) on channel-blocked data (NCHW[b]c), for the convert-layout pass.

The products of kiln/loops/winograd.py turned around, so that every vector runs along
channels, which NCHW[b]c keeps contiguous:

    Mᵀ[ξ] (T × O) = Vᵀ[ξ] (T × C) · Uᵀ[ξ] (C × O)

1. the input transformed a tile and a block of b channels at a time into ``V[ξ][t][c]``
   (vectors of channels), read where it is: the tiles whose windows lie inside the image
   as they are, those at its edges with each read tested (a zero-padded copy of the input
   first took 9 % of a 64-channel 56² layer);
2. the α² products by the packed GEMM (kiln/loops/gemm.py): A = Vᵀ read in place from
   V's rows (a tile's channels contiguous: packing A panels first took another 10 % of a
   64-channel 56² layer), B = Uᵀ in B panels, packed once at compile time — the layout
   `pack_weight` of winograd.py makes with the GEMM's ``nr`` as its row tile, since the A
   panels of U and the B panels of Uᵀ are the same array;
3. the inverse transform, a tile and a block of b output channels at a time (Aᵀ M A), its
   m×m pixels written through the fused consumers as vectors of channels.

The three steps run on a *group* of tiles at a time, a group to a task of the thread pool,
so that V and M of a group (a few hundred KiB) stay in its core's L2 from the transform
that writes them to the one that reads them. Run over the whole image, step by step (each
parallel on its own), V and M are each as large as the image's channels times α²/m² (1.8
MB for a 64-channel 56² image): the input transform of that layer wrote them at a fifth of
its instruction rate, out to L3, and the products read them from the other core's half.
Grouped, the layer takes 0.61 → 0.23 ms and ResNet-18 9.7 → 7.8 ms (2 threads, Emerald
Rapids). A schedule's ``group`` is the register tiles of rows (tiles) per group; 0 runs the
whole image in three steps (an image with fewer tiles than a group for each thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
from kiln.loops.tunable import Space, ordered, overridden, site_key
from kiln.loops.winograd import _combine, _lets, matrices
from kiln.target import Target


def key(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
        m: int) -> str:
    """The key naming a blocked Winograd convolution's products in a tuning log (blocked
    shapes; padding: top, left)."""
    return site_key("winograd_nchwc", x=tuple(int(d) for d in x_shape),
                    out=tuple(int(d) for d in out_shape),
                    padding=tuple(int(d) for d in padding[:2]), m=m)


@dataclass(frozen=True)
class WinogradSchedule:
    """The products' GEMM knobs and how many of its register tiles of rows (tiles) make a
    group (module docstring); ``group`` 0: the whole image, the GEMM as ``gemm`` says."""

    gemm: g.GemmSchedule
    group: int

    @property
    def rows(self) -> int:
        """Tiles per group (0: the whole image at once)."""
        return self.group * self.gemm.mr

    def attrs(self) -> dict:
        """The knobs, for ``kernel.attrs`` (printing, statistics)."""
        return {**self.gemm.attrs(), "group": self.group}


# Tiles a group should have: its GEMM reads all of U (from L2 or L3) once, each B panel
# serving the group's register tiles from L1; twice as many where a register tile is short
# (AVX2's 6 rows: a B vector feeds 6 FMAs, not 14). ResNet-18, built both ways and
# alternated in one process, 2 threads: for AVX2 groups of 25 tiles took 0.95 of the time
# groups of 12 took (with the other core busy 1.01); on AVX-512 groups of 26 took 0.98 of
# the time groups of 14 took, but 1.02-1.06 with the other core busy (8 groups, not 14, to
# share out); groups of 40 1.12.
MIN_GROUP = 12
SHORT_TILE = 8  # register tiles of fewer rows take groups of 2 × MIN_GROUP


def _products(x_shape: Sequence[int], out_shape: Sequence[int], m: int
              ) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the products: positions, tiles, out channels, in channels."""
    c = int(x_shape[1]) * int(x_shape[4])
    _, o0, oh, ow, b = (int(d) for d in out_shape)
    return (m + 2) ** 2, -(-oh // m) * -(-ow // m), o0 * b, c


def group_rule(tiles: int, threads: int, mr: int) -> tuple[int, int]:
    """(register tile height, tiles a group in register tiles) for ``tiles`` tiles on
    ``threads`` threads, the height at most ``mr``; (mr, 0) where there are too few tiles
    for a group for each thread. A group is `MIN_GROUP` tiles or more (twice that for a
    `SHORT_TILE`), fewer where that would give the busiest thread more than a quarter over
    its even share. A height r costs r + 1 per step (as in `kiln.loops.gemm._split_height`),
    times the groups of the busiest thread: 196 tiles on two threads take 14 groups of 14
    on AVX-512, 8 of 25 on AVX2 (the last 21); 49 tiles 4 of 13 (the last 10) on AVX-512,
    30 tiles 2 of 15 on AVX2."""
    def ceil(a: int, b: int) -> int:
        return -(-a // b)

    even = ceil(tiles, max(threads, 1))
    best: tuple[tuple[int, int], int, int] | None = None
    for r in range(max(4, mr - 2), mr + 1):
        j = ceil(MIN_GROUP * (2 if mr < SHORT_TILE else 1), r)
        while j > 1 and ceil(ceil(tiles, j * r), max(threads, 1)) * j * r > 1.25 * even:
            j -= 1
        groups = ceil(tiles, j * r)
        if groups < threads:
            continue
        cost = (ceil(groups, max(threads, 1)) * j * (r + 1), -r)
        if best is None or cost < best[0]:
            best = (cost, r, j)
    return (mr, 0) if best is None else (best[1], best[2])


def _heuristic(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
               m: int, target: Target) -> WinogradSchedule:
    batch, tiles, o, c = _products(x_shape, out_shape, m)
    base = g.GemmSchedule.heuristic(batch, tiles, o, c, "float32", b_prepacked=True,
                                    target=target)
    r, group = group_rule(tiles, max(target.cores, 1), g.register_tile(target)[0])
    if group:
        base = replace(base, mr=r, mc=r * group, parallel=None)
    return WinogradSchedule(replace(base, key=key(x_shape, out_shape, padding, m)), group)


GROUPS = (0, 1, 2, 3, 4)  # the tuner's values of ``group``


def space(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
          target: Target | None = None) -> Space:
    """The search space of the products (`kiln.loops.gemm.tile_space`) and the group: the
    K blocking fixed (U is padded to `k_blocking`'s blocks), every other knob free —
    convert-layout packs U with the ``nr`` the same overrides give, and A is V read in
    place whatever its ``mr``. With a group, the GEMM of a group is serial, one M block
    (``mb`` and ``parallel`` are the whole image's), and ``chunks`` cuts the loop over the
    groups."""
    t = lowering_target(target)
    batch, tiles, o, c = _products(x_shape, out_shape, m)
    base = _heuristic(x_shape, out_shape, padding, m, t)
    knobs = g.tile_space(base.gemm, batch, tiles, o, c, "float32", t, ("kc", "lanes"))
    groups = ordered(base.group, [j for j in GROUPS if j * 4 <= tiles])
    tiles_ok = g.tile_check(base.gemm, "float32", t)
    same = g.tile_canonical(tiles, o)

    def check(kn: Mapping[str, Any]) -> bool:
        return kn["group"] * kn["mr"] <= tiles and tiles_ok(kn)

    def canonical(kn: Mapping[str, Any]) -> Any:
        if not kn["group"]:
            return same(kn)
        d = base.gemm
        # the chunks are the tasks' (the groups'), not the serial product's
        return (same({**kn, "mb": d.mc // d.mr, "parallel": None}), kn["group"], kn["chunks"])

    return Space(base.gemm.key or "", (*knobs, ("group", groups)), check, canonical)


def _apply(base: WinogradSchedule, knobs: Mapping[str, Any]) -> WinogradSchedule:
    """``base`` with the knobs of a point of `space`, marked tuned where they differ."""
    group = int(knobs["group"])
    s = g.gemm_schedule(base.gemm, {k: v for k, v in knobs.items() if k != "group"})
    tuned = s.tuned or group != base.group
    if group:
        s = replace(s, mc=group * s.mr, parallel=None)
    return WinogradSchedule(replace(s, tuned=tuned), group)


def schedule(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int], m: int,
             target: Target | None = None) -> WinogradSchedule:
    """The schedule of the α² products on blocked data (U's panels a constant, as B): the
    knobs the enclosing `overrides_scope` gives its key (a tuning log's), else the rule's."""
    t = lowering_target(target)
    return overridden(_heuristic(x_shape, out_shape, padding, m, t),
                      lambda: space(x_shape, out_shape, padding, m, t), _apply)


def packed_shape(x_shape: Sequence[int], out_shape: Sequence[int], padding: Sequence[int],
                 m: int) -> tuple[int, int, int, int]:
    """The shape of the panels `conv2d` reads: `winograd.pack_weight`'s with the GEMM's
    ``nr`` as its tile and K padded to the GEMM's K blocks."""
    s = schedule(x_shape, out_shape, padding, m).gemm
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
    ws = schedule(x.shape, out_shape, padding, m, tgt)
    s = ws.gemm
    lanes = s.lanes or tgt.lanes("float32")
    data = x.buffer
    ty0, ty1 = oplib.windows_inside(h, m, alpha, 1, top, th)
    tx0, tx1 = oplib.windows_inside(w, m, alpha, 1, left, tw)

    def input_tile(img: Expr, c0: Expr, ty: Expr, tx: Expr, v: Buffer, row: Expr) -> Stmt:
        """V's α² vectors of tile (ty, tx), channels of block c0, at ``row`` of ``v``: a
        tile whose window lies inside the image reads it as it is (its tile row and column
        clamped to those: no value changes, but the verifier's interval arithmetic then
        bounds every read), one at an edge tests its reads."""
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
        if not (ty1 > ty0 and tx1 > tx0):
            return transformed(tested, c0, v, row)
        inside = Binary("and", Binary("and", Binary("ge", ty, Const(ty0, INDEX)),
                                      Binary("lt", ty, Const(ty1, INDEX))),
                        Binary("and", Binary("ge", tx, Const(tx0, INDEX)),
                               Binary("lt", tx, Const(tx1, INDEX))))
        return IfThenElse(inside, transformed(plain, c0, v, row),
                          transformed(tested, c0, v, row))

    def transformed(d: list[list[Expr]], c0: Expr, v: Buffer, row: Expr) -> Stmt:
        """V's α² vectors of one tile, channels of block c0, from its window's ``d``."""
        binds: list[tuple[Var, Expr]] = []
        rows = []  # r[a][j] = Σ_i Bᵀ[a][i] d[i][j]; then V[a][b'] = Σ_j r[a][j] Bᵀ[b'][j]
        for a in range(alpha):
            names = [Var(f"r{a}_{j}", "float32", b) for j in range(alpha)]
            binds += [(names[j], _combine(bt_m[a], [d[i][j] for i in range(alpha)], b))
                      for j in range(alpha)]
            rows.append(names)
        stores = [Store(v, (Const(a * alpha + q, INDEX), row, c0 * b),
                        _combine(bt_m[q], rows[a], b))
                  for a in range(alpha) for q in range(alpha)]
        return _lets(binds, Seq(tuple(stores)))

    def product(v: Buffer, mm: Buffer, rows: int, gs: g.GemmSchedule,
                last: Expr | None = None) -> Stmt:
        """M = V·U over ``rows`` rows of V (``last``: rows past it repeat it — a group's
        past the image's tiles; their sums are never read)."""
        def row_of(i: Expr) -> Expr:
            if last is not None:
                return Binary("min", i, last)
            return i if rows % gs.mr == 0 else g.index_min(i, rows - 1)

        def put(bt: Expr, i: Expr, j: Expr, value: Expr) -> Stmt:
            return Store(mm, (bt, i, j), value)

        def a_panel(bt: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
            # Vᵀ's rows read in place, a tile's channels contiguous (the last row tile's
            # rows past V's repeat the last: their sums are never read)
            return Load(v, (bt, row_of(tile * gs.mr + i), kk))

        # (packed after all where the K blocks would pad C: the padding must read zeros)
        unpacked = g.k_blocking(c, tgt)
        return g.gemm(pos, rows, o, c, lambda bt, i, p: Load(v, (bt, row_of(i), p)),
                      lambda bt, p, j: Const(0.0, "float32"), put, "float32", gs,
                      a_panel=a_panel if unpacked[0] * unpacked[1] == c else None,
                      b_panel=lambda bt, tile, kk, cc: Load(up, (bt, tile, kk, cc), lanes),
                      target=tgt)

    def output_tile(img: Expr, o0: Expr, ty: Expr, tx: Expr, mm: Buffer, row: Expr,
                    write: WriteFn) -> Stmt:
        """The m×m pixels of tile (ty, tx), channels of block o0, from ``row`` of M."""
        q = [[Load(mm, (Const(a * alpha + j, INDEX), row, o0 * b), b) for j in range(alpha)]
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
        return Allocate(ytile, _lets(binds, Seq((Seq(tuple(stores)), out))))

    def whole(write: WriteFn) -> Stmt:
        # each step over the whole image, parallel on its own: the transforms over (block
        # of channels, row of tiles), the products as the GEMM's schedule says
        v = Buffer("wv", (pos, tiles, c), "float32", "local")
        mm = Buffer("wm", (pos, tiles, o), "float32", "local")
        img, c0, o0, ty, tx = Var("n"), Var("c0"), Var("o0"), Var("ty"), Var("tx")
        inputs = _units(Var("u"), (c0, c0s), (ty, th), For(
            tx, Const(0), Const(tw), input_tile(img, c0, ty, tx, v, ty * tw + tx), "rolled"))
        outputs = _units(Var("u"), (o0, o0s), (ty, th), For(
            tx, Const(0), Const(tw), output_tile(img, o0, ty, tx, mm, ty * tw + tx, write),
            "rolled"))
        one = Seq((inputs, product(v, mm, tiles, s), outputs))
        return Allocate(v, Allocate(mm, For(img, Const(0), Const(nimg), one)))

    def grouped(write: WriteFn) -> Stmt:
        # a task per (image, group of tiles): its V and M its own, the GEMM serial; the
        # last group of an image takes the tiles left (its GEMM rows past them repeat the
        # last tile's, never written out)
        rows = ws.rows
        groups = -(-tiles // rows)
        u, img, grp = Var("u"), Var("n"), Var("grp")
        v = Buffer("wv", (pos, rows, c), "float32", "local")
        mm = Buffer("wm", (pos, rows, o), "float32", "local")
        first = grp * rows
        count = Binary("min", Const(rows, INDEX), Const(tiles, INDEX) - first) \
            if tiles % rows else Const(rows, INDEX)
        c0, o0, i, ty, tx = Var("c0"), Var("o0"), Var("i"), Var("ty"), Var("tx")

        def each_tile(body: Stmt) -> Stmt:
            # (the tile's index clamped to the last, which it never passes: the verifier's
            # intervals cannot tell that i < count keeps first + i inside)
            t = g.index_min(first + i, tiles - 1)
            return For(i, Const(0), count, LetStmt(ty, t // tw, LetStmt(tx, t % tw, body)),
                       "rolled")

        inputs = For(c0, Const(0), Const(c0s), each_tile(input_tile(img, c0, ty, tx, v, i)),
                     "rolled")
        outputs = For(o0, Const(0), Const(o0s), each_tile(
            output_tile(img, o0, ty, tx, mm, i, write)), "rolled")
        last = count - 1 if tiles % rows else None
        task = Allocate(v, Allocate(mm, Seq((inputs, product(v, mm, rows, s, last),
                                             outputs))))
        return For(u, Const(0), Const(nimg * groups), LetStmt(img, u // groups, LetStmt(
            grp, u % groups, task)), "parallel", s.chunks)

    out = extern(tuple(out_shape), "float32", grouped if ws.group else whole)
    out.schedule = {**ws.attrs(), "algorithm": f"winograd F({m}x{m}, 3x3) NCHW{b}c",
                    "tiles": tiles}
    return out
