"""A packed, register-blocked matrix product in loop IR (BLIS-style), with a fused epilogue.

``C[b, i, j] = sum_p A[b, i, p] * B[b, p, j]`` for float32, where A and B are given as read
functions (so dense, batch_matmul and conv2d as an implicit GEMM share it) and each element of
C goes out through the lowering's ``write(idx, value)``, which applies the fused elementwise
consumers (bias, relu, residual add) before storing. The loop nest follows BLIS:

    for b                      batch (or conv groups)
      for jc: nc columns       a panel of B ...
        for pc: kc of K        ... packed into Bp[nc/nr][kc][nr] (zero padded)
          for ic: mc rows      a block of A packed into Ap[mc/mr][kc][mr] (zero padded)
            for jr, ir:        an mr×nr tile of C in vector registers:
              for p in kc:     nr/L vector loads of Bp, mr broadcasts of Ap, mr·nr/L FMAs
              epilogue         (last pc) the tile through ``write``; else kept in Cp

(L: the vector lanes of the `kiln.Target`). The tile and the blocks come from the target
(`register_tile`, `k_blocking`, `GemmSchedule.default`): 6×16 on AVX2, 14×32 on AVX-512.
The accumulator tile is a local buffer indexed only by constants, which SROA turns into
registers (12 ymm accumulators on AVX2, 28 zmm on AVX-512; see `tests/loops/test_gemm.py`).
Partial K blocks are summed in Cp, a padded copy of C. Edge tiles read zeros from the padded
packing, and the epilogue writes only the valid rows and columns: full-width tiles with a
vectorizable loop of ``nr``, the last, narrower column tile with a loop of ``n % nr``. When
that last tile has at most one vector of columns (n % nr ≤ L, as a 7×7 conv's N = 49), its
micro-kernel is ``mr``×L (AVX2, N = 49: 56 columns computed instead of 64).

Tile indices are clamped (``min(jc·TNB + t, NT - 1)``): the clamp never changes a value at
run time, but it lets the verifier's interval arithmetic prove every access in bounds.

A constant weight can be packed once at compile time instead (the alter-layout pass,
kiln/op/nn/packed.py): the kernel then reads its panels in place (``a_panel``/``b_panel``).

Only float32 takes this path; other dtypes keep the operators' plain reduction loops. The
knobs (`GemmSchedule`) are recorded in ``kernel.attrs["schedules"]``, with the site's key;
their legal values for a shape and Target are `gemm_space` (`space_of`), which `kiln.tune`
searches and a tuning log's entries are checked against (kiln/loops/tunable.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kiln.errors import InternalError
from kiln.ir.dtype import dtype_of
from kiln.loops.ir import (
    CHUNKS_PER_THREAD,
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
    Prefetch,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.schedule import lowering_target, weights_fit_split, worth_parallel
from kiln.loops.tunable import Space, ordered, overridden, site_key
from kiln.target import Target

DTYPES = ("float32",)  # what the packed micro-kernel handles
MR_MAX = 16  # rows of a tile: beyond this the A sliver packed per tile outgrows its use
# K steps ahead at which the first row tile of a column tile prefetches its streamed B panel
# (`gemm`): a few hundred cycles of FMAs, about a memory latency. Prefetching the next column
# tile's panel instead (the same step) was 4-8 % slower on ResNet-18's 512-channel 7×7 layer
# at batch 1 (196-219 against 208-238 GFLOP/s) and 2 % on six 768↔3072 dense layers at 128
# rows, 2 threads, Sapphire Rapids-class; 8 and 128 steps ahead fell between.
PREFETCH_STEPS = 32

ReadFn = Callable[[Expr, Expr, Expr], Expr]  # (batch, row or k, k or col) -> scalar
WriteFn = Callable[[Expr, Expr, Expr, Expr], Stmt]  # (batch, row, col, value) -> statement


def supported(dtype: str) -> bool:
    """Whether the packed micro-kernel handles ``dtype`` (float32 only, for now)."""
    return dtype in DTYPES


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def register_tile(target: Target, dtype: str = "float32") -> tuple[int, int]:
    """(mr, nr): the register tile of the micro-kernel for ``target``.

    Each step of the K loop keeps mr × nr/lanes accumulators, loads nr/lanes vectors of B
    and broadcasts one element of A at a time, so they fit when
    ``mr · v + v + 1 ≤ registers`` (v = nr/lanes). Two vectors of B per step (v = 2) give
    the most FMAs per load that fit: AVX2 (16 registers, 8 float32 lanes): 6×16, 12
    accumulators; AVX-512 (32 registers, 16 lanes): 14×32, 28 accumulators; NEON (32
    registers, 4 lanes): 14×8. Enough accumulators, too, to hide the FMA latency (4 cycles
    × 2 pipes = 8 in flight).
    """
    lanes = target.lanes(dtype)
    v = 2
    mr = min((target.registers - v - 1) // v, MR_MAX)
    return mr, v * lanes


def _kc_max(target: Target, dtype: str) -> int:
    # A kc×nr micro-panel of B stays in L1 across a block's row tiles, the A sliver streaming
    # beside it: two thirds of L1 up to 256 steps, or half where that is more. AVX2 with 32
    # KiB: 256; with 48 KiB: 384; AVX-512 with 48 KiB: 256, not half's 192, which split
    # K = 1024 in 8 blocks of 128 (the 1024³ product 10-15 % slower on Sapphire Rapids at 1
    # and 2 threads: the C tile is loaded and stored twice as often). A multiple of 16.
    _, nr = register_tile(target, dtype)
    size = dtype_of(dtype).itemsize
    half = (target.l1d // 2) // (nr * size) // 16 * 16
    two_thirds = (2 * target.l1d // 3) // (nr * size) // 16 * 16
    return max(16, half, min(256, two_thirds))


def k_blocking(k: int, target: Target | None = None, dtype: str = "float32") -> tuple[int, int]:
    """(kc, number of K blocks) for a reduction of length ``k``: blocks of at most the
    target's kc (`_kc_max`), as even as possible, and all of one length where up to twice
    the fewest blocks allow it (a conv's K = C·kh·kw: 1152 = 6 × 192, not 5 × 231), so that
    no K step of the micro-kernel reads the padding under a guard (a select on every load
    of the unpacked operand: about a third of the speed of a 3×3 conv with 128 channels on
    Zen 3). A prepacked operand is padded with zeros to kc × blocks along K."""
    kc_max = _kc_max(lowering_target(target), dtype)
    k = max(k, 1)
    fewest = _ceil(k, kc_max)
    blocks = next((b for b in range(fewest, 2 * fewest + 1) if k % b == 0), fewest)
    return _ceil(k, blocks), blocks


@dataclass(frozen=True)
class GemmSchedule:
    """Knobs of the packed product.

    ``mr``×``nr``: the register tile (``nr`` a multiple of the vector width); ``kc``: the K
    block; ``mc``/``nc``: rows of an A block and columns of a B panel (multiples of
    ``mr``/``nr``); ``parallel``: the loop on the thread pool ("batch", "n", "m" or None);
    ``unroll``: how many steps of the K loop are unrolled; ``lanes``: elements per vector
    (None: the target's width for the dtype); ``order``: the tile loops of a block, outer
    then inner — ``"nm"``, BLIS's, the column tiles outside, so that a kc×nr micro-panel of
    B stays in L1 while the block's A slivers stream past it; ``"mn"``, the row tiles
    outside, an A sliver in L1 while B's micro-panels stream; ``chunks``: the pieces per
    thread the parallel loop is cut into for the pool (`kiln.loops.ir.For`).
    """

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    parallel: str | None
    unroll: int = 1
    lanes: int | None = None
    order: str = "nm"
    chunks: int = CHUNKS_PER_THREAD
    key: str | None = None  # the site's key (`gemm_key`), where a tuning log can name it
    tuned: bool = False  # whether the knobs came from outside (kiln/loops/tunable.py)

    @staticmethod
    def default(batch: int, m: int, n: int, k: int, dtype: str = "float32",
                threads: int | None = None, b_prepacked: bool = False,
                a_prepacked: bool = False, target: Target | None = None) -> GemmSchedule:
        """The schedule of this product: the knobs the enclosing `overrides_scope` gives its
        key (`gemm_key`; a tuning log's), else `heuristic`'s."""
        t = lowering_target(target)
        base = GemmSchedule.heuristic(batch, m, n, k, dtype, threads, b_prepacked,
                                      a_prepacked, t)
        if not supported(dtype):
            return base
        key = gemm_key(batch, m, n, k, dtype, b_prepacked, a_prepacked, threads)
        base = replace(base, key=key)
        return overridden(base, lambda: gemm_space(base, batch, m, n, k, dtype, b_prepacked,
                                                   a_prepacked, t), gemm_schedule)

    @staticmethod
    def heuristic(batch: int, m: int, n: int, k: int, dtype: str = "float32",
                  threads: int | None = None, b_prepacked: bool = False,
                  a_prepacked: bool = False, target: Target | None = None) -> GemmSchedule:
        """A schedule for ``target`` (default: the lowering's) from the shapes: its register
        tile, cache-sized blocks, the parallel loop over its cores (or ``threads``). With
        ``b_prepacked`` (B's panels are a constant), splitting M copies nothing; with
        ``a_prepacked``, splitting N."""
        t = lowering_target(target)
        lanes = t.lanes(dtype)
        size = dtype_of(dtype).itemsize
        mr, nr = register_tile(t, dtype)
        if n <= lanes:
            # narrow: one vector of B per step, so twice the rows in the same accumulators
            nr, mr = lanes, min(2 * mr, t.registers - 2)
        elif mr >= 8:
            # up to two rows shorter where that wastes fewer padded rows of M (64 rows in
            # tiles of 14 compute 70, in tiles of 13 65: a 64-channel conv 3 % faster, a
            # 128-channel one 7 %, one Sapphire Rapids core)
            mr = min(range(mr - 2, mr + 1), key=lambda r: (-(-m // r) * r, -r))
        kc = k_blocking(k, t, dtype)[0]
        # An mc×kc block of A stays in a quarter of L2 (B's micro-panels stream through the
        # rest); a kc×nc panel of B in half of each core's share of L3, at most 4096 columns.
        mc_max = max(mr, (t.l2 // 4) // (kc * size))
        nc_max = max(nr, min(4096, (t.l3 // (2 * max(t.cores, 1))) // (kc * size)))
        mt, nt = _ceil(m, mr), _ceil(n, nr)
        tmb = max(1, min(mt, mc_max // mr))
        tnb = max(1, min(nt, nc_max // nr))
        threads = t.cores if threads is None else threads
        parallel = None
        if worth_parallel(batch * m * n * k, threads):  # kiln/loops/schedule.py
            # Over N each thread packs its own panels of B but all of A; over M, its own
            # blocks of A but all of B: the cheaper duplicate wins (A is M×K, B is K×N).
            if batch >= threads:
                parallel = "batch"
            elif b_prepacked and nt >= threads and weights_fit_split(t):
                tnb = min(tnb, _ceil(nt, threads))
                parallel = "n"
            elif (m > n or b_prepacked) and not a_prepacked and mt >= threads:
                # one M block per thread where it fits (B is packed once per M block)
                if n > lanes:
                    mr = _split_height(m, threads, mr, 2 * mc_max)
                    mt = _ceil(m, mr)
                tmb = max(1, min(_ceil(mt, threads), 2 * mc_max // mr))
                parallel = "m"
            elif nt >= threads:
                tnb = min(tnb, _ceil(nt, threads))
                parallel = "n"
            elif mt >= threads:
                tmb = min(tmb, _ceil(mt, threads))
                parallel = "m"
        return GemmSchedule(mr, nr, kc, tmb * mr, tnb * nr, parallel, unroll_for(kc),
                            lanes=lanes)

    def attrs(self) -> dict:
        """The knobs, for ``kernel.attrs`` (printing, statistics)."""
        return {"kernel": "gemm", **asdict(self)}


def _split_height(m: int, threads: int, mr: int, rows_max: int) -> int:
    """The row tile for M split into one block per thread: the height, at most ``mr``, that
    costs the most loaded thread least, a tile of r rows costing r + 1 (per K step its 2r
    FMAs take r cycles on two ports, its r broadcasts and 2 loads of B r + 1 on two).

    The register tile cuts few rows badly: an LSTM's input projection over 32 steps ran as
    28 + 4 rows on two threads in tiles of 14, now 16 + 16 in tiles of 8; batch 64 as 42 + 22
    in tiles of 14, then 39 + 25 in tiles of 13, now 33 + 31 in tiles of 11; ViT's 197 rows
    as 108 + 89 in tiles of 12, now 99 + 98 in tiles of 11 (its dense layers 6-8 % faster).
    Where a thread would need more than one block of ``rows_max``, the pool balances the
    blocks and ``mr`` stays."""
    def cost(r: int) -> tuple[int, int]:
        return _ceil(_ceil(m, r), threads) * (r + 1), -r
    heights = [r for r in range(min(4, mr), mr + 1)
               if _ceil(_ceil(m, r), threads) * r <= rows_max]
    return min(heights, key=cost) if heights else mr


UNROLLS = (4, 2, 1)  # the K loop's unrolling by default: the largest dividing the K block


def unroll_for(kc: int) -> int:
    """How many steps of a K block of ``kc`` the micro-kernel's loop unrolls by default.

    Four steps a trip where they divide the block, as the tuner kept choosing for large
    products. Against one step (the same model built both ways, alternated in one process,
    three runs on the 2-core Emerald Rapids VM): the batch-64 MLP 6-7 % faster, the 4-layer
    encoder 2-16 %, a 1024³ matmul 1.5-5.5 %, MobileNetV2 and ResNet-18 within the noise
    (-10 to +1 %, -4 to +1 %); compiled for AVX2 on the same machine, the encoder 3 %, the
    rest within 1 %. An identical build alternated with itself differs by up to 6 %."""
    return next(u for u in UNROLLS if kc % u == 0)


# --- the search space (kiln/loops/tunable.py) ---------------------------------------------------


def gemm_key(batch: int, m: int, n: int, k: int, dtype: str = "float32",
             b_prepacked: bool = False, a_prepacked: bool = False,
             threads: int | None = None) -> str:
    """The key naming this product's schedule in a tuning log (the Target is the log's)."""
    fields: dict = dict(batch=batch, m=m, n=n, k=k, dtype=dtype, a_prepacked=a_prepacked,
                        b_prepacked=b_prepacked)
    if threads is not None:
        fields["threads"] = threads
    return site_key("gemm", **fields)


def tile_knobs(s: GemmSchedule) -> dict:
    """A schedule's knobs as a point of its space: the blocks as numbers of tiles."""
    return {"mr": s.mr, "nr": s.nr, "kc": s.kc, "mb": s.mc // s.mr, "nb": s.nc // s.nr,
            "parallel": s.parallel, "unroll": s.unroll, "lanes": s.lanes, "order": s.order,
            "chunks": s.chunks}


def gemm_schedule(base: GemmSchedule, knobs: dict) -> GemmSchedule:
    """``base`` with the knobs of a point of its space (see `gemm_space`), marked tuned."""
    mr, nr = int(knobs["mr"]), int(knobs["nr"])
    return replace(base, mr=mr, nr=nr, kc=int(knobs["kc"]), mc=int(knobs["mb"]) * mr,
                   nc=int(knobs["nb"]) * nr, parallel=knobs["parallel"],
                   unroll=int(knobs["unroll"]), lanes=int(knobs["lanes"]),
                   order=str(knobs["order"]), chunks=int(knobs["chunks"]),
                   tuned=tile_knobs(base) != knobs)


def tile_space(base: GemmSchedule, batch: int, m: int, n: int, k: int, dtype: str,
               target: Target, fixed: tuple[str, ...] = ()) -> tuple[tuple[str, tuple], ...]:
    """The knobs' legal values around ``base`` (its own first) for an m×n×k product on
    ``target``: register tiles that fit its registers (1-3 vectors of columns), K in a
    quarter to 2× as many even blocks, blocks of 1 to 32 tiles within a cache's size, each
    parallel loop with work for several threads, cut into 2 to 16 chunks a thread, unrolling
    of the K loop by 1, 2 or 4, either order of a block's tile loops, and vectors of the
    Target's width or half of it (``lanes``: 256-bit vectors on an AVX-512 machine, where
    some CPUs run them at a higher clock). Knobs in ``fixed`` keep base's
    value (a prepacked operand's layout depends on them; kernels built around the Target's
    vector width fix ``lanes``)."""
    lanes = base.lanes or target.lanes(dtype)
    regs = target.registers
    d = tile_knobs(base)
    mrs = [x for x in (4, 6, 8, 10, 12, 14, 16, 2 * lanes - 4) if x <= regs - 2 and x < 2 * m]
    nrs = [v * lanes for v in (1, 2, 3) if (v == 1 or n > (v - 1) * lanes)
           and (regs - v - 1) // v >= 4]
    blocks = -(-k // base.kc)
    # fewer, longer blocks too: a convolution whose weight panel serves few pixel tiles
    # (256 channels at 14², 9 blocks of 256) ran 10 % faster in 4 of 576, its partial sums
    # stored and reloaded less often
    kcs = [-(-k // b) for b in {max(1, blocks - 1), blocks + 1, 2 * blocks, max(1, blocks // 2),
                                max(1, blocks // 4)}]
    kcs = [x for x in kcs if x >= 8]
    mt, nt = -(-m // min(mrs + [base.mr])), -(-n // min(nrs + [base.nr]))
    mbs = [x for x in (1, 2, 4, 8, 16, 32) if x <= mt]
    nbs = [x for x in (1, 2, 4, 8, 16, 32) if x <= nt]
    pars: list = [None]
    if target.cores > 1:
        pars += ["batch"] if batch >= 2 else []
        pars += ["m"] if -(-m // base.mr) >= 2 else []
        pars += ["n"] if -(-n // base.nr) >= 2 else []
    # a tile height only where some allowed width fits it in the registers
    widths = [d["nr"]] if "nr" in fixed else [d["nr"], *nrs]
    mrs = [x for x in mrs if any(x * (w // lanes) + w // lanes + 1 <= regs for w in widths)]
    # unrolling only by what divides some K block (else the loop is not unrolled at all)
    blocks_k = [d["kc"]] if "kc" in fixed else [d["kc"], *kcs]
    unrolls = [u for u in (1, 2, 4) if any(x % u == 0 for x in blocks_k)]
    lane_counts = [lanes // 2] if lanes >= 8 else []
    # one chunk a thread is left out: a thread whose core is busy would hold up the rest
    chunks = [2, 8, 16] if target.cores > 1 else []
    values = {"mr": mrs, "nr": nrs, "kc": kcs, "mb": mbs, "nb": nbs, "parallel": pars,
              "unroll": unrolls, "lanes": lane_counts, "order": ["mn"], "chunks": chunks}
    return tuple((name, ordered(d[name], [] if name in fixed else values[name]))
                 for name in d)


def tile_check(base: GemmSchedule, dtype: str, target: Target) -> Callable[[Any], bool]:
    """The combinations of `tile_space` allowed: an accumulator tile that fits the
    registers, an unrolling that divides the K block, and packed blocks no larger than a
    cache (or than base's)."""
    lanes = base.lanes or target.lanes(dtype)
    size = dtype_of(dtype).itemsize
    a_cap = max(base.mc * base.kc * size, target.l2 // 2)
    b_cap = max(base.nc * base.kc * size, target.l2)

    def check(knobs: Any) -> bool:
        mr, nr, kc = knobs["mr"], knobs["nr"], knobs["kc"]
        width = knobs.get("lanes") or lanes
        v = nr // width
        if nr % width or mr * v + v + 1 > target.registers or kc % knobs["unroll"]:
            return False
        return knobs["mb"] * mr * kc * size <= a_cap and knobs["nb"] * nr * kc * size <= b_cap

    return check


def gemm_space(base: GemmSchedule, batch: int, m: int, n: int, k: int, dtype: str,
               b_prepacked: bool, a_prepacked: bool, target: Target) -> Space:
    """The search space of a packed product (`GemmSchedule.default`'s site): see
    `tile_space`. A prepacked operand fixes the K blocking (alter-layout pads K to
    `k_blocking`'s blocks, kiln/transform/alter_layout.py). A dense weight's panels are as
    wide as this schedule's ``nr`` — alter-layout asks `GemmSchedule.default` too, under the
    same overrides — so ``nr`` stays free; A prepacked (not made here) keeps ``mr``."""
    fixed = ("kc",) * (a_prepacked or b_prepacked) + ("mr",) * a_prepacked
    key = base.key or gemm_key(batch, m, n, k, dtype, b_prepacked, a_prepacked)
    return Space(key, tile_space(base, batch, m, n, k, dtype, target, fixed),
                 tile_check(base, dtype, target), tile_canonical(m, n))


def tile_canonical(m: int, n: int) -> Callable[[Any], tuple]:
    """What a point of `tile_space` builds, for telling equal kernels apart from different
    ones: blocks of more tiles than M or N has are all of it, the order of a block's tile
    loops is moot where one of them has a single tile, and so are the chunks of no parallel
    loop."""
    def canonical(knobs: Any) -> tuple:
        out = dict(knobs)
        out["mb"] = min(out["mb"], -(-m // out["mr"]))
        out["nb"] = min(out["nb"], -(-n // out["nr"]))
        if min(out["mb"], out["nb"]) == 1:
            out["order"] = "nm"
        if out["parallel"] is None:
            out["chunks"] = CHUNKS_PER_THREAD
        return tuple(sorted((name, str(v)) for name, v in out.items()))
    return canonical


def space_of(batch: int, m: int, n: int, k: int, dtype: str = "float32",
             b_prepacked: bool = False, a_prepacked: bool = False,
             threads: int | None = None, target: Target | None = None) -> Space:
    """The search space of the product `GemmSchedule.default` schedules for these shapes."""
    t = lowering_target(target)
    base = replace(GemmSchedule.heuristic(batch, m, n, k, dtype, threads, b_prepacked,
                                          a_prepacked, t),
                   key=gemm_key(batch, m, n, k, dtype, b_prepacked, a_prepacked, threads))
    return gemm_space(base, batch, m, n, k, dtype, b_prepacked, a_prepacked, t)


def index_min(a: Expr, b: int) -> Expr:
    if isinstance(a, Const) and isinstance(a.value, int):
        return Const(min(a.value, b), INDEX)
    return Binary("min", a, Const(b, INDEX))


def loop(name: str, count: int, body: Callable[[Expr], Stmt], kind: str = "serial",
         chunks: int = CHUNKS_PER_THREAD) -> Stmt:
    """``for v in [0, count)``; with a count of 1, the body at 0 (no loop). ``chunks``: a
    parallel loop's chunks per thread."""
    if count == 1 and kind != "parallel":
        return body(Const(0, INDEX))
    v = Var(name)
    return For(v, Const(0, INDEX), Const(count, INDEX), body(v), kind, chunks)


def tile_blocks(block: Expr, per_block: int, total: int, name: str,
            body: Callable[[Expr, Expr], Stmt]) -> Stmt:
    """The tiles of one block: ``body(t, tile)`` for the block's tiles (t within the block,
    ``tile`` global and clamped to ``total - 1`` so the verifier can bound it)."""
    first = block * per_block
    if total % per_block == 0:
        return loop(name, per_block, lambda t: body(t, first + t))
    count: Expr = Binary("min", Const(per_block, INDEX), Const(total, INDEX) - first)
    if isinstance(first, Const):
        count = Const(min(per_block, total - int(first.value)), INDEX)
    t = Var(name)
    return For(t, Const(0, INDEX), count, body(t, index_min(first + t, total - 1)))


def guarded(value: Expr, conds: list[Expr], dtype: str) -> Expr:
    """``value`` where every condition holds, else zero (a packing's padding rows and
    columns, whose reads the caller has clamped into the operand)."""
    cond: Expr | None = None
    for c in conds:
        cond = c if cond is None else Binary("and", cond, c)
    return value if cond is None else Select(cond, value, Const(0.0, dtype))


PanelFn = Callable[[Expr, Expr, Expr, Expr], Expr]  # (batch, tile, kk, lane) -> value
GridWriteFn = Callable[[Expr, Expr, Expr, Expr, Expr], Stmt]  # (batch, row, y, x, value)


@dataclass(frozen=True)
class Grid:
    """N as rows of ``cols`` columns of which the first ``valid`` are results (a conv's
    output pixels at the padded width of its planes, kiln/loops/conv_kernels.py): the
    epilogue writes element (i, y·cols + x) of C, x < valid, as ``write(bt, i, y, x, v)``,
    each tile's columns cut into per-row runs of consecutive x, so that its stores are
    vectors and the padding columns are skipped, not masked."""

    cols: int
    valid: int
    rows: int
    write: GridWriteFn


def gemm(batch: int, m: int, n: int, k: int, a: ReadFn, b: ReadFn, write: WriteFn,
         dtype: str = "float32", schedule: GemmSchedule | None = None,
         a_panel: PanelFn | None = None, b_panel: PanelFn | None = None,
         target: Target | None = None, grid: Grid | None = None,
         down_columns: bool | str = False) -> Stmt:
    """The statement computing ``C = A·B`` (see the module docstring).

    ``a(bt, i, p)`` and ``b(bt, p, j)`` read A and B (only at indices inside the shapes);
    ``write(bt, i, j, value)`` is the statement storing C's element. An operand packed ahead
    of time (a constant weight, kiln/op/nn/packed.py) is given instead as ``a_panel(bt, tile,
    kk, i)`` (a scalar of row ``tile·mr + i``) or ``b_panel(bt, tile, kk, c)`` (``nr``/L
    vectors at column ``tile·nr + c``), with kk over the K padded to kc × blocks: it is then
    read in place, never packed. With a `Grid`, C's columns are its pixels and results go
    out through ``grid.write`` instead of ``write``. ``down_columns``: C's consecutive rows
    are consecutive in memory, its columns apart (a conv's pixels as rows), so the epilogue
    stores each column of a tile as a vector; ``down_columns="unrolled"``: C's rows are not
    evenly spaced (several images' pixels as rows), so each of a tile's rows is found once
    (the division of its index hoisted out of the loop over columns) and its elements stored
    one by one.
    """
    t = lowering_target(target)
    s = schedule or GemmSchedule.default(batch, m, n, k, dtype, target=t)
    lanes = s.lanes or t.lanes(dtype)
    if s.nr % lanes:
        raise InternalError(f"a GEMM tile of {s.nr} columns is not a whole number of "
                            f"{lanes}-lane vectors")
    mr, nr, kc = s.mr, s.nr, s.kc
    mt, nt, nk = _ceil(m, mr), _ceil(n, nr), _ceil(k, kc)
    tmb, tnb = s.mc // mr, s.nc // nr
    nbm, nbn = _ceil(mt, tmb), _ceil(nt, tnb)
    zero = Const(0.0, dtype)
    # A prepacked B too large to stay in L2 streams from memory: the first row tile of each
    # column tile prefetches its panel `PREFETCH_STEPS` ahead, a cache line per step and
    # line (see `micro`); the other row tiles find it in L1
    line = 64 // dtype_of(dtype).itemsize
    stream_b = b_panel is not None and k * n * dtype_of(dtype).itemsize > t.l2
    bp = Buffer("Bp", (tnb, kc, nr), dtype, "local")
    ap = Buffer("Ap", (tmb, kc, mr), dtype, "local")
    # partial sums between K blocks, tile by tile: a micro-kernel's are contiguous, the next
    # row tile's follow (C's own rows are N apart: 4 KiB for N = 1024, every row of a tile in
    # one L1 set and each load waiting on the last tile's stores to the same low address bits)
    cp = Buffer("Cp", (nt, mt * mr, nr), dtype, "local") if nk > 1 else None

    def kk_of(pc: Expr, p: Expr) -> tuple[Expr, list[Expr]]:
        kk = pc * kc + p
        if nk * kc == k:
            return kk, []
        return index_min(kk, k - 1), [Binary("lt", kk, Const(k, INDEX))]

    def pack_b(bt: Expr, jc: Expr, pc: Expr) -> Stmt:
        def packing(t: Expr, tile: Expr, edge: bool) -> Stmt:
            # ``edge``: the last tile, whose columns past N are zeros
            p, j = Var("p"), Var("j")
            kk, conds = kk_of(pc, p)
            col = tile * nr + j
            if edge:
                conds = conds + [Binary("lt", col, Const(n, INDEX))]
                col = index_min(col, n - 1)
            value = guarded(b(bt, kk, col), conds, dtype)
            # unrolled: whatever the read computes from the column alone (a conv's pixel
            # coordinates) is hoisted out of the loop over p
            inner = For(j, Const(0), Const(nr), Store(bp, (t, p, j), value), "unrolled")
            # not vectorized: LLVM would scatter along p (8 lanes a store), slower than the
            # scalar stores; 0-8 % on 1024-row products with K or N of 256, 1 and 2 threads
            return For(p, Const(0), Const(kc), inner, "scalar")

        def tile_body(t: Expr, tile: Expr) -> Stmt:
            if nt * nr == n or nt == 1:
                return packing(t, tile, nt * nr != n)
            # the full tiles without the guard, whose clamped column LLVM gathered
            return IfThenElse(Binary("lt", tile, Const(n // nr, INDEX)),
                              packing(t, tile, False), packing(t, tile, True))

        return tile_blocks(jc, tnb, nt, "tb", tile_body)

    def pack_a(bt: Expr, ic: Expr, pc: Expr) -> Stmt:
        def packing(t: Expr, tile: Expr, edge: bool) -> Stmt:
            # ``edge``: the last tile, whose rows past M are zeros
            p, i = Var("p"), Var("i")
            kk, conds = kk_of(pc, p)
            row = tile * mr + i
            if edge:
                conds = conds + [Binary("lt", row, Const(m, INDEX))]
                row = index_min(row, m - 1)
            value = guarded(a(bt, row, kk), conds, dtype)
            # like B's: the row's mr stores unrolled, p not vectorized
            return For(p, Const(0), Const(kc), For(i, Const(0), Const(mr), Store(
                ap, (t, p, i), value), "unrolled"), "scalar")

        def tile_body(t: Expr, tile: Expr) -> Stmt:
            if mt * mr == m or mt == 1:
                return packing(t, tile, mt * mr != m)
            # the full tiles without the guard (a select per read, which LLVM made gathers:
            # 2-5 % of a 1024-row product, one core)
            return IfThenElse(Binary("lt", tile, Const(m // mr, INDEX)),
                              packing(t, tile, False), packing(t, tile, True))

        return tile_blocks(ic, tmb, mt, "ta", tile_body)

    def micro(bt: Expr, pc: Expr, tn: Expr, tile_n: Expr, tm: Expr, tile_m: Expr,
              width: int = nr, prefetch: bool = False) -> Stmt:
        # ``width`` < nr: the last column tile, narrower (its other columns are padding);
        # ``prefetch``: step p also prefetches row p + PREFETCH_STEPS of the B panel
        acc = Buffer("acc", (mr, nr), dtype, "local")
        vecs = [(i, v * lanes) for i in range(mr) for v in range(width // lanes)]

        def acc_at(i: int, c: int) -> Load:
            return Load(acc, (Const(i), Const(c)), lanes)

        zero_init = Seq(tuple(Store(acc, (Const(i), Const(c)), Broadcast(zero, lanes))
                              for i, c in vecs))
        init: Stmt = zero_init
        if cp is not None:
            load = Seq(tuple(Store(acc, (Const(i), Const(c)),
                                   Load(cp, (tile_n, tile_m * mr + i, Const(c)), lanes))
                             for i, c in vecs))
            init = IfThenElse(Binary("eq", pc, Const(0)), zero_init, load)

        def a_at(p: Expr, i: int) -> Expr:
            if a_panel is not None:
                return a_panel(bt, tile_m, pc * kc + p, Const(i, INDEX))
            return Load(ap, (tm, p, Const(i)))

        def b_at(p: Expr, c: int) -> Expr:
            if b_panel is not None:
                return b_panel(bt, tile_n, pc * kc + p, Const(c, INDEX))
            return Load(bp, (tn, p, Const(c)), lanes)

        def ahead(p: Expr) -> list[Stmt]:
            assert b_panel is not None
            kk = index_min(pc * kc + p + PREFETCH_STEPS, kc * nk - 1)
            refs = [b_panel(bt, tile_n, kk, Const(c, INDEX)) for c in range(0, nr, line)]
            return [Prefetch(r) for r in refs if isinstance(r, Load)]

        kloop = _k_loop(acc, a_at, b_at, kc, mr, width, lanes, s.unroll,
                        ahead if prefetch else None)
        finish = epilogue(bt, acc, tile_m, tile_n, width)
        if cp is not None:
            keep = Seq(tuple(Store(cp, (tile_n, tile_m * mr + i, Const(c)), acc_at(i, c))
                             for i, c in vecs))
            finish = IfThenElse(Binary("eq", pc, Const(nk - 1)), finish, keep)
        return Allocate(acc, Seq((init, kloop, finish)))

    def tile_rows(tile_m: Expr) -> Expr:
        """How many rows of M tile ``tile_m`` are C's (the last tile: maybe fewer)."""
        if m % mr:
            return Binary("min", Const(mr, INDEX), Const(m, INDEX) - tile_m * mr)
        return Const(mr, INDEX)

    def row_of(tile_m: Expr, i: Expr) -> Expr:
        """C's row for row ``i`` of M tile ``tile_m`` (clamped so the verifier bounds it)."""
        row = tile_m * mr + i
        return index_min(row, m - 1) if m % mr else row

    def epilogue(bt: Expr, acc: Buffer, tile_m: Expr, tile_n: Expr, width: int = nr) -> Stmt:
        if grid is not None:
            return grid_epilogue(bt, acc, tile_m, tile_n, width)
        ctile = Buffer("ctile", (mr, nr), dtype, "local")
        spill = Seq(tuple(Store(ctile, (Const(i), Const(v * lanes)),
                                Load(acc, (Const(i), Const(v * lanes)), lanes))
                          for i in range(mr) for v in range(width // lanes)))
        nfull = n // nr
        tile_m_rows = tile_rows(tile_m)

        def rows_loop(width: int, col0: Callable[[], Expr], kind: str,
                      rows: Expr = tile_m_rows) -> Stmt:
            i, j = Var("i"), Var("j")
            body = write(bt, row_of(tile_m, i), col0() + j, Load(ctile, (i, j)))
            if down_columns == "unrolled" and isinstance(rows, Const):
                # vectorized, the rows' coordinates (a division per lane, LLVM's two-lane
                # gathers and scatters) took 11 % of ResNet-18's folded 512-channel layer
                return For(j, Const(0), Const(width), For(i, Const(0), rows, body,
                                                          "unrolled"), "scalar")
            if down_columns:
                # C's rows are consecutive in memory (a conv's pixels as rows): each column
                # a vector store of the tile's rows (a gather from the tile), not a scatter
                # per row. ResNet-18's 3×3 layers, 2 threads: 5-12 % faster
                return For(j, Const(0), Const(width), For(i, Const(0), rows, body,
                                                          "vectorized"), "scalar")
            # i not vectorized: LLVM unrolls the short j loop whole, then vectorized i with
            # a gather from the tile and a scatter to C per column (4 rows a vector), which
            # took 60 % of a 24→144 1×1 conv at 56² (K = 24): 406 → 179 µs on one core
            return For(i, Const(0), rows, For(j, Const(0), Const(width), body, kind),
                       "scalar")

        parts: list[Stmt] = []
        if nfull:
            tile_f = tile_n if nfull == nt else index_min(tile_n, nfull - 1)
            full = rows_loop(nr, lambda: tile_f * nr, "vectorized")
            if m % mr and not down_columns and mt > 1:
                # the full row tiles apart from the last: a constant count of rows, which
                # LLVM unrolls where the epilogue is small (the sums stored from registers,
                # not spilled to the stack for a loop of variable length)
                full = IfThenElse(Binary("lt", tile_m, Const(m // mr, INDEX)), rows_loop(
                    nr, lambda: tile_f * nr, "vectorized", Const(mr, INDEX)), full)
            parts.append(full)
        if n % nr:
            parts.append(rows_loop(n % nr, lambda: Const(nfull * nr, INDEX), "serial"))
        body = parts[0] if len(parts) == 1 else IfThenElse(
            Binary("lt", tile_n, Const(nfull, INDEX)), parts[0], parts[1])
        return Allocate(ctile, Seq((spill, body)))

    def grid_epilogue(bt: Expr, acc: Buffer, tile_m: Expr, tile_n: Expr, width: int) -> Stmt:
        # The tile's columns j0 .. j0 + w - 1 are pixels (y0 + r, x) for a few rows r: spilled
        # at offset s = j0 % cols of a row-aligned buffer, then written run by run — or, when
        # they all lie in row y0's results (s + w <= valid), as one run of constant length.
        assert grid is not None
        cols, valid = grid.cols, grid.valid
        reach = -(-(cols - 1 + nr) // cols)  # rows a tile can touch
        ctile = Buffer("ctile", (mr, (reach + 1) * cols), dtype, "local")
        s, y0 = Var("s"), Var("y0")
        j0 = tile_n * nr
        spill = Seq(tuple(Store(ctile, (Const(i), s + v * lanes),
                                Load(acc, (Const(i), Const(v * lanes)), lanes))
                          for i in range(mr) for v in range(width // lanes)))
        rows = tile_rows(tile_m)

        def runs(w: int) -> Stmt:
            # w columns of the tile are results (the last tile: fewer)
            i, x = Var("i"), Var("x")
            row = row_of(tile_m, i)
            parts: list[Stmt] = []
            for r in range(-(-(cols - 1 + w) // cols)):
                lo = Binary("max", s - r * cols, Const(0, INDEX))
                hi = Binary("min", s + (w - r * cols), Const(valid, INDEX))
                y = Binary("min", y0 + r, Const(grid.rows - 1, INDEX))  # past the end: no run
                put = grid.write(bt, row, y, x, Load(ctile, (i, x + r * cols)))
                parts.append(For(x, lo, Binary("max", hi - lo, Const(0, INDEX)), IfThenElse(
                    Binary("lt", x, Const(valid, INDEX)), put), "vectorized"))
                x = Var("x")
            spread = For(i, Const(0), rows, Seq(tuple(parts)))
            if valid < w:
                return spread
            # Most tiles lie within one row's results: one vector loop of constant length
            c, i1 = Var("c"), Var("i")
            at = s + c
            inside = For(i1, Const(0), rows, For(c, Const(0), Const(w), grid.write(
                bt, row_of(tile_m, i1), y0, at, Load(ctile, (i1, at))), "vectorized"))
            return IfThenElse(Binary("le", s, Const(valid - w, INDEX)), inside, spread)

        nfull = n // nr
        if n % nr == 0:
            body = runs(width)
        elif nfull == 0:
            body = runs(n)
        else:
            body = IfThenElse(Binary("lt", tile_n, Const(nfull, INDEX)), runs(width),
                              runs(n % nr))
        return Allocate(ctile, LetStmt(s, j0 % cols, LetStmt(y0, j0 // cols, Seq((
            spill, body)))))

    def m_block(bt: Expr, jc: Expr, pc: Expr, ic: Expr) -> Stmt:
        def tile(tn: Expr, tile_n: Expr, tm: Expr, tile_m: Expr) -> Stmt:
            full = micro(bt, pc, tn, tile_n, tm, tile_m)
            if stream_b:  # the block's first row tile fetches its panel ahead
                full = IfThenElse(Binary("eq", tm, Const(0, INDEX)),
                                  micro(bt, pc, tn, tile_n, tm, tile_m, prefetch=True), full)
            if not 0 < n % nr <= lanes < nr:
                return full
            # the last column tile has at most `lanes` columns: one vector of B per step
            return IfThenElse(Binary("lt", tile_n, Const(nt - 1, INDEX)), full,
                              micro(bt, pc, tn, tile_n, tm, tile_m, lanes))

        if s.order == "mn":  # an A sliver in L1, B's micro-panels streaming past it
            tiles = tile_blocks(ic, tmb, mt, "ir", lambda tm, tile_m: tile_blocks(
                jc, tnb, nt, "jr", lambda tn, tile_n: tile(tn, tile_n, tm, tile_m)))
        else:  # a B micro-panel in L1, the block's A slivers streaming past it
            tiles = tile_blocks(jc, tnb, nt, "jr", lambda tn, tile_n: tile_blocks(
                ic, tmb, mt, "ir", lambda tm, tile_m: tile(tn, tile_n, tm, tile_m)))
        if a_panel is not None:
            return tiles
        return Allocate(ap, Seq((pack_a(bt, ic, pc), tiles)))

    def n_block(bt: Expr, jc: Expr, ic: Expr | None) -> Stmt:
        """A panel of B over every K block: the M blocks ``ic`` (all when None)."""
        def k_block(pc: Expr) -> Stmt:
            rows = m_block(bt, jc, pc, ic) if ic is not None else loop(
                "ic", nbm, lambda i: m_block(bt, jc, pc, i))
            return rows if b_panel is not None else Seq((pack_b(bt, jc, pc), rows))
        blocks = loop("pc", nk, k_block)
        return blocks if b_panel is not None else Allocate(bp, blocks)

    def batch_body(bt: Expr) -> Stmt:
        # The parallel loop is the outermost of the product: one fork and join per call.
        if s.parallel == "m":  # each M block packs its own copy of the B panels
            stmt = loop("ic", nbm, lambda ic: loop(
                "jc", nbn, lambda jc: n_block(bt, jc, ic)), "parallel", s.chunks)
        else:
            stmt = loop("jc", nbn, lambda jc: n_block(bt, jc, None),
                        "parallel" if s.parallel == "n" else "serial", s.chunks)
        return Allocate(cp, stmt) if cp is not None else stmt

    return loop("bt", batch, batch_body, "parallel" if s.parallel == "batch" else "serial",
                s.chunks)


def _k_loop(acc: Buffer, a_at: Callable[[Expr, int], Expr], b_at: Callable[[Expr, int], Expr],
            kc: int, mr: int, nr: int, lanes: int, unroll: int,
            ahead: Callable[[Expr], list[Stmt]] | None = None) -> Stmt:
    """``acc += A[:, p]ᵀ · B[p, :]`` for p in [0, kc) over the packed panels: the FMA
    micro-kernel (``a_at(p, i)`` a scalar, ``b_at(p, c)`` a vector; ``ahead(p)``: prefetches
    to issue at step p)."""
    dtype = acc.dtype

    def step(p: Expr) -> Stmt:
        bvs = [Var(f"b{v}", dtype, lanes) for v in range(nr // lanes)]
        avs = [Var(f"a{i}", dtype) for i in range(mr)]
        fmas: list[Stmt] = []
        for i in range(mr):
            for v in range(nr // lanes):
                at = (Const(i), Const(v * lanes))
                fmas.append(Store(acc, at, FMA(Broadcast(avs[i], lanes), bvs[v],
                                               Load(acc, at, lanes))))
        stmt: Stmt = Seq(tuple((ahead(p) if ahead is not None else []) + fmas))
        for i in reversed(range(mr)):
            stmt = LetStmt(avs[i], a_at(p, i), stmt)
        for v in reversed(range(nr // lanes)):
            stmt = LetStmt(bvs[v], b_at(p, v * lanes), stmt)
        return stmt

    if unroll > 1 and kc % unroll == 0:
        p0, p1 = Var("p0"), Var("p1")
        return For(p0, Const(0), Const(kc // unroll),
                   For(p1, Const(0), Const(unroll), step(p0 * unroll + p1), "unrolled"))
    p = Var("p")
    return For(p, Const(0), Const(kc), step(p))
