"""split-to-slices: a split whose fields feed only fusible operators becomes slices that
fuse-ops folds into its consumers; any other split is left alone. Results are checked
against the reference interpreter on the unoptimized program."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.expr import Call, Op
from kiln.ir.traverse import post_order
from kiln.op import nn, sigmoid, split, tanh
from kiln.transform import SplitToSlices

RNG = np.random.default_rng(3)


def _ops(mod: kiln.IRModule) -> list[str]:
    return [n.op.name for n in post_order(mod["main"])
            if isinstance(n, Call) and isinstance(n.op, Op)]


def _run_pass(mod: kiln.IRModule) -> kiln.IRModule:
    return SplitToSlices()(kiln.infer_types(mod))


def test_fields_feeding_elementwise_ops_become_slices() -> None:
    x = kiln.var("x", shape=(2, 12))
    parts = split(x, indices_or_sections=3, axis=1)
    body = kiln.op.multiply(sigmoid(kiln.TupleGetItem(parts, 0)),
                            tanh(kiln.TupleGetItem(parts, 2)))
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    out = _run_pass(mod)
    assert "split" not in _ops(out) and _ops(out).count("strided_slice") == 2
    a = RNG.standard_normal((2, 12)).astype(np.float32)
    np.testing.assert_allclose(kiln.interpret(out, a), kiln.interpret(mod, a), rtol=1e-6)
    exe = kiln.build(mod)  # and the split's kernel is gone: one kernel for the whole body
    assert exe.stats().kernels == 1
    np.testing.assert_allclose(exe(a), kiln.interpret(mod, a), rtol=1e-5, atol=1e-6)


def test_uneven_sections_by_indices_on_another_axis() -> None:
    x = kiln.var("x", shape=(7, 3))
    parts = split(x, indices_or_sections=(2, 5), axis=0)
    body = kiln.op.add(kiln.op.exp(kiln.TupleGetItem(parts, 1)),
                       kiln.op.negative(kiln.TupleGetItem(parts, 1)))
    tail = kiln.op.abs(kiln.TupleGetItem(parts, 2))
    mod = kiln.IRModule.from_expr(kiln.Function([x], kiln.Tuple([body, tail])))
    out = _run_pass(mod)
    assert "split" not in _ops(out)
    a = RNG.standard_normal((7, 3)).astype(np.float32)
    for got, want in zip(kiln.interpret(out, a), kiln.interpret(mod, a)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("case", ["dense", "result", "unknown"])
def test_other_splits_are_left_alone(case: str) -> None:
    if case == "unknown":  # a symbolic dimension along the axis
        x = kiln.var("x", shape=(2, kiln.ir.ty.SymDim("n")))
    else:
        x = kiln.var("x", shape=(2, 8))
    parts = split(x, indices_or_sections=2, axis=1)
    first = kiln.TupleGetItem(parts, 0)
    if case == "dense":  # a field reaches a dense: the split kernel stays
        w = kiln.var("w", shape=(3, 4))
        body = kiln.op.add(nn.dense(first, w), kiln.op.sum(kiln.TupleGetItem(parts, 1)))
        params = [x, w]
    elif case == "result":  # a field is the function's result itself
        body, params = first, [x]
    else:
        body, params = sigmoid(first), [x]
    mod = kiln.infer_types(kiln.IRModule.from_expr(kiln.Function(params, body)))
    assert _ops(_run_pass(mod)) == _ops(mod)
