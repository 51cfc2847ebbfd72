"""Reductions folded in vectors (kiln/loops/reduce_emit.py), compiled, against numpy in float64.

Rows of every remainder (whole vectors, a vector tail, a scalar tail), several reduced axes
(the fold runs across the outer ones), reductions over outer axes (columns, in blocks of
the output's last axis, the last one narrower), one along neither (the scalar loop),
maximum with NaNs, and one and two threads bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.runtime.backend import lower
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(5)


def build(shape: tuple, body) -> tuple[kiln.Executable, str]:
    x = kiln.var("x", shape=shape, dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x], body(x)))
    low = lower(mod, "llvm", 3, upto="lower-kernels")
    text = "\n".join(str(d.kernel.body) for d in low.program.kernels.values()
                     if d.kernel is not None)
    return kiln.build(mod), text


@pytest.mark.parametrize("shape,axis,way", [
    ((64, 256), [1], "fold["),  # whole chunks of four vectors
    ((33, 250), [1], "fold["),  # a vector tail and a scalar tail
    ((7, 1000), [1], "fold["),
    ((5, 7), [1], "acc["),  # shorter than two vectors: the scalar loop
    ((3, 5, 70), [1, 2], "fold["),  # the fold runs across the outer reduced axis
    ((40, 300), [0], "cols["),  # columns: one block and a narrower one
    ((3, 7, 512), [0, 1], "cols["),  # two whole blocks
    ((6, 40, 9), [0, 2], "acc["),  # the middle axis kept: along neither
])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_folded_reductions(shape: tuple, axis: list, way: str, op: str) -> None:
    exe, text = build(shape, lambda x: getattr(kiln.op, op)(x, axis=axis))
    assert [w for w in ("fold[", "cols[", "acc[") if w in text] == [way]
    a = RNG.standard_normal(shape).astype(np.float32)
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(a))
    np.testing.assert_array_equal(results[0], results[1])
    want = getattr(np, op)(a.astype(np.float64), axis=tuple(axis))
    n = int(np.prod([shape[i] for i in axis]))
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-6 * np.sqrt(n))


def test_folded_maximum_keeps_nans_and_infinities() -> None:
    exe, text = build((4, 300), lambda x: kiln.op.max(x, axis=[1]))
    assert "fold[" in text
    a = RNG.standard_normal((4, 300)).astype(np.float32)
    a[0, 17] = np.nan  # in a whole vector
    a[1, 299] = np.nan  # in the scalar tail
    a[2, 5] = np.inf
    a[3, :] = -np.inf
    np.testing.assert_array_equal(exe(a), np.max(a, axis=1))


def test_column_sum_of_a_fused_product() -> None:
    # a bias's gradient: the sum over the batch of a product computed in the kernel
    exe, text = build((300, 70), lambda x: kiln.op.sum(kiln.op.multiply(x, x), axis=[0]))
    assert "cols[" in text
    a = RNG.standard_normal((300, 70)).astype(np.float32)
    np.testing.assert_allclose(exe(a), (a.astype(np.float64) ** 2).sum(0), rtol=1e-5)
