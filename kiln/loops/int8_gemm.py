"""An int8 matrix product in loop IR: 8-bit inputs, exact int32 sums, from the Target.

``C[b, i, j] = sum_p A[b, i, p] * B[b, p, j]`` for A and B of ``uint8`` or ``int8`` and C
of ``int32`` (what nn.dense, nn.batch_matmul and nn.conv2d compute with ``out_dtype="int32"``,
and what the qnn operators lower to). The loop nest is the float GEMM's (kiln/loops/gemm.py)
without K blocking, on operands packed so that 4 consecutive K values sit in one 32-bit lane:

    for b                       batch (or conv images)
      for jc: nc columns        a panel of B packed into Bp[nc/nr][K/4][nr]   (int32 lanes)
        for ic: mc rows         a block of A packed into Ap[mc/mr][K/4][mr]   (int32 scalars)
          for jr, ir:           an mr×nr tile of int32 accumulators in vector registers:
            for p4 in K/4:      nr/L vector loads of Bp, mr broadcasts of Ap,
                                mr·nr/L `DotProduct`s (4 multiply-adds per lane each)
            epilogue            the tile through the lowering's ``write`` (fused consumers)

(L: int32 lanes of the Target's vectors.) The padding of K to a multiple of 4 and of the
tiles is zeros, which add nothing. How each `DotProduct` becomes machine code is the code
generator's choice from the Target's features (kiln/codegen/dot_product.py): one
``vpdpbusd`` per 4·L multiply-adds on AVX-512-VNNI (zmm) and AVX-VNNI (ymm), an exact
``vpmaddwd`` sequence on AVX2, a widening sequence elsewhere (aarch64 cross targets).

``vpdpbusd`` multiplies unsigned by signed bytes. uint8 × int8 and int8 × uint8 use it
directly (the unsigned operand first); int8 × int8 shifts A by +128 into uint8 as it is
packed and subtracts ``128 · Σ_p B[p, j]`` (B's column sums, taken while packing B) in the
epilogue: ``Σ (a + 128)·b − 128·Σ b = Σ a·b``, exact modulo 2³² as int32 sums are.
uint8 × uint8 takes the widening forms on every Target (there is no unsigned × unsigned
``vpdpbusd``). The register tile fits the Target's registers: 14×32 on AVX-512-VNNI
(28 zmm accumulators, B in 2, A broadcast from memory), 6×16 on AVX-VNNI, 8×L elsewhere
(the widening forms need registers for their int16 temporaries).

Results do not depend on the thread count: every element is summed by one thread in the
same order whatever the split (over N, or M when it is longer, like the float path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from kiln.loops.gemm import index_min, loop, tile_blocks
from kiln.loops.ir import (
    CHUNKS_PER_THREAD,
    INDEX,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Cast,
    Const,
    DotProduct,
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
from kiln.loops.schedule import lowering_target, worth_parallel
from kiln.loops.tunable import Space, ordered, overridden, site_key
from kiln.target import Target

INPUT_DTYPES = ("uint8", "int8")
MR_MAX = 16

ReadFn = Callable[[Expr, Expr, Expr], Expr]  # (batch, row or k, k or col) -> scalar
PanelFn = Callable[[Expr, Expr, Expr, Expr], Expr]  # (batch, tile, lane group, column or row)
SumsFn = Callable[[Expr, Expr], Expr]  # (tile, column) -> int32: a column's sum
WriteFn = Callable[[Expr, Expr, Expr, Expr], Stmt]  # (batch, row, col, int32 value) -> stmt


def supported(a_dtype: str, b_dtype: str, out_dtype: str) -> bool:
    """Whether this kernel computes a product of ``a_dtype`` × ``b_dtype`` into
    ``out_dtype``: 8-bit integers summed in int32."""
    return a_dtype in INPUT_DTYPES and b_dtype in INPUT_DTYPES and out_dtype == "int32"


def vnni_lanes(features: frozenset[str]) -> tuple[int, ...]:
    """The int32 lane counts at which ``features`` have ``vpdpbusd`` (uint8 × int8)."""
    out: list[int] = []
    if "avx512vnni" in features and "avx512f" in features:
        out.append(16)
    if "avxvnni" in features or {"avx512vnni", "avx512vl"} <= features:
        out += [8, 4]
    return tuple(out)


def dot_form(features: frozenset[str], lanes: int, a_dtype: str, b_dtype: str) -> str:
    """Which form a dot product of ``lanes`` int32 lanes takes: "vnni", "pmaddwd" or
    "widen" (see the module docstring)."""
    if (a_dtype, b_dtype) == ("uint8", "int8") and lanes in vnni_lanes(features):
        return "vnni"
    if madd_width(features, lanes):
        return "pmaddwd"
    return "widen"


def madd_width(features: frozenset[str], lanes: int) -> int:
    """int16 lanes per ``vpmaddwd`` for a dot product of ``lanes`` int32 lanes: 32 (zmm,
    AVX-512BW) or 16 (ymm, AVX2); 0 where none fits."""
    if "avx512bw" in features and (2 * lanes) % 32 == 0:
        return 32
    if "avx2" in features and (2 * lanes) % 16 == 0:
        return 16
    return 0


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Int8Schedule:
    """How the product runs: the register tile ``mr``×``nr`` (``nr`` = L·vectors), the
    blocks ``mc``/``nc``, the parallel loop ("batch", "n", "m" or None), the int32 lanes L,
    the `DotProduct` form the Target gives ("vnni", "pmaddwd" or "widen"), whether A
    is shifted by +128 (int8 × int8 on VNNI), and, parallel over M, how many M blocks one
    iteration of the parallel loop takes (``m_blocks``: they share one packing of B), and
    the parallel loop's chunks a thread. A dense layer's or batch_matmul's schedule is a
    tuning site (``key``, `space`), and so is an 8-bit convolution's (kiln/loops/int8_conv.py
    `plan`, around the rule's made finer)."""

    mr: int
    nr: int
    mc: int
    nc: int
    parallel: str | None
    lanes: int
    form: str
    shift: bool
    m_blocks: int = 1
    chunks: int = CHUNKS_PER_THREAD
    key: str | None = None  # the site's key (`int8_key`), where a tuning log can name it
    tuned: bool = False  # whether the knobs came from a tuning log

    @staticmethod
    def default(batch: int, m: int, n: int, k: int, a_dtype: str, b_dtype: str,
                threads: int | None = None, target: Target | None = None,
                site: str | None = None) -> Int8Schedule:
        """The schedule for ``target`` (default: the lowering's) from the shapes. With
        ``site`` ("dense", "dense_prepacked" or "batch_matmul": the kernel that runs it),
        the knobs the enclosing `overrides_scope` gives its key (a tuning log's) instead."""
        base = Int8Schedule.rule(batch, m, n, k, a_dtype, b_dtype, threads, target)
        if site is None:
            return base
        t = lowering_target(target)
        key = int8_key(site, batch, m, n, k, a_dtype, b_dtype)
        return overridden(replace(base, key=key),
                          lambda: space(site, batch, m, n, k, a_dtype, b_dtype, t),
                          apply_knobs)

    @staticmethod
    def rule(batch: int, m: int, n: int, k: int, a_dtype: str, b_dtype: str,
             threads: int | None = None, target: Target | None = None) -> Int8Schedule:
        """The rule's schedule for these shapes on ``target``."""
        t = lowering_target(target)
        lanes = t.lanes("int32")
        pair = _ordered(a_dtype, b_dtype)
        form = dot_form(t.features, lanes, *pair)
        shift = False
        if form != "vnni" and pair == ("int8", "int8"):
            shifted = dot_form(t.features, lanes, "uint8", "int8")
            if shifted == "vnni":
                form, shift = shifted, True
        if form != "vnni":  # int16 pairs, widened as they are packed (vpmaddwd on AVX2)
            form = "pmaddwd" if madd_width(t.features, lanes) else "widen"
        v = 2  # accumulators, 2 vectors of B, A broadcast from memory: as the float tile
        mr = min((t.registers - v - 1) // v, MR_MAX)
        nr = v * lanes
        if n <= lanes:
            nr = lanes
        group = 4 if form == "vnni" else 2
        kg = _ceil(max(k, 1), group)
        # a block of A in a quarter of L2; a panel of B in half of a core's share of L3
        mc_max = max(mr, (t.l2 // 4) // (kg * 4))
        nc_max = max(nr, min(4096, (t.l3 // (2 * max(t.cores, 1))) // (kg * 4)))
        mt, nt = _ceil(m, mr), _ceil(n, nr)
        tmb = max(1, min(mt, mc_max // mr))
        tnb = max(1, min(nt, nc_max // nr))
        threads = t.cores if threads is None else threads
        parallel = None
        m_blocks = 1
        if worth_parallel(batch * m * n * k // 4, threads):  # 4 multiply-adds per lane op
            if batch >= threads:
                parallel = "batch"
            elif m > n and mt >= threads:
                tmb = max(1, min(_ceil(mt, threads), 2 * mc_max // mr))
                parallel = "m"
            elif nt >= threads:
                tnb = min(tnb, _ceil(nt, threads))
                parallel = "n"
            elif mt >= threads:
                tmb = min(tmb, _ceil(mt, threads))
                parallel = "m"
        if parallel == "m":
            # B is packed once per iteration of the parallel loop: about two per thread
            m_blocks = max(1, _ceil(_ceil(mt, tmb), 2 * threads))
        return Int8Schedule(mr, nr, tmb * mr, tnb * nr, parallel, lanes, form, shift,
                            m_blocks)

    def attrs(self) -> dict:
        """The knobs, for ``kernel.attrs["schedules"]`` (printing, statistics)."""
        return {"kernel": "int8_gemm", **asdict(self)}


SITES = ("dense", "dense_prepacked", "batch_matmul")


def int8_key(site: str, batch: int, m: int, n: int, k: int, a_dtype: str, b_dtype: str) -> str:
    """The key naming an int8 product's schedule in a tuning log."""
    return site_key("int8_gemm", op=site, batch=batch, m=m, n=n, k=k, a=a_dtype, b=b_dtype)


def _knobs(s: Int8Schedule) -> dict[str, Any]:
    return {"mr": s.mr, "nr": s.nr, "mb": s.mc // s.mr, "nb": s.nc // s.nr,
            "parallel": s.parallel, "m_blocks": s.m_blocks, "chunks": s.chunks}


def apply_knobs(base: Int8Schedule, knobs: Mapping[str, Any]) -> Int8Schedule:
    """``base`` with the knobs of a point of its `space` (``tuned`` where they differ)."""
    mr, nr = int(knobs["mr"]), int(knobs["nr"])
    s = replace(base, mr=mr, nr=nr, mc=int(knobs["mb"]) * mr, nc=int(knobs["nb"]) * nr,
                parallel=knobs["parallel"], m_blocks=int(knobs["m_blocks"]),
                chunks=int(knobs["chunks"]))
    return replace(s, tuned=_knobs(s) != _knobs(base))


def space(site: str, batch: int, m: int, n: int, k: int, a_dtype: str, b_dtype: str,
          target: Target | None = None) -> Space:
    """The knobs of an int8 product for these shapes (the rule's first): register tiles of
    4 to 16 rows by one to three vectors of int32 lanes within the Target's registers (the
    widening forms keep the rule's: their int16 temporaries take registers too), blocks of
    1 to 32 tiles a side, the parallel loop (batch, M or N: each with work for two threads,
    or none), M blocks per parallel iteration, and 2 to 16 chunks a thread. Every point sums
    each element over K in the same order: the results are exact and the same."""
    t = lowering_target(target)
    base = Int8Schedule.rule(batch, m, n, k, a_dtype, b_dtype, target=t)
    return space_around(base, int8_key(site, batch, m, n, k, a_dtype, b_dtype), batch, m, n,
                        k, t)


def space_around(base: Int8Schedule, key: str, batch: int, m: int, n: int, k: int,
                 target: Target) -> Space:
    """`space`'s knobs with ``base``'s first, under ``key`` (an int8 convolution's
    schedule is the rule's made finer: kiln/loops/int8_conv.py)."""
    t = target
    d = _knobs(base)
    lanes, regs = base.lanes, t.registers
    if base.form == "vnni":
        mrs = [x for x in (4, 6, 8, 10, 12, 14, 16) if x <= MR_MAX and x < 2 * m]
        nrs = [v * lanes for v in (1, 2, 3) if v == 1 or n > (v - 1) * lanes]
    else:
        mrs, nrs = [], []
    mt = _ceil(m, min([base.mr, *mrs]))
    nt = _ceil(n, min([base.nr, *nrs]))
    pars: list[Any] = [None]
    if t.cores > 1:
        pars += ["batch"] if batch >= 2 else []
        pars += ["m"] if mt >= 2 else []
        pars += ["n"] if nt >= 2 else []
    cores = t.cores > 1
    knobs = (("mr", ordered(d["mr"], mrs)), ("nr", ordered(d["nr"], nrs)),
             ("mb", ordered(d["mb"], [x for x in (1, 2, 4, 8, 16, 32) if x <= mt])),
             ("nb", ordered(d["nb"], [x for x in (1, 2, 4, 8, 16, 32) if x <= nt])),
             ("parallel", ordered(d["parallel"], pars)),
             ("m_blocks", ordered(d["m_blocks"], [1, 2, 4] if cores else [])),
             ("chunks", ordered(d["chunks"], [2, 8, 16] if cores else [])))

    # packed blocks no larger than a cache (or than the rule's): A's in L2, B's panel in a
    # core's half of L3
    k4 = _ceil(max(k, 1), 4 if base.form == "vnni" else 2)
    a_cap = max(base.mc * k4 * 4, t.l2)
    b_cap = max(base.nc * k4 * 4, t.l3 // (2 * max(t.cores, 1)))

    def check(kn: Mapping[str, Any]) -> bool:
        mr, nr = int(kn["mr"]), int(kn["nr"])
        v = nr // lanes
        return nr % lanes == 0 and mr * v + v + 1 <= regs \
            and int(kn["mb"]) * mr * k4 * 4 <= a_cap and int(kn["nb"]) * nr * k4 * 4 <= b_cap

    def canonical(kn: Mapping[str, Any]) -> Any:
        mr, nr = int(kn["mr"]), int(kn["nr"])
        tmb = min(int(kn["mb"]), _ceil(m, mr))
        tnb = min(int(kn["nb"]), _ceil(n, nr))
        par = kn["parallel"]
        return (mr, nr, tmb, tnb, par, kn["m_blocks"] if par == "m" else None,
                kn["chunks"] if par is not None else None)

    return Space(key, knobs, check, canonical)


def _ordered(a_dtype: str, b_dtype: str) -> tuple[str, str]:
    """The dot product's operand dtypes with the unsigned one first (the order of
    ``vpdpbusd``: multiplication commutes, so the kernel may swap them)."""
    return (b_dtype, a_dtype) if (a_dtype, b_dtype) == ("int8", "uint8") else (a_dtype, b_dtype)


def lane_byte(v: Expr, shift: bool) -> Expr:
    """An 8-bit value as its byte in [0, 255] (int64), shifted by +128 when ``shift``."""
    x: Expr = Cast(INDEX, v)
    if shift:
        x = Binary("add", x, Const(128, INDEX))
    return Binary("and", x, Const(255, INDEX))


def pack_lanes(values: list[Expr], bits: int) -> Expr:
    """Four bytes or two int16 (int64 in [0, 2^bits)) as one int32, the first lowest."""
    total: Expr = values[0]
    for q in range(1, len(values)):
        total = Binary("add", total, Binary("mul", values[q], Const(2 ** (bits * q), INDEX)))
    return Cast("int32", total)  # the low 32 bits


def lane_int16(v: Expr) -> Expr:
    """An 8-bit value as the bits of the int16 of the same value (int64 in [0, 65535])."""
    return Binary("and", Cast(INDEX, v), Const(65535, INDEX))


def int8_gemm(batch: int, m: int, n: int, k: int, a: ReadFn, b: ReadFn, write: WriteFn,
              a_dtype: str, b_dtype: str, schedule: Int8Schedule | None = None,
              target: Target | None = None, b_panel: PanelFn | None = None,
              b_sums: SumsFn | None = None, a_panel: PanelFn | None = None) -> Stmt:
    """The statement computing ``C = A·B`` in int32 (see the module docstring).

    ``a(bt, i, p)`` and ``b(bt, p, j)`` read A and B (only inside their shapes);
    ``write(bt, i, j, value)`` is the statement storing C's element (an int32). A B packed
    ahead of time (a constant weight, kiln/op/nn/int8_packed.py) is read in place, never
    packed: ``b_panel(bt, tile, p, c)`` gives ``lanes`` int32 of its panels at lane group
    p, column c of the tile, and ``b_sums(tile, c)`` the column's sum (needed
    when A is shifted); a prepacked A likewise, ``a_panel(bt, tile, p, i)``: the int32 of
    row i of M tile ``tile`` at lane group p (an int8 convolution's weight,
    kiln/loops/int8_conv.py).
    """
    t = lowering_target(target)
    s = schedule or Int8Schedule.default(batch, m, n, k, a_dtype, b_dtype, target=t)
    mr, nr, lanes = s.mr, s.nr, s.lanes
    group = 4 if s.form == "vnni" else 2  # bytes, or int16 pairs, per int32 lane
    bits = 32 // group
    k4 = _ceil(max(k, 1), group)
    mt, nt = _ceil(m, mr), _ceil(n, nr)
    tmb, tnb = s.mc // mr, s.nc // nr
    nbm, nbn = _ceil(mt, tmb), _ceil(nt, tnb)
    swap = group == 4 and _ordered(a_dtype, b_dtype) != (a_dtype, b_dtype)
    a_dt = "uint8" if s.shift else a_dtype
    b_dt = b_dtype
    if group == 2:
        a_dt = b_dt = "int16"

    def lane_value(v: Expr, shift: bool = False) -> Expr:
        return lane_byte(v, shift) if group == 4 else lane_int16(v)
    bp = Buffer("Bp", (tnb, k4, nr), "int32", "local")
    ap = Buffer("Ap", (tmb, k4, mr), "int32", "local")
    csum = Buffer("Bsum", (tnb, nr), "int32", "local") if s.shift and b_panel is None else None
    zero8 = {"uint8": Const(0, "uint8"), "int8": Const(0, "int8")}

    def k_at(p4: Expr, q: int) -> tuple[Expr, Expr | None]:
        """K index group·p4 + q, clamped, and whether it is inside K (None: always)."""
        kk = p4 * group + q
        if k4 * group == k:
            return kk, None
        return index_min(kk, k - 1), Binary("lt", kk, Const(k, INDEX))

    def guarded(value: Expr, conds: list[Expr | None], dtype: str) -> Expr:
        cond: Expr | None = None
        for c in conds:
            if c is not None:
                cond = c if cond is None else Binary("and", cond, c)
        return value if cond is None else Select(cond, value, zero8[dtype])

    def pack_b(bt: Expr, jc: Expr) -> Stmt:
        def tile_body(tl: Expr, tile: Expr) -> Stmt:
            p4, j = Var("p4"), Var("j")
            col = tile * nr + j
            conds: list[Expr | None] = []
            if nt * nr != n:
                conds.append(Binary("lt", col, Const(n, INDEX)))
                col = index_min(col, n - 1)
            vals = []
            for q in range(group):
                kk, inside = k_at(p4, q)
                vals.append(guarded(b(bt, kk, col), conds + [inside], b_dtype))
            stores: list[Stmt] = [Store(bp, (tl, p4, j),
                                        pack_lanes([lane_value(v) for v in vals], bits))]
            if csum is not None:
                total: Expr = Cast("int32", vals[0])
                for v in vals[1:]:
                    total = Binary("add", total, Cast("int32", v))
                stores.append(Store(csum, (tl, j), Binary("add", Load(csum, (tl, j)), total)))
            # column outer: what the read computes from the column alone (a conv's pixel
            # coordinates) stays out of the K loop, and a dense weight's row is read in order
            body: Stmt = For(j, Const(0), Const(nr), For(p4, Const(0), Const(k4),
                                                         Seq(tuple(stores))))
            if csum is not None:
                j0 = Var("j")
                clear = For(j0, Const(0), Const(nr), Store(csum, (tl, j0), Const(0, "int32")))
                body = Seq((clear, body))
            return body

        return tile_blocks(jc, tnb, nt, "tb", tile_body)

    def pack_a(bt: Expr, ic: Expr) -> Stmt:
        def tile_body(tl: Expr, tile: Expr) -> Stmt:
            p4, i = Var("p4"), Var("i")
            row = tile * mr + i
            conds: list[Expr | None] = []
            if mt * mr != m:
                conds.append(Binary("lt", row, Const(m, INDEX)))
                row = index_min(row, m - 1)
            vals = []
            for q in range(group):
                kk, inside = k_at(p4, q)
                vals.append(lane_value(guarded(a(bt, row, kk), conds + [inside], a_dtype),
                                       s.shift))
            return For(i, Const(0), Const(mr), For(p4, Const(0), Const(k4),
                                                   Store(ap, (tl, p4, i), pack_lanes(vals, bits))))

        return tile_blocks(ic, tmb, mt, "ta", tile_body)

    def micro(bt: Expr, tn: Expr, tile_n: Expr, tm: Expr, tile_m: Expr) -> Stmt:
        acc = Buffer("acc", (mr, nr), "int32", "local")
        vecs = [(i, v * lanes) for i in range(mr) for v in range(nr // lanes)]
        init = Seq(tuple(Store(acc, (Const(i), Const(c)), Broadcast(Const(0, "int32"), lanes))
                         for i, c in vecs))
        p4 = Var("p4")
        bvs = [Var(f"b{v}", "int32", lanes) for v in range(nr // lanes)]
        steps: list[Stmt] = []
        for i, c in vecs:
            av = Broadcast(Load(ap, (tm, p4, Const(i))) if a_panel is None
                           else a_panel(bt, tile_m, p4, Const(i, INDEX)), lanes)
            bv = bvs[c // lanes]
            at = (Const(i), Const(c))
            dot = (DotProduct(bv, av, Load(acc, at, lanes), b_dt, a_dt) if swap
                   else DotProduct(av, bv, Load(acc, at, lanes), a_dt, b_dt))
            steps.append(Store(acc, at, dot))
        step: Stmt = Seq(tuple(steps))
        for v in reversed(range(nr // lanes)):
            bvec = (Load(bp, (tn, p4, Const(v * lanes)), lanes) if b_panel is None
                    else b_panel(bt, tile_n, p4, Const(v * lanes, INDEX)))
            step = LetStmt(bvs[v], bvec, step)
        kloop = For(p4, Const(0), Const(k4), step)
        return Allocate(acc, Seq((init, kloop, epilogue(bt, acc, tn, tile_m, tile_n))))

    def epilogue(bt: Expr, acc: Buffer, tn: Expr, tile_m: Expr, tile_n: Expr) -> Stmt:
        ctile = Buffer("ctile", (mr, nr), "int32", "local")
        spill = Seq(tuple(Store(ctile, (Const(i), Const(v * lanes)),
                                Load(acc, (Const(i), Const(v * lanes)), lanes))
                          for i in range(mr) for v in range(nr // lanes)))
        rows: Expr = Const(mr, INDEX)
        if m % mr:
            rows = Binary("min", Const(mr, INDEX), Const(m, INDEX) - tile_m * mr)
        nfull = n // nr

        def rows_loop(width: int, tile: Expr, kind: str) -> Stmt:
            i, j = Var("i"), Var("j")
            row = tile_m * mr + i
            row = index_min(row, m - 1) if m % mr else row
            value: Expr = Load(ctile, (i, j))
            sums: Expr | None = None
            if csum is not None:
                sums = Load(csum, (tn, j))
            elif s.shift and b_sums is not None:
                sums = b_sums(tile, j)
            if sums is not None:  # int8 × int8 by the shift: A was A + 128
                value = Binary("sub", value, Binary("mul", sums, Const(128, "int32")))
            body = write(bt, row, tile * nr + j, value)
            return For(i, Const(0), rows, For(j, Const(0), Const(width), body, kind))

        parts: list[Stmt] = []
        if nfull:
            tile_f = tile_n if nfull == nt else index_min(tile_n, nfull - 1)
            parts.append(rows_loop(nr, tile_f, "vectorized"))
        if n % nr:
            parts.append(rows_loop(n % nr, Const(nfull, INDEX), "serial"))
        body = parts[0] if len(parts) == 1 else IfThenElse(
            Binary("lt", tile_n, Const(nfull, INDEX)), parts[0], parts[1])
        return Allocate(ctile, Seq((spill, body)))

    def m_block(bt: Expr, jc: Expr, ic: Expr) -> Stmt:
        tiles = tile_blocks(jc, tnb, nt, "jr", lambda tn, tile_n: tile_blocks(
            ic, tmb, mt, "ir", lambda tm, tile_m: micro(bt, tn, tile_n, tm, tile_m)))
        return tiles if a_panel is not None else Allocate(ap, Seq((pack_a(bt, ic), tiles)))

    def n_block(bt: Expr, jc: Expr, chunk: Expr | None) -> Stmt:
        """A panel of B and the M blocks of ``chunk`` (``s.m_blocks`` of them; all: None)."""
        rows = tile_blocks(chunk, s.m_blocks, nbm, "icb", lambda t, ic: m_block(bt, jc, ic)) \
            if chunk is not None else loop("ic", nbm, lambda i: m_block(bt, jc, i))
        if b_panel is not None:
            return rows
        stmt: Stmt = Allocate(bp, Seq((pack_b(bt, jc), rows)))
        return Allocate(csum, stmt) if csum is not None else stmt

    def batch_body(bt: Expr) -> Stmt:
        if s.parallel == "m":  # each chunk of M blocks packs its own copy of the B panels
            return loop("ic", _ceil(nbm, s.m_blocks), lambda c: loop(
                "jc", nbn, lambda jc: n_block(bt, jc, c)), "parallel", s.chunks)
        return loop("jc", nbn, lambda jc: n_block(bt, jc, None),
                     "parallel" if s.parallel == "n" else "serial", s.chunks)

    return loop("bt", batch, batch_body, "parallel" if s.parallel == "batch" else "serial",
                s.chunks)
