"""Emit: a loop-IR kernel as an LLVM module (the first of code generation's three stages).

Calling convention. Every kernel is ``i32 @<symbol>(ptr %args)``: ``args[i]`` is the data
pointer of the i-th parameter (inputs, then outputs), followed, for a symbolic kernel, by
the values of its `Kernel.dims` as 64-bit integers. It returns 0, or a status: k (1-based)
when the k-th `Check` of the kernel (in order of appearance) fails, or ``len(checks) + j``
when the j-th heap allocation fails (`status_messages` lists them all; the messages stay on
the Python side). The wrapper loads the pointers and calls ``@<symbol>.body``, whose
parameters are marked ``noalias`` and ``dereferenceable`` (inputs never overlap outputs;
every buffer is exactly its shape): inlined, that becomes alias metadata the vectorizer uses.

Statements. Loops are rotated basic-block loops; ``vectorized`` ones carry
``llvm.loop.vectorize.enable`` (``scalar`` ones the hint that forbids it, ``rolled`` ones that and
``llvm.loop.unroll.disable``), ``unrolled`` ones
are emitted unrolled (their extents are small constants), ``parallel`` ones are outlined and
run on kiln's thread pool (outline.py).
A local `Allocate` of up to `STACK_LIMIT` bytes (and `STACK_BUDGET` for the kernel) is an
``alloca`` in the function's entry block (SROA turns register tiles into registers); a
larger one is ``malloc``/``free``d, NULL-checked. A failed `Check` frees the live heap
buffers and returns its status.

Statements are walked with an explicit work stack (nesting can be deep); expressions are
emitted by `ExprEmitter`, once per statement.
"""

from __future__ import annotations

import functools
from itertools import count

from llvmlite import ir

from kiln.codegen.amx import emit_tile_product
from kiln.codegen.emit_expr import Memo
from kiln.codegen.function import (
    FunctionState,
    Work,
    alloca,
    int_as,
    mark_buffer_params,
    nbytes,
)
from kiln.codegen.llvmtypes import (
    I1,
    I8,
    I32,
    I64,
    PTR,
    VOID,
    ModuleContext,
    itemsize,
    memory_type,
    value_type,
    with_element,
)
from kiln.codegen.outline import emit_parallel
from kiln.errors import InternalError
from kiln.loops.ir import (
    Allocate,
    Buffer,
    Check,
    Const,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Prefetch,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Var,
)

STACK_LIMIT = 64 * 1024  # bytes: a larger local buffer goes on the heap
STACK_BUDGET = 256 * 1024  # bytes: all of a kernel's stack buffers together
# Vectorized loops shorter than FOLD_TAIL_MAX whose length is not a multiple of
# FOLD_TAIL_LANES (a float32 vector of AVX-512) fold their tail into masked steps (`_fold_tail`)
FOLD_TAIL_LANES = 16
FOLD_TAIL_MAX = 128
# ... and those of KEEP_LOOP_MIN to FOLD_TAIL_LANES - 1 iterations, one masked step, are kept
# as loops for the vectorizer (`_loop_metadata`): LLVM's full unrolling, which runs first,
# turned a depthwise convolution's 7-pixel output rows into 7 scalar copies and then
# vectorized the loop *around* them across rows, with gathers and scatters. Shorter loops
# (zeroing one or two pixels of padding) are left to the unroller: the vectorizer declines
# them and says so on stderr.
KEEP_LOOP_MIN = 4


# --- what a kernel's status codes mean ---------------------------------------------------------


def _pre_order(kernel: Kernel) -> list[Stmt]:
    out: list[Stmt] = []
    stack: list[Stmt] = [kernel.body]
    while stack:
        s = stack.pop()
        out.append(s)
        match s:
            case For(body=body) | LetStmt(body=body) | Allocate(body=body):
                stack.append(body)
            case Seq(stmts=stmts):
                stack.extend(reversed(stmts))
            case IfThenElse(then_case=t, else_case=f):
                if f is not None:
                    stack.append(f)
                stack.append(t)
    return out


def checks(kernel: Kernel) -> list[Check]:
    """The kernel's `Check`s in order of appearance (status k is the k-th, 1-based)."""
    return [s for s in _pre_order(kernel) if isinstance(s, Check)]


def heap_allocations(kernel: Kernel) -> list[Buffer]:
    """Local buffers that go on the heap, in order of appearance: each one larger than
    `STACK_LIMIT`, and any that would take the kernel's stack buffers past `STACK_BUDGET`
    (they all live in the entry block at once; a worker thread's stack is not large)."""
    out: list[Buffer] = []
    used = 0
    seen: set[int] = set()
    for s in _pre_order(kernel):
        if not isinstance(s, Allocate) or id(s.buffer) in seen:
            continue
        seen.add(id(s.buffer))
        size = nbytes(s.buffer)
        if size > STACK_LIMIT or used + size > STACK_BUDGET:
            out.append(s.buffer)
        else:
            used += size
    return out


def uses_tiles(kernel: Kernel) -> bool:
    """Whether ``kernel`` has a `TileProduct` (AMX: its process needs the tile state)."""
    return any(isinstance(s, TileProduct) for s in _pre_order(kernel))


def status_messages(kernel: Kernel) -> list[str]:
    """The message of each nonzero status (index status - 1)."""
    out = [c.message for c in checks(kernel)]
    for buf in heap_allocations(kernel):
        out.append(f"out of memory: cannot allocate {nbytes(buf)} bytes for the local buffer "
                   f"{buf.name} of kernel {kernel.name}")
    return out


# --- the kernel --------------------------------------------------------------------------------


class _KernelEmitter:
    """Emits one kernel's module: the entry point, its body, outlined parallel loops."""

    def __init__(self, kernel: Kernel, symbol: str, triple: str, data_layout: str,
                 features: frozenset[str] = frozenset()) -> None:
        self.kernel = kernel
        self.symbol = symbol
        self.module = ir.Module(name=symbol)
        self.module.triple = triple
        self.module.data_layout = data_layout
        self.mc = ModuleContext(self.module, features)
        self.check_status = {id(c): k + 1 for k, c in enumerate(checks(kernel))}
        n_checks = len(self.check_status)
        self.heap_status = {id(b): n_checks + k + 1
                            for k, b in enumerate(heap_allocations(kernel))}
        self.parallel_count = count()

    def emit(self) -> ir.Module:
        params = list(self.kernel.params)
        dims = self.kernel.dims
        body_fn = ir.Function(self.module,
                              ir.FunctionType(I32, [PTR] * len(params) + [I64] * len(dims)),
                              f"{self.symbol}.body")
        body_fn.linkage = "internal"
        body_fn.attributes.add("alwaysinline")
        body_fn.attributes.add("nounwind")
        mark_buffer_params(body_fn, params, 0)
        env = {id(d): body_fn.args[len(params) + k] for k, d in enumerate(dims)}
        f = FunctionState(self.mc, body_fn, env,
                          {id(b): a for b, a in zip(params, body_fn.args)})
        self.emit_stmts(f, self.kernel.body)
        f.finish()

        entry = ir.Function(self.module, ir.FunctionType(I32, [PTR]), self.symbol)
        entry.attributes.add("nounwind")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        args = []
        for k in range(len(params) + len(dims)):
            slot = b.gep(entry.args[0], [ir.Constant(I64, k)], source_etype=PTR, inbounds=True)
            args.append(b.load(slot, typ=PTR if k < len(params) else I64, align=8))
        b.ret(b.call(body_fn, args))
        return self.module

    # --- the statement walk ------------------------------------------------------------------

    def emit_stmts(self, f: FunctionState, root: Stmt) -> None:
        work: Work = [root]
        while work:
            item = work.pop()
            match item:
                case For():
                    self._for(f, item, work)
                case Store():
                    self._store(f, item, work)
                case LetStmt():
                    self._let(f, item, work)
                case Allocate():
                    self._allocate(f, item, work)
                case Seq():
                    self._seq(f, item, work)
                case IfThenElse():
                    self._if(f, item, work)
                case Check():
                    self._check(f, item, work)
                case TileProduct():
                    emit_tile_product(self.mc, f, item)
                case Prefetch():
                    self._prefetch(f, item)
                case Stmt():
                    raise InternalError(f"codegen: unknown statement {type(item).__name__}")
                case _:
                    item()  # a continuation: unbind a variable, close a loop or a branch

    def _seq(self, f: FunctionState, s: Seq, work: Work) -> None:
        work.extend(reversed(s.stmts))

    def _store(self, f: FunctionState, s: Store, work: Work) -> None:
        memo: Memo = {}
        value = f.expr(s.value, memo)
        ptr = f.x.address(s.buffer, s.indices, memo)
        if s.buffer.dtype == "bool":
            value = f.b.zext(value, with_element(value.type, I8))
        f.b.store(value, ptr, align=itemsize(s.buffer.dtype))

    def _prefetch(self, f: FunctionState, s: Prefetch) -> None:
        # llvm.prefetch(address, read (0), locality 3: keep in every level, data cache (1))
        ptr = f.x.address(s.ref.buffer, s.ref.indices, {})
        fn = self.mc.declare("llvm.prefetch.p0", VOID, [PTR, I32, I32, I32])
        f.b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])

    def _let(self, f: FunctionState, s: LetStmt, work: Work) -> None:
        value = f.expr(s.value, {})
        key = id(s.var)
        previous = f.env.get(key)
        f.env[key] = value

        def unbind() -> None:
            if previous is None:
                f.env.pop(key, None)
            else:
                f.env[key] = previous

        work.append(unbind)
        work.append(s.body)

    def _allocate(self, f: FunctionState, s: Allocate, work: Work) -> None:
        buf = s.buffer
        key = id(buf)
        size = nbytes(buf)
        if key not in self.heap_status:
            f.buffers[key] = alloca(f.entry, ir.ArrayType(memory_type(buf.dtype),
                                                           max(buf.size, 1)), buf.name)
            work.append(lambda: f.buffers.pop(key, None))
            work.append(s.body)
            return
        malloc = self.mc.declare("malloc", PTR, [I64])
        ptr = f.b.call(malloc, [ir.Constant(I64, size)], name=buf.name)
        ok, fail = f.block(f"{buf.name}.ok"), f.block(f"{buf.name}.oom")
        f.b.cbranch(self.likely(f, f.b.icmp_unsigned("!=", ptr, ir.Constant(PTR, None))),
                    ok, fail)
        f.b.position_at_end(fail)
        self.return_status(f, ir.Constant(I32, self.heap_status[key]))
        f.b.position_at_end(ok)
        f.buffers[key] = ptr
        f.heap.append(ptr)

        def release() -> None:
            f.heap.pop()
            f.b.call(self.mc.declare("free", VOID, [PTR]), [ptr])
            f.buffers.pop(key, None)

        work.append(release)
        work.append(s.body)

    def _if(self, f: FunctionState, s: IfThenElse, work: Work) -> None:
        cond = f.expr(s.cond, {})
        else_case = s.else_case
        then_bb = f.block("then")
        else_bb = f.block("else") if else_case is not None else None
        merge = f.block("endif")
        f.b.cbranch(cond, then_bb, else_bb or merge)
        f.b.position_at_end(then_bb)

        def after_then() -> None:
            f.b.branch(merge)
            if else_case is None:
                f.b.position_at_end(merge)
                return
            f.b.position_at_end(else_bb)
            work.append(after_else)
            work.append(else_case)

        def after_else() -> None:
            f.b.branch(merge)
            f.b.position_at_end(merge)

        work.append(after_then)
        work.append(s.then_case)

    def _check(self, f: FunctionState, s: Check, work: Work) -> None:
        cond = f.expr(s.cond, {})
        ok, fail = f.block("check.ok"), f.block("check.fail")
        f.b.cbranch(self.likely(f, cond), ok, fail)
        f.b.position_at_end(fail)
        self.return_status(f, ir.Constant(I32, self.check_status[id(s)]))
        f.b.position_at_end(ok)

    def likely(self, f: FunctionState, cond: ir.Value) -> ir.Value:
        expect = self.mc.declare("llvm.expect.i1", I1, [I1, I1])
        return f.b.call(expect, [cond, ir.Constant(I1, 1)])

    def return_status(self, f: FunctionState, status: ir.Value) -> None:
        free = self.mc.declare("free", VOID, [PTR])
        for ptr in reversed(f.heap):
            f.b.call(free, [ptr])
        f.b.ret(status)

    # --- loops -------------------------------------------------------------------------------

    def _for(self, f: FunctionState, s: For, work: Work) -> None:
        if s.kind == "parallel":
            emit_parallel(self, f, s, f"{self.symbol}.par{next(self.parallel_count)}")
        elif s.kind == "unrolled":
            self._unrolled(f, s, work)
        else:
            memo: Memo = {}
            vt = value_type(s.var.dtype)
            start = int_as(f.b, f.index(s.start, memo), vt)
            n = int_as(f.b, f.index(s.extent, memo), vt)
            self._loop(f, s.var, start, n, s.extent, s.body, s.kind, work)

    def _loop(self, f: FunctionState, var: Var, start: ir.Value, n: ir.Value, extent: Expr,
              body: Stmt, kind: str, work: Work) -> None:
        """``for var in [start, start + n)`` as a rotated loop: guard, body, latch."""
        known = extent.value if isinstance(extent, Const) else None
        if known is not None and known <= 0:
            return
        end = f.b.add(start, n, flags=["nsw"])
        pre = f.b.block
        body_bb, exit_bb = f.block(f"{var.name}.loop"), f.block(f"{var.name}.end")
        if known is None:
            f.b.cbranch(f.b.icmp_signed(">", n, ir.Constant(n.type, 0)), body_bb, exit_bb)
        else:
            f.b.branch(body_bb)
        f.b.position_at_end(body_bb)
        i = f.b.phi(start.type, name=var.name)
        i.add_incoming(start, pre)
        f.env[id(var)] = i

        def latch() -> None:
            nxt = f.b.add(i, ir.Constant(i.type, 1), flags=["nsw"])
            i.add_incoming(nxt, f.b.block)
            br = f.b.cbranch(f.b.icmp_signed("<", nxt, end), body_bb, exit_bb)
            br.set_metadata("llvm.loop", self._loop_metadata(
                kind, int(known) if known is not None else None))
            f.b.position_at_end(exit_bb)
            f.env.pop(id(var), None)

        work.append(latch)
        work.append(body)

    def _fold_tail(self, extent: int | None) -> bool:
        """Whether a vectorized loop of ``extent`` iterations runs its tail as one masked
        vector step (LLVM's predication) instead of a scalar loop: with AVX-512's mask
        registers, for short loops of a length that whole vectors do not cover. A 14-pixel
        row of a depthwise convolution was three 4-lane steps and two scalar ones; now one
        masked 16-lane step (MobileNetV2's 384-channel 14×14 layer: 58 → 39 µs, one core).
        Kept from full unrolling too below a vector's length (`KEEP_LOOP_MIN`): the
        960-channel 7×7 depthwise layer alone, 2 threads of the Emerald Rapids VM,
        26 → 18 µs."""
        return (extent is not None and "avx512f" in self.mc.features
                and extent % FOLD_TAIL_LANES != 0 and extent < FOLD_TAIL_MAX)

    def _loop_metadata(self, kind: str, extent: int | None = None) -> ir.MDValue:
        md = self.module
        hints = [md.add_metadata([ir.MetaDataString(md, "llvm.loop.mustprogress")])]
        if kind in ("vectorized", "scalar", "rolled"):
            hints.append(self.module.add_metadata(
                [ir.MetaDataString(self.module, "llvm.loop.vectorize.enable"),
                 ir.Constant(I1, int(kind == "vectorized"))]))
        if kind == "rolled":
            hints.append(self.module.add_metadata(
                [ir.MetaDataString(self.module, "llvm.loop.unroll.disable")]))
        if kind == "vectorized" and self._fold_tail(extent):
            hints.append(self.module.add_metadata(
                [ir.MetaDataString(self.module, "llvm.loop.vectorize.predicate.enable"),
                 ir.Constant(I1, 1)]))
            if extent is not None and KEEP_LOOP_MIN <= extent < FOLD_TAIL_LANES:
                hints.append(self.module.add_metadata(
                    [ir.MetaDataString(self.module, "llvm.loop.unroll.disable")]))
        # A loop ID refers to itself, so that each loop's node is distinct.
        node = self.module.add_metadata(
            [ir.MetaDataString(self.module, f"kiln.loop.{len(self.module.metadata)}")])
        node.operands = (node, *hints)
        return node

    def _unrolled(self, f: FunctionState, s: For, work: Work) -> None:
        start = f.index(s.start, {})
        vt = value_type(s.var.dtype)
        start = int_as(f.b, start, vt)
        if not isinstance(s.extent, Const):
            raise InternalError(f"codegen: unrolled loop {s.var.name} has extent {s.extent}, "
                                "not a constant (the verifier requires one)")
        items: Work = []
        for k in range(int(s.extent.value)):
            value = (ir.Constant(vt, start.constant + k) if isinstance(start, ir.Constant)
                     else f.b.add(start, ir.Constant(vt, k), flags=["nsw"]))
            items.append(functools.partial(f.env.__setitem__, id(s.var), value))
            items.append(s.body)
        items.append(lambda: f.env.pop(id(s.var), None))
        work.extend(reversed(items))


def emit_kernel(kernel: Kernel, symbol: str, triple: str = "", data_layout: str = "",
                features: frozenset[str] = frozenset()) -> ir.Module:
    """The LLVM module defining ``i32 @<symbol>(ptr args)`` for ``kernel``; ``features``
    (the Target's) choose instructions only some CPUs have (kiln/codegen/dot_product.py)."""
    return _KernelEmitter(kernel, symbol, triple, data_layout, features).emit()
