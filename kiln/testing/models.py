"""Models written with kiln's builder, with random weights: for benchmarks and tests.

Each function returns ``(mod, params)``: ``@main`` takes the input first and the weights as
the remaining parameters, and ``params`` maps each weight's name to a random array (seeded).
``kiln.optimize(mod, params=params)`` binds the weights as constants.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.ir.expr import Expr, Function, Var, const, var
from kiln.ir.module import IRModule
from kiln.op import add, multiply, nn, reshape, transpose
from kiln.op import erf as _erf


class _Weights:
    """Collects the weight parameters of a model as it is built."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vars: list[Var] = []
        self.values: dict[str, np.ndarray] = {}

    def __call__(self, name: str, shape: tuple[int, ...], kind: str = "normal") -> Var:
        if kind == "normal":  # He initialization for the fan-in of a weight
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            value = self.rng.standard_normal(shape) * math.sqrt(2.0 / max(fan_in, 1))
        elif kind == "ones":
            value = 1.0 + 0.1 * self.rng.standard_normal(shape)
        elif kind == "positive":
            value = 0.5 + self.rng.random(shape)
        else:
            value = 0.1 * self.rng.standard_normal(shape)
        v = var(name, shape=shape)
        self.vars.append(v)
        self.values[name] = value.astype("float32")
        return v

    def module(self, inputs: list[Var], body: Expr) -> tuple[IRModule, dict[str, np.ndarray]]:
        return IRModule.from_expr(Function([*inputs, *self.vars], body)), self.values


def mlp(batch: int = 1, sizes: tuple[int, ...] = (784, 512, 512, 10), seed: int = 0):
    """A multilayer perceptron: dense → bias_add → relu per hidden layer, softmax at the end."""
    w = _Weights(seed)
    x = var("data", shape=(batch, sizes[0]))
    h: Expr = x
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        h = nn.bias_add(nn.dense(h, w(f"fc{i}_weight", (n_out, n_in))),
                        w(f"fc{i}_bias", (n_out,), "small"), axis=-1)
        if i < len(sizes) - 2:
            h = nn.relu(h)
    return w.module([x], nn.softmax(h))


def _conv_bn(w: _Weights, x: Expr, name: str, c_in: int, c_out: int, k: int, stride: int,
             relu: bool = True) -> Expr:
    y = nn.conv2d(x, w(f"{name}_weight", (c_out, c_in, k, k)), strides=(stride, stride),
                  padding=(k // 2, k // 2), channels=c_out, kernel_size=(k, k))
    bn = nn.batch_norm(y, w(f"{name}_bn_gamma", (c_out,), "ones"),
                       w(f"{name}_bn_beta", (c_out,), "small"),
                       w(f"{name}_bn_mean", (c_out,), "small"),
                       w(f"{name}_bn_var", (c_out,), "positive"))
    out = bn[0]
    return nn.relu(out) if relu else out


def resnet18(batch: int = 1, image: int = 224, classes: int = 1000, seed: int = 0):
    """ResNet-18 (He et al.) in NCHW: 4 stages of 2 basic blocks, batch norm after each conv."""
    w = _Weights(seed)
    x = var("data", shape=(batch, 3, image, image))
    h = _conv_bn(w, x, "conv1", 3, 64, 7, 2)
    h = nn.max_pool2d(h, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}_{block}"
            y = _conv_bn(w, h, f"{name}_conv1", c_in, c_out, 3, stride)
            y = _conv_bn(w, y, f"{name}_conv2", c_out, c_out, 3, 1, relu=False)
            shortcut = h
            if stride != 1 or c_in != c_out:
                shortcut = _conv_bn(w, h, f"{name}_down", c_in, c_out, 1, stride, relu=False)
            h = nn.relu(add(y, shortcut))
            c_in = c_out
    h = nn.batch_flatten(nn.global_avg_pool2d(h))
    h = nn.bias_add(nn.dense(h, w("fc_weight", (classes, 512))), w("fc_bias", (classes,), "small"),
                    axis=-1)
    return w.module([x], nn.softmax(h))


def _gelu(x: Expr) -> Expr:
    return multiply(multiply(x, const(0.5)), add(const(1.0), _erf(multiply(x, const(2 ** -0.5)))))


def bert_encoder(batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
                 layers: int = 12, ffn: int = 3072, seed: int = 0):
    """A BERT-base-sized transformer encoder (post-layer-norm), input (batch, seq, hidden)."""
    w = _Weights(seed)
    x = var("data", shape=(batch, seq, hidden))
    d = hidden // heads
    h: Expr = reshape(x, newshape=(batch * seq, hidden))

    def dense(t: Expr, name: str, n_in: int, n_out: int) -> Expr:
        return nn.bias_add(nn.dense(t, w(f"{name}_weight", (n_out, n_in))),
                           w(f"{name}_bias", (n_out,), "small"), axis=-1)

    def heads_first(t: Expr) -> Expr:  # (b*s, hidden) -> (b*heads, s, d)
        t = reshape(t, newshape=(batch, seq, heads, d))
        return reshape(transpose(t, axes=(0, 2, 1, 3)), newshape=(batch * heads, seq, d))

    for i in range(layers):
        p = f"layer{i}"
        q = heads_first(dense(h, f"{p}_query", hidden, hidden))
        k = heads_first(dense(h, f"{p}_key", hidden, hidden))
        v = heads_first(dense(h, f"{p}_value", hidden, hidden))
        scores = multiply(nn.batch_matmul(q, k), const(1.0 / math.sqrt(d)))
        probs = nn.softmax(scores, axis=-1)
        ctx = nn.batch_matmul(probs, transpose(v, axes=(0, 2, 1)))
        ctx = reshape(transpose(reshape(ctx, newshape=(batch, heads, seq, d)), axes=(0, 2, 1, 3)),
                      newshape=(batch * seq, hidden))
        attn = dense(ctx, f"{p}_attn_out", hidden, hidden)
        h = nn.layer_norm(add(attn, h), w(f"{p}_ln1_gamma", (hidden,), "ones"),
                          w(f"{p}_ln1_beta", (hidden,), "small"))
        up = _gelu(dense(h, f"{p}_ffn_in", hidden, ffn))
        down = dense(up, f"{p}_ffn_out", ffn, hidden)
        h = nn.layer_norm(add(down, h), w(f"{p}_ln2_gamma", (hidden,), "ones"),
                          w(f"{p}_ln2_beta", (hidden,), "small"))
    return w.module([x], reshape(h, newshape=(batch, seq, hidden)))
