"""Training-mode nn.batch_norm against torch (forward, running statistics, autograd), and
nn.dropout_train: reproducible from its key, Bernoulli(1 - rate), interpreter == compiled bit
for bit, whatever the thread count. (Finite differences: tests/ad/test_op_gradients.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ad import grad
from kiln.ir.ty import TensorType
from kiln.op import nn
from kiln.op.nn.dropout import random_bits

from .helpers import covers, infer, rand, run

T = torch.from_numpy


def _bn_module(shape: tuple[int, ...], axis: int, **attrs: object) -> kiln.IRModule:
    c = shape[axis]
    x = kiln.var("x", shape=shape)
    g, b, m, v = (kiln.var(n, shape=(c,)) for n in ("g", "b", "m", "v"))
    return kiln.IRModule.from_expr(kiln.Function(
        [x, g, b, m, v], nn.batch_norm(x, g, b, m, v, axis=axis, training=True, **attrs)))


def _bn_inputs(rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> list[np.ndarray]:
    c = shape[axis]
    return [rand(rng, shape, low=-2, high=3), rand(rng, (c,)), rand(rng, (c,)), rand(rng, (c,)),
            rand(rng, (c,), low=0.5, high=2.0)]


@covers("nn.batch_norm")
@pytest.mark.parametrize(("shape", "axis"), [((4, 3, 5, 5), 1), ((6, 4), -1), ((3, 2, 7), 2)])
@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batch_norm_training_against_torch(shape: tuple[int, ...], axis: int,
                                           momentum: float) -> None:
    rng = np.random.default_rng(len(shape) + axis)
    x, gamma, beta, mean, var = _bn_inputs(rng, shape, axis)
    running_mean, running_var = T(mean.copy()), T(var.copy())
    expected = F.batch_norm(T(x).movedim(axis, 1), running_mean, running_var, T(gamma), T(beta),
                            training=True, momentum=momentum, eps=1e-5).movedim(1, axis).numpy()
    mod = _bn_module(shape, axis, momentum=momentum)
    compiled = kiln.build(mod)(x, gamma, beta, mean, var)
    for got in (run("nn.batch_norm", x, gamma, beta, mean, var, axis=axis, training=True,
                    momentum=momentum), kiln.interpret(mod, x, gamma, beta, mean, var), compiled):
        out, new_mean, new_var = got
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new_mean, running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_var, running_var.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, False)])
def test_batch_norm_training_gradient_against_torch_autograd(center: bool, scale: bool) -> None:
    """d/d(data, gamma, beta) of a loss of all three results, as torch's autograd gives it
    (torch updates the running statistics in place, outside autograd: their part of the loss
    is added by hand, from the closed form of the update)."""
    shape, axis, momentum = (4, 3, 3, 2), 1, 0.2
    rng = np.random.default_rng(7)
    x, gamma, beta, mean, var = (a.astype(np.float64) for a in _bn_inputs(rng, shape, axis))
    w_out, w_mean, w_var = rng.standard_normal(shape), rng.standard_normal(3), \
        rng.standard_normal(3)
    xs, gs, bs = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    out = F.batch_norm(xs, torch.tensor(mean), torch.tensor(var), gs if scale else None,
                       bs if center else None, training=True, momentum=momentum)
    n = x.size // 3
    dims = (0, 2, 3)
    batch_var = xs.var(dim=dims, unbiased=True)
    new_mean = (1 - momentum) * torch.tensor(mean) + momentum * xs.mean(dim=dims)
    new_var = (1 - momentum) * torch.tensor(var) + momentum * batch_var
    loss = ((out * torch.tensor(w_out)).sum() + (new_mean * torch.tensor(w_mean)).sum()
            + (new_var * torch.tensor(w_var)).sum())
    loss.backward()
    assert n > 1

    xv = kiln.var("x", shape=shape, dtype="float64")
    g, b, m, v = (kiln.var(name, shape=(3,), dtype="float64") for name in "gbmv")
    bn = nn.batch_norm(xv, g, b, m, v, training=True, momentum=momentum, center=center,
                       scale=scale)
    fn = kiln.infer_types(kiln.Function([xv, g, b, m, v], bn))
    dfn = grad(fn, mode="first_order", wrt=(0, 1, 2, 3, 4), keeping=(), seedable=True)
    dx, dg, db, dm, dv = kiln.interpret(kiln.IRModule.from_expr(dfn), x, gamma, beta, mean, var,
                                        (w_out, w_mean, w_var))
    assert xs.grad is not None
    np.testing.assert_allclose(dx, xs.grad.numpy(), rtol=1e-9, atol=1e-10)
    if scale:
        assert gs.grad is not None
        np.testing.assert_allclose(dg, gs.grad.numpy(), rtol=1e-9, atol=1e-10)
    if center:
        assert bs.grad is not None
        np.testing.assert_allclose(db, bs.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(dm, (1 - momentum) * w_mean, rtol=1e-12)
    np.testing.assert_allclose(dv, (1 - momentum) * w_var, rtol=1e-12)


def test_batch_norm_training_relation() -> None:
    vec = TensorType((3,))
    with pytest.raises(kiln.TypeCheckError, match="more than one value per channel"):
        infer("nn.batch_norm", [TensorType((1, 3)), vec, vec, vec, vec], training=True)
    with pytest.raises(kiln.TypeCheckError, match="momentum"):
        infer("nn.batch_norm", [TensorType((2, 3)), vec, vec, vec, vec], training=True,
              momentum=1.5)
    # inference mode is unchanged: a batch of one is fine
    assert infer("nn.batch_norm", [TensorType((1, 3)), vec, vec, vec, vec]) is not None


def test_simplify_inference_leaves_training_batch_norm_alone() -> None:
    mod = _bn_module((4, 3), 1)
    out = kiln.transform.SimplifyInference()(mod)
    assert "nn.batch_norm" in kiln.astext(out)


# --- dropout -------------------------------------------------------------------------------


def _dropout_module(shape: tuple[int, ...], rate: float, stream: int = 0) -> kiln.IRModule:
    x, k = kiln.var("x", shape=shape), kiln.var("key", shape=(2,), dtype="int64")
    return kiln.IRModule.from_expr(kiln.Function(
        [x, k], nn.dropout_train(x, k, rate=rate, stream=stream)))


@covers("nn.dropout_train")
def test_dropout_train_keeps_each_element_with_probability_one_minus_rate() -> None:
    x = np.ones((64, 257), np.float32)
    for rate in (0.1, 0.5, 0.9):
        out = np.asarray(run("nn.dropout_train", x, np.array([3, 11]), rate=rate))
        kept = out != 0
        np.testing.assert_allclose(out[kept], np.float32(1 / (1 - rate)), rtol=1e-7)
        n, p = x.size, 1 - rate
        assert abs(kept.sum() - n * p) < 4 * np.sqrt(n * p * (1 - p)), rate
    # the bits themselves: each of the 32 is 1 half the time, neighbours uncorrelated
    bits = random_bits(np.array([5, 0]), (1 << 14,))
    for k in range(32):
        ones = ((bits >> k) & 1).sum()
        assert abs(ones - 8192) < 4 * 64, k
    a, b = bits[:-1] / 2**32 - 0.5, bits[1:] / 2**32 - 0.5
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05


def test_dropout_train_is_reproducible_and_keyed() -> None:
    x = rand(np.random.default_rng(0), (8, 32))
    same = [run("nn.dropout_train", x, np.array([1, 2]), rate=0.5) for _ in range(2)]
    np.testing.assert_array_equal(same[0], same[1])
    masks = [run("nn.dropout_train", x, np.array(key), rate=0.5, stream=stream) != 0
             for key, stream in [((1, 2), 0), ((1, 3), 0), ((2, 2), 0), ((1, 2), 1)]]
    # the seed, the counter and the stream each change the mask
    assert len({m.tobytes() for m in masks}) == 4


@pytest.mark.parametrize("threads", [1, 2])
def test_dropout_train_interpreter_equals_compiled_bit_for_bit(threads: int) -> None:
    shape = (4, 6, 33, 17)  # large enough to be split across threads
    mod = _dropout_module(shape, 0.3, stream=1)
    exe = kiln.build(mod, threads=threads)
    x = rand(np.random.default_rng(1), shape)
    for key in ([0, 0], [123456789, 7], [-5, 2**33 + 1]):
        k = np.array(key, np.int64)
        expected = kiln.interpret(mod, x, k)
        got = exe(x, k)
        np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))


def test_dropout_train_gradient_is_the_same_mask() -> None:
    x = kiln.var("x", shape=(5, 6), dtype="float64")
    k = kiln.var("key", shape=(2,), dtype="int64")
    fn = kiln.infer_types(kiln.Function([x, k], kiln.op.sum(nn.dropout_train(x, k, rate=0.4))))
    dfn = grad(fn, mode="first_order", wrt=(0,), keeping=())
    key = np.array([8, 1])
    ones = np.ones((5, 6))
    (dx,) = kiln.interpret(kiln.IRModule.from_expr(dfn), ones, key)
    forward = run("nn.dropout_train", ones, key, rate=0.4)
    np.testing.assert_array_equal(dx, forward)


def test_dropout_train_relation() -> None:
    x = TensorType((2, 3))
    with pytest.raises(kiln.TypeCheckError, match=r"int64 tensor of shape \(2,\)"):
        infer("nn.dropout_train", [x, TensorType((2,), "int32")])
    with pytest.raises(kiln.TypeCheckError, match=r"\[0, 1\)"):
        infer("nn.dropout_train", [x, TensorType((2,), "int64")], rate=1.0)
    assert infer("nn.dropout_train", [x, TensorType((2,), "int64")]) == x
