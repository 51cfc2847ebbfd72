"""Native threads for parallel loops: kiln's own thread pool, and the thread count it reads.

A ``parallel`` loop calls ``kiln_parallel_for`` from the generated code (outline.py), so
iterations run on native threads with no Python between them, and the calling Python thread
has released the GIL (ctypes does, for the whole kernel call). The pool is kiln's own
(pool.py): LLVM IR compiled here once per process, needing only pthreads from libc — no C
compiler and no OpenMP runtime. Work is claimed dynamically in small chunks and the caller
takes part, so a worker that is descheduled (a busy core, another runtime's spinning
threads) slows a region down instead of stalling it: libgomp's static split, which kiln used
before, took an LSTM loop from 0.6 ms to 16 ms with one core of two busy. Idle workers spin
briefly, then sleep.

The thread count is a native ``int32`` named ``kiln_num_threads`` that the pool reads each
time a parallel loop starts, so machine code does not depend on it (and caches across
counts). It starts from ``KILN_NUM_THREADS`` (default: every core this process may use)
and `set_num_threads` changes it for the whole process. An executable given its own count
(`kiln.Executable.set_threads`) sets it for the length of each of its calls (`run_threads`):
while calls with their own counts run, the count is the latest one begun, and when the last
ends it is the process's again. The count only decides how many threads share a loop's
chunks, never what they compute.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import llvmlite.binding as llvm

from kiln.codegen.memory import keep_freed_memory
from kiln.codegen.outline import NUM_THREADS_SYMBOL
from kiln.codegen.pool import FP_UPDATE_SYMBOL, PARALLEL_FOR_SYMBOL, SPIN_NS_SYMBOL, pool_ir
from kiln.codegen.target import host_target, initialize
from kiln.errors import Error, InternalError

_count = ctypes.c_int32(1)
_process_count = 1  # what set_num_threads (or KILN_NUM_THREADS) chose
_calls: list[int] = []  # the counts of the calls running with their own, oldest first
_lock = threading.Lock()
_ready = False
_pool_engine = None  # keeps the pool's machine code alive
_parallel_for = 0  # its address
_spin_ns: ctypes.c_int64 | None = None  # the pool's kiln_pool_spin_ns


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


def default_spin_ms() -> float:
    """``KILN_SPIN_MS`` if set (milliseconds an idle worker stays awake yielding its core
    after its last region before it sleeps), else 0: sleep after the pool's few ms of checks."""
    text = os.environ.get("KILN_SPIN_MS", "").strip()
    if not text:
        return 0.0
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 60_000:
        raise Error(f"KILN_SPIN_MS must be a number of milliseconds from 0 to 60000, "
                    f"not {text!r}")
    return ms


def ensure_runtime() -> None:
    """Make the symbols generated code needs resolvable (once per process)."""
    global _ready
    if _ready:
        return
    with _lock:
        if _ready:
            return
        initialize()
        keep_freed_memory()
        global _process_count
        _process_count = default_num_threads()
        _count.value = _process_count
        llvm.add_symbol(NUM_THREADS_SYMBOL, ctypes.addressof(_count))
        _install_pool()
        _ready = True


def host_engine(ir_of: Callable[[str], str], what: str) -> Any:
    """An MCJIT engine holding the LLVM module ``ir_of(triple)`` compiled for this machine
    (code that runs in this process: the pool, the VM's chain runner); ``what`` names it in
    the error LLVM's refusal raises."""
    m = host_target(2)
    try:
        module = llvm.parse_assembly(ir_of(m.triple))
        module.verify()
    except RuntimeError as exc:
        raise InternalError(f"LLVM rejected {what}: {exc}") from None
    module.data_layout = m.data_layout
    m.optimize(module)
    engine = llvm.create_mcjit_compiler(module, m.new_machine())
    engine.finalize_object()
    return engine


def _install_pool() -> None:
    """Compile the pool (pool.py) for this machine and register ``kiln_parallel_for``."""
    global _pool_engine, _parallel_for
    engine = host_engine(pool_ir, "kiln's thread pool")
    _parallel_for = engine.get_function_address(PARALLEL_FOR_SYMBOL)
    spin = engine.get_global_value_address(SPIN_NS_SYMBOL)
    if not _parallel_for or not spin:
        raise InternalError("kiln's thread pool has no kiln_parallel_for or spin setting")
    llvm.add_symbol(PARALLEL_FOR_SYMBOL, _parallel_for)
    _pool_engine = engine
    global _spin_ns
    _spin_ns = ctypes.c_int64.from_address(spin)
    _spin_ns.value = int(default_spin_ms() * 1e6)
    global _fp_update
    _fp_update = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)(
        engine.get_function_address(FP_UPDATE_SYMBOL))


# MXCSR bits: flush-to-zero (results) and denormals-are-zero (operands)
_FTZ_DAZ = 0x8040
_fp_update: Callable[[int, int], int] | None = None


@contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[None]:
    """Run the block's kernels with subnormal floats treated as zero (on x86: MXCSR's
    flush-to-zero and denormals-are-zero; elsewhere nothing changes), the calling thread's
    mode restored after. Workers of kiln's pool run a region's chunks in its caller's mode.

    Arithmetic on subnormals takes a microcode assist on x86, a hundred times slower than
    normal: a training step whose gradients decay through the subnormal range (ResNet-18,
    batch 8, steps 5-8 of SGD with momentum on a constant loss) took 30-50 s instead of 1 s.
    Values below 1.2e-38 become 0, as TensorFlow's and oneDNN's defaults do; `kiln.train.Step`
    flushes unless told not to, inference does not."""
    ensure_runtime()
    if not enabled or _fp_update is None:
        yield
        return
    old = _fp_update(0xFFFFFFFF, _FTZ_DAZ)
    try:
        yield
    finally:
        _fp_update(0, old)


def parallel_for_address() -> int:
    """The address of this process's ``kiln_parallel_for`` (pool.py)."""
    ensure_runtime()
    return _parallel_for


def num_threads() -> int:
    """The number of threads a parallel loop may use."""
    ensure_runtime()
    return int(_count.value)


def set_num_threads(n: int) -> None:
    """Let parallel loops use ``n`` threads (process-wide; 1 runs them serially)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise Error(f"the number of threads must be a positive integer, not {n!r}")
    ensure_runtime()
    global _process_count
    with _lock:
        _process_count = n
        if not _calls:
            _count.value = n


def spin_ms() -> float:
    """Milliseconds an idle pool worker stays awake after its last region (`set_spin_ms`)."""
    ensure_runtime()
    assert _spin_ns is not None
    return _spin_ns.value / 1e6


def set_spin_ms(ms: float) -> None:
    """Let idle pool workers stay awake, yielding their cores, for ``ms`` milliseconds after
    their last parallel region before they sleep (process-wide; 0, the default, sleeps after
    the pool's own few milliseconds of checks). Longer keeps the next call fast after a pause
    where waking a sleeping thread is slow (a VM's halted vCPU), at the price of a core busy
    yielding in between."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 60_000:
        raise Error(f"the spin time must be a number of milliseconds from 0 to 60000, "
                    f"not {ms!r}")
    ensure_runtime()
    assert _spin_ns is not None
    _spin_ns.value = int(ms * 1e6)


@contextmanager
def run_threads(n: int) -> Iterator[None]:
    """Run what the block calls with ``n`` threads (one call of an executable with its own
    count; see the module docstring), then give back the count in force before."""
    ensure_runtime()
    with _lock:
        _calls.append(n)
        _count.value = n
    try:
        yield
    finally:
        with _lock:
            _calls.remove(n)
            _count.value = _calls[-1] if _calls else _process_count


@contextmanager
def threads(n: int) -> Iterator[None]:
    """``with threads(1): ...`` runs kernels with ``n`` threads, then restores the count."""
    before = num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(before)
