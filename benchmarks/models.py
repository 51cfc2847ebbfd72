"""Whole models: kiln against PyTorch eager and ONNX Runtime, on the same weights, side by side.

For each model of kiln/testing/models.py — MLP 784-512-512-10 at batch 1 and 64, ResNet-18 and
MobileNetV2 at batch 1 224×224, an LSTM over 32 steps, a 4-layer transformer encoder — this
builds

- kiln: ``kiln.build(mod, target="llvm", opt_level=3, params=params)``, threads from
  ``KILN_NUM_THREADS`` (default: every core);
- PyTorch 2.13 eager: the twin of kiln/testing/torch_models.py holding the same arrays,
  ``torch.set_num_threads(THREADS)``, under ``torch.inference_mode()``;
- ONNX Runtime: that twin exported with ``torch.onnx.export(..., dynamo=False)`` (the
  TorchScript exporter; works offline), ``intra_op_num_threads=THREADS``, all graph
  optimizations;

checks that the three agree, then times them in rounds (each round: a block of INNER calls of
each, after a pause, so that load from other processes on a shared machine falls on all three
alike and no runtime's spinning thread pool slows the next one) and prints medians and
the ratios kiln/ORT and kiln/torch against the issue's goals: every model within 1.5× of ONNX
Runtime, MLP batch 1 and the LSTM faster than PyTorch eager. Then ResNet-18's build time with
an empty ``$KILN_CACHE`` (cold) and again with the cache it filled (warm), each in a fresh
process: goals under 60 s and under 5 s.

    .venv/bin/python benchmarks/models.py [--repeat 30] [--threads 2] [--only mlp1,lstm]
    .venv/bin/python benchmarks/models.py --quick     # reduced sizes, a few repeats: a smoke run

On a machine shared with other work, libgomp's spinning workers make every 2-thread runtime
that uses it (PyTorch) many times slower than on an idle machine; the "kiln 1T" column (the
same executable on one thread) and ``--omp-passive`` show how much of a figure that is. kiln
runs on its own thread pool (kiln/codegen/pool.py), which OMP_WAIT_POLICY does not change.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kiln
from kiln.codegen import num_threads
from kiln.codegen import threads as kiln_threads
from kiln.testing import models, torch_models

INNER = 5  # timed calls per block


@dataclass
class Case:
    """One model: how to build it for kiln and for torch, and its input."""

    key: str
    title: str
    build: Callable[[], tuple[Any, dict[str, np.ndarray]]]
    twin: Callable[[dict[str, np.ndarray]], Any]
    input_shape: tuple[int, ...]
    goals: list[str] = field(default_factory=lambda: ["ort"])


def cases(quick: bool) -> list[Case]:
    image = 64 if quick else 224
    width = 0.5 if quick else 1.0
    lstm_size = 128 if quick else 256
    tr = dict(seq=32, d_model=64, heads=4, ff=256) if quick else \
        dict(seq=128, d_model=256, heads=4, ff=1024)
    return [
        Case("mlp1", "MLP 784-512-512-10, batch 1", lambda: models.mlp(batch=1),
             torch_models.torch_mlp, (1, 784), ["ort", "torch"]),
        Case("mlp64", "MLP 784-512-512-10, batch 64", lambda: models.mlp(batch=64),
             torch_models.torch_mlp, (64, 784)),
        Case("resnet18", f"ResNet-18, batch 1, {image}x{image}",
             lambda: models.resnet18(image=image), torch_models.torch_resnet18,
             (1, 3, image, image)),
        Case("mobilenet_v2", f"MobileNetV2 (width {width}), batch 1, {image}x{image}",
             lambda: models.mobilenet_v2(image=image, width=width),
             lambda p: torch_models.torch_mobilenet_v2(p, width=width), (1, 3, image, image)),
        Case("lstm", f"LSTM {lstm_size}-{lstm_size}, 32 steps, batch 1",
             lambda: models.lstm(steps=32, input=lstm_size, hidden=lstm_size),
             torch_models.torch_lstm, (32, 1, lstm_size), ["ort", "torch"]),
        Case("transformer", "transformer encoder, 4 layers, seq {seq}, d {d_model}, "
             "{heads} heads, ff {ff}".format(**tr),
             lambda: models.transformer_encoder(layers=4, **tr),
             lambda p: torch_models.torch_transformer_encoder(p, tr["heads"]),
             (1, tr["seq"], tr["d_model"])),
    ]


def run_case(case: Case, repeat: int, threads: int) -> dict[str, Any]:
    import torch

    mod, params = case.build()
    x = np.random.default_rng(1).standard_normal(case.input_shape).astype("float32")
    start = time.perf_counter()
    exe = kiln.build(mod, target="llvm", opt_level=3, params=params)
    build_s = time.perf_counter() - start
    twin = case.twin(params)
    tx = torch.from_numpy(x)

    def torch_call() -> Any:
        with torch.inference_mode():
            return twin(tx)

    ort_call = torch_models.onnx_session(twin, x, threads)
    want = torch_models.run_torch(twin, x)
    errors = {"kiln": torch_models.max_error(exe(x), want),
              "ort": torch_models.max_error(ort_call(), want)}

    def kiln_one_thread() -> Any:
        with kiln_threads(1):
            return exe(x)

    runners = {"kiln": lambda: exe(x), "kiln1": kiln_one_thread, "torch": torch_call,
               "ort": ort_call}
    times: dict[str, list[float]] = {name: [] for name in runners}
    deadline = time.perf_counter() + 120.0  # keep one slow model from taking the whole run
    while len(times["kiln"]) < repeat:
        for name, f in runners.items():
            # The three runtimes each keep a thread pool whose workers spin for a while after
            # a parallel region; on 2 cores, one that starts while another's workers still
            # spin runs many times slower (kiln's MLP batch 1: 0.09 ms alone, 58 ms right
            # after an ORT call). So each block starts after a pause and an untimed call.
            time.sleep(0.05)
            f()
            for _ in range(INNER):
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        if time.perf_counter() > deadline and len(times["kiln"]) >= 5:
            break
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"case": case, "median": med, "runs": len(times["kiln"]), "build_s": build_s,
            "errors": errors, "executor": exe.stats().executor}


BUILD_SCRIPT = """
import time, kiln
from kiln.testing.models import resnet18
mod, params = resnet18(image={image})
start = time.perf_counter()
kiln.build(mod, target="llvm", opt_level=3, params=params)
print(time.perf_counter() - start)
"""


def build_times(image: int) -> tuple[float, float]:
    """ResNet-18's ``kiln.build`` time in a fresh process: empty cache, then the same cache."""
    script = BUILD_SCRIPT.format(image=image)
    out = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
        env = {**os.environ, "KILN_CACHE": cache}
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                  text=True, check=True)
            out.append(float(proc.stdout.strip().splitlines()[-1]))
    return out[0], out[1]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f}"


def report(results: list[dict[str, Any]], cold_warm: tuple[float, float] | None) -> None:
    print()
    print(f"{'model':<58} {'kiln ms':>9} {'kiln 1T':>9} {'torch ms':>9} {'ORT ms':>9} "
          f"{'kiln/ORT':>8} {'kiln/torch':>10}  goal")
    goals_met = []
    for r in results:
        med, case = r["median"], r["case"]
        vs_ort, vs_torch = med["kiln"] / med["ort"], med["kiln"] / med["torch"]
        goal_parts = [f"≤1.5× ORT: {'yes' if vs_ort <= 1.5 else 'NO'}"]
        met = vs_ort <= 1.5
        if "torch" in case.goals:
            goal_parts.append(f"< torch: {'yes' if vs_torch < 1.0 else 'NO'}")
            met = met and vs_torch < 1.0
        goals_met.append(met)
        print(f"{case.title:<58} {ms(med['kiln'])} {ms(med['kiln1'])} {ms(med['torch'])} "
              f"{ms(med['ort'])} "
              f"{vs_ort:8.2f} {vs_torch:10.2f}  {'; '.join(goal_parts)}")
    print()
    for r in results:
        e = r["errors"]
        print(f"  {r['case'].key:<13} kiln build {r['build_s']:6.1f} s ({r['executor']}), "
              f"{r['runs']} calls; max error vs torch: kiln {e['kiln']:.1e}, ORT {e['ort']:.1e}")
    if cold_warm is not None:
        cold, warm = cold_warm
        print()
        print(f"ResNet-18 kiln.build, fresh process: cold cache {cold:6.1f} s (goal < 60 s: "
              f"{'yes' if cold < 60 else 'NO'}), warm cache {warm:6.2f} s (goal < 5 s: "
              f"{'yes' if warm < 5 else 'NO'})")
    print(f"\nlatency goals met: {sum(goals_met)} of {len(goals_met)}  (kiln: KILN_NUM_THREADS "
          f"threads; kiln 1T: the same executable with one thread, not part of the goals)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed calls of each runtime (default 30, quick 10)")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and ORT")
    parser.add_argument("--quick", action="store_true", help="reduced sizes, few repeats")
    parser.add_argument("--only", default="", help="comma-separated keys: mlp1,mlp64,resnet18,"
                        "mobilenet_v2,lstm,transformer")
    parser.add_argument("--skip-build-time", action="store_true",
                        help="skip ResNet-18's cold and warm build times")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for torch's libgomp: idle "
                        "workers sleep at once instead of spinning (kinder to a shared machine)")
    args = parser.parse_args()
    if args.omp_passive:  # read when libgomp loads: before torch's import
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    repeat = args.repeat or (10 if args.quick else 30)

    import torch

    torch.set_num_threads(args.threads)
    print(f"kiln threads {num_threads()} (KILN_NUM_THREADS), torch {torch.__version__} threads "
          f"{torch.get_num_threads()}, onnxruntime intra-op threads {args.threads}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
          f"medians of up to {repeat} calls each, in blocks of {INNER}")
    load_start = os.getloadavg()
    only = {k for k in args.only.split(",") if k}
    results = []
    for case in cases(args.quick):
        if only and case.key not in only:
            continue
        print(f"  {case.title} ...", flush=True)
        results.append(run_case(case, repeat, args.threads))
    cold_warm = None
    if not args.skip_build_time and (not only or "resnet18" in only):
        print("  ResNet-18 cold and warm builds ...", flush=True)
        cold_warm = build_times(64 if args.quick else 224)
    report(results, cold_warm)
    print("load average (1, 5, 15 min) at start {:.1f} {:.1f} {:.1f}, at end {:.1f} {:.1f} {:.1f} "
          "on {} cores".format(*load_start, *os.getloadavg(), os.cpu_count()))


if __name__ == "__main__":
    main()
