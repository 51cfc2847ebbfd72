"""Converters of ONNX's recurrent layers (RNN, GRU, LSTM), unrolled over the sequence.

The sequence length is static (the first axis of X, or the second with ``layout=1``), so each
layer becomes a straight chain of kiln operators, one step per element — no loop to run:
the input projections of all steps are one ``nn.dense`` ((seq * batch) x input by the gate
weights), and each step adds the recurrent projection of the previous state and applies the
gates as the ONNX specification writes them (gate orders: GRU z, r, h; LSTM i, o, f, c;
peepholes i, o, f). ``direction`` ``reverse`` walks the steps backwards; ``bidirectional``
does both and stacks them on the direction axis. ``sequence_lens`` shorter than the sequence
keep the state and emit zeros past each batch entry's end (forward direction only).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Expr

Activation = Callable[[Expr], Expr]

# name -> (how many of activation_alpha / activation_beta it takes, builder)
_ACTIVATIONS: dict[str, tuple[int, int, Callable[..., Activation]]] = {
    "Relu": (0, 0, lambda d: op.nn.relu),
    "Tanh": (0, 0, lambda d: op.tanh),
    "Sigmoid": (0, 0, lambda d: op.sigmoid),
    "Affine": (1, 1, lambda d, a, b: lambda x: op.add(op.multiply(x, const_like(a, d)),
                                                       const_like(b, d))),
    "LeakyRelu": (1, 0, lambda d, a: lambda x: op.nn.leaky_relu(x, alpha=a)),
    "ThresholdedRelu": (1, 0, lambda d, a: lambda x: op.where(
        op.greater(x, const_like(a, d)), x, op.zeros_like(x))),
    "ScaledTanh": (1, 1, lambda d, a, b: lambda x: op.multiply(
        const_like(a, d), op.tanh(op.multiply(x, const_like(b, d))))),
    "HardSigmoid": (1, 1, lambda d, a, b: lambda x: op.clip(
        op.add(op.multiply(x, const_like(a, d)), const_like(b, d)), a_min=0.0, a_max=1.0)),
    "Elu": (1, 0, lambda d, a: lambda x: op.where(
        op.less(x, const_like(0, d)),
        op.multiply(const_like(a, d), op.subtract(op.exp(x), const_like(1, d))), x)),
    "Softsign": (0, 0, lambda d: lambda x: op.divide(
        x, op.add(const_like(1, d), op.abs(x)))),
    "Softplus": (0, 0, lambda d: lambda x: op.log(op.add(op.exp(x), const_like(1, d)))),
}

_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# About how many kiln operations one unrolled step makes (for the import limit max_unroll).
_STEP_OPS = {"RNN": 8, "GRU": 24, "LSTM": 32}


def activations(ctx: NodeContext, kind: str, directions: int, dtype: str) -> list[list[Activation]]:
    """The activation functions of each direction, with their alpha and beta values."""
    per = len(_DEFAULTS[kind])
    names = ctx.attr("activations") or _DEFAULTS[kind] * directions
    if len(names) != per * directions:
        raise ctx.error(f"activations lists {len(names)} functions; {kind} takes {per} per "
                        f"direction ({per * directions})")
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    out: list[Activation] = []
    for name in names:
        key = next((k for k in _ACTIVATIONS if k.lower() == name.lower()), None)
        if key is None:
            raise ctx.error(f"activation {name!r} is not one ONNX defines for {kind}")
        n_alpha, n_beta, build = _ACTIVATIONS[key]
        args = [alphas.pop(0) if alphas else _default_alpha(key) for _ in range(n_alpha)]
        args += [betas.pop(0) if betas else _default_beta(key) for _ in range(n_beta)]
        out.append(build(dtype, *args))
    return [out[d * per:(d + 1) * per] for d in range(directions)]


def _default_alpha(name: str) -> float:
    return {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "HardSigmoid": 0.2, "Elu": 1.0}.get(
        name, 1.0)


def _default_beta(name: str) -> float:
    return {"HardSigmoid": 0.5}.get(name, 0.0)


def _gate(x: Expr, k: int, hidden: int) -> Expr:
    """Gate ``k`` of a (batch, gates * hidden) tensor."""
    return op.strided_slice(x, begin=[k * hidden], end=[(k + 1) * hidden], axes=[1])


def _row(w: Expr, d: int) -> Expr:
    return op.take(w, const_like(d, "int64"), axis=0)


def recurrent(ctx: NodeContext, kind: str) -> list[Expr]:
    x_shape = ctx.shape(0)
    layout = int(ctx.attr("layout", 0))
    x = ctx.x(0) if layout == 0 else op.transpose(ctx.x(0), axes=[1, 0, 2])
    seq, batch, size = (x_shape if layout == 0 else (x_shape[1], x_shape[0], x_shape[2]))
    dtype = ctx.dtype(0)
    hidden = int(ctx.need_attr("hidden_size"))
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.error(f"direction {direction!r} is not forward, reverse or bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    gates = _GATES[kind]
    if ctx.shape(1) != (dirs, gates * hidden, size):
        raise ctx.error(f"W has shape {ctx.shape(1)}, expected {(dirs, gates * hidden, size)}")
    clip = ctx.attr("clip")
    acts = activations(ctx, kind, dirs, dtype)
    ctx.check_unroll(seq * dirs * _STEP_OPS[kind],
                     f"the unrolled layer ({seq} steps x {dirs} direction(s) x about "
                     f"{_STEP_OPS[kind]} kiln operations per {kind} step)")
    lens = ctx.ints(4, "sequence_lens") if ctx.has(4) else []
    masked = any(n != seq for n in lens)
    if masked and direction != "forward":
        raise ctx.error("sequence_lens shorter than the sequence are imported for the forward "
                        "direction only")
    ctx.check_elements((batch, hidden), "its zero state")
    zeros_state = const_like(np.zeros((batch, hidden)), dtype)
    flat_x = op.reshape(x, newshape=[seq * batch, size])
    ys, hs, cs = [], [], []
    for d in range(dirs):
        proj = op.reshape(op.nn.dense(flat_x, _row(ctx.x(1), d)),
                          newshape=[seq, batch, gates * hidden])
        if ctx.has(3):
            b = _row(ctx.x(3), d)
            wb: Expr = op.strided_slice(b, begin=[0], end=[gates * hidden], axes=[0])
            rb: Expr = op.strided_slice(b, begin=[gates * hidden], end=[2 * gates * hidden],
                                        axes=[0])
        else:
            wb = rb = const_like(np.zeros(gates * hidden), dtype)
        proj = op.add(proj, wb)
        r = _row(ctx.x(2), d)
        h = _row(ctx.x(5), d) if ctx.has(5) else zeros_state
        c = _row(ctx.x(6), d) if kind == "LSTM" and ctx.has(6) else zeros_state
        peep = _row(ctx.x(7), d) if kind == "LSTM" and ctx.has(7) else None
        steps = range(seq - 1, -1, -1) if (direction == "reverse" or d == 1) else range(seq)
        outs: dict[int, Expr] = {}
        for t in steps:
            xt = op.take(proj, const_like(t, "int64"), axis=0)
            rec = op.add(op.nn.dense(h, r), rb)
            if kind == "RNN":
                new_h, new_c = _rnn(xt, rec, acts[d], clip, dtype), c
            elif kind == "GRU":
                new_h, new_c = _gru(ctx, xt, rec, h, r, rb, hidden, acts[d], clip, dtype), c
            else:
                new_h, new_c = _lstm(ctx, xt, rec, c, peep, hidden, acts[d], clip, dtype)
            if masked:
                alive = const_like(np.array([[t < n] for n in lens]), "bool")
                new_h = op.where(alive, new_h, h)
                new_c = op.where(alive, new_c, c)
                outs[t] = op.where(alive, new_h, zeros_state)
            else:
                outs[t] = new_h
            h, c = ctx.let(new_h, "rnn_h"), ctx.let(new_c, "rnn_c")
        ys.append(op.stack([outs[t] for t in range(seq)], axis=0))  # (seq, batch, hidden)
        hs.append(h)
        cs.append(c)
    y = op.stack(ys, axis=1)  # (seq, dirs, batch, hidden)
    y_h, y_c = op.stack(hs, axis=0), op.stack(cs, axis=0)
    if layout == 1:
        y = op.transpose(y, axes=[2, 0, 1, 3])
        y_h, y_c = op.transpose(y_h, axes=[1, 0, 2]), op.transpose(y_c, axes=[1, 0, 2])
    return [y, y_h, y_c] if kind == "LSTM" else [y, y_h]


def _clip(x: Expr, clip: float | None) -> Expr:
    return x if clip is None else op.clip(x, a_min=-float(clip), a_max=float(clip))


def _rnn(xt: Expr, rec: Expr, acts: list[Activation], clip: float | None, dtype: str) -> Expr:
    return acts[0](_clip(op.add(xt, rec), clip))


def _gru(ctx: NodeContext, xt: Expr, rec: Expr, h: Expr, r: Expr, rb: Expr, hidden: int,
         acts: list[Activation], clip: float | None, dtype: str) -> Expr:
    f, g = acts
    z = f(_clip(op.add(_gate(xt, 0, hidden), _gate(rec, 0, hidden)), clip))
    reset = f(_clip(op.add(_gate(xt, 1, hidden), _gate(rec, 1, hidden)), clip))
    if ctx.attr("linear_before_reset", 0):
        cand: Expr = op.add(_gate(xt, 2, hidden), op.multiply(reset, _gate(rec, 2, hidden)))
    else:
        rh = op.strided_slice(r, begin=[2 * hidden], end=[3 * hidden], axes=[0])
        rbh = op.strided_slice(rb, begin=[2 * hidden], end=[3 * hidden], axes=[0])
        cand = op.add(_gate(xt, 2, hidden),
                      op.add(op.nn.dense(op.multiply(reset, h), rh), rbh))
    cand = g(_clip(cand, clip))
    one = const_like(1.0, dtype)
    return op.add(op.multiply(op.subtract(one, z), cand), op.multiply(z, h))


def _lstm(ctx: NodeContext, xt: Expr, rec: Expr, c: Expr, peep: Expr | None, hidden: int,
          acts: list[Activation], clip: float | None, dtype: str) -> tuple[Expr, Expr]:
    f, g, h_act = acts

    def pre(k: int) -> Expr:
        return op.add(_gate(xt, k, hidden), _gate(rec, k, hidden))

    def peephole(k: int, state: Expr) -> Expr:
        if peep is None:
            return const_like(0.0, dtype)
        p = op.strided_slice(peep, begin=[k * hidden], end=[(k + 1) * hidden], axes=[0])
        return op.multiply(p, state)

    i = f(_clip(op.add(pre(0), peephole(0, c)), clip))
    if ctx.attr("input_forget", 0):
        forget: Expr = op.subtract(const_like(1.0, dtype), i)
    else:
        forget = f(_clip(op.add(pre(2), peephole(2, c)), clip))
    cand = g(_clip(pre(3), clip))
    new_c = op.add(op.multiply(forget, c), op.multiply(i, cand))
    o = f(_clip(op.add(pre(1), peephole(1, new_c)), clip))
    return op.multiply(o, h_act(new_c)), new_c


@converter("RNN", since=7)
def rnn_7(ctx: NodeContext) -> list[Expr]:
    return recurrent(ctx, "RNN")


@converter("GRU", since=7)
def gru_7(ctx: NodeContext) -> list[Expr]:
    return recurrent(ctx, "GRU")


@converter("LSTM", since=7)
def lstm_7(ctx: NodeContext) -> list[Expr]:
    return recurrent(ctx, "LSTM")
