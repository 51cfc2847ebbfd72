"""The one way executors call a kernel, whoever made it.

A `KernelFunction` runs one loop-IR `Kernel`: ``f(*arrays)`` takes the input arrays and then
the output arrays (allocated by the caller, C-contiguous, exactly the kernel's shapes and
dtypes) and fills the outputs; a failed `Check` in the kernel raises `kiln.EvalError`. The
code generator (kiln/codegen) makes them from machine code; `EvaluatedKernel` runs the loop IR
directly, element by element — the oracle in tests, far too slow for anything else.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import numpy as np

from kiln.errors import InternalError
from kiln.loops.evaluate import evaluate
from kiln.loops.ir import Kernel


class KernelFunction(Protocol):
    kernel: Kernel

    def __call__(self, *arrays: np.ndarray) -> None: ...


_SIGNATURES: weakref.WeakKeyDictionary[Kernel, tuple[tuple[tuple[int, ...], np.dtype], ...]] = (
    weakref.WeakKeyDictionary())


def _signature(kernel: Kernel) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
    sig = _SIGNATURES.get(kernel)
    if sig is None:
        sig = tuple((b.shape, np.dtype(b.dtype)) for b in kernel.params)
        _SIGNATURES[kernel] = sig
    return sig


def check_arrays(kernel: Kernel, arrays: tuple[np.ndarray, ...]) -> None:
    """Every argument is exactly what the kernel expects (native code trusts this)."""
    # The common case, fast: the VM calls kernels tens of thousands of times a second.
    sig = _signature(kernel)
    n_in = len(kernel.inputs)
    if len(arrays) == len(sig):
        for k, ((shape, dtype), a) in enumerate(zip(sig, arrays)):
            if (type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype
                    or not a.flags.c_contiguous or not a.flags.aligned
                    or (k >= n_in and not a.flags.writeable)):
                break
        else:
            return
    params = kernel.params
    if len(arrays) != len(params):
        raise InternalError(f"kernel {kernel.name} takes {len(params)} arrays, got {len(arrays)}")
    for b, a in zip(params, arrays):
        if not isinstance(a, np.ndarray) or a.shape != b.shape or a.dtype.name != b.dtype:
            raise InternalError(
                f"kernel {kernel.name}: {b.name} must be a {b.dtype}{list(b.shape)} array, got "
                f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}")
        if not a.flags.c_contiguous or not a.flags.aligned:
            raise InternalError(f"kernel {kernel.name}: {b.name} is not C-contiguous and aligned")
        if a.dtype != np.dtype(b.dtype):
            raise InternalError(f"kernel {kernel.name}: {b.name} is not in native byte order")
    for a in arrays[len(kernel.inputs):]:
        if not a.flags.writeable:
            raise InternalError(f"kernel {kernel.name}: an output array is read-only")


class EvaluatedKernel:
    """A kernel run by the loop-IR evaluator (for tests: exact, slow)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def __call__(self, *arrays: np.ndarray) -> None:
        check_arrays(self.kernel, arrays)
        n = len(self.kernel.inputs)
        outs = evaluate(self.kernel, *arrays[:n])
        for dst, src in zip(arrays[n:], outs):
            dst[...] = src
