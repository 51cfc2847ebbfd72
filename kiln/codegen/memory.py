"""Memory for native code: glibc's malloc told to keep big freed blocks for the next call.

A kernel's large local buffers (a convolution's planes and sums, a GEMM's packed panels:
kiln/codegen/emit.py puts what is over 64 KiB on the heap) and an executable's results are
allocated on every call and freed at its end. glibc serves blocks above its mmap threshold
(128 KiB to start, raised as such blocks are freed) with ``mmap`` and gives them back with
``munmap``, and trims the top of its heaps once more than twice that is free, so each call
faulted its buffers' pages in again, zeroed by the kernel: in a VM each fault costs
microseconds. An int8 ResNet stem convolution with 5.6 MB of buffers took 6.4 ms a call that
way and 1.6 ms with the blocks reused (one Sapphire Rapids-class core, Firecracker VM).

So, once per process when kiln's native runtime starts, ``mallopt`` sets the mmap threshold
to its largest (32 MiB: smaller blocks come from the heap and are reused) and the trim
threshold to 512 MiB (freed memory stays with the process, as ONNX Runtime's and PyTorch's
arenas keep theirs). The price is resident memory that is not returned to the system after
a burst, up to about that much. ``KILN_KEEP_MEMORY=0`` leaves malloc as it is. Other C
libraries (musl, macOS) have no ``mallopt``; nothing is changed there.
"""

from __future__ import annotations

import ctypes
import os

from kiln.errors import Error

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 512 << 20


def keep_memory_wanted() -> bool:
    """``KILN_KEEP_MEMORY`` (default 1): whether kiln tunes malloc (module docstring)."""
    text = os.environ.get("KILN_KEEP_MEMORY", "1").strip()
    if text not in ("0", "1"):
        raise Error(f"KILN_KEEP_MEMORY must be 0 or 1, not {text!r}")
    return text == "1"


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says; whether it was done."""
    if not keep_memory_wanted():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) \
        and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
