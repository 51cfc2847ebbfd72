"""The adjoints written for speed in the linear and normalization rules, against
torch.autograd in float32: nn.dense's weight gradient as one product with a transposed
operand (rank-2 and rank-3 data), and the per-feature sums of bias_add's, layer_norm's and
batch_norm's gradients summed one axis at a time (grad_helpers.sum_over_rows: the shortest
axis first, a last run of rows in stages of 16); interpreted and compiled."""

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


def _sums(e) -> list[list[int]]:
    """The axes of the sums of an expression (a tree of a few calls), the outermost first."""
    out, stack = [], [e]
    while stack:
        node = stack.pop()
        if getattr(getattr(node, "op", None), "name", None) == "sum":
            out.append(list(node.attrs["axis"]))
        stack.extend(getattr(node, "args", ()))
    return out


@pytest.mark.parametrize("shape,axis,sums", [
    ((4, 64, 5), -1, [[0], [1], [0]]),        # the 4 first, then 64 rows: a stage of 16, the 4
    ((64, 4, 5), -1, [[0], [1], [1]]),        # the 4 first (axis 1), then the rows as above
    ((3, 16, 16, 2), -1, [[0], [0], [0]]),    # 3, 16, then 16 rows: no stage
    ((1024, 3), -1, [[0], [1], [1]]),         # 1024 rows: stages to 64 and 4, then their sum
    ((150, 4), -1, [[0]]),                    # 150 rows do not divide by 16: one sum
    ((8, 6, 12, 10), 1, [[1], [2], [0]]),     # NCHW: the batch (8), W (10), then H (12)
    ((2, 5), 0, [[1]]),                       # the kept axis first: one sum over the columns
])
def test_sum_over_rows_sums_as_said(shape, axis, sums) -> None:
    """The staged sum equals numpy's in float64, and sums the axes as its docstring says:
    one at a time, the shortest first; a last run of rows before a kept last axis in
    stages of 16 rows."""
    x = var("x", shape=shape, dtype="float64")
    f = kiln.infer_types(kiln.IRModule.from_expr(Function((x,), x)))["main"]
    e = grad_helpers.sum_over_rows(f.params[0], f.params[0], axis=axis)
    assert _sums(e) == sums
    mod = kiln.IRModule.from_expr(Function(f.params, e))
    data = np.random.default_rng(0).standard_normal(shape)
    got = kiln.interpret(mod, data)
    keep = axis % len(shape)
    want = data.sum(tuple(a for a in range(len(shape)) if a != keep))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _torch_batch_norm_grads(arrays: list[np.ndarray], training: bool) -> list[np.ndarray]:
    x, gamma, beta, r = (torch.tensor(a, requires_grad=True) for a in arrays[:3] + arrays[5:])
    mean, variance = torch.tensor(arrays[3]), torch.tensor(arrays[4])
    y = F.batch_norm(x, mean, variance, gamma, beta, training=training, momentum=0.1)
    (y * r).sum().backward()
    return [t.grad.numpy() for t in (x, gamma, beta)]


@pytest.mark.parametrize("shape", [(8, 6, 12, 10), (2, 5, 7, 9), (3, 4, 16, 2)])
@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_gradients_match_torch(shape, training) -> None:
    """Batch norm's per-channel sums (its gamma and beta gradients, and in training mode the
    statistics' gradients inside dx) summed axis by axis, compiled, against torch."""
    c = shape[1]
    x, r = var("x", shape=shape), var("r", shape=shape)
    params = [var(n, shape=(c,)) for n in ("gamma", "beta", "mean", "var")]
    y = nn.batch_norm(x, *params, training=training, momentum=0.1)[0]
    mod = kiln.infer_types(kiln.IRModule.from_expr(Function((x, *params, r),
                                                            call("sum", y * r))))
    rng = np.random.default_rng(sum(shape))
    arrays = [(2 * rng.standard_normal(shape) + 0.5).astype("float32"),
              rng.uniform(0.5, 1.5, c).astype("float32"),
              rng.standard_normal(c).astype("float32"),
              rng.standard_normal(c).astype("float32"),
              rng.uniform(0.5, 2.0, c).astype("float32"),
              rng.standard_normal(shape).astype("float32")]
    g = grad(mod["main"], mod=mod, mode="first_order", wrt=(0, 1, 2), keeping=())
    got = kiln.build(kiln.IRModule.from_expr(g, mod), threads=1)(*arrays)
    for name, a, want in zip(("x", "gamma", "beta"), got, _torch_batch_norm_grads(
            arrays, training)):
        np.testing.assert_allclose(np.asarray(a), want, rtol=2e-4,
                                   atol=2e-4 * np.abs(want).max(), err_msg=name)


def test_relu_gradient_reads_its_result_so_relu_fuses_with_its_producer() -> None:
    """relu's adjoint masks by its result (positive exactly where its input is), so the
    input keeps relu as its only consumer: in a compiled gradient the batch norm's scale and
    shift and the relu are one kernel, not two with the normalized values stored between;
    the gradients still equal torch's."""
    shape = (4, 6, 5, 5)
    x, r = var("x", shape=shape), var("r", shape=shape)
    params = [var(n, shape=(6,)) for n in ("gamma", "beta", "mean", "var")]
    y = nn.relu(nn.batch_norm(x, *params)[0])
    mod = kiln.infer_types(kiln.IRModule.from_expr(Function((x, *params, r),
                                                            call("sum", y * r))))
    g = grad(mod["main"], mod=mod, mode="first_order", wrt=(0, 1, 2), keeping=())
    exe = kiln.build(kiln.IRModule.from_expr(g, mod), threads=1)
    kernels = [k.ops for k in exe.program.kernels.values()]
    # the shift (add) and the relu in one kernel
    assert any(ops[-2:] == ("add", "nn.relu") for ops in kernels), kernels
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(shape).astype("float32"),
              rng.uniform(0.5, 1.5, 6).astype("float32"),
              rng.standard_normal(6).astype("float32"),
              rng.standard_normal(6).astype("float32"),
              rng.uniform(0.5, 2.0, 6).astype("float32"),
              rng.standard_normal(shape).astype("float32")]
    tx, tg, tb, tr = (torch.tensor(a, requires_grad=True) for a in
                      (arrays[0], arrays[1], arrays[2], arrays[5]))
    out = F.relu(F.batch_norm(tx, torch.tensor(arrays[3]), torch.tensor(arrays[4]), tg, tb))
    (out * tr).sum().backward()
    for a, want in zip(exe(*arrays), (tx.grad, tg.grad, tb.grad)):
        np.testing.assert_allclose(np.asarray(a), want.numpy(), rtol=2e-4, atol=2e-5)
