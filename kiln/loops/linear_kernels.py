"""Fast kernels of nn.dense and nn.batch_matmul: the packed GEMM, and a dot-product kernel
for a handful of rows.

These are the float32 paths of the operators' ``lower=`` rules (kiln/op/nn/linear.py); each
returns an extern `Tensor` whose elements go out through the lowering's ``write`` (the fused
epilogue). A dense layer with very few rows (batch 1 inference) gains nothing from packing
its weight every call: it reads each weight row once, contiguously, with vector FMAs
(`dot_rows`). Everything else is the BLIS-style product of kiln/loops/gemm.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from kiln.ir.dtype import dtype_of
from kiln.loops import gemm as g
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, WriteFn, extern
from kiln.loops.ir import (
    CHUNKS_PER_THREAD,
    FMA,
    INDEX,
    Allocate,
    Binary,
    Broadcast,
    Const,
    Expr,
    For,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.ir import Buffer as LBuffer
from kiln.loops.schedule import lowering_target, worth_parallel, worth_parallel_stream
from kiln.loops.tunable import Space, ordered, overridden, site_key
from kiln.target import Target

DOT_MAX_ROWS = 4  # dense with at most this many rows uses the dot-product kernel


def uses_dot(m: int, n: int, k: int, lanes: int) -> bool:
    """Whether a dense of ``m`` rows, ``n`` units and ``k`` inputs takes the dot-product
    kernel (each output a dot product of an input row and a weight row, both read in place)
    rather than the GEMM: few rows, or at most one vector of units (a classifier's 10), where
    the GEMM's packing of every input row is used by one column tile only. A call, the
    GEMM's against the dot products' (2-core Emerald Rapids VM): 64×10×512 19.3 → 9.2 µs,
    197×10×384 35.0 → 19.8, 4096×10×512 1102 → 322; from 24 units on the GEMM is as fast
    or faster (64×24×512 18.8 against 20.1, 64×32×512 18.0 against 29.9)."""
    return k >= lanes and (m <= DOT_MAX_ROWS or n <= lanes)


def prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def split_index(i: Expr, dims: Sequence[int]) -> tuple[Expr, ...]:
    """A flat row-major index over ``dims`` as one index per axis."""
    if len(dims) == 1:
        return (i,)
    out: list[Expr] = []
    stride = prod(dims)
    for n, d in enumerate(dims):
        stride //= d
        v = i // stride
        out.append(v if n == 0 else v % d)
    return tuple(out)


def usable(dtype: str, *shapes: Sequence[int]) -> bool:
    """Whether the fast kernels apply: a supported dtype and no empty dimension."""
    return g.supported(dtype) and all(d > 0 for s in shapes for d in s)


def dense(x: Tensor, w: Tensor, out_shape: Sequence[int], dtype: str,
          target: Target | None = None) -> Tensor:
    """``x @ w.T`` for x of shape (..., K) and w of shape (N, K), scheduled for ``target``
    (default: the lowering's)."""
    tgt = lowering_target(target)
    lead = tuple(x.shape[:-1])
    m, k, n = prod(lead), x.shape[-1], w.shape[0]
    shape = tuple(out_shape)
    lanes = tgt.lanes(dtype)
    if uses_dot(m, n, k, lanes) and isinstance(x, BufferTensor) and isinstance(w, BufferTensor):
        ds = DotSchedule.default(m, n, k, dtype, tgt)
        t = extern(shape, dtype, lambda write: dot_rows(
            x.buffer, w.buffer, lead, m, n, k, write, tgt, ds))
        t.schedule = {"kernel": "dot", **asdict(ds), "lanes": lanes}
        return t
    schedule = g.GemmSchedule.default(1, m, n, k, dtype, target=tgt)

    def emit(write: WriteFn) -> Stmt:
        return g.gemm(
            1, m, n, k,
            lambda b, i, p: x(*split_index(i, lead), p),
            lambda b, p, j: w(j, p),
            lambda b, i, j, v: write((*split_index(i, lead), j), v),
            dtype, schedule, target=tgt)

    t = extern(shape, dtype, emit)
    t.schedule = schedule.attrs()
    return t


def dense_prepacked(x: Tensor, wp: LBuffer, units: int, out_shape: Sequence[int], dtype: str,
                    target: Target | None = None) -> Tensor | None:
    """``x @ W.T`` with W's panels prepacked in ``wp`` (kiln/op/nn/packed.py); None when the
    panels are not in the layout this GEMM would choose for ``target``."""
    tgt = lowering_target(target)
    lead = tuple(x.shape[:-1])
    m, k = prod(lead), x.shape[-1]
    schedule = g.GemmSchedule.default(1, m, units, k, dtype, b_prepacked=True, target=tgt)
    kc, blocks = g.k_blocking(k, tgt, dtype)
    if wp.shape[2] != schedule.nr or wp.shape[1] != kc * blocks \
            or wp.shape[0] != -(-units // schedule.nr):
        return None
    lanes = schedule.lanes or tgt.lanes(dtype)

    def emit(write: WriteFn) -> Stmt:
        return g.gemm(
            1, m, units, k,
            lambda b, i, p: x(*split_index(i, lead), p),
            lambda b, p, j: Const(0.0, dtype),  # B is never packed: read from wp
            lambda b, i, j, v: write((*split_index(i, lead), j), v),
            dtype, schedule,
            b_panel=lambda b, tile, kk, c: Load(wp, (tile, kk, c), lanes), target=tgt)

    t = extern(tuple(out_shape), dtype, emit)
    t.schedule = {**schedule.attrs(), "b_prepacked": True}
    return t


def batch_matmul(x: Tensor, y: Tensor, out_shape: Sequence[int], dtype: str,
                 transpose_a: bool, transpose_b: bool, target: Target | None = None) -> Tensor:
    """Batched ``x @ y`` with Relay's transpose flags and broadcast batch of 1."""
    tgt = lowering_target(target)
    batch, m, n = out_shape
    k = x.shape[1] if transpose_a else x.shape[2]
    bx = (lambda b: b) if x.shape[0] == batch else (lambda b: Const(0, INDEX))
    by = (lambda b: b) if y.shape[0] == batch else (lambda b: Const(0, INDEX))
    schedule = g.GemmSchedule.default(batch, m, n, k, dtype, target=tgt)

    def a(b: Expr, i: Expr, p: Expr) -> Expr:
        return x(bx(b), p, i) if transpose_a else x(bx(b), i, p)

    def bread(b: Expr, p: Expr, j: Expr) -> Expr:
        return y(by(b), j, p) if transpose_b else y(by(b), p, j)

    schedule, a_panel, b_panel = _in_place(x, y, bx, by, (m, n, k), transpose_a,
                                           transpose_b, schedule, tgt)

    def emit(write: WriteFn) -> Stmt:
        return g.gemm(batch, m, n, k, a, bread, lambda b, i, j, v: write((b, i, j), v),
                      dtype, schedule, a_panel=a_panel, b_panel=b_panel, target=tgt)

    t = extern(tuple(out_shape), dtype, emit)
    t.schedule = {**schedule.attrs(), "a": "in place" if a_panel else "packed",
                  "b": "in place" if b_panel else "packed"}
    return t


# Products of at most this many rows and columns (an attention head's: 128 × 128 or
# 128 × 64 per batch element) read their operands in place (`_in_place`).
IN_PLACE_MAX = 256


def _in_place(x: Tensor, y: Tensor, bx: Callable[[Expr], Expr], by: Callable[[Expr], Expr],
              mnk: tuple[int, int, int], ta: bool, tb: bool, s: g.GemmSchedule, tgt: Target
              ) -> tuple[g.GemmSchedule, g.PanelFn | None, g.PanelFn | None]:
    """``s`` and the panels of a batch of small products whose operands the micro-kernel
    reads where they are instead of packing them per block: A (either layout: a tile's rows
    are a stride apart, or consecutive) where a register tile of ``s.mr`` rows or down to
    half as many (at least 4) divides M; B where it is not transposed (each K step's row
    of B is a tile's vectors) and its columns fill whole tiles, whether or not A is (ViT's
    P·V over 197 tokens, a prime: 6 heads, 99.4 -> 93.5 µs); K in one block. Packing
    took as long as a third of the FMAs there: the 8-row tile that avoids it is faster
    than the 13-row one that does, and than 13 rows clamped at M's edge (LLVM then keeps
    a pointer per row).

    An attention head's products at batch 32, 2 threads of a Sapphire Rapids-class VM, both
    built in one process and alternated, µs: QKᵀ (128×128×64, B packed) 277 -> 231, P·V
    (128×64×128) 275 -> 210, Pᵀ·dO 290 -> 256, dS·K 281 -> 227."""
    m, n, k = mnk
    if s.tuned or k > s.kc or m > IN_PLACE_MAX or n > IN_PLACE_MAX \
            or not isinstance(x, BufferTensor) or not isinstance(y, BufferTensor):
        return s, None, None
    fit = [r for r in range(s.mr, max(4, s.mr // 2) - 1, -1) if m % r == 0]
    lanes, nr = s.lanes or tgt.lanes(y.dtype), s.nr
    b_fits = not tb and n % nr == 0
    if not fit and not b_fits:
        return s, None, None
    mr = fit[0] if fit else s.mr
    s = replace(s, mr=mr, mc=mr * -(-m // mr), kc=k, unroll=g.unroll_for(k))

    def a_panel(b: Expr, tile: Expr, kk: Expr, i: Expr) -> Expr:
        row = tile * mr + i
        return x(bx(b), kk, row) if ta else x(bx(b), row, kk)

    def b_panel(b: Expr, tile: Expr, kk: Expr, c: Expr) -> Expr:
        return Load(y.buffer, (by(b), kk, tile * nr + c), lanes)

    return s, a_panel if fit else None, b_panel if b_fits else None


def _dot_parallel(m: int, n: int, k: int, dtype: str, target: Target | None = None) -> bool:
    # the rules of kiln/loops/schedule.py: enough multiply-adds for the target's cores, or a
    # weight too large for one core's L2, which every call streams from L3 at one core's
    # bandwidth unless the cores share it; a narrow dense (more rows) splits its rows
    t = lowering_target(target)
    if m > DOT_MAX_ROWS:
        return worth_parallel(m * n * k, t.cores)
    return n >= 2 and (worth_parallel(m * n * k, t.cores)
                       or worth_parallel_stream(n * k * dtype_of(dtype).itemsize, t))


# dot_rows computes DOT_BLOCK_ROWS weight rows at once, each in DOT_BLOCK_ACCS vector
# accumulators: one row's four chains of k / (4 · lanes) dependent FMAs left the FMA units
# waiting on their latency (4 cycles on Zen 3) for rows of a few hundred elements (an LSTM
# step's 1024×256), and every x vector loaded serves all the rows of the block.
DOT_BLOCK_ROWS = 4
DOT_BLOCK_ACCS = 2


@dataclass(frozen=True)
class DotSchedule:
    """Knobs of `dot_rows`: the weight rows a block computes at once (``rows``), the
    vector accumulators along K each of them keeps (``accs``), whether the loop runs on the
    thread pool, and its chunks a thread."""

    rows: int = DOT_BLOCK_ROWS
    accs: int = DOT_BLOCK_ACCS
    parallel: bool = False
    chunks: int = CHUNKS_PER_THREAD
    key: str | None = None  # the site's key (`dot_key`), where a tuning log can name it
    tuned: bool = False

    @staticmethod
    def default(m: int, n: int, k: int, dtype: str = "float32",
                target: Target | None = None) -> DotSchedule:
        """The rule's (`DOT_BLOCK_ROWS`, `DOT_BLOCK_ACCS`, `_dot_parallel`), or the knobs the
        enclosing `overrides_scope` gives its key (a tuning log's)."""
        t = lowering_target(target)
        base = DotSchedule(DOT_BLOCK_ROWS, DOT_BLOCK_ACCS, _dot_parallel(m, n, k, dtype, t),
                           key=dot_key(m, n, k, dtype))
        return overridden(base, lambda: dot_space(m, n, k, dtype, t), _dot_apply)


def dot_key(m: int, n: int, k: int, dtype: str = "float32") -> str:
    """The key naming a dot-product kernel's schedule in a tuning log."""
    return site_key("dot", m=m, n=n, k=k, dtype=dtype)


def _dot_knobs(s: DotSchedule) -> dict[str, Any]:
    return {"rows": s.rows, "accs": s.accs, "parallel": s.parallel, "chunks": s.chunks}


def _dot_apply(base: DotSchedule, knobs: Mapping[str, Any]) -> DotSchedule:
    s = replace(base, rows=int(knobs["rows"]), accs=int(knobs["accs"]),
                parallel=bool(knobs["parallel"]), chunks=int(knobs["chunks"]))
    return replace(s, tuned=_dot_knobs(s) != _dot_knobs(base))


def dot_space(m: int, n: int, k: int, dtype: str = "float32",
              target: Target | None = None) -> Space:
    """The knobs of `dot_rows` for these shapes (the rule's first): 1, 2, 4 or 8 weight rows
    a block, 1, 2 or 4 accumulators a row (their product within the Target's registers, two
    left for x), the loop on the thread pool or not, in 2 to 16 chunks a thread. Other
    accumulators sum K in another order: results differ in the last bits, as the tuner's
    check allows."""
    t = lowering_target(target)
    lanes = t.lanes(dtype)
    base = DotSchedule(DOT_BLOCK_ROWS, DOT_BLOCK_ACCS, _dot_parallel(m, n, k, dtype, t))
    d = _dot_knobs(base)
    cores = t.cores > 1
    knobs = (("rows", ordered(d["rows"], [1, 2, 8])), ("accs", ordered(d["accs"], [1, 4])),
             ("parallel", ordered(d["parallel"], [True, False] if cores else [])),
             ("chunks", ordered(d["chunks"], [2, 8, 16] if cores else [])))

    def check(kn: Mapping[str, Any]) -> bool:
        return int(kn["rows"]) * int(kn["accs"]) <= t.registers - 2

    def canonical(kn: Mapping[str, Any]) -> Any:
        # no blocks where K is shorter than a row's accumulators or N than a block
        blocked = k >= int(kn["accs"]) * lanes and n >= int(kn["rows"])
        return (kn["rows"] if blocked else None, kn["accs"] if blocked else None,
                kn["parallel"], kn["chunks"] if kn["parallel"] else None)

    return Space(dot_key(m, n, k, dtype), tuple(knobs), check, canonical)


def dot_rows(x: LBuffer, w: LBuffer, lead: tuple[int, ...], m: int, n: int, k: int,
             write: WriteFn, target: Target | None = None,
             schedule: DotSchedule | None = None) -> Stmt:
    """``out[i, j] = x[i, :] · w[j, :]``: blocks of ``schedule.rows`` weight rows, each with
    ``schedule.accs`` vector accumulators along K (vectors of the target's width), then a
    horizontal sum and the scalar tail; parallel over j when the product is large or its
    weight at least a core's L2 (`_dot_parallel`; `DotSchedule.default` unless given)."""
    tgt = lowering_target(target)
    s = schedule or DotSchedule.default(m, n, k, x.dtype, tgt)
    lanes = tgt.lanes(x.dtype)
    j, i = Var("j"), Var("i")
    xrow = split_index(i, lead)

    def step(acc: Expr, p: Expr) -> Expr:
        return FMA(Load(x, (*xrow, p), lanes), Load(w, (j, p), lanes), acc)

    def tail(total: Expr, q: Expr) -> Expr:
        return FMA(Load(x, (*xrow, q)), Load(w, (j, q)), total)

    body = oplib.lane_fold(k, lanes, x.dtype, Const(0.0, x.dtype), step, "add", tail,
                           lambda v: write((*xrow, j), v))
    rows = s.rows
    blocks = n // rows if k >= s.accs * lanes else 0
    jb = Var("jb")
    kind = "parallel" if s.parallel else "serial"

    def block(jb: Expr) -> Stmt:
        return _dot_block(x, w, xrow, jb, k, lanes, write, rows, s.accs)
    if m > DOT_MAX_ROWS:
        # a narrow dense (`uses_dot`): the rows of x outermost, each read once for every
        # output, the few weight rows staying in cache; parallel over those rows (over j,
        # 10 units ran two blocks of four in parallel and the last two alone)
        parts: list[Stmt] = []
        if blocks:
            parts.append(For(jb, Const(0), Const(blocks), block(jb)))
        if blocks * rows < n:
            parts.append(For(j, Const(blocks * rows), Const(n - blocks * rows), body))
        return For(i, Const(0), Const(m), parts[0] if len(parts) == 1 else Seq(tuple(parts)),
                   kind, s.chunks)
    if not blocks:
        return For(j, Const(0), Const(n), For(i, Const(0), Const(m), body), kind, s.chunks)
    blocked = For(jb, Const(0), Const(blocks), For(i, Const(0), Const(m), block(jb)), kind,
                  s.chunks)
    if blocks * rows == n:
        return blocked
    rest = For(j, Const(blocks * rows), Const(n - blocks * rows),
               For(i, Const(0), Const(m), body))
    return Seq((blocked, rest))


def _dot_block(x: LBuffer, w: LBuffer, xrow: tuple[Expr, ...], jb: Expr, k: int, lanes: int,
               write: WriteFn, rows: int = DOT_BLOCK_ROWS, accs: int = DOT_BLOCK_ACCS) -> Stmt:
    """``out[xrow, jb·R + r] = x[xrow, :] · w[jb·R + r, :]`` for the R = DOT_BLOCK_ROWS rows of
    block ``jb``: vector accumulators along K, then per row its accumulators added, its
    lanes summed as a tree (halving the vector: on AVX-512 four extract-and-adds a row,
    where a sum lane by lane took LLVM some 75 shuffles and adds per block of four rows) and
    the scalar tail — an order fixed by the shapes (and ``accs``) alone."""
    dtype = x.dtype
    acc = LBuffer("dotacc", (rows * accs, lanes), dtype, "local")
    halves = {h: LBuffer(f"dothalf{h}", (rows, h), dtype, "local")
              for h in (lanes >> s for s in range(1, lanes.bit_length()))}
    zero = Const(0, INDEX)
    width = accs * lanes
    chunks = k // width
    vec_tail = (k - chunks * width) // lanes
    wrow = [jb * rows + r for r in range(rows)]

    def at(a: int) -> Load:
        return Load(acc, (Const(a, INDEX), zero), lanes)

    def put(a: int, value: Expr) -> Store:
        return Store(acc, (Const(a, INDEX), zero), value)

    def steps(p: Expr, count: int) -> list[Stmt]:
        return [put(r * accs + u, FMA(Load(x, (*xrow, p + u * lanes), lanes),
                                      Load(w, (wrow[r], p + u * lanes), lanes),
                                      at(r * accs + u)))
                for r in range(rows) for u in range(count)]

    stmts: list[Stmt] = [put(a, Broadcast(Const(0.0, dtype), lanes))
                         for a in range(rows * accs)]
    p0 = Var("p0")
    stmts.append(For(p0, Const(0, INDEX), Const(chunks, INDEX),
                     Seq(tuple(steps(p0 * width, accs)))))
    if vec_tail:
        stmts += steps(Const(chunks * width, INDEX), vec_tail)
    for r in range(rows):
        vec: Expr = at(r * accs)
        for u in range(1, accs):
            vec = Binary("add", vec, at(r * accs + u))
        stmts.append(put(r * accs, vec))
        # lane l += lane l + h for h = lanes/2, ..., 1, each level in a buffer of its own
        # (LLVM keeps them in registers; writing the levels over one buffer defeated that)
        src, row, h = acc, Const(r * accs, INDEX), lanes // 2
        while h:
            stmts.append(Store(halves[h], (Const(r, INDEX), zero), Binary(
                "add", Load(src, (row, zero), h), Load(src, (row, Const(h, INDEX)), h))))
            src, row, h = halves[h], Const(r, INDEX), h // 2
        total: Expr = Load(src, (row, zero))
        for q in range(chunks * width + vec_tail * lanes, k):
            qc = Const(q, INDEX)
            total = FMA(Load(x, (*xrow, qc)), Load(w, (wrow[r], qc)), total)
        stmts.append(write((*xrow, wrow[r]), total))
    out: Stmt = Seq(tuple(stmts))
    for level in halves.values():
        out = Allocate(level, out)
    return Allocate(acc, out)
