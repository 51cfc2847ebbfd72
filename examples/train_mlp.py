"""Train an MLP with kiln's gradients: SGD on ten Gaussian clusters in the plane.

    python examples/train_mlp.py [--steps 400] [--mode first_order|higher_order]

The model and its loss are a Relay program; `kiln.grad` turns it into a program returning the
loss and its gradient with respect to every weight, which the reference interpreter runs once
per step. Nothing else computes a derivative: numpy only draws the data and applies the update.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln.ad import grad

CLASSES = 10
HIDDEN = 32

MODEL = """
#[version = "0.0.5"]
def @main(%x: Tensor[(BATCH, 2), float32], %label: Tensor[(BATCH, 10), float32],
          %w1: Tensor[(HIDDEN, 2), float32], %b1: Tensor[(HIDDEN), float32],
          %w2: Tensor[(HIDDEN, HIDDEN), float32], %b2: Tensor[(HIDDEN), float32],
          %w3: Tensor[(10, HIDDEN), float32], %b3: Tensor[(10), float32]) {
  let %h1 = nn.relu(nn.bias_add(nn.dense(%x, %w1), %b1, axis=-1));
  let %h2 = nn.relu(nn.bias_add(nn.dense(%h1, %w2), %b2, axis=-1));
  let %logits = nn.bias_add(nn.dense(%h2, %w3), %b3, axis=-1);
  let %loss = negative(mean(sum(nn.log_softmax(%logits) * %label, axis=[1])));
  (%loss, %logits)
}
"""

WEIGHTS = ("w1", "b1", "w2", "b2", "w3", "b3")


def make_data(per_class: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian clusters: centres on two rings, labels 0..9."""
    rng = np.random.default_rng(seed)
    angles = np.arange(CLASSES) * 2 * np.pi / 5
    radii = np.where(np.arange(CLASSES) < 5, 2.5, 5.5)
    angles = angles + np.where(np.arange(CLASSES) < 5, 0.0, np.pi / 5)
    centres = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    labels = np.repeat(np.arange(CLASSES), per_class)
    points = centres[labels] + 0.45 * rng.standard_normal((labels.size, 2))
    order = rng.permutation(labels.size)
    return points[order].astype("float32"), labels[order]


def model(batch: int) -> kiln.IRModule:
    text = MODEL.replace("BATCH", str(batch)).replace("HIDDEN", str(HIDDEN))
    return kiln.infer_types(kiln.parse(text))


def init_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def he(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * np.sqrt(2.0 / inp)).astype("float32")

    return {
        "w1": he(HIDDEN, 2), "b1": np.zeros(HIDDEN, "float32"),
        "w2": he(HIDDEN, HIDDEN), "b2": np.zeros(HIDDEN, "float32"),
        "w3": he(CLASSES, HIDDEN), "b3": np.zeros(CLASSES, "float32"),
    }


def gradient_program(batch: int, mode: str = "first_order") -> kiln.IRModule:
    """A typed module whose @main returns ((loss, logits), (d/dw1, d/db1, ..., d/db3))."""
    mod = model(batch)
    g = grad(mod["main"], mod=mod, mode=mode, wrt=range(2, 8), of=0)
    return kiln.infer_types(kiln.IRModule.from_expr(g, mod))


def train(
    steps: int = 400,
    batch: int = 100,
    lr: float = 0.1,
    mode: str = "first_order",
    seed: int = 0,
    log: Callable[[str], None] | None = print,
    every: int = 50,
) -> dict[str, object]:
    """Minibatch SGD; returns the losses, the weights and the training accuracy."""
    x, labels = make_data(seed=seed)
    onehot = np.eye(CLASSES, dtype="float32")[labels]
    weights = init_weights(seed)
    program = gradient_program(batch, mode)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        at = (step * batch) % len(x)
        xb, yb = x[at : at + batch], onehot[at : at + batch]
        (loss, _), grads = kiln.interpret(program, xb, yb, *(weights[n] for n in WEIGHTS))
        for name, g in zip(WEIGHTS, grads, strict=True):
            weights[name] = weights[name] - np.float32(lr) * g
        losses.append(float(loss))
        if log and (step % every == 0 or step == steps - 1):
            log(f"step {step:4d}  loss {float(loss):.4f}")
    elapsed = time.perf_counter() - start
    acc = accuracy(weights, x, labels)
    if log:
        log(f"{steps} steps in {elapsed:.1f} s ({1000 * elapsed / steps:.1f} ms per step); "
            f"training accuracy {100 * acc:.1f}%")
    return {"losses": losses, "weights": weights, "accuracy": acc, "seconds": elapsed}


def accuracy(weights: dict[str, np.ndarray], x: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of points the model classifies right (the forward program, run by kiln)."""
    mod = model(len(x))
    onehot = np.eye(CLASSES, dtype="float32")[labels]
    _, logits = kiln.interpret(mod, x, onehot, *(weights[n] for n in WEIGHTS))
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--mode", default="first_order", choices=["first_order", "higher_order"])
    args = parser.parse_args()
    result = train(steps=args.steps, lr=args.lr, mode=args.mode)
    if result["accuracy"] < 0.95:  # type: ignore[operator]
        raise SystemExit("training accuracy stayed under 95%")


if __name__ == "__main__":
    main()
