"""Gradients of whole models against torch.autograd, in float32, to 1e-4 relative.

Each model is written once in Relay text and once with torch.nn.functional. Batch norm in
training form is composed in the program: the batch statistics (mean and biased variance over
N, H, W, as torch computes them in training) are passed to nn.batch_norm as its moving
statistics, so the gradient flows through them too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ad import grad

MODES = ["higher_order", "first_order"]

MLP = """
#[version = "0.0.5"]
def @main(%x: Tensor[(8, 10), float32], %label: Tensor[(8, 4), float32],
          %w1: Tensor[(16, 10), float32], %b1: Tensor[(16), float32],
          %w2: Tensor[(16, 16), float32], %b2: Tensor[(16), float32],
          %w3: Tensor[(4, 16), float32], %b3: Tensor[(4), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w1), %b1, axis=-1));
  %1 = nn.relu(nn.bias_add(nn.dense(%0, %w2), %b2, axis=-1));
  %2 = nn.bias_add(nn.dense(%1, %w3), %b3, axis=-1);
  negative(mean(sum(nn.log_softmax(%2) * %label, axis=[1])))
}
"""


def mlp_torch(x, label, w1, b1, w2, b2, w3, b3):
    h = F.relu(F.linear(x, w1, b1))
    h = F.relu(F.linear(h, w2, b2))
    return -(F.log_softmax(F.linear(h, w3, b3), dim=1) * label).sum(1).mean()


CNN = """
#[version = "0.0.5"]
def @main(%data: Tensor[(2, 3, 10, 10), float32], %label: Tensor[(2, 5), float32],
          %w1: Tensor[(6, 3, 3, 3), float32],
          %gamma: Tensor[(6), float32], %beta: Tensor[(6), float32],
          %w2: Tensor[(8, 3, 3, 3), float32],
          %wfc: Tensor[(5, 72), float32], %bfc: Tensor[(5), float32]) {
  /* no bias before batch norm, which would cancel it (its gradient is 0) */
  %1 = nn.conv2d(%data, %w1, padding=[1, 1, 1, 1]);
  /* batch norm in training form: statistics of this batch */
  let %mean = mean(%1, axis=[0, 2, 3]);
  let %centred = %1 - reshape(%mean, newshape=[1, 6, 1, 1]);
  let %var = mean(%centred * %centred, axis=[0, 2, 3]);
  %2 = nn.batch_norm(%1, %gamma, %beta, %mean, %var);
  %3 = nn.relu(%2.0);
  %4 = nn.max_pool2d(%3, pool_size=[2, 2], strides=[2, 2]);
  %5 = nn.conv2d(%4, %w2, padding=[1, 1, 1, 1], groups=2);
  %6 = nn.avg_pool2d(%5, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
                     count_include_pad=True);
  %7 = nn.bias_add(nn.dense(nn.batch_flatten(%6), %wfc), %bfc, axis=-1);
  negative(mean(sum(nn.log_softmax(%7) * %label, axis=[1])))
}
"""


def cnn_torch(data, label, w1, gamma, beta, w2, wfc, bfc):
    h = F.conv2d(data, w1, padding=1)
    h = F.batch_norm(h, None, None, gamma, beta, training=True, eps=1e-5)
    h = F.max_pool2d(F.relu(h), 2, 2)
    h = F.conv2d(h, w2, padding=1, groups=2)
    h = F.avg_pool2d(h, 3, 2, 1, count_include_pad=True)
    out = F.linear(h.flatten(1), wfc, bfc)
    return -(F.log_softmax(out, dim=1) * label).sum(1).mean()


LSTM = """
#[version = "0.0.5"]
def @main(%x: Tensor[(4, 6), float32], %h: Tensor[(4, 5), float32], %c: Tensor[(4, 5), float32],
          %w_ih: Tensor[(20, 6), float32], %w_hh: Tensor[(20, 5), float32],
          %b_ih: Tensor[(20), float32], %b_hh: Tensor[(20), float32],
          %target: Tensor[(4, 5), float32]) {
  let %gates = nn.bias_add(nn.dense(%x, %w_ih), %b_ih, axis=-1)
           + nn.bias_add(nn.dense(%h, %w_hh), %b_hh, axis=-1);
  let %g = split(%gates, indices_or_sections=4, axis=1);
  let %c2 = sigmoid(%g.1) * %c + sigmoid(%g.0) * tanh(%g.2);
  let %h2 = sigmoid(%g.3) * tanh(%c2);
  let %d = %h2 - %target;
  sum(%d * %d) + mean(%c2 * %c2)
}
"""


def lstm_torch(x, h, c, w_ih, w_hh, b_ih, b_hh, target):
    cell = torch.nn.LSTMCell(6, 5).double() if x.dtype == torch.float64 else torch.nn.LSTMCell(6, 5)
    cell.weight_ih, cell.weight_hh = torch.nn.Parameter(w_ih), torch.nn.Parameter(w_hh)
    cell.bias_ih, cell.bias_hh = torch.nn.Parameter(b_ih), torch.nn.Parameter(b_hh)
    h2, c2 = cell(x, (h, c))
    return ((h2 - target) ** 2).sum() + (c2 * c2).mean(), cell


ATTENTION = """
#[version = "0.0.5"]
def @main(%x: Tensor[(2, 5, 8), float32], %gamma: Tensor[(8), float32],
          %beta: Tensor[(8), float32], %wq: Tensor[(8, 8), float32],
          %wk: Tensor[(8, 8), float32], %wv: Tensor[(8, 8), float32],
          %wo: Tensor[(8, 8), float32], %bo: Tensor[(8), float32]) {
  let %n = nn.layer_norm(%x, %gamma, %beta);
  let %q = nn.dense(%n, %wq);
  let %k = nn.dense(%n, %wk);
  let %v = nn.dense(%n, %wv);
  let %scores = nn.batch_matmul(%q, %k) * 0.35355339f;
  let %att = nn.softmax(%scores, axis=-1);
  let %o = nn.batch_matmul(%att, %v, transpose_b=False);
  let %y = %x + nn.bias_add(nn.dense(%o, %wo), %bo, axis=-1);
  mean(%y * %y)
}
"""


def attention_torch(x, gamma, beta, wq, wk, wv, wo, bo):
    n = F.layer_norm(x, (8,), gamma, beta, eps=1e-5)
    q, k, v = n @ wq.T, n @ wk.T, n @ wv.T
    att = torch.softmax(q @ k.transpose(1, 2) * 0.35355339, dim=-1)
    y = x + F.linear(att @ v, wo, bo)
    return (y * y).mean()


def _inputs(mod: kiln.IRModule, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for p in mod["main"].params:
        shape = [int(d) for d in p.checked_type.shape]
        if p.name_hint == "label":
            labels = rng.integers(0, shape[1], shape[0])
            out.append(np.eye(shape[1], dtype="float32")[labels])
        elif p.name_hint == "gamma":
            out.append(rng.uniform(0.5, 1.5, shape).astype("float32"))
        else:
            scale = 1.0 if len(shape) != 2 or p.name_hint in ("x", "h", "c", "target") else 0.4
            out.append((rng.standard_normal(shape) * scale).astype("float32"))
    return out


def _torch_grads(fn: Callable, args: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    loss = fn(*ts)
    if isinstance(loss, tuple):  # LSTM: the cell holds the weights as parameters
        loss, cell = loss
        loss.backward()
        grads = [t.grad for t in ts]
        names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
        for i, name in enumerate(names, start=3):
            grads[i] = getattr(cell, name).grad
    else:
        loss.backward()
        grads = [t.grad for t in ts]
    return float(loss.detach()), [g.numpy() if g is not None else np.zeros_like(a)
                         for g, a in zip(grads, args, strict=True)]


MODELS = {"mlp": (MLP, mlp_torch), "cnn": (CNN, cnn_torch), "lstm": (LSTM, lstm_torch),
          "attention": (ATTENTION, attention_torch)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_model_gradients_agree_with_torch(model: str, mode: str) -> None:
    text, reference = MODELS[model]
    mod = kiln.infer_types(kiln.parse(text))
    args = _inputs(mod, np.random.default_rng(7))
    g = grad(mod["main"], mod=mod, mode=mode)
    loss, grads = kiln.interpret(kiln.IRModule.from_expr(g, mod), *args)
    expected_loss, expected = _torch_grads(reference, args)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    names = [p.name_hint for p in mod["main"].params]
    assert len(grads) == len(expected)
    for name, actual, want in zip(names, grads, expected, strict=True):
        assert actual.dtype == np.float32 and actual.shape == want.shape, name
        scale = float(np.max(np.abs(want))) or 1.0
        error = float(np.max(np.abs(actual - want)))
        assert error <= 1e-4 * scale, f"d/d%{name}: error {error:.3g} against scale {scale:.3g}"
