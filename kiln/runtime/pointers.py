"""The address of a numpy array's data, fast: what every call into machine code passes.

Here rather than beside the kernels (kiln/codegen/library.py) so that the VM uses it without
loading LLVM.
"""

from __future__ import annotations

import ctypes

import numpy as np


def _numpy_data_offset() -> int | None:
    """Where numpy keeps an array's data pointer inside the array object, if it is where
    numpy's ABI puts it (right after the object header); None to use ``a.ctypes.data``.

    Reading it directly costs a fraction of a microsecond; ``a.ctypes.data`` costs three,
    several times the cost of a small kernel. The layout is checked on live arrays first.
    """
    offset = object.__basicsize__  # the PyObject header: refcount and type
    probes = [np.zeros(3, np.float32), np.arange(10.0)[2:], np.zeros((2, 0)), np.empty(())]
    for a in probes:
        if ctypes.c_void_p.from_address(id(a) + offset).value != a.ctypes.data:
            return None
    return offset


DATA_OFFSET = _numpy_data_offset()  # for callers that inline data_pointer (the VM)


def data_pointer(a: np.ndarray) -> int:
    """The address of an array's first element."""
    if DATA_OFFSET is None:
        return a.ctypes.data
    return ctypes.c_void_p.from_address(id(a) + DATA_OFFSET).value or 0
