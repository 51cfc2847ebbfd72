"""Loss functions of any batch size for the data-parallel tests, the example and the
benchmark: a small MLP, a small CNN and one with batch norms in training mode, built with
kiln.op (cross entropy, mean over the batch), their weights drawn from a seed."""

from __future__ import annotations

import numpy as np

import kiln
from kiln.ir.expr import Function, var
from kiln.op import nn

MLP_IN, MLP_HIDDEN, CLASSES = 12, 16, 5
CNN_CHANNELS, CNN_SIDE = 4, 8


def mlp_loss(rows: int, hidden: int = MLP_HIDDEN, features: int = MLP_IN) -> kiln.IRModule:
    """@main(%x, %w1, %b1, %w2, %b2, %target) of a 2-layer MLP on ``rows`` samples."""
    x = var("x", shape=(rows, features))
    w1, b1 = var("w1", shape=(hidden, features)), var("b1", shape=(hidden,))
    w2, b2 = var("w2", shape=(CLASSES, hidden)), var("b2", shape=(CLASSES,))
    h = nn.relu(nn.bias_add(nn.dense(x, w1), b1))
    f = Function((x, w1, b1, w2, b2), nn.bias_add(nn.dense(h, w2), b2))
    return kiln.train.with_loss(f, "cross_entropy")


def mlp_params(seed: int = 0, hidden: int = MLP_HIDDEN,
               features: int = MLP_IN) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((hidden, features)) / np.sqrt(features)).astype("float32"),
        "b1": (0.1 * rng.standard_normal(hidden)).astype("float32"),
        "w2": (rng.standard_normal((CLASSES, hidden)) / np.sqrt(hidden)).astype("float32"),
        "b2": (0.1 * rng.standard_normal(CLASSES)).astype("float32"),
    }


def cnn_loss(rows: int) -> kiln.IRModule:
    """@main(%x, %c1, %cb1, %c2, %fc, %fcb, %target): conv-relu, conv-relu, global average
    pool, linear, on ``rows`` images of 3x8x8."""
    c = CNN_CHANNELS
    x = var("x", shape=(rows, 3, CNN_SIDE, CNN_SIDE))
    c1, cb1 = var("c1", shape=(c, 3, 3, 3)), var("cb1", shape=(c,))
    c2 = var("c2", shape=(c, c, 3, 3))
    fc, fcb = var("fc", shape=(CLASSES, c)), var("fcb", shape=(CLASSES,))
    h = nn.relu(nn.bias_add(nn.conv2d(x, c1, padding=[1, 1, 1, 1]), cb1, axis=1))
    h = nn.relu(nn.conv2d(h, c2, padding=[1, 1, 1, 1], strides=[2, 2]))
    pooled = nn.batch_flatten(nn.global_avg_pool2d(h))
    f = Function((x, c1, cb1, c2, fc, fcb), nn.bias_add(nn.dense(pooled, fc), fcb))
    return kiln.train.with_loss(f, "cross_entropy")


def cnn_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = CNN_CHANNELS
    return {
        "c1": (rng.standard_normal((c, 3, 3, 3)) / np.sqrt(27)).astype("float32"),
        "cb1": (0.1 * rng.standard_normal(c)).astype("float32"),
        "c2": (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype("float32"),
        "fc": (rng.standard_normal((CLASSES, c)) / np.sqrt(c)).astype("float32"),
        "fcb": (0.1 * rng.standard_normal(CLASSES)).astype("float32"),
    }


BN_MOMENTUM = 0.1


def bn_cnn_loss(rows: int) -> kiln.IRModule:
    """@main(%x, %c1, %g1, %be1, %m1, %v1, %c2, %g2, %be2, %m2, %v2, %fc, %fcb, %target):
    conv-batch norm-relu twice (the second of stride 2), global average pool, linear, the
    batch norms in training mode (%m*, %v*: their running statistics), on ``rows`` images
    of 3x8x8."""
    c = CNN_CHANNELS
    x = var("x", shape=(rows, 3, CNN_SIDE, CNN_SIDE))
    c1, c2 = var("c1", shape=(c, 3, 3, 3)), var("c2", shape=(c, c, 3, 3))
    norms = [tuple(var(f"{n}{k}", shape=(c,)) for n in ("g", "be", "m", "v")) for k in (1, 2)]
    fc, fcb = var("fc", shape=(CLASSES, c)), var("fcb", shape=(CLASSES,))
    h = nn.conv2d(x, c1, padding=[1, 1, 1, 1])
    h = nn.relu(nn.batch_norm(h, *norms[0], training=True, momentum=BN_MOMENTUM)[0])
    h = nn.conv2d(h, c2, padding=[1, 1, 1, 1], strides=[2, 2])
    h = nn.relu(nn.batch_norm(h, *norms[1], training=True, momentum=BN_MOMENTUM)[0])
    pooled = nn.batch_flatten(nn.global_avg_pool2d(h))
    f = Function((x, c1, *norms[0], c2, *norms[1], fc, fcb),
                 nn.bias_add(nn.dense(pooled, fc), fcb))
    return kiln.train.with_loss(f, "cross_entropy")


def bn_cnn_params(seed: int = 0) -> dict[str, np.ndarray]:
    """The weights and, as torch starts them, the running statistics (mean 0, variance 1)
    of `bn_cnn_loss`; gamma and beta drawn too, so that they matter."""
    rng = np.random.default_rng(seed)
    c = CNN_CHANNELS
    out = {
        "c1": (rng.standard_normal((c, 3, 3, 3)) / np.sqrt(27)).astype("float32"),
        "c2": (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype("float32"),
        "fc": (rng.standard_normal((CLASSES, c)) / np.sqrt(c)).astype("float32"),
        "fcb": (0.1 * rng.standard_normal(CLASSES)).astype("float32"),
    }
    for k in (1, 2):
        out[f"g{k}"] = rng.uniform(0.5, 1.5, c).astype("float32")
        out[f"be{k}"] = rng.uniform(-0.5, 0.5, c).astype("float32")
        out[f"m{k}"] = np.zeros(c, "float32")
        out[f"v{k}"] = np.ones(c, "float32")
    return out


def data(model: str, steps: int, rows: int, seed: int = 1,
         features: int = MLP_IN) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` global batches of ``rows`` samples and their labels."""
    rng = np.random.default_rng(seed)
    shape = (features,) if model == "mlp" else (3, CNN_SIDE, CNN_SIDE)
    xs = rng.standard_normal((steps, rows, *shape)).astype("float32")
    ys = rng.integers(0, CLASSES, (steps, rows)).astype("int64")
    return xs, ys


MODELS = {"mlp": (mlp_loss, mlp_params), "cnn": (cnn_loss, cnn_params),
          "bncnn": (bn_cnn_loss, bn_cnn_params)}
