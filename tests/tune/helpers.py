"""Small models with tunable kernels, for the tuning tests."""

from __future__ import annotations

import numpy as np

import kiln
from kiln.ir.module import IRModule


def conv_net(seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """conv 3x3 stride 2 + relu, a 1x1 conv, and a dense layer of 6 rows: three sites."""
    rng = np.random.default_rng(seed)
    x = kiln.var("x", shape=(1, 3, 12, 12))
    w1 = kiln.var("w1", shape=(8, 3, 3, 3))
    w2 = kiln.var("w2", shape=(10, 8, 1, 1))
    fc = kiln.var("fc", shape=(20, 60))  # wider than a vector: a GEMM, not dot products
    nn = kiln.op.nn
    h = nn.relu(nn.conv2d(x, w1, strides=(2, 2), padding=(1, 1)))
    h = nn.conv2d(h, w2)
    h = kiln.op.reshape(h, newshape=(6, 60))
    body = nn.dense(h, fc)
    mod = IRModule.from_expr(kiln.Function([x, w1, w2, fc], body))
    params = {"w1": rng.uniform(-1, 1, (8, 3, 3, 3)).astype(np.float32),
              "w2": rng.uniform(-1, 1, (10, 8, 1, 1)).astype(np.float32),
              "fc": rng.uniform(-1, 1, (20, 60)).astype(np.float32)}
    return mod, params


def winograd_net(seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Two 3×3 convolutions of two vectors' channels at 28², a relu between: convert-layout
    runs them as Winograd on channel blocks."""
    rng = np.random.default_rng(seed)
    c = kiln.Target.host().lanes("float32") * 2
    x = kiln.var("x", shape=(1, c, 28, 28))
    w1, w2 = kiln.var("w1", shape=(c, c, 3, 3)), kiln.var("w2", shape=(c, c, 3, 3))
    nn = kiln.op.nn
    body = nn.conv2d(nn.relu(nn.conv2d(x, w1, padding=(1, 1))), w2, padding=(1, 1))
    mod = IRModule.from_expr(kiln.Function([x, w1, w2], body))
    params = {n: rng.uniform(-0.2, 0.2, (c, c, 3, 3)).astype(np.float32) for n in ("w1", "w2")}
    return mod, params


def reference(mod: IRModule, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The reference interpreter's result (the weights as arguments)."""
    names = [p.name_hint for p in mod["main"].params]
    return np.asarray(kiln.interpret(mod, *[params.get(n, x) for n in names]))
