"""Data-parallel training throughput: samples/s of one process training on the whole batch
against two ranks of kiln.distributed.DataParallel (gloo on loopback), each on half of it.

    .venv/bin/python benchmarks/ddp.py [--steps 40] [--batch 256] [--hidden 512]

The model is an MLP (784 features, one hidden layer, 5 classes; cross entropy) from
tests/train/ddp_models.py. One process runs a kiln.train.Step with 1 and with 2 threads; the
two ranks (started by this script, as torchrun would) run 1 thread each, and rank 0 reports
its step time and the part of it spent in the gradient all-reduce. Times are medians of
``--steps`` steps after 3 warm-up steps; on a shared machine they are noisy (run it twice).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kiln  # noqa: E402
from tests.train.ddp_models import data, mlp_loss, mlp_params  # noqa: E402

FEATURES = 784


def _median_ms(times: list[float]) -> float:
    return 1000 * float(np.median(times))


def _step_times(step: Callable[[np.ndarray, np.ndarray], Any],
                args: argparse.Namespace) -> list[float]:
    """Seconds of each of 3 warm-up and ``args.steps`` timed steps, over 4 seeded batches."""
    xs, ys = data("mlp", 4, args.batch, features=FEATURES)
    times = []
    for s in range(args.steps + 3):
        t = time.perf_counter()
        step(xs[s % 4], ys[s % 4])
        times.append(time.perf_counter() - t)
    return times


def single(args: argparse.Namespace, threads: int) -> float:
    step = kiln.train.Step(mlp_loss(args.batch, args.hidden, FEATURES),
                           mlp_params(0, args.hidden, FEATURES),
                           kiln.train.SGD(lr=0.01, momentum=0.9), threads=threads)
    return _median_ms(_step_times(step, args)[3:])


def rank_worker(args: argparse.Namespace) -> None:
    kiln.distributed.init_process_group("gloo", timeout_s=120)
    dp = kiln.distributed.DataParallel(
        lambda rows: mlp_loss(rows, args.hidden, FEATURES), mlp_params(0, args.hidden, FEATURES),
        kiln.train.SGD(lr=0.01, momentum=0.9), batch_size=args.batch, threads=1)
    reduce_times: list[float] = []
    inner = dp.step.grad_hook
    assert inner is not None

    def timed(grads: list[np.ndarray]) -> None:
        t = time.perf_counter()
        inner(grads)
        reduce_times.append(time.perf_counter() - t)

    dp.step.grad_hook = timed
    times = _step_times(dp, args)
    dp.check_replicas()
    if dp.rank == 0:
        step_ms, reduce_ms = _median_ms(times[3:]), _median_ms(reduce_times[3:])
        print(f"RESULT {step_ms:.3f} {reduce_ms:.3f} {dp.buckets!r}", flush=True)
    kiln.distributed.destroy_process_group()


def two_ranks(args: argparse.Namespace) -> tuple[float, float, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LOCAL_RANK=str(rank))
        cmd = [sys.executable, __file__, "--rank-worker", "--steps", str(args.steps),
               "--batch", str(args.batch), "--hidden", str(args.hidden)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a rank failed")
    line = next(x for x in outs[0].splitlines() if x.startswith("RESULT"))
    _, step_ms, reduce_ms, buckets = line.split(" ", 3)
    return float(step_ms), float(reduce_ms), buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_worker(args)
        return
    import torch

    print(f"MLP {FEATURES}-{args.hidden}-5, global batch {args.batch}, SGD with momentum; "
          f"torch {torch.__version__} (gloo); median of {args.steps} steps")
    one = single(args, 1)
    two_threads = single(args, 2)
    ddp, reduce_ms, buckets = two_ranks(args)
    rate = {k: args.batch / (v / 1000) for k, v in
            (("one", one), ("two_threads", two_threads), ("ddp", ddp))}
    print(f"  1 process, 1 thread      {one:9.3f} ms/step  {rate['one']:9.0f} samples/s")
    print(f"  1 process, 2 threads     {two_threads:9.3f} ms/step  {rate['two_threads']:9.0f} "
          f"samples/s  {rate['two_threads'] / rate['one']:.2f}x")
    print(f"  2 ranks, 1 thread each   {ddp:9.3f} ms/step  {rate['ddp']:9.0f} samples/s  "
          f"{rate['ddp'] / rate['one']:.2f}x   (all-reduce {reduce_ms:.3f} ms of it; "
          f"{buckets})")


if __name__ == "__main__":
    main()
