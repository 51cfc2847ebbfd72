"""Shared helpers for the code generator's tests: run a kernel compiled and evaluated."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen import compile_kernels
from kiln.loops.evaluate import evaluate
from kiln.loops.ir import Kernel


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    """Every test compiles into a cache of its own session (never ~/.cache/kiln)."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def sentinel(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """What the evaluator fills outputs with before a kernel runs (shows unwritten elements)."""
    if dtype.startswith("float"):
        return np.full(shape, np.nan, dtype=dtype)
    if dtype == "bool":
        return np.ones(shape, dtype=bool)
    return np.full(shape, np.iinfo(dtype).max, dtype=dtype)


def run_compiled(kernel: Kernel, *inputs: np.ndarray, opt_level: int = 3) -> list[np.ndarray]:
    """The outputs of ``kernel`` compiled to machine code."""
    lib = compile_kernels([kernel], opt_level=opt_level)
    outs = [sentinel(b.shape, b.dtype) for b in kernel.outputs]
    lib[kernel.name](*inputs, *outs)
    return outs


def assert_same(kernel: Kernel, *inputs: np.ndarray, rtol: float = 0.0, atol: float = 0.0,
                opt_level: int = 3) -> list[np.ndarray]:
    """Compiled and evaluated outputs agree: bit for bit, or within the tolerances."""
    got = run_compiled(kernel, *inputs, opt_level=opt_level)
    want = evaluate(kernel, *inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if rtol == 0.0 and atol == 0.0:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    return got
