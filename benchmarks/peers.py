"""kiln against ONNX Runtime and PyTorch eager, same weights, one process: idle and one core busy.

Workloads (kiln/testing/models.py builders and their torch twins, built at run time): MLP
784-512-512-10 at batch 1 and 64, ResNet-18 and MobileNetV2 at batch 1 224×224, the LSTM loop
of ``models.lstm`` (32 steps), ``nn.LSTM`` imported into kiln by ``kiln.frontend.from_torch``,
a 4-layer transformer encoder (seq 128, d 256), a ViT-style classifier (ViT-S/16 width, 4
layers), GPT-style causal decoder layers (GPT-2 small width, 2 layers, seq 128), a matmul
1024³ (numpy/OpenBLAS in that row too) and a single 3×3 convolution, 64 channels, 56×56.

For each: kiln is ``kiln.build(mod, params=params)`` on ``--threads`` threads; PyTorch is the
twin holding the same arrays, eager, ``torch.inference_mode()``, ``torch.set_num_threads``;
ONNX Runtime runs that twin exported with ``torch.onnx.export(..., dynamo=False)``,
``intra_op_num_threads`` the same, all graph optimizations. The three (four) must agree before
anything is timed. Then they are timed interleaved, in rounds as benchmarks/models.py does (a
pause, an untimed call, a block of INNER timed calls of each in turn), and the table gives the
median and p90 of each, kiln/ORT and kiln/torch, and the geomean of kiln/ORT.

Conditions: ``idle`` (nothing else from this script), and ``busy``: one child process spins a
Python loop, pinned nowhere, for the whole timing, and is stopped in a ``finally``. A runtime
whose workers wait for each other at a barrier suffers most there.

Also: "alternating with numpy": an MLP batch 64 with its weights as arguments, called
alternately with the same computation in numpy (OpenBLAS, whose idle threads spin), against
kiln's time called alone just before (once OpenBLAS's threads sleep), in 5 runs, in a fresh
process; and again with
``OPENBLAS_THREAD_TIMEOUT=4`` (OpenBLAS's idle threads sleep at once) unless it is set.
Everything that calls OpenBLAS (this check and the numpy column) runs after all the kiln
timings: once OpenBLAS has run, kiln's parallel kernels are many times slower for a while,
and torch's and ORT's are not.

    .venv/bin/python benchmarks/peers.py [--threads 2] [--repeat 100] [--only mlp1,matmul]
        [--conditions idle,busy] [--unset-openblas] [--spin-ms 100] [--kiln-from onnx]
    .venv/bin/python benchmarks/peers.py --quick       # reduced sizes, few repeats: a smoke run

``--kiln-from onnx``: kiln imports the very ONNX file ONNX Runtime runs (``kiln.frontend.
from_onnx``) instead of building the kiln.testing model, as a user with a model file would.

numpy's OpenBLAS reads its environment when it loads, so the script runs itself again when it
must change it: ``OPENBLAS_NUM_THREADS`` set to ``--threads`` if unset, and with
``--unset-openblas``, without ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` (which force
OpenBLAS's Haswell kernels on newer CPUs and slow numpy). ``--spin-ms`` keeps kiln's idle
pool workers awake that long (``kiln.codegen.set_spin_ms``; ONNX Runtime's spin by default),
which matters where waking a sleeping thread is slow (a VM). On a machine shared with other work
every figure is noisy: compare the runtimes within a row, never an absolute time across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kiln
from kiln.codegen import num_threads, set_num_threads, set_spin_ms, spin_ms
from kiln.ir.expr import Function, var
from kiln.ir.module import IRModule
from kiln.op import nn
from kiln.testing import models, torch_models

INNER = 5  # timed calls per block
# Timed calls of each runtime per workload: 20 blocks. With 6 (30 calls) the batch-1 MLP's
# kiln/ORT moved 0.75-1.43 from run to run (the host slows a block now and then, and the
# median of 30 follows one or two such blocks); over 90 blocks kiln was ahead at every
# position after the pause (26-33 µs against ORT's 36-41 for a block of five).
REPEAT = 100
OPENBLAS_SETTLE_S = 0.5  # seconds, past the spin of OpenBLAS's idle threads after a call
RTOL = 1e-4  # agreement, relative to the largest expected magnitude (tests/models' tolerance)
CASE_SECONDS = 60.0  # cap on one workload's timing in one condition
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REEXEC_MARK = "KILN_PEERS_REEXECUTED"


@dataclass
class Case:
    """One workload: the kiln builder, its torch twin and the input shape.

    ``import_twin``: kiln compiles the twin imported by ``from_torch`` instead of the builder's
    module (whose weights the twin holds). ``numpy``: the same computation in numpy, timed too.
    """

    key: str
    title: str
    model: Callable[[], tuple[IRModule, dict[str, np.ndarray]]]
    twin: Callable[[dict[str, np.ndarray]], Any]
    input_shape: tuple[int, ...]
    import_twin: bool = False
    numpy: Callable[[dict[str, np.ndarray], np.ndarray], Callable[[], Any]] | None = None


def _matmul(n: int, seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """``data`` (n, n) by ``weight``ᵀ (n, n): ``nn.dense``, what ``nn.Linear`` computes."""
    x, w = var("data", shape=(n, n)), var("weight", shape=(n, n))
    value = np.random.default_rng(seed).standard_normal((n, n)).astype("float32") / math.sqrt(n)
    return IRModule.from_expr(Function((x, w), nn.dense(x, w))), {"weight": value}


def _conv(channels: int, size: int, seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray]]:
    """One 3×3 convolution, stride 1, padding 1, ``channels`` in and out, batch 1, no bias."""
    x = var("data", shape=(1, channels, size, size))
    w = var("weight", shape=(channels, channels, 3, 3))
    body = nn.conv2d(x, w, padding=(1, 1), channels=channels, kernel_size=(3, 3))
    scale = math.sqrt(2.0 / (9 * channels))
    value = (np.random.default_rng(seed).standard_normal((channels, channels, 3, 3)) * scale)
    return IRModule.from_expr(Function((x, w), body)), {"weight": value.astype("float32")}


def _holding(layer: Any, weight: np.ndarray) -> Any:
    """A torch layer with ``weight`` copied into its weight, in eval mode."""
    import torch

    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
    return layer.eval()


def _torch_linear(params: dict[str, np.ndarray]) -> Any:
    from torch import nn as tnn

    n_out, n_in = params["weight"].shape
    return _holding(tnn.Linear(n_in, n_out, bias=False), params["weight"])


def _torch_conv(params: dict[str, np.ndarray]) -> Any:
    from torch import nn as tnn

    c_out, c_in, k, _ = params["weight"].shape
    return _holding(tnn.Conv2d(c_in, c_out, k, padding=k // 2, bias=False), params["weight"])


def _numpy_matmul(params: dict[str, np.ndarray], x: np.ndarray) -> Callable[[], Any]:
    w_t = params["weight"].T  # a transposed view: OpenBLAS's sgemm takes it as it is
    return lambda: x @ w_t


def cases(quick: bool) -> list[Case]:
    image = 64 if quick else 224
    width = 0.5 if quick else 1.0
    lstm_size = 128 if quick else 256
    tr = dict(seq=32, d_model=64, heads=4, ff=256) if quick else \
        dict(seq=128, d_model=256, heads=4, ff=1024)
    vit = dict(image=64, patch=16, d_model=128, heads=4, ff=512, layers=2) if quick else \
        dict(image=224, patch=16, d_model=384, heads=6, ff=1536, layers=4)
    gpt = dict(seq=32, d_model=128, heads=4, ff=512, layers=2) if quick else \
        dict(seq=128, d_model=768, heads=12, ff=3072, layers=2)
    n = 256 if quick else 1024
    conv_c, conv_hw = (32, 28) if quick else (64, 56)

    def lstm() -> tuple[IRModule, dict[str, np.ndarray]]:
        return models.lstm(steps=32, input=lstm_size, hidden=lstm_size)

    return [
        Case("mlp1", "MLP 784-512-512-10, batch 1", lambda: models.mlp(batch=1),
             torch_models.torch_mlp, (1, 784)),
        Case("mlp64", "MLP 784-512-512-10, batch 64", lambda: models.mlp(batch=64),
             torch_models.torch_mlp, (64, 784)),
        Case("resnet18", f"ResNet-18, batch 1, {image}²",
             lambda: models.resnet18(image=image), torch_models.torch_resnet18,
             (1, 3, image, image)),
        Case("mobilenet_v2", f"MobileNetV2 (width {width}), batch 1, {image}²",
             lambda: models.mobilenet_v2(image=image, width=width),
             lambda p: torch_models.torch_mobilenet_v2(p, width=width), (1, 3, image, image)),
        Case("lstm", f"LSTM loop {lstm_size}-{lstm_size}, 32 steps", lstm,
             torch_models.torch_lstm, (32, 1, lstm_size)),
        Case("nn_lstm", f"nn.LSTM {lstm_size}-{lstm_size}, 32 steps (from_torch)", lstm,
             torch_models.torch_lstm, (32, 1, lstm_size), import_twin=True),
        Case("transformer", "transformer encoder, 4 layers, seq {seq}, d {d_model}".format(**tr),
             lambda: models.transformer_encoder(layers=4, **tr),
             lambda p: torch_models.torch_transformer_encoder(p, tr["heads"]),
             (1, tr["seq"], tr["d_model"])),
        Case("vit", "ViT-style, {layers} layers, d {d_model}, {image}², patch {patch}".format(
             **vit), lambda: models.vit_block(**vit),
             lambda p: torch_models.torch_vit_block(p, vit["heads"]),
             (1, 3, vit["image"], vit["image"])),
        Case("gpt", "GPT-style causal, {layers} layers, seq {seq}, d {d_model}".format(**gpt),
             lambda: models.gpt_block(**gpt),
             lambda p: torch_models.torch_gpt_block(p, gpt["heads"]),
             (1, gpt["seq"], gpt["d_model"])),
        Case("matmul", f"matmul {n}³", lambda: _matmul(n), _torch_linear, (n, n),
             numpy=_numpy_matmul),
        Case("conv", f"conv2d {conv_c}×{conv_hw}×{conv_hw} 3×3", lambda: _conv(conv_c, conv_hw),
             _torch_conv, (1, conv_c, conv_hw, conv_hw)),
    ]


@dataclass
class Workload:
    """A case built for every runtime and checked: ready to time."""

    case: Case
    runners: dict[str, Callable[[], Any]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    build_s: float = 0.0
    executor: str = ""
    skipped: str = ""  # why it is not timed


def prepare(case: Case, threads: int, kiln_from: str = "model") -> Workload:
    """Build kiln, the twin and ORT for a case and check that they agree with the twin;
    ``kiln_from="onnx"``: kiln imports the ONNX file ORT runs instead of building the model."""
    import torch

    work = Workload(case)
    mod, params = case.model()
    x = np.random.default_rng(1).standard_normal(case.input_shape).astype("float32")
    twin = case.twin(params)
    tx = torch.from_numpy(x)
    onnx_file = torch_models.onnx_model(twin, x)
    weights = params  # the twin's and numpy's, by the builder's names
    if kiln_from == "onnx":
        from kiln.frontend import from_onnx

        mod, params = from_onnx(onnx_file)
    elif case.import_twin:
        from kiln.frontend import from_torch

        try:
            mod, params = from_torch(twin, (tx,))
        except Exception as e:  # noqa: BLE001 - reported as the reason to skip the row
            work.skipped = f"from_torch could not import it: {type(e).__name__}: {e}"
            return work
    start = time.perf_counter()
    exe = kiln.build(mod, params=params)
    work.build_s = time.perf_counter() - start
    work.executor = exe.stats().executor

    def torch_call() -> Any:
        with torch.inference_mode():
            return twin(tx)

    work.runners = {"kiln": lambda: exe(x), "torch": torch_call,
                    "ort": torch_models.onnx_session(twin, x, threads, onnx_file)}
    if case.numpy is not None:
        work.runners["numpy"] = case.numpy(weights, x)
    want = torch_models.run_torch(twin, x)
    for name, f in work.runners.items():
        if name != "torch":
            work.errors[name] = torch_models.max_error(f(), want)
    bad = [f"{name} {e:.1e}" for name, e in work.errors.items() if e > RTOL]
    if bad:
        work.skipped = f"disagrees with torch beyond {RTOL:g}: {', '.join(bad)}"
    return work


@dataclass
class Timing:
    median: dict[str, float]
    p90: dict[str, float]
    calls: int


def time_rounds(runners: dict[str, Callable[[], Any]], repeat: int) -> Timing:
    """Interleaved rounds: each runtime in turn, after a pause and an untimed call, INNER calls.

    The runtimes' thread pools spin for a while after a parallel region; on 2 cores one that
    starts while another's workers still spin runs many times slower, hence the pause. The
    order turns by one each round, so that no runtime always follows the same one: a pool
    that spins longer than the pause keeps a core's vCPU awake for whoever comes next (in
    a VM, waking a halted vCPU takes 0.5-5 ms, longer than a small model's whole call).
    """
    times: dict[str, list[float]] = {name: [] for name in runners}
    first = next(iter(runners))
    deadline = time.perf_counter() + CASE_SECONDS
    names = list(runners)
    turn = 0
    while len(times[first]) < repeat:
        order = names[turn % len(names):] + names[:turn % len(names)]
        turn += 1
        for name in order:
            f = runners[name]
            time.sleep(0.05)
            f()
            for _ in range(INNER):
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        if time.perf_counter() > deadline:
            break
    return Timing({n: statistics.median(ts) for n, ts in times.items()},
                  {n: statistics.quantiles(ts, n=10)[-1] for n, ts in times.items()},
                  len(times[first]))


def time_condition(works: list[Workload], repeat: int, condition: str
                   ) -> list[tuple[Workload, Timing]]:
    """kiln, torch and ORT interleaved, workload by workload (numpy is timed apart)."""
    rows = []
    for work in works:
        print(f"  [{condition}] timing {work.case.title} ...", flush=True)
        runners = {n: f for n, f in work.runners.items() if n != "numpy"}
        rows.append((work, time_rounds(runners, repeat)))
    return rows


def time_numpy(rows: list[tuple[Workload, Timing]], repeat: int) -> None:
    """numpy's column, timed on its own, into the rows that have one.

    After OpenBLAS has run, kiln's parallel kernels run many times slower for a while (the
    256³ matmul: about 8 ms instead of 0.13 ms when it follows numpy in rounds, even after a
    50 ms pause; torch and ORT are not slowed), so numpy runs after every kiln timing.
    """
    for work, timing in rows:
        if "numpy" in work.runners:
            alone = time_rounds({"numpy": work.runners["numpy"]}, repeat)
            timing.median["numpy"] = alone.median["numpy"]
            timing.p90["numpy"] = alone.p90["numpy"]


SPIN = "while True:\n    pass\n"


@contextmanager
def one_core_busy() -> Iterator[int]:
    """A child process spinning a Python loop (no affinity set) until the block ends."""
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.5)  # let it start and take its core
        if child.poll() is not None:
            raise RuntimeError(f"the spinning child exited at once ({child.returncode})")
        yield child.pid
    finally:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def numpy_mlp(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """``models.mlp`` in numpy: dense + bias + relu per hidden layer, softmax."""
    h = x
    layers = len(weights) // 2
    for i in range(layers):
        h = h @ weights[2 * i].T + weights[2 * i + 1]
        if i < layers - 1:
            h = np.maximum(h, 0.0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def timed_after(f: Callable[[], Any], before: Callable[[], Any] | None, calls: int) -> float:
    """The median time of ``calls`` calls of ``f``, each right after an untimed call of
    ``before`` where given (after a pause and an untimed call of ``f``)."""
    time.sleep(0.05)
    f()
    ts = []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def alternating_with_numpy(runs: int, calls: int) -> list[tuple[float, float, float]]:
    """MLP batch 64, weights as arguments: kiln alone, then kiln each call after a numpy MLP.

    Per run: (kiln alone, kiln right after numpy, numpy alone), medians in seconds. Each run
    times kiln alone just before its alternation, once OpenBLAS's threads have gone to sleep
    (`OPENBLAS_SETTLE_S` after the last numpy call: kiln alone then takes what it takes
    before the process ever called OpenBLAS, 0.323-0.342 ms against 0.323-0.338 on the
    Emerald Rapids VM), so that the host's load, which moves from second to second, weighs
    on both alike (timing every run alone first, a slow minute of the host had made one
    after/alone 0.70 and another 1.31). numpy alone is timed once, at the end.
    """
    mod, params = models.mlp(batch=64)
    exe = kiln.build(mod)  # no params: the weights stay arguments
    weights = list(params.values())
    x = np.random.default_rng(1).standard_normal((64, 784)).astype("float32")
    got = exe(x, *weights)

    def kiln_call() -> Any:
        return exe(x, *weights)

    def numpy_call() -> Any:
        return numpy_mlp(weights, x)

    error = torch_models.max_error(got, numpy_mlp(weights, x))
    if error > RTOL:
        raise RuntimeError(f"kiln's MLP with weight arguments disagrees with numpy: {error:.1e}")
    pairs = []
    for _ in range(runs):
        time.sleep(OPENBLAS_SETTLE_S)
        alone = timed_after(kiln_call, None, calls)
        pairs.append((alone, timed_after(kiln_call, numpy_call, calls)))
    numpy_alone = timed_after(numpy_call, None, calls)
    return [(a, b, numpy_alone) for a, b in pairs]


def alternating_in_child(threads: int, calls: int, env: dict[str, str] | None = None
                         ) -> list[tuple[float, float, float]]:
    """`alternating_with_numpy` in a fresh process: one that has not run OpenBLAS yet
    (``env``: variables to set in it besides this process's)."""
    command = [sys.executable, os.path.abspath(__file__), "--alternating-child",
               "--threads", str(threads), "--repeat", str(calls)]
    proc = subprocess.run(command, capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})})
    return [tuple(run) for run in json.loads(proc.stdout.strip().splitlines()[-1])]


# OpenBLAS's idle threads sleep after 2^4 cycles instead of 2^28 (docs/runtime.md, "Right
# after numpy"): the alternation is run with it too, unless the caller set it already
QUICK_SLEEP = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def report(condition: str, rows: list[tuple[Workload, Timing]], skipped: list[Workload]) -> None:
    print(f"\n### condition: {condition}\n")
    print("| workload | kiln ms med (p90) | torch ms med (p90) | ORT ms med (p90) | "
          "numpy ms med (p90) | kiln/ORT | kiln/torch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for work, t in rows:
        cells = []
        for name in ("kiln", "torch", "ort", "numpy"):
            cells.append(f"{ms(t.median[name])} ({ms(t.p90[name])})" if name in t.median
                         else "–")
        vs_ort = t.median["kiln"] / t.median["ort"]
        ratios.append(vs_ort)
        print(f"| {work.case.title} | {' | '.join(cells)} | {vs_ort:.2f} | "
              f"{t.median['kiln'] / t.median['torch']:.2f} |")
    for work in skipped:
        print(f"| {work.case.title} | skipped: {work.skipped} | | | | | |")
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"\ngeomean kiln/ORT over {len(ratios)} workloads: **{geomean:.2f}** "
              f"(above 1: kiln slower)")


def report_busy_vs_idle(results: dict[str, list[tuple[Workload, Timing]]]) -> None:
    idle = {w.case.key: t for w, t in results["idle"]}
    print("\n### busy / idle (median time with one core busy over the idle median)\n")
    print("| workload | kiln | torch | ORT |")
    print("|---|---:|---:|---:|")
    for work, t in results["busy"]:
        base = idle.get(work.case.key)
        if base is None:
            continue
        cells = [f"{t.median[n] / base.median[n]:.2f}" for n in ("kiln", "torch", "ort")]
        print(f"| {work.case.title} | {' | '.join(cells)} |")


def machine(threads: int) -> None:
    """The CPU, the thread counts and the environment that changes the figures."""
    import onnxruntime as ort
    import torch

    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "?")
    except OSError:
        pass
    host = kiln.Target.host()
    print(f"CPU: {model}; kiln.Target.host(): cpu {host.cpu}, {host.vector_bits}-bit vectors, "
          f"{host.cores} cores; os.cpu_count() {os.cpu_count()}")
    print(f"threads: kiln {num_threads()} (idle workers awake {spin_ms():g} ms), "
          f"torch {torch.__version__} {torch.get_num_threads()}, "
          f"onnxruntime {ort.__version__} intra-op {threads}, numpy/OpenBLAS "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', '(all cores)')}")
    forced = {k: os.environ[k] for k in OPENBLAS_OVERRIDES if k in os.environ}
    if forced:
        print(f"note: {', '.join(f'{k}={v}' for k, v in forced.items())} is set: OpenBLAS uses "
              f"those kernels and cache sizes, not its own choice for this CPU, which slows "
              f"numpy (the matmul row's numpy column and the alternating check); "
              f"--unset-openblas runs without them")
    elif os.environ.get(REEXEC_MARK):
        print("note: running without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (--unset-openblas)")


def reexecute_if_needed(args: argparse.Namespace) -> None:
    """Run this script again with OpenBLAS's environment changed, which it reads at load."""
    if os.environ.get(REEXEC_MARK):
        return
    env = dict(os.environ)
    if args.unset_openblas:
        for k in OPENBLAS_OVERRIDES:
            env.pop(k, None)
    env.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    if env != dict(os.environ):
        env[REEXEC_MARK] = "1"
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


@contextmanager
def condition_context(condition: str) -> Iterator[None]:
    """Nothing for ``idle``; for ``busy``, a spinning child process while the block runs."""
    if condition != "busy":
        yield
        return
    with one_core_busy() as pid:
        print(f"  [busy] child {pid} spinning", flush=True)
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"timed calls of each runtime per workload (default {REPEAT}, "
                        "quick 10)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for kiln, torch, ORT and (if unset) OpenBLAS")
    parser.add_argument("--quick", action="store_true", help="reduced sizes, few repeats")
    parser.add_argument("--kiln-from", choices=("model", "onnx"), default="model",
                        help="kiln builds the kiln.testing model (default) or imports the "
                             "ONNX file that ONNX Runtime runs")
    parser.add_argument("--only", default="", help="comma-separated keys: " + ",".join(
        c.key for c in cases(False)) + ",numpy_alternating")
    parser.add_argument("--conditions", default="idle,busy", help="idle, busy or both")
    parser.add_argument("--spin-ms", type=float, default=None,
                        help="kiln's idle workers stay awake this long (default: kiln's, 0)")
    parser.add_argument("--unset-openblas", action="store_true",
                        help="run without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE")
    parser.add_argument("--alternating-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    reexecute_if_needed(args)
    if args.spin_ms is not None:
        os.environ["KILN_SPIN_MS"] = str(args.spin_ms)  # the alternating child's too
        set_spin_ms(args.spin_ms)
    repeat = args.repeat or (10 if args.quick else REPEAT)
    if args.alternating_child:  # prints the runs as JSON for the parent
        set_num_threads(args.threads)
        print(json.dumps(alternating_with_numpy(5, repeat)))
        return
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = set(conditions) - {"idle", "busy"}
    if unknown:
        parser.error(f"unknown conditions: {', '.join(sorted(unknown))} (idle, busy)")
    only = {k for k in args.only.split(",") if k}

    import torch

    torch.set_num_threads(args.threads)
    set_num_threads(args.threads)
    machine(args.threads)
    print(f"medians and p90 of up to {repeat} calls each, in blocks of {INNER}, interleaved; "
          f"at most {CASE_SECONDS:.0f} s a workload and condition")
    load_start = os.getloadavg()

    works = []
    for case in cases(args.quick):
        if only and case.key not in only:
            continue
        print(f"  building {case.title} ...", flush=True)
        work = prepare(case, args.threads, args.kiln_from)
        if work.skipped:
            print(f"    skipped: {work.skipped}")
        else:
            errors = ", ".join(f"{n} {e:.1e}" for n, e in work.errors.items())
            print(f"    kiln build {work.build_s:.1f} s ({work.executor}); max error vs torch: "
                  f"{errors}")
        works.append(work)
    ready = [w for w in works if not w.skipped]
    skipped = [w for w in works if w.skipped]
    if any("numpy" in w.runners for w in works):
        # the agreement check called numpy: let OpenBLAS's threads, which spin about 100 ms
        # after a call, go to sleep before the first timing (see time_numpy)
        time.sleep(OPENBLAS_SETTLE_S)

    results: dict[str, list[tuple[Workload, Timing]]] = {}
    for condition in conditions:
        with condition_context(condition):
            results[condition] = time_condition(ready, repeat, condition)
    # numpy last, condition by condition again: see time_numpy
    alternating: dict[str, list[tuple[str, list[tuple[float, float, float]]]]] = {}
    settings: list[tuple[str, dict[str, str] | None]] = [("OpenBLAS as it is", None)]
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        settings.append(("OPENBLAS_THREAD_TIMEOUT=4", QUICK_SLEEP))
    for condition in conditions:
        with condition_context(condition):
            time_numpy(results[condition], repeat)
            if not only or "numpy_alternating" in only:
                print(f"  [{condition}] MLP batch 64 alternating with numpy ...", flush=True)
                alternating[condition] = [
                    (name, alternating_in_child(args.threads, 10 if args.quick else 30, env))
                    for name, env in settings]

    for condition, rows in results.items():
        report(condition, rows, skipped)
        for setting, runs in alternating.get(condition, []):
            print(f"\nMLP batch 64 (weights as arguments) called alternately with numpy, "
                  f"{condition}, {setting}, in a fresh process: kiln alone / kiln right after "
                  f"numpy / numpy alone, medians in ms, per run")
            for solo, after, np_solo in runs:
                print(f"  {ms(solo)} / {ms(after)} / {ms(np_solo)}   after/alone "
                      f"{after / solo:.2f}")
            print(f"  median after/alone: {statistics.median(a / s for s, a, _ in runs):.2f}, "
                  f"worst {max(a / s for s, a, _ in runs):.2f}")
    if "idle" in results and "busy" in results:
        report_busy_vs_idle(results)
    print("\nload average (1, 5, 15 min) at start {:.1f} {:.1f} {:.1f}, at end {:.1f} {:.1f} "
          "{:.1f} on {} cores".format(*load_start, *os.getloadavg(), os.cpu_count()))


if __name__ == "__main__":
    main()
