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


@pytest.mark.parametrize("n", [7, 64, 250, 1030])
def test_layer_norm_rows_folded_in_vectors(n: int) -> None:
    # layer norm's mean and variance along memory as vector folds (kiln/op/nn/norm.py):
    # rows of no whole vector, whole chunks, a vector and a scalar tail, a long row
    rows = 9
    x = kiln.var("x", shape=(rows, n), dtype="float32")
    g = kiln.var("g", shape=(n,), dtype="float32")
    b = kiln.var("b", shape=(n,), dtype="float32")
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function(
        [x, g, b], kiln.op.nn.layer_norm(x, g, b, epsilon=1e-5))))
    a = (RNG.standard_normal((rows, n)) * 3 + 1).astype(np.float32)
    gv, bv = (RNG.standard_normal(n).astype(np.float32) for _ in range(2))
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(a, gv, bv))
    np.testing.assert_array_equal(results[0], results[1])
    a64 = a.astype(np.float64)
    mu = a64.mean(1, keepdims=True)
    want = (a64 - mu) / np.sqrt(((a64 - mu) ** 2).mean(1, keepdims=True) + 1e-5) * gv + bv
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [20, 128, 1000, 1009])
def test_softmax_rows_sum_as_a_fold(n: int) -> None:
    # softmax's denominator folded over the kept exponentials (kiln/op/nn/activation.py);
    # past KEPT_EXPS (1008) the row's sum stays LLVM's
    x = kiln.var("x", shape=(6, n), dtype="float32")
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], kiln.op.nn.softmax(x))))
    a = (RNG.standard_normal((6, n)) * 4).astype(np.float32)
    a64 = a.astype(np.float64)
    e = np.exp(a64 - a64.max(1, keepdims=True))
    np.testing.assert_allclose(exe(a), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_fold_with_a_scalar_operand() -> None:
    # a read of a 0-d tensor (no index) beside the row's: still folded
    x = kiln.var("x", shape=(5, 300), dtype="float32")
    s = kiln.var("s", shape=(), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, s], kiln.op.sum(
        kiln.op.multiply(x, s), axis=[1])))
    a, v = RNG.standard_normal((5, 300)).astype(np.float32), np.float32(1.5)
    np.testing.assert_allclose(kiln.build(mod)(a, np.array(v)),
                               (a.astype(np.float64) * 1.5).sum(1), rtol=1e-5, atol=1e-5)
