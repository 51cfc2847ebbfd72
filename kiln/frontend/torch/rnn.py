"""Recurrent layers: ``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh``/``rnn_relu`` (what
``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` export to) and their single-step cells, unrolled over
the sequence, which torch.export has fixed.

Each layer projects the whole input sequence at once (one ``nn.dense`` of shape (T, B, G·H)),
then steps through time with the recurrent product, the gates cut apart with ``split``:

    LSTM  i, f, g, o = split(x·Wihᵀ + bih + h·Whhᵀ + bhh)      gates in torch's order
          c' = σ(f)·c + σ(i)·tanh(g);  h' = σ(o)·tanh(c')       (h' = h'·Whrᵀ with proj_size)
    GRU   r, z, n: r = σ(xr + hr), z = σ(xz + hz), n = tanh(xn + r·hn);  h' = (1 − z)·n + z·h
    RNN   h' = tanh(x·Wihᵀ + bih + h·Whhᵀ + bhh)   (or relu)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kiln.frontend.torch.registry import AtenCall, converter
from kiln.ir import Expr, const
from kiln.op import (
    add,
    concatenate,
    expand_dims,
    multiply,
    nn,
    sigmoid,
    split,
    squeeze,
    stack,
    subtract,
    tanh,
    transpose,
)

State = tuple[Expr, ...]


class Weights(NamedTuple):
    """One layer's and direction's parameters, in torch's order (biases and w_hr optional)."""

    w_ih: Expr
    w_hh: Expr
    b_ih: Expr | None
    b_hh: Expr | None
    w_hr: Expr | None = None  # proj_size's projection of the hidden state (LSTM only)


# (input projection at one step, state, the direction's weights) -> (output, new state)
Step = Callable[[Expr, State, Weights], tuple[Expr, State]]


def _chunks(x: Expr, count: int) -> list[Expr]:
    parts = split(x, indices_or_sections=count, axis=-1)
    return [parts[i] for i in range(count)]


def _dense(x: Expr, w: Expr, b: Expr | None) -> Expr:
    y = nn.dense(x, w)
    return y if b is None else nn.bias_add(y, b, axis=-1)


def _lstm_step(xw: Expr, state: State, w: Weights) -> tuple[Expr, State]:
    h, c = state
    i, f, g, o = _chunks(add(xw, nn.dense(h, w.w_hh)), 4)
    c = add(multiply(sigmoid(f), c), multiply(sigmoid(i), tanh(g)))
    h = multiply(sigmoid(o), tanh(c))
    if w.w_hr is not None:  # proj_size: the hidden state is projected
        h = nn.dense(h, w.w_hr)
    return h, (h, c)


def _gru_step(xw: Expr, state: State, w: Weights) -> tuple[Expr, State]:
    (h,) = state
    xr, xz, xn = _chunks(xw, 3)
    hr, hz, hn = _chunks(_dense(h, w.w_hh, w.b_hh), 3)
    r, z = sigmoid(add(xr, hr)), sigmoid(add(xz, hz))
    cand = tanh(add(xn, multiply(r, hn)))
    h = add(multiply(subtract(const(1.0, "float32"), z), cand), multiply(z, h))
    return h, (h,)


def _rnn_step(activation: Callable[[Expr], Expr]) -> Step:
    def step(xw: Expr, state: State, w: Weights) -> tuple[Expr, State]:
        h = activation(add(xw, nn.dense(state[0], w.w_hh)))
        return h, (h,)

    return step


def _projection(kind: str, x: Expr, w: Weights) -> Expr:
    """The input's share of every gate, for the whole sequence at once."""
    w_ih, b_ih, b_hh = w.w_ih, w.b_ih, w.b_hh
    if kind == "gru" or b_ih is None:  # GRU adds b_hh inside its reset gate
        return _dense(x, w_ih, b_ih)
    # torch gives both biases or neither, so b_hh is here when b_ih is
    assert b_hh is not None
    return nn.bias_add(nn.dense(x, w_ih), add(b_ih, b_hh), axis=-1)


def _run(n: AtenCall, kind: str, x: Expr, states: list[Expr], params: Sequence[Expr],
         has_biases: bool, layers: int, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[Expr, list[Expr]]:
    """The stacked, possibly bidirectional recurrence; the output sequence and final states."""
    if train and layers > 1:
        raise n.error("dropout between layers in training mode is random; call model.eval()")
    if n.dtype(x) != "float32":
        raise n.error("recurrent layers are imported for float32 only")
    step: Step = {"lstm": _lstm_step, "gru": _gru_step, "rnn_tanh": _rnn_step(tanh),
                  "rnn_relu": _rnn_step(nn.relu)}[kind]
    dirs = 2 if bidirectional else 1
    per = len(params) // (layers * dirs)
    shape = n.static_shape(x, kind)
    unbatched = len(shape) == 2
    steps = shape[1] if batch_first and not unbatched else shape[0]
    if batch_first and not unbatched:
        x = transpose(x, axes=[1, 0, 2])
    if unbatched:
        x = expand_dims(x, axis=1)
    init = [_per_layer(s, layers * dirs, unbatched) for s in states]
    final: list[list[Expr]] = [[] for _ in states]
    for layer in range(layers):
        outputs = []
        for d in range(dirs):
            k = layer * dirs + d
            p = params[k * per:(k + 1) * per]
            w = Weights(*p) if has_biases else Weights(p[0], p[1], None, None, *p[2:])
            xw = _projection(kind, x, w)
            at = split(xw, indices_or_sections=steps, axis=0)
            state: State = tuple(s[k] for s in init)
            hs: list[Any] = [None] * steps
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                hs[t], state = step(squeeze(at[t], axis=[0]), state, w)
            outputs.append(stack(hs, axis=0))
            for i, s in enumerate(state):
                final[i].append(s)
        x = outputs[0] if dirs == 1 else concatenate(outputs, axis=-1)
    if unbatched:
        x = squeeze(x, axis=[1])
    elif batch_first:
        x = transpose(x, axes=[1, 0, 2])
    ends: list[Expr] = [stack(f, axis=0) for f in final]
    if unbatched:
        ends = [squeeze(e, axis=[1]) for e in ends]
    return x, ends


def _per_layer(state: Expr, count: int, unbatched: bool) -> list[Expr]:
    """The initial state of each layer and direction: (L·D, B, H) cut along its first axis."""
    if unbatched:
        state = expand_dims(state, axis=1)
    if count == 1:
        return [squeeze(state, axis=[0])]
    parts = split(state, indices_or_sections=count, axis=0)
    return [squeeze(parts[i], axis=[0]) for i in range(count)]


@converter("aten.lstm.input")
def lstm(n: AtenCall, x: Expr, hx: list[Expr], params: list[Expr], has_biases: bool,
         layers: int, _dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> list[Expr]:
    out, (h, c) = _run(n, "lstm", x, hx, params, has_biases, layers, train, bidirectional,
                       batch_first)
    return [out, h, c]


@converter("aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input")
def gru(n: AtenCall, x: Expr, hx: Expr, params: list[Expr], has_biases: bool, layers: int,
        _dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> list[Expr]:
    kind = n.target.split(".")[1]
    out, (h,) = _run(n, kind, x, [hx], params, has_biases, layers, train, bidirectional,
                     batch_first)
    return [out, h]


@converter("aten.lstm_cell.default")
def lstm_cell(n: AtenCall, x: Expr, hx: list[Expr], w_ih: Expr, w_hh: Expr,
              b_ih: Expr | None = None, b_hh: Expr | None = None) -> list[Expr]:
    w = Weights(w_ih, w_hh, b_ih, b_hh)
    _, (h, c) = _lstm_step(_projection("lstm", x, w), (hx[0], hx[1]), w)
    return [h, c]


@converter("aten.gru_cell.default", "aten.rnn_tanh_cell.default", "aten.rnn_relu_cell.default")
def gru_cell(n: AtenCall, x: Expr, hx: Expr, w_ih: Expr, w_hh: Expr, b_ih: Expr | None = None,
             b_hh: Expr | None = None) -> Expr:
    kind = n.target.split(".")[1].removesuffix("_cell")
    step = {"gru": _gru_step, "rnn_tanh": _rnn_step(tanh), "rnn_relu": _rnn_step(nn.relu)}[kind]
    w = Weights(w_ih, w_hh, b_ih, b_hh)
    h, _ = step(_projection(kind, x, w), (hx,), w)
    return h
