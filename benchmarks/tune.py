"""Schedule search (kiln.tune): ResNet-18 batch 1 untuned vs tuned vs ONNX Runtime, and a
1024³ matmul tuned against numpy.

1. ResNet-18 (kiln/testing/models.py, batch 1, 224×224) is tuned for ``--budget`` seconds
   (default 300) into a log; then three runners on the same weights and input — kiln built
   without the log, kiln built with it (``kiln.build(..., tuning_log=log)``), and ONNX Runtime
   (the PyTorch twin exported by torch.onnx, all optimizations) — are checked to agree and
   timed in interleaved rounds (each round a block of calls of each, after a pause), so load
   from other processes falls on all three alike. Medians and ratios are printed, with the
   per-kernel table of the search: default and tuned time, candidates tried, and the time
   the search took to find its best (time-to-best).
2. A 1024×1024×1024 float32 product (``nn.batch_matmul`` of two inputs) is tuned for
   ``--matmul-budget`` seconds (default 30) and its GFLOP/s compared with numpy's ``a @ b``
   (its BLAS, same threads), interleaved likewise.

    .venv/bin/python benchmarks/tune.py                      # the issue's figures
    .venv/bin/python benchmarks/tune.py --budget 60 --matmul-budget 10   # a short form
    .venv/bin/python benchmarks/tune.py --image 64 --budget 20 --rounds 5  # a smoke run

The machine's CPU and thread count are printed first; on a shared machine the figures move
by several percent between runs (the tuner re-measures its winners against the defaults,
interleaved, before it keeps them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln
from kiln.codegen import num_threads
from kiln.testing import models, torch_models

INNER = 3  # calls per runner per round
PAUSE_S = 0.05  # before each runner's block: another runtime's spinning workers go to sleep
# ... and after numpy: OpenBLAS's workers spin about 0.1 s after a call (its thread
# timeout), and a parallel kiln kernel started meanwhile runs at one thread's speed
PAUSE_AFTER_NUMPY_S = 0.25


def interleaved(runners: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each runner, timed in interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    last = ""
    for _ in range(rounds):
        for name, f in runners.items():
            time.sleep(PAUSE_AFTER_NUMPY_S if last == "numpy" else PAUSE_S)
            last = name
            f()
            for _ in range(INNER):
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def resnet(budget: float, image: int, rounds: int, threads: int, log: str) -> None:
    mod, params = models.resnet18(image=image)
    x = np.random.default_rng(1).standard_normal((1, 3, image, image)).astype("float32")
    print(f"== ResNet-18, batch 1, {image}x{image}: tuning for {budget:g} s into {log}")
    start = time.perf_counter()
    result = kiln.tune(mod, params, budget_s=budget, log=log)
    print(result)
    print(f"tuning took {time.perf_counter() - start:.1f} s")
    untuned = kiln.build(mod, params=params)
    tuned = kiln.build(mod, params=params, tuning_log=log)
    twin = torch_models.torch_resnet18(params)
    ort = torch_models.onnx_session(twin, x, threads)
    want = torch_models.run_torch(twin, x)
    for name, got in (("untuned", untuned(x)), ("tuned", tuned(x)), ("ort", ort())):
        print(f"max error vs PyTorch, {name}: {torch_models.max_error(got, want):.2e}")
    med = interleaved({"kiln untuned": lambda: untuned(x), "kiln tuned": lambda: tuned(x),
                       "onnxruntime": ort}, rounds)
    for name, t in med.items():
        print(f"{name:<14} {t * 1e3:9.3f} ms (median of {rounds * INNER})")
    print(f"tuned / untuned: {med['kiln tuned'] / med['kiln untuned']:.3f} "
          f"(goal <= 0.909, 10 % faster); tuned / ORT: "
          f"{med['kiln tuned'] / med['onnxruntime']:.3f} (goal < 1)")
    print("time-to-best per kernel (s): " + ", ".join(
        f"{r.time_to_best_s:.1f}" for r in result.kernels))


MATMUL = """#[version = "0.0.5"]
def @main(%a: Tensor[(1, {n}, {n}), float32], %b: Tensor[(1, {n}, {n}), float32]) {{
  nn.batch_matmul(%a, %b, transpose_b=False)
}}
"""


def matmul(budget: float, rounds: int, log: str, n: int = 1024) -> None:
    mod = kiln.parse(MATMUL.format(n=n))
    print(f"== {n}^3 float32 matmul: tuning for {budget:g} s")
    result = kiln.tune(mod, budget_s=budget, log=log)
    print(result)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, n, n)).astype("float32")
    b = rng.standard_normal((1, n, n)).astype("float32")
    untuned = kiln.build(mod)
    tuned = kiln.build(mod, tuning_log=log)
    want = a[0].astype(np.float64) @ b[0].astype(np.float64)
    err = np.abs(tuned(a, b)[0] - want).max() / np.abs(want).max()
    print(f"relative error vs float64: {err:.2e}")
    a2, b2 = a[0], b[0]
    med = interleaved({"kiln untuned": lambda: untuned(a, b), "kiln tuned": lambda: tuned(a, b),
                       "numpy": lambda: a2 @ b2}, rounds)
    flops = 2 * n ** 3
    for name, t in med.items():
        print(f"{name:<13} {t * 1e3:8.2f} ms  {flops / t / 1e9:7.1f} GFLOP/s")
    print(f"tuned / numpy GFLOP/s: {med['numpy'] / med['kiln tuned']:.3f} (goal >= 0.9)")
    if result.kernels:
        r = result.kernels[0]
        print(f"time to best: {r.time_to_best_s:.1f} s after {r.candidates} candidates")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=300.0, help="ResNet-18 tuning seconds")
    p.add_argument("--matmul-budget", type=float, default=30.0, help="matmul tuning seconds")
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    p.add_argument("--only", choices=("resnet", "matmul"), help="run one part")
    p.add_argument("--log-dir", help="where to keep the logs (default: a temporary folder)")
    args = p.parse_args()
    threads = num_threads()
    print(f"target {kiln.Target.host().describe()}; kiln threads {threads}; "
          f"KILN_NUM_THREADS={os.environ.get('KILN_NUM_THREADS', '(unset)')}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.log_dir or tmp
        if args.only in (None, "resnet"):
            resnet(args.budget, args.image, args.rounds, threads,
                   os.path.join(folder, "resnet18.tunelog"))
        if args.only in (None, "matmul"):
            matmul(args.matmul_budget, args.rounds, os.path.join(folder, "matmul.tunelog"))


if __name__ == "__main__":
    main()
