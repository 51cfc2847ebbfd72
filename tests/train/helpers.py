"""An MLP written both in kiln and in PyTorch, with the same weights and data."""

from __future__ import annotations

import numpy as np

import kiln
from kiln.ir.expr import Function, var
from kiln.op import nn

BATCH, IN, HIDDEN, OUT = 8, 12, 16, 5


def mlp_loss() -> kiln.IRModule:
    """@main(%x, %w1, %b1, %w2, %b2, %target): cross entropy of a 2-layer MLP."""
    x = var("x", shape=(BATCH, IN))
    w1, b1 = var("w1", shape=(HIDDEN, IN)), var("b1", shape=(HIDDEN,))
    w2, b2 = var("w2", shape=(OUT, HIDDEN)), var("b2", shape=(OUT,))
    h = nn.relu(nn.bias_add(nn.dense(x, w1), b1))
    f = Function((x, w1, b1, w2, b2), nn.bias_add(nn.dense(h, w2), b2))
    return kiln.train.with_loss(f, "cross_entropy")


def mlp_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (0.3 * rng.standard_normal((HIDDEN, IN))).astype("float32"),
        "b1": (0.1 * rng.standard_normal(HIDDEN)).astype("float32"),
        "w2": (0.3 * rng.standard_normal((OUT, HIDDEN))).astype("float32"),
        "b2": (0.1 * rng.standard_normal(OUT)).astype("float32"),
    }


def batches(steps: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((steps, BATCH, IN)).astype("float32")
    ys = rng.integers(0, OUT, (steps, BATCH)).astype("int64")
    return xs, ys


def torch_loss(tp, x, y):
    import torch
    from torch.nn import functional as F

    h = torch.relu(F.linear(torch.from_numpy(x), tp["w1"], tp["b1"]))
    return F.cross_entropy(F.linear(h, tp["w2"], tp["b2"]), torch.from_numpy(y))


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference over the largest magnitude of the reference ``b``."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
