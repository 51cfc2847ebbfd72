"""One LLVM function being emitted: its builder, bindings, and helpers (emit stage).

`FunctionState` holds what the statement emitter needs at each point of one function: the
builder, an entry block for ``alloca``s (so SROA can turn stack buffers into registers),
the LLVM values bound to loop-IR variables and buffers, and the heap buffers live at that
point (an early return frees them).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from kiln.codegen.emit_expr import ExprEmitter, Memo
from kiln.codegen.llvmtypes import I32, PTR, ModuleContext, itemsize
from kiln.loops.ir import Buffer, Expr, Stmt

Work = list[Stmt | Callable[[], None]]  # the statement walk's stack: statements, continuations


class FunctionState:
    """Emission state of one LLVM function returning an ``i32`` status."""

    def __init__(self, mc: ModuleContext, fn: ir.Function, env: dict[int, ir.Value],
                 buffers: dict[int, ir.Value]) -> None:
        self.fn = fn
        self.entry = ir.IRBuilder(fn.append_basic_block("entry"))  # allocas only
        self.start = fn.append_basic_block("start")
        self.b = ir.IRBuilder(self.start)
        self.env = env
        self.buffers = buffers
        self.heap: list[ir.Value] = []
        self.x = ExprEmitter(mc, self.b, env, buffers)

    def expr(self, e: Expr, memo: Memo) -> ir.Value:
        return self.x.emit(e, memo)

    def index(self, e: Expr, memo: Memo) -> ir.Value:
        """An integer expression as an i64."""
        return self.x.as_index(self.x.emit(e, memo), e.dtype)

    def block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def finish(self) -> None:
        """Close the entry block and return success from the current one."""
        self.entry.branch(self.start)
        self.b.ret(ir.Constant(I32, 0))


def nbytes(buf: Buffer) -> int:
    return buf.size * itemsize(buf.dtype)


def mark_buffer_params(fn: ir.Function, bufs: list[Buffer], first: int) -> None:
    """Buffers never overlap and are exactly their size: ``noalias dereferenceable(n)``."""
    for k, buf in enumerate(bufs):
        arg = fn.args[first + k]
        arg.add_attribute("noalias")
        if not buf.is_symbolic and nbytes(buf):  # a symbolic one's size is known at run time
            arg.attributes.dereferenceable = nbytes(buf)


def alloca(b: ir.IRBuilder, t: ir.Type, name: str) -> ir.Value:
    """A stack slot as an opaque ``ptr`` (llvmlite would type it ``t*``)."""
    slot = b.alloca(t, name=name)
    slot.align = 32
    slot.type = PTR
    return slot


def field(b: ir.IRBuilder, ptr: ir.Value, struct_t: ir.Type, k: int) -> ir.Value:
    """The address of field ``k`` of the struct at ``ptr``."""
    return b.gep(ptr, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True,
                 source_etype=struct_t)


def int_as(b: ir.IRBuilder, v: ir.Value, t: ir.Type) -> ir.Value:
    """An i64 index converted to a loop variable's integer type."""
    return v if v.type == t else b.trunc(v, t)
