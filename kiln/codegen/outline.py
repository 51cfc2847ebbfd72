"""Parallel loops: outlined bodies run on kiln's thread pool (emit stage).

A ``parallel`` loop runs its iterations on native threads with no Python in between. The
loop body becomes ``@<symbol>.parK.chunk(lo, hi, buffers..., values...)``, running
``for var in [lo, hi)`` with the buffers it uses as ``noalias`` parameters and the variables
it reads passed by value; ``@<symbol>.parK(ptr data, i64 lo, i64 hi)`` is what the pool
calls for each chunk of iterations: it reads the loop's start and the captured values from
the struct at ``data`` and calls the chunk on ``[start + lo, start + hi)``. The kernel fills
the struct and calls ``kiln_parallel_for(fn, data, extent, grain)`` (pool.py) when
``kiln_num_threads`` and the extent allow more than one thread, else calls the chunk
directly. The grain is ⌊extent / (chunks · threads)⌋ (at least 1), the loop's ``chunks``
per thread (`kiln.loops.ir.CHUNKS_PER_THREAD` unless a schedule says otherwise): at least a
few chunks per thread, so that the threads that are running take over the share of one that
is not (a busy core), and few enough that claiming one (an atomic add) costs nothing beside
its work. Rounded up instead, a loop of 14 iterations on 2 threads made 7 chunks of 2, which
the pool's per-thread ranges split 4 and 3 (8 iterations against 6): the 64-channel 56²
Winograd convolution's 14 groups of tiles, 0.93 of the time with the grain rounded down;
MobileNetV2 0.98, ResNet-18 0.99 (Emerald Rapids, 2 threads). Chunks are
whole iterations and no reduction is split, so results do not depend on the count. A chunk
that fails a Check stores the status into the struct; the kernel then frees its heap
buffers and returns it. Local buffers allocated inside the body belong to each chunk's own
call (the verifier forbids nested parallel loops). Inside the chunk the loop variable is
clamped to the loop's constant range (a no-op) so that LLVM knows it, also in the copy
inlined into the pool's function, where lo and hi are unknown: without it a conv's
``pixel // width`` stayed signed and scalar there, and 2 threads ran 3× slower than one.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Protocol

from llvmlite import ir

from kiln.codegen.function import FunctionState, alloca, field, mark_buffer_params
from kiln.codegen.llvmtypes import I1, I32, I64, PTR, VOID, ModuleContext
from kiln.loops.ir import (
    INDEX,
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    For,
    LetStmt,
    Load,
    Stmt,
    Store,
    Var,
)

NUM_THREADS_SYMBOL = "kiln_num_threads"  # an int32 in the runtime (kiln/codegen/threads.py)
PARALLEL_FOR_SYMBOL = "kiln_parallel_for"  # the pool's entry (kiln/codegen/pool.py)


class StatementEmitter(Protocol):
    """What outlining needs from the kernel's statement emitter (emit.py)."""

    module: ir.Module
    mc: ModuleContext
    symbol: str

    def emit_stmts(self, f: FunctionState, root: Stmt) -> None: ...

    def likely(self, f: FunctionState, cond: ir.Value) -> ir.Value: ...

    def return_status(self, f: FunctionState, status: ir.Value) -> None: ...


def emit_parallel(em: StatementEmitter, f: FunctionState, s: For, name: str) -> None:
    """Emit the parallel loop ``s`` into ``f`` as a region of kiln's thread pool."""
    if isinstance(s.extent, Const) and s.extent.value <= 0:
        return  # no iterations
    memo: dict = {}
    start = f.index(s.start, memo)
    n = f.index(s.extent, memo)
    names, bufs = free_refs(s.body)
    cvars = [v for v in names if id(v) in f.env and v is not s.var]
    cbufs = [b for b in bufs if id(b) in f.buffers]
    captured_types = [f.env[id(v)].type for v in cvars]
    chunk = _chunk_function(em, s, name, cvars, cbufs, captured_types)

    # What every chunk reads: status, start, extent, then the captured values.
    data_t = ir.LiteralStructType([I32, I64, I64] + [PTR] * len(cbufs) + captured_types)
    outlined = _thread_function(em, name, data_t, chunk, len(cbufs) + len(cvars))
    data = alloca(f.entry, data_t, f"{name}.data")
    values = [ir.Constant(I32, 0), start, n] + [f.buffers[id(b)] for b in cbufs] \
        + [f.env[id(v)] for v in cvars]
    for k, value in enumerate(values):
        f.b.store(value, field(f.b, data, data_t, k))
    want = f.b.sext(f.b.load(_num_threads(em.module), typ=I32, align=4), I64)
    threads = f.b.select(f.b.icmp_signed("<", want, n), want, n)
    many, one, join = f.block(f"{name}.threads"), f.block(f"{name}.inline"), \
        f.block(f"{name}.join")
    f.b.cbranch(f.b.icmp_signed(">", threads, ir.Constant(I64, 1)), many, one)
    f.b.position_at_end(many)
    share = f.b.mul(threads, ir.Constant(I64, s.chunks), flags=["nsw"])
    grain = f.b.sdiv(n, share)  # 0 where n < share: the pool takes 1
    parallel_for = em.mc.declare(PARALLEL_FOR_SYMBOL, VOID, [PTR, PTR, I64, I64])
    f.b.call(parallel_for, [outlined, data, n, grain])
    status_many = f.b.load(field(f.b, data, data_t, 0), typ=I32, align=4)
    f.b.branch(join)
    f.b.position_at_end(one)
    status_one = f.b.call(chunk, [start, f.b.add(start, n, flags=["nsw"])] + values[3:])
    f.b.branch(join)
    f.b.position_at_end(join)
    status = f.b.phi(I32)
    status.add_incoming(status_many, many)
    status.add_incoming(status_one, one)
    ok, fail = f.block(f"{name}.ok"), f.block(f"{name}.fail")
    f.b.cbranch(em.likely(f, f.b.icmp_unsigned("==", status, ir.Constant(I32, 0))), ok, fail)
    f.b.position_at_end(fail)
    em.return_status(f, status)
    f.b.position_at_end(ok)


def _chunk_function(em: StatementEmitter, s: For, name: str, cvars: list[Var],
                    cbufs: list[Buffer], captured_types: list[ir.Type]) -> ir.Function:
    """``i32 @name.chunk(lo, hi, buffers..., values...)``: ``for var in [lo, hi): body``."""
    chunk = ir.Function(em.module, ir.FunctionType(
        I32, [I64, I64] + [PTR] * len(cbufs) + captured_types), f"{name}.chunk")
    chunk.linkage = "internal"
    chunk.attributes.add("alwaysinline")
    chunk.attributes.add("nounwind")
    mark_buffer_params(chunk, cbufs, 2)
    lo, hi = chunk.args[0], chunk.args[1]
    cf_assume = []
    if isinstance(s.start, Const) and isinstance(s.extent, Const):
        # The chunk lies inside the loop's range: tell LLVM, so that it can treat index
        # arithmetic as unsigned (floordiv/floormod by constants become shifts and masks).
        first, end = int(s.start.value), int(s.start.value) + int(s.extent.value)
        cf_assume = [("sge", lo, first), ("sle", hi, end), ("sle", lo, "hi")]
    env = {id(v): a for v, a in zip(cvars, chunk.args[2 + len(cbufs):])}
    buffers = {id(b): a for b, a in zip(cbufs, chunk.args[2:])}
    cf = FunctionState(em.mc, chunk, env, buffers)
    assume = em.mc.declare("llvm.assume", VOID, [I1]) if cf_assume else None
    for pred, value, bound in cf_assume:
        other = hi if bound == "hi" else ir.Constant(I64, bound)
        cond = cf.b.icmp_signed({"sge": ">=", "sle": "<="}[pred], value, other)
        cf.b.call(assume, [cond])
    lo_var, n_var = Var("lo", INDEX), Var("n", INDEX)
    env[id(lo_var)] = lo
    env[id(n_var)] = cf.b.sub(hi, lo)
    start: Expr = lo_var if s.var.dtype == INDEX else Cast(s.var.dtype, lo_var)
    extent: Expr = n_var if s.var.dtype == INDEX else Cast(s.var.dtype, n_var)
    body = s.body
    if cf_assume:
        # The body sees the iteration clamped to the loop's range: a no-op at run time, but
        # it gives LLVM the variable's range where the assumes above do not reach (the
        # chunk is compiled once, not inlined into a caller that knows lo and hi), so
        # index arithmetic on it stays unsigned and vectorizable.
        it = Var(s.var.name, s.var.dtype)
        lo_c, hi_c = Const(first, s.var.dtype), Const(end - 1, s.var.dtype)
        body = LetStmt(s.var, Binary("min", Binary("max", it, lo_c), hi_c), body)
        em.emit_stmts(cf, For(it, start, extent, body, "serial"))
    else:
        em.emit_stmts(cf, For(s.var, start, extent, body, "serial"))
    cf.finish()
    return chunk


def _thread_function(em: StatementEmitter, name: str, data_t: ir.LiteralStructType,
                     chunk: ir.Function, ncaptured: int) -> ir.Function:
    """``void @name(ptr data, i64 lo, i64 hi)``: iterations ``[start + lo, start + hi)``."""
    fn = ir.Function(em.module, ir.FunctionType(VOID, [PTR, I64, I64]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    data, lo, hi = fn.args
    loaded = [b.load(field(b, data, data_t, k), typ=data_t.elements[k])
              for k in range(1, 3 + ncaptured)]
    start, captured = loaded[0], loaded[2:]
    report, done = (fn.append_basic_block(x) for x in ("report", "done"))
    status = b.call(chunk, [b.add(start, lo, flags=["nsw"]), b.add(start, hi, flags=["nsw"]),
                            *captured])
    b.cbranch(b.icmp_unsigned("!=", status, ir.Constant(I32, 0)), report, done)
    b.position_at_end(report)
    b.atomic_rmw("xchg", field(b, data, data_t, 0), status, "monotonic")
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _num_threads(module: ir.Module) -> ir.GlobalVariable:
    g = module.globals.get(NUM_THREADS_SYMBOL)
    if g is None:
        g = ir.GlobalVariable(module, I32, NUM_THREADS_SYMBOL)
        g.linkage = "external"
    return g


def free_refs(body: Stmt) -> tuple[list[Var], list[Buffer]]:
    """Variables and buffers a statement refers to, in a deterministic order."""
    names: dict[int, Var] = {}
    bufs: dict[int, Buffer] = {}
    seen: set[int] = set()
    stack: list[object] = [body]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        match x:
            case Var():
                names.setdefault(id(x), x)
            case Load(buffer=b) | Store(buffer=b):
                bufs.setdefault(id(b), b)
                # a symbolic buffer's dims address it (its strides)
                stack.extend(d for d in b.shape if isinstance(d, Var))
        if is_dataclass(x):
            for fld in fields(x):
                value = getattr(x, fld.name)
                if isinstance(value, (Stmt, Expr)):
                    stack.append(value)
                elif isinstance(value, tuple):
                    stack.extend(v for v in value if isinstance(v, (Stmt, Expr)))
    return list(names.values()), list(bufs.values())

