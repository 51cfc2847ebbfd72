"""A run of kernels in one native call: ``kiln_run_chain``, what the VM calls for the kernels
of a straight stretch of a block instead of calling each one from Python.

    i32 kiln_run_chain(ptr plan, ptr bases)

The plan is an array of i64 words, built once when the VM turns a block into steps:

    n, widest, then for each kernel: address, argument count, (base, offset) per argument

Argument ``a`` of a kernel is the pointer ``bases[base] + offset``, or the absolute address
``offset`` when ``base`` is negative (a constant's data). The caller passes ``bases``: the
frame's arena first (the arena's planned buffers are offsets from it), then the data
pointers of the registers the chain reads that are not in the arena, in the plan's order.
The kernels run in order, each on an argument table built on the stack (``widest`` slots),
and the first nonzero status stops the chain: it returns ``(k + 1) << 16 | status`` for
kernel ``k`` (the same encoding as a program's entry point, kiln/codegen/program.py), else 0.

Why: a kernel call from Python costs 2–4 microseconds (the pointer table, ctypes, the
status), more than a small kernel computes (a TreeLSTM cell's gates: 150 elements). A
chain pays that once. The plan holds addresses of this process only, so it is never saved:
the VM builds it again wherever it loads an executable. The function is LLVM IR compiled
once per process, like the thread pool (kiln/codegen/pool.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

from kiln.codegen.target import initialize
from kiln.codegen.threads import host_engine
from kiln.errors import InternalError

CHAIN_SYMBOL = "kiln_run_chain"
STATUS_SHIFT = 16  # as the program entry point's

_TEMPLATE = """
target triple = "{triple}"

define i32 @{symbol}(ptr %plan, ptr %bases) nounwind {{
entry:
  %n = load i64, ptr %plan, align 8
  %wp = getelementptr inbounds i64, ptr %plan, i64 1
  %widest = load i64, ptr %wp, align 8
  %args = alloca ptr, i64 %widest, align 16
  br label %kernel
kernel:
  %k = phi i64 [ 0, %entry ], [ %k1, %next ]
  %pos = phi i64 [ 2, %entry ], [ %apos, %next ]
  %more = icmp ult i64 %k, %n
  br i1 %more, label %head, label %done
head:
  %fp = getelementptr inbounds i64, ptr %plan, i64 %pos
  %fword = load i64, ptr %fp, align 8
  %fn = inttoptr i64 %fword to ptr
  %cp = getelementptr inbounds i64, ptr %fp, i64 1
  %count = load i64, ptr %cp, align 8
  %first = add i64 %pos, 2
  br label %arg
arg:
  %a = phi i64 [ 0, %head ], [ %a1, %fill ]
  %apos = phi i64 [ %first, %head ], [ %apos1, %fill ]
  %amore = icmp ult i64 %a, %count
  br i1 %amore, label %fill, label %call
fill:
  %bp = getelementptr inbounds i64, ptr %plan, i64 %apos
  %base = load i64, ptr %bp, align 8
  %op = getelementptr inbounds i64, ptr %bp, i64 1
  %offset = load i64, ptr %op, align 8
  %absolute = icmp slt i64 %base, 0
  %index = select i1 %absolute, i64 0, i64 %base
  %bq = getelementptr inbounds i64, ptr %bases, i64 %index
  %bword = load i64, ptr %bq, align 8
  %from = select i1 %absolute, i64 0, i64 %bword
  %address = add i64 %from, %offset
  %pointer = inttoptr i64 %address to ptr
  %slot = getelementptr inbounds ptr, ptr %args, i64 %a
  store ptr %pointer, ptr %slot, align 8
  %a1 = add i64 %a, 1
  %apos1 = add i64 %apos, 2
  br label %arg
call:
  %status = call i32 %fn(ptr %args)
  %bad = icmp ne i32 %status, 0
  br i1 %bad, label %fail, label %next
next:
  %k1 = add i64 %k, 1
  br label %kernel
fail:
  %which = add i64 %k, 1
  %which32 = trunc i64 %which to i32
  %high = shl i32 %which32, {shift}
  %code = or i32 %high, %status
  ret i32 %code
done:
  ret i32 0
}}
"""

_lock = threading.Lock()
_engine = None  # keeps the machine code alive
_function: Callable[[int, object], int] | None = None


def chain_ir(triple: str) -> str:
    """The chain runner's LLVM module for ``triple``, as text."""
    return _TEMPLATE.format(triple=triple, symbol=CHAIN_SYMBOL, shift=STATUS_SHIFT)


def run_chain() -> Callable[[int, object], int]:
    """``kiln_run_chain`` as a ctypes function ``(plan address, bases array) -> status``,
    compiled for this machine on first use. ctypes releases the GIL for the call."""
    global _engine, _function
    if _function is not None:
        return _function
    with _lock:
        if _function is None:
            initialize()
            engine = host_engine(chain_ir, "kiln's kernel chain runner")
            address = engine.get_function_address(CHAIN_SYMBOL)
            if not address:
                raise InternalError("kiln's kernel chain runner has no entry point")
            _engine = engine
            kind = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
            _function = kind(address)
    return _function


def split_status(status: int) -> tuple[int, int]:
    """(index of the kernel that failed, its own status) from a chain's nonzero status."""
    return (status >> STATUS_SHIFT) - 1, status & ((1 << STATUS_SHIFT) - 1)


__all__ = ["CHAIN_SYMBOL", "chain_ir", "run_chain", "split_status"]
