"""Native threads for parallel loops: libgomp, and the thread count kernels read.

A ``parallel`` loop calls libgomp's ``GOMP_parallel`` from the generated code (see emit.py),
so iterations run on native threads with no Python between them, and the calling Python
thread has released the GIL (ctypes does, for the whole kernel call). libgomp ships with
gcc; kiln loads ``libgomp.so.1`` into the process once. We chose it over a pool of our
own because it is mature (a team per calling thread, spin-then-sleep waiting) and already
what PyTorch and numpy's BLAS use on Linux. Where libgomp cannot be loaded, a small
stand-in compiled at start-up runs every parallel loop on the calling thread.

The thread count is a native ``int32`` named ``kiln_num_threads`` that kernels read each
time a parallel loop starts, so machine code does not depend on it (and caches across
counts). It starts from ``KILN_NUM_THREADS`` (default: every core this process may use)
and `set_num_threads` changes it for the whole process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llvmlite.binding as llvm

from kiln.codegen.outline import NUM_THREADS_SYMBOL
from kiln.codegen.target import host_target, initialize
from kiln.errors import Error

_count = ctypes.c_int32(1)
_lock = threading.Lock()
_ready = False
_libgomp = False
_fallback_engine = None  # keeps the stand-in's machine code alive


def default_num_threads() -> int:
    """``KILN_NUM_THREADS`` if set, else the number of cores this process may run on."""
    text = os.environ.get("KILN_NUM_THREADS", "").strip()
    if text:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise Error(f"KILN_NUM_THREADS must be a positive integer, not {text!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ensure_runtime() -> None:
    """Make the symbols generated code needs resolvable (once per process)."""
    global _ready, _libgomp
    if _ready:
        return
    with _lock:
        if _ready:
            return
        initialize()
        _count.value = default_num_threads()
        llvm.add_symbol(NUM_THREADS_SYMBOL, ctypes.addressof(_count))
        for name in ("libgomp.so.1", ctypes.util.find_library("gomp")):
            if not name:
                continue
            try:
                llvm.load_library_permanently(name)
                _libgomp = llvm.address_of_symbol("GOMP_parallel") is not None
            except RuntimeError:
                continue
            if _libgomp:
                break
        if not _libgomp:
            _install_serial_stand_in()
        _ready = True


def _install_serial_stand_in() -> None:
    """``GOMP_parallel`` and friends running the region once, on the calling thread."""
    global _fallback_engine
    text = """
define void @kiln_serial_parallel(ptr %fn, ptr %data, i32 %n, i32 %flags) {
  call void %fn(ptr %data)
  ret void
}
define i32 @kiln_serial_zero() { ret i32 0 }
define i32 @kiln_serial_one() { ret i32 1 }
"""
    tm = host_target(0)  # it runs in this process, so it is built for this machine
    module = llvm.parse_assembly(text)
    module.triple = tm.triple
    engine = llvm.create_mcjit_compiler(module, tm.new_machine())
    engine.finalize_object()
    for symbol, fn in (("GOMP_parallel", "kiln_serial_parallel"),
                       ("omp_get_thread_num", "kiln_serial_zero"),
                       ("omp_get_num_threads", "kiln_serial_one")):
        llvm.add_symbol(symbol, engine.get_function_address(fn))
    _fallback_engine = engine


def has_libgomp() -> bool:
    """Whether parallel loops really run on several threads."""
    ensure_runtime()
    return _libgomp


def num_threads() -> int:
    """The number of threads a parallel loop may use."""
    ensure_runtime()
    return int(_count.value)


def set_num_threads(n: int) -> None:
    """Let parallel loops use ``n`` threads (process-wide; 1 runs them serially)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise Error(f"the number of threads must be a positive integer, not {n!r}")
    ensure_runtime()
    _count.value = n


@contextmanager
def threads(n: int) -> Iterator[None]:
    """``with threads(1): ...`` runs kernels with ``n`` threads, then restores the count."""
    before = num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(before)
