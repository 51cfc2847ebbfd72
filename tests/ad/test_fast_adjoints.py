"""The adjoints written for speed in the linear and layer-norm rules, against torch.autograd
in float32: nn.dense's weight gradient as one product with a transposed operand (rank-2 and
rank-3 data), and the sums over rows of bias_add's and layer_norm's parameter gradients in
stages of 16 rows (row counts that stage once, twice, end on a remainder, or do not divide);
interpreted and compiled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ad import grad
from kiln.ir.expr import Function, var
from kiln.op import grad_helpers, nn
from kiln.op.grad_helpers import call

# (leading shape of the data, features in, features out)
SHAPES = [((12,), 5, 3), ((4, 64), 24, 40), ((3, 16, 16), 8, 20), ((3, 50), 16, 9)]


def _linear_ln_loss(lead: tuple[int, ...], k: int, units: int) -> kiln.IRModule:
    """sum(r * layer_norm(bias_add(dense(x, w), b))): every parameter's gradient through the
    rules under test."""
    x = var("x", shape=(*lead, k))
    w, b = var("w", shape=(units, k)), var("b", shape=(units,))
    gamma, beta = var("gamma", shape=(units,)), var("beta", shape=(units,))
    r = var("r", shape=(*lead, units))
    y = nn.bias_add(nn.dense(x, w), b, axis=-1)
    y = nn.layer_norm(y, gamma, beta, axis=-1)
    return kiln.infer_types(kiln.IRModule.from_expr(Function(
        (x, w, b, gamma, beta, r), call("sum", y * r))))


def _torch_grads(arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, w, b, gamma, beta, r = (torch.tensor(a, requires_grad=True) for a in arrays)
    y = F.linear(x, w, b)
    y = F.layer_norm(y, (y.shape[-1],), gamma, beta, eps=1e-5)
    (y * r).sum().backward()
    return [t.grad.numpy() for t in (x, w, b, gamma, beta)]


@pytest.mark.parametrize("lead,k,units", SHAPES)
@pytest.mark.parametrize("compiled", [False, True])
def test_linear_and_layer_norm_gradients_match_torch(lead, k, units, compiled) -> None:
    mod = _linear_ln_loss(lead, k, units)
    rng = np.random.default_rng(len(lead) + k)
    arrays = [rng.standard_normal(s).astype("float32") for s in (
        (*lead, k), (units, k), (units,), (units,), (units,), (*lead, units))]
    arrays[3] += 1.0  # gamma about 1
    g = grad(mod["main"], mod=mod, mode="first_order", wrt=(0, 1, 2, 3, 4), keeping=())
    gmod = kiln.IRModule.from_expr(g, mod)
    if compiled:
        got = kiln.build(gmod, threads=1)(*arrays)
    else:
        got = kiln.interpret(gmod, *arrays)
    for name, a, want in zip(("x", "w", "b", "gamma", "beta"), got, _torch_grads(arrays)):
        a = np.asarray(a)
        assert a.shape == want.shape, name
        np.testing.assert_allclose(a, want, rtol=2e-4, atol=2e-4 * np.abs(want).max(),
                                   err_msg=name)


@pytest.mark.parametrize("shape,stages", [
    ((4, 64, 5), 1),      # 256 rows: a stage to 16, then their sum
    ((3, 16, 16, 2), 2),  # 768 rows: stages to 48 and 3, then their sum
    ((3, 50, 4), 0),      # 150 rows do not divide by 16: one sum
    ((16, 7), 0),         # 16 rows: no stage, one sum
])
def test_sum_over_rows_stages_as_said(shape, stages) -> None:
    """The staged sum equals numpy's in float64, and stages as its docstring says: a sum of
    16 rows per stage while the rows divide by 16 and exceed it, then one sum."""
    x = var("x", shape=shape, dtype="float64")
    f = kiln.infer_types(kiln.IRModule.from_expr(Function((x,), x)))["main"]
    e = grad_helpers.sum_over_rows(f.params[0], f.params[0], axis=-1)
    sums = 0
    stack = [e]
    while stack:  # count the sums of the expression (a tree of a few calls)
        node = stack.pop()
        if hasattr(node, "op") and getattr(node.op, "name", None) == "sum":
            sums += 1
        stack.extend(getattr(node, "args", ()))
    assert sums == stages + 1
    mod = kiln.IRModule.from_expr(Function(f.params, e))
    data = np.random.default_rng(0).standard_normal(shape)
    got = kiln.interpret(mod, data)
    np.testing.assert_allclose(got, data.reshape(-1, shape[-1]).sum(0), rtol=1e-12)


def test_other_axes_are_one_sum() -> None:
    """A kept axis that is not the last (a bias over NCHW channels) is Relay's sum as it was."""
    x = var("x", shape=(2, 3, 4, 4))
    f = kiln.infer_types(kiln.IRModule.from_expr(Function((x,), x)))["main"]
    e = grad_helpers.sum_over_rows(f.params[0], f.params[0], axis=1)
    assert e.op.name == "sum" and e.args[0] is f.params[0]
