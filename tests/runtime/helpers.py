"""Shared by the runtime tests: comparing executor results with the reference interpreter."""

from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime.compiler import native_available

PROGRAMS = Path(__file__).parent.parent / "programs"

needs_native = pytest.mark.skipif(not native_available(),
                                  reason="kiln.codegen (llvmlite) is not available")


def assert_same(got, want, rtol=1e-5, atol=1e-6):
    """Executor values equal the interpreter's: arrays (dtype, shape, close values), tuples,
    ADT values (constructor and fields), references (their contents)."""
    stack = [(got, want, "result")]
    while stack:
        a, b, where = stack.pop()
        if isinstance(b, tuple):
            assert isinstance(a, tuple) and len(a) == len(b), where
            stack.extend((x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        elif isinstance(b, kiln.ConstructorValue):
            assert isinstance(a, kiln.ConstructorValue) and a.name == b.name, where
            stack.append((a.fields, b.fields, f"{where}.{b.name}"))
        elif isinstance(b, kiln.RefValue):
            assert isinstance(a, kiln.RefValue), where
            stack.append((a.value, b.value, f"{where}.value"))
        else:
            assert isinstance(a, np.ndarray), where
            assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, a.shape, b.dtype,
                                                               b.shape)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=where)
