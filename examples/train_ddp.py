"""Data-parallel training with kiln.distributed: an MLP on ten Gaussian clusters, each batch
split over the processes, the gradients averaged through torch.distributed (gloo).

    torchrun --nproc-per-node 2 examples/train_ddp.py [--steps 200] [--batch 64]
             [--checkpoint run.npz] [--resume]

On several machines, start the same command on each with torchrun's rendezvous options
(docs/training.md): --nnodes 2 --node-rank 0|1 --master-addr <rank 0's host> --master-port 29500.
Every rank draws the same data and batches (same seed) and trains on its rows of each batch.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import kiln
from kiln.ir.expr import Function, var
from kiln.op import nn

CLASSES, HIDDEN = 10, 64


def make_data(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian clusters in the plane, on two rings; labels 0..9."""
    rng = np.random.default_rng(seed)
    k = np.arange(CLASSES)
    angles = k * 2 * np.pi / 5 + np.where(k < 5, 0.0, np.pi / 5)
    radii = np.where(k < 5, 2.5, 5.5)
    centres = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    labels = rng.integers(0, CLASSES, n)
    points = centres[labels] + 0.45 * rng.standard_normal((n, 2))
    return points.astype("float32"), labels.astype("int64")


def loss_function(rows: int) -> kiln.IRModule:
    """Cross entropy of a 3-layer MLP on ``rows`` points (this rank's shard)."""
    x = var("x", shape=(rows, 2))
    w1, b1 = var("w1", shape=(HIDDEN, 2)), var("b1", shape=(HIDDEN,))
    w2, b2 = var("w2", shape=(HIDDEN, HIDDEN)), var("b2", shape=(HIDDEN,))
    w3, b3 = var("w3", shape=(CLASSES, HIDDEN)), var("b3", shape=(CLASSES,))
    h = nn.relu(nn.bias_add(nn.dense(x, w1), b1))
    h = nn.relu(nn.bias_add(nn.dense(h, w2), b2))
    f = Function((x, w1, b1, w2, b2, w3, b3), nn.bias_add(nn.dense(h, w3), b3))
    return kiln.train.with_loss(f, "cross_entropy")


def init_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def he(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * np.sqrt(2.0 / inp)).astype("float32")

    return {"w1": he(HIDDEN, 2), "b1": np.zeros(HIDDEN, "float32"),
            "w2": he(HIDDEN, HIDDEN), "b2": np.zeros(HIDDEN, "float32"),
            "w3": he(CLASSES, HIDDEN), "b3": np.zeros(CLASSES, "float32")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="global batch (all ranks)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", help="save the weights here at the end (rank 0)")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint")
    args = parser.parse_args()

    kiln.distributed.init_process_group("gloo")     # from torchrun's environment
    threads = int(os.environ.get("KILN_THREADS", "1"))  # one core per rank by default
    dp = kiln.distributed.DataParallel(loss_function, init_weights(), kiln.train.SGD(
        lr=args.lr, momentum=0.9), batch_size=args.batch, check_every=50, threads=threads)
    if args.resume and args.checkpoint:
        dp.load(args.checkpoint)                     # read by rank 0, broadcast to all
    x, y = make_data()
    say = print if dp.rank == 0 else (lambda *_: None)
    say(f"{dp.world_size} ranks, {dp.shards} rows of each batch of {args.batch}")
    order = np.random.default_rng(1).permutation(len(x))
    start = time.perf_counter()
    for s in range(dp.step.steps_taken, args.steps):
        at = (s * args.batch) % (len(x) - args.batch)
        idx = order[at: at + args.batch]
        loss = dp(x[idx], y[idx])
        if s % 50 == 0 or s == args.steps - 1:
            say(f"step {s:4d}  loss {loss:.4f}")
    seconds = time.perf_counter() - start
    say(f"{args.steps} steps in {seconds:.1f} s")
    dp.check_replicas()
    if args.checkpoint:
        dp.save(args.checkpoint)
    kiln.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
