"""Constants on 64-byte boundaries: the arrays an executor holds for the whole of its life.

numpy aligns what it allocates to 16 bytes only. A kernel's vector loads are 64 bytes wide
on AVX-512 (a cache line): from a weight 16 bytes off a line, three loads in four straddle
two lines, and a kernel that streams its weight from L2 (a matrix-vector product: batch-1
dense layers, an LSTM's recurrent step) reads at not much more than half the speed. On the
2-core Emerald Rapids VM, built with every constant 64-byte aligned against 16 bytes off,
interleaved in one process: the 32-step LSTM 338 → 297 µs, the batch-1 MLP 784-512-512-10
21.0 → 17.3 µs, the batch-64 one 393 → 382 µs; ResNet-18 and MobileNetV2, whose products
reuse each weight panel many times from L1, the same.

Loaded executables already hold their constants as aligned views into the file's buffer
(kiln/runtime/artifact.py), and exported libraries place each one on a 64-byte boundary
(kiln/runtime/export.py); this is the same for executables built in the process.
"""

from __future__ import annotations

import numpy as np

ALIGN = 64  # bytes: a cache line, and an AVX-512 vector


def is_aligned(a: np.ndarray, align: int = ALIGN) -> bool:
    """Whether ``a``'s first element lies on an ``align``-byte boundary (an empty array,
    which no kernel reads, always does)."""
    return a.size == 0 or a.ctypes.data % align == 0


def frozen_constant(value: np.ndarray) -> np.ndarray:
    """``value`` as an executor keeps a constant: C-contiguous, on a 64-byte boundary and
    read-only; the array itself when it is all three already (nothing is copied), else an
    aligned copy, so that a caller's later writes to ``value`` change nothing."""
    a = np.asarray(value)
    if a.flags.c_contiguous and not a.flags.writeable and a.dtype.isnative and is_aligned(a):
        return a
    out = aligned_empty(a.shape, a.dtype.newbyteorder("="))
    out[...] = a
    out.setflags(write=False)
    return out


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose first element lies on an ``align``-byte
    boundary (a view into a slightly larger byte buffer, which it keeps alive)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dt).reshape(shape)
