"""Models written with kiln's builder, with random weights: for benchmarks and tests.

Each function returns ``(mod, params)``: ``@main`` takes the input first and the weights as
the remaining parameters, and ``params`` maps each weight's name to a random array (seeded).
``kiln.optimize(mod, params=params)`` binds the weights as constants.

Weight names are flat and follow the layer they belong to (``conv1_weight``, ``conv1_bn_gamma``,
``layer0_in_proj_weight``, ...), with PyTorch's layouts (dense weights are (out, in), convolution
weights OIHW), so that kiln/testing/torch_models.py can load the same arrays into an equivalent
``torch.nn.Module``. Each builder's docstring lists its names.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.ir.expr import Call, Expr, Function, GlobalVar, Var, const, if_, tuple_, var
from kiln.ir.module import IRModule
from kiln.ir.ty import TupleType, tensor_type
from kiln.op import (
    add,
    broadcast_to,
    clip,
    concatenate,
    less,
    multiply,
    nn,
    reshape,
    sigmoid,
    split,
    take,
    tanh,
    transpose,
)
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
        return IRModule.from_expr(Function((*inputs, *self.vars), body)), self.values


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
    h: Expr = _conv_bn(w, x, "conv1", 3, 64, 7, 2)
    h = nn.max_pool2d(h, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}_{block}"
            y = _conv_bn(w, h, f"{name}_conv1", c_in, c_out, 3, stride)
            y = _conv_bn(w, y, f"{name}_conv2", c_out, c_out, 3, 1, relu=False)
            shortcut: Expr = h
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


def _linear(w: _Weights, t: Expr, name: str, n_in: int, n_out: int) -> Expr:
    """dense + bias_add with weights ``{name}_weight`` (n_out, n_in) and ``{name}_bias``."""
    return nn.bias_add(nn.dense(t, w(f"{name}_weight", (n_out, n_in))),
                       w(f"{name}_bias", (n_out,), "small"), axis=-1)


def _heads_first(t: Expr, batch: int, seq: int, heads: int, d: int) -> Expr:
    """(batch*seq, heads*d) -> (batch*heads, seq, d): attention heads as the batch axis."""
    t = reshape(t, newshape=(batch, seq, heads, d))
    return reshape(transpose(t, axes=(0, 2, 1, 3)), newshape=(batch * heads, seq, d))


def bert_encoder(batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
                 layers: int = 12, ffn: int = 3072, seed: int = 0):
    """A BERT-base-sized transformer encoder (post-layer-norm), input (batch, seq, hidden)."""
    w = _Weights(seed)
    x = var("data", shape=(batch, seq, hidden))
    d = hidden // heads
    h: Expr = reshape(x, newshape=(batch * seq, hidden))

    def dense(t: Expr, name: str, n_in: int, n_out: int) -> Expr:
        return _linear(w, t, name, n_in, n_out)

    def heads_first(t: Expr) -> Expr:
        return _heads_first(t, batch, seq, heads, d)

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


def _make_divisible(value: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: to a multiple of ``divisor``, never down by more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_relu6(w: _Weights, x: Expr, name: str, c_in: int, c_out: int, k: int, stride: int,
                   groups: int = 1, relu6: bool = True) -> Expr:
    y = nn.conv2d(x, w(f"{name}_weight", (c_out, c_in // groups, k, k)),
                  strides=(stride, stride), padding=(k // 2, k // 2), groups=groups,
                  channels=c_out, kernel_size=(k, k))
    out = nn.batch_norm(y, w(f"{name}_bn_gamma", (c_out,), "ones"),
                        w(f"{name}_bn_beta", (c_out,), "small"),
                        w(f"{name}_bn_mean", (c_out,), "small"),
                        w(f"{name}_bn_var", (c_out,), "positive"))[0]
    return clip(out, a_min=0.0, a_max=6.0) if relu6 else out


# (expansion t, output channels c, repeats n, first stride s), as in Sandler et al., table 2
_MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(batch: int = 1, image: int = 224, classes: int = 1000, width: float = 1.0,
                 seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """MobileNetV2 (Sandler et al.) in NCHW; returns the logits (batch, classes).

    Each convolution is followed by an inference-form ``nn.batch_norm`` and, except for the
    linear bottleneck projections, by ReLU6 written as ``clip(0, 6)``; depthwise convolutions
    are ``nn.conv2d`` with ``groups`` equal to the channels. Weights: ``stem_*`` (3×3 stride-2
    convolution), ``block{j}_expand_*`` (1×1, absent when the expansion is 1), ``block{j}_dw_*``
    (3×3 depthwise), ``block{j}_project_*`` (1×1, no ReLU6), ``head_*`` (1×1 to 1280·max(1,
    width) channels), each with ``_weight`` (OIHW) and ``_bn_gamma``, ``_bn_beta``, ``_bn_mean``,
    ``_bn_var``; then ``fc_weight`` (classes, channels) and ``fc_bias``. A block adds its input
    when its stride is 1 and its channels do not change.
    """
    w = _Weights(seed)
    x = var("data", shape=(batch, 3, image, image))
    c_in = _make_divisible(32 * width)
    h = _conv_bn_relu6(w, x, "stem", 3, c_in, 3, 2)
    j = 0
    for t, c, n, s in _MOBILENET_V2_BLOCKS:
        c_out = _make_divisible(c * width)
        for r in range(n):
            stride = s if r == 0 else 1
            hidden = c_in * t
            y = h
            if t != 1:
                y = _conv_bn_relu6(w, y, f"block{j}_expand", c_in, hidden, 1, 1)
            y = _conv_bn_relu6(w, y, f"block{j}_dw", hidden, hidden, 3, stride, groups=hidden)
            y = _conv_bn_relu6(w, y, f"block{j}_project", hidden, c_out, 1, 1, relu6=False)
            h = add(h, y) if stride == 1 and c_in == c_out else y
            c_in = c_out
            j += 1
    c_last = _make_divisible(1280 * max(1.0, width))
    h = _conv_bn_relu6(w, h, "head", c_in, c_last, 1, 1)
    h = nn.batch_flatten(nn.global_avg_pool2d(h))
    h = nn.bias_add(nn.dense(h, w("fc_weight", (classes, c_last))),
                    w("fc_bias", (classes,), "small"), axis=-1)
    return w.module([x], h)


def lstm(batch: int = 1, steps: int = 32, input: int = 256, hidden: int = 256,
         seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """A one-layer LSTM over ``steps`` steps, as a loop by tail recursion; returns ``(h, c)``.

    ``@main(data, w_ih, w_hh, b_ih, b_hh)`` takes the sequence ``data`` of shape (steps, batch,
    input) (PyTorch's ``nn.LSTM`` layout without ``batch_first``), projects every step's input
    at once (one dense of (steps·batch, input) by ``w_ih``, plus ``b_ih``: one matrix product
    instead of one matrix-vector product per step, as ONNX Runtime's LSTM does), and calls
    ``@lstm_loop(i, h, c, xw, w_hh, b_hh)``, which runs step ``i`` (gates = ``xw[i]`` + ``h``
    by ``w_hh`` + ``b_hh``) and calls itself with ``i + 1`` until ``i == steps``, then returns
    the final hidden and cell states, each (batch, hidden). The weights have ``nn.LSTM``'s
    names, shapes and gate order (input, forget, cell, output): ``w_ih`` (4·hidden, input),
    ``w_hh`` (4·hidden, hidden), ``b_ih`` and ``b_hh`` (4·hidden).
    """
    w = _Weights(seed)
    x = var("data", shape=(steps, batch, input))
    w_ih = w("w_ih", (4 * hidden, input), "small")
    w_hh = w("w_hh", (4 * hidden, hidden), "small")
    b_ih = w("b_ih", (4 * hidden,), "small")
    b_hh = w("b_hh", (4 * hidden,), "small")
    state = tensor_type((batch, hidden))
    loop = GlobalVar("lstm_loop")

    i = var("i", shape=(), dtype="int32")
    h, c = var("h", state), var("c", state)
    xw = var("xw", shape=(steps, batch, 4 * hidden))
    wh = var("w_hh", shape=(4 * hidden, hidden))
    bh = var("b_hh", shape=(4 * hidden,))
    gates = add(take(xw, i, axis=0), nn.bias_add(nn.dense(h, wh), bh, axis=-1))
    parts = split(gates, indices_or_sections=4, axis=1)
    in_gate, forget_gate = sigmoid(parts[0]), sigmoid(parts[1])
    cell_gate, out_gate = tanh(parts[2]), sigmoid(parts[3])
    c_next = add(multiply(forget_gate, c), multiply(in_gate, cell_gate))
    h_next = multiply(out_gate, tanh(c_next))
    step = Call(loop, (add(i, const(1)), h_next, c_next, xw, wh, bh))
    body = if_(less(i, const(steps)), step, tuple_(h, c))
    loop_fn = Function((i, h, c, xw, wh, bh), body, ret_type=TupleType((state, state)))

    projected = nn.bias_add(nn.dense(reshape(x, newshape=(steps * batch, input)), w_ih), b_ih,
                            axis=-1)
    projected = reshape(projected, newshape=(steps, batch, 4 * hidden))
    zeros = const(np.zeros((batch, hidden), "float32"))
    main_body = Call(loop, (const(0), zeros, zeros, projected, w_hh, b_hh))
    mod, params = w.module([x], main_body)
    return mod.with_function(loop, loop_fn), params


def transformer_encoder(batch: int = 1, seq: int = 128, d_model: int = 256, heads: int = 4,
                        ff: int = 1024, layers: int = 4, activation: str = "relu",
                        seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """A stack of post-norm encoder layers like ``nn.TransformerEncoderLayer(batch_first=True)``.

    Input and output (batch, seq, d_model). Per layer ``i``: ``x = norm1(x + attn(x))``, ``x =
    norm2(x + linear2(act(linear1(x))))`` with ``act`` relu or gelu (erf form). Weights of layer
    ``i``, as in PyTorch: ``layer{i}_in_proj_weight`` (3·d_model, d_model: query, key, value
    stacked) and ``_in_proj_bias``, ``layer{i}_out_proj_weight``/``_bias``,
    ``layer{i}_linear1_weight`` (ff, d_model)/``_bias``, ``layer{i}_linear2_weight``/``_bias``,
    ``layer{i}_norm1_weight``/``_bias`` and ``layer{i}_norm2_weight``/``_bias`` (layer norms,
    epsilon 1e-5).
    """
    if activation not in ("relu", "gelu"):
        raise Error(f"activation must be 'relu' or 'gelu', not {activation!r}")
    w = _Weights(seed)
    x = var("data", shape=(batch, seq, d_model))
    d = d_model // heads
    h: Expr = reshape(x, newshape=(batch * seq, d_model))

    def linear(t: Expr, name: str, n_in: int, n_out: int) -> Expr:
        return _linear(w, t, name, n_in, n_out)

    def heads_first(t: Expr) -> Expr:
        return _heads_first(t, batch, seq, heads, d)

    for i in range(layers):
        p = f"layer{i}"
        qkv = split(linear(h, f"{p}_in_proj", d_model, 3 * d_model), indices_or_sections=3,
                    axis=1)
        q, k, v = heads_first(qkv[0]), heads_first(qkv[1]), heads_first(qkv[2])
        scores = nn.batch_matmul(multiply(q, const(1.0 / math.sqrt(d))), k)
        probs = nn.softmax(scores, axis=-1)
        ctx = nn.batch_matmul(probs, v, transpose_b=False)
        ctx = reshape(transpose(reshape(ctx, newshape=(batch, heads, seq, d)), axes=(0, 2, 1, 3)),
                      newshape=(batch * seq, d_model))
        attn = linear(ctx, f"{p}_out_proj", d_model, d_model)
        h = nn.layer_norm(add(h, attn), w(f"{p}_norm1_weight", (d_model,), "ones"),
                          w(f"{p}_norm1_bias", (d_model,), "small"))
        up = linear(h, f"{p}_linear1", d_model, ff)
        up = nn.relu(up) if activation == "relu" else _gelu(up)
        down = linear(up, f"{p}_linear2", ff, d_model)
        h = nn.layer_norm(add(h, down), w(f"{p}_norm2_weight", (d_model,), "ones"),
                          w(f"{p}_norm2_bias", (d_model,), "small"))
    return w.module([x], reshape(h, newshape=(batch, seq, d_model)))


def _pre_norm_layer(w: _Weights, h: Expr, p: str, batch: int, seq: int, d_model: int,
                    heads: int, ff: int, mask: Expr | None) -> Expr:
    """One pre-norm encoder layer on (batch·seq, d_model), with GELU and an optional additive
    attention mask: ``h + attn(norm1(h))``, then ``h + linear2(gelu(linear1(norm2(h))))``.

    Its weights are ``{p}_*`` with ``transformer_encoder``'s names, so that the twin is an
    ``nn.TransformerEncoderLayer(norm_first=True, activation="gelu")``.
    """
    d = d_model // heads
    a = nn.layer_norm(h, w(f"{p}_norm1_weight", (d_model,), "ones"),
                      w(f"{p}_norm1_bias", (d_model,), "small"))
    qkv = split(_linear(w, a, f"{p}_in_proj", d_model, 3 * d_model), indices_or_sections=3,
                axis=1)
    q, k, v = (_heads_first(qkv[j], batch, seq, heads, d) for j in range(3))
    scores = nn.batch_matmul(multiply(q, const(1.0 / math.sqrt(d))), k)
    if mask is not None:
        scores = add(scores, mask)
    ctx = nn.batch_matmul(nn.softmax(scores, axis=-1), v, transpose_b=False)
    ctx = reshape(transpose(reshape(ctx, newshape=(batch, heads, seq, d)), axes=(0, 2, 1, 3)),
                  newshape=(batch * seq, d_model))
    h = add(h, _linear(w, ctx, f"{p}_out_proj", d_model, d_model))
    m = nn.layer_norm(h, w(f"{p}_norm2_weight", (d_model,), "ones"),
                      w(f"{p}_norm2_bias", (d_model,), "small"))
    up = _gelu(_linear(w, m, f"{p}_linear1", d_model, ff))
    return add(h, _linear(w, up, f"{p}_linear2", ff, d_model))


def vit_block(batch: int = 1, image: int = 224, patch: int = 16, d_model: int = 384,
              heads: int = 6, ff: int = 1536, layers: int = 4, classes: int = 1000,
              seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """A ViT-style classifier (Dosovitskiy et al.) on (batch, 3, image, image); returns logits.

    The image is cut into (image/patch)² patches by a stride-``patch`` convolution
    (``patch_embed_weight`` (d_model, 3, patch, patch), ``patch_embed_bias``), a learned
    ``class_token`` (1, 1, d_model) is put in front and ``pos_embed`` (1, 1 + patches, d_model)
    added; then ``layers`` pre-norm encoder layers with GELU (weights ``layer{i}_*`` named as in
    ``transformer_encoder``), a final layer norm (``norm_weight``/``norm_bias``) and a linear
    head (``head_weight`` (classes, d_model), ``head_bias``) on the class token.
    """
    w = _Weights(seed)
    x = var("data", shape=(batch, 3, image, image))
    patches = (image // patch) ** 2
    seq = patches + 1
    t = nn.conv2d(x, w("patch_embed_weight", (d_model, 3, patch, patch)),
                  strides=(patch, patch), channels=d_model, kernel_size=(patch, patch))
    t = nn.bias_add(t, w("patch_embed_bias", (d_model,), "small"), axis=1)
    t = transpose(reshape(t, newshape=(batch, d_model, patches)), axes=(0, 2, 1))
    cls = broadcast_to(w("class_token", (1, 1, d_model), "small"), shape=(batch, 1, d_model))
    h: Expr = add(concatenate(tuple_(cls, t), axis=1),
                  w("pos_embed", (1, seq, d_model), "small"))
    h = reshape(h, newshape=(batch * seq, d_model))
    for i in range(layers):
        h = _pre_norm_layer(w, h, f"layer{i}", batch, seq, d_model, heads, ff, None)
    h = nn.layer_norm(h, w("norm_weight", (d_model,), "ones"),
                      w("norm_bias", (d_model,), "small"))
    first = take(reshape(h, newshape=(batch, seq, d_model)), const(0), axis=1)
    return w.module([x], _linear(w, first, "head", d_model, classes))


def gpt_block(batch: int = 1, seq: int = 128, d_model: int = 256, heads: int = 4,
              ff: int = 1024, layers: int = 1, seed: int = 0
              ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """GPT-style decoder layers on embeddings (batch, seq, d_model), output of the same shape.

    Each layer is pre-norm with causal self-attention (a position attends to itself and the
    ones before it: the scores get a constant lower-triangular mask, -1e9 above the diagonal)
    and a GELU MLP; weights ``layer{i}_*`` named as in ``transformer_encoder``; then a final
    layer norm ``norm_weight``/``norm_bias``, as GPT-2's ``ln_f``.
    """
    w = _Weights(seed)
    x = var("data", shape=(batch, seq, d_model))
    mask = const(np.triu(np.full((seq, seq), -1e9, "float32"), k=1))
    h: Expr = reshape(x, newshape=(batch * seq, d_model))
    for i in range(layers):
        h = _pre_norm_layer(w, h, f"layer{i}", batch, seq, d_model, heads, ff, mask)
    h = nn.layer_norm(h, w("norm_weight", (d_model,), "ones"),
                      w("norm_bias", (d_model,), "small"))
    return w.module([x], reshape(h, newshape=(batch, seq, d_model)))


_TREE_LSTM = """
type Tree {{ Leaf(Tensor[(1, {e}), float32]), Node(Tree, Tree), }}

def @tree(%t: Tree, %leaf_weight: Tensor[({h3}, {e}), float32],
          %leaf_bias: Tensor[({h3}), float32], %node_weight: Tensor[({h5}, {h2}), float32],
          %node_bias: Tensor[({h5}), float32]) -> (Tensor[(1, {h}), float32],
                                                   Tensor[(1, {h}), float32]) {{
  match (%t) {{
    Leaf(%x) => {{
      let %g = split(nn.bias_add(nn.dense(%x, %leaf_weight), %leaf_bias),
                     indices_or_sections=3, axis=1);
      let %c = multiply(sigmoid(%g.0), tanh(%g.2));
      (multiply(sigmoid(%g.1), tanh(%c)), %c)
    }},
    Node(%l, %r) => {{
      let %a = @tree(%l, %leaf_weight, %leaf_bias, %node_weight, %node_bias);
      let %b = @tree(%r, %leaf_weight, %leaf_bias, %node_weight, %node_bias);
      let %hs = concatenate((%a.0, %b.0), axis=1);
      let %g = split(nn.bias_add(nn.dense(%hs, %node_weight), %node_bias),
                     indices_or_sections=5, axis=1);
      let %c = add(add(multiply(sigmoid(%g.0), tanh(%g.4)), multiply(sigmoid(%g.1), %a.1)),
                   multiply(sigmoid(%g.2), %b.1));
      (multiply(sigmoid(%g.3), tanh(%c)), %c)
    }},
  }}
}}

def @main(%t: Tree, %leaf_weight: Tensor[({h3}, {e}), float32],
          %leaf_bias: Tensor[({h3}), float32], %node_weight: Tensor[({h5}, {h2}), float32],
          %node_bias: Tensor[({h5}), float32]) -> Tensor[(1, {h}), float32] {{
  @tree(%t, %leaf_weight, %leaf_bias, %node_weight, %node_bias).0
}}
"""


def tree_lstm(embed: int = 300, hidden: int = 150, seed: int = 0
              ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """A binary TreeLSTM (Tai et al., 2015) over a tree ADT, by recursion: ``@main(t, ...)``
    returns the root's hidden state (1, hidden) for ``t`` of type ``Tree { Leaf(Tensor[(1,
    embed)]), Node(Tree, Tree) }`` (`random_tree` makes one).

    A leaf computes gates ``x·leaf_weightᵀ + leaf_bias`` = (i, o, u), ``c = σ(i)·tanh(u)``; a
    node, from its children's (h, c), gates ``[h_l, h_r]·node_weightᵀ + node_bias`` = (i,
    f_l, f_r, o, u), ``c = σ(i)·tanh(u) + σ(f_l)·c_l + σ(f_r)·c_r``; both ``h = σ(o)·tanh(c)``.
    Weights: ``leaf_weight`` (3·hidden, embed), ``leaf_bias`` (3·hidden), ``node_weight``
    (5·hidden, 2·hidden), ``node_bias`` (5·hidden).
    """
    from kiln.text.parser import parse

    text = _TREE_LSTM.format(e=embed, h=hidden, h2=2 * hidden, h3=3 * hidden, h5=5 * hidden)
    rng = np.random.default_rng(seed)

    def uniform(*shape: int) -> np.ndarray:  # PyTorch's nn.Linear initialization
        bound = 1.0 / math.sqrt(shape[-1] if len(shape) > 1 else hidden)
        return rng.uniform(-bound, bound, shape).astype("float32")

    params = {"leaf_weight": uniform(3 * hidden, embed), "leaf_bias": uniform(3 * hidden),
              "node_weight": uniform(5 * hidden, 2 * hidden), "node_bias": uniform(5 * hidden)}
    return parse(text), params


def random_tree(mod: IRModule, leaves: int, embed: int = 300, seed: int = 0) -> Any:
    """A `kiln.ConstructorValue` of ``mod``'s ``Tree`` with ``leaves`` leaves, shaped by
    random splits, each leaf a random (1, embed) embedding."""
    from kiln.eval.values import ConstructorValue

    rng = np.random.default_rng(seed)
    leaf, node = mod.get_constructor("Leaf"), mod.get_constructor("Node")
    # built bottom-up with an explicit stack: (leaves wanted, children built so far)
    done: list[Any] = []
    work: list[tuple[int, bool]] = [(leaves, False)]
    while work:
        n, expanded = work.pop()
        if n == 1:
            done.append(ConstructorValue(leaf, (
                rng.standard_normal((1, embed)).astype("float32"),)))
        elif not expanded:
            left = int(rng.integers(1, n))
            work += [(n, True), (n - left, False), (left, False)]
        else:
            right, left_tree = done.pop(), done.pop()
            done.append(ConstructorValue(node, (left_tree, right)))
    return done[0]
