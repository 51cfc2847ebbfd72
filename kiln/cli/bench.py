"""``kiln bench``: how fast a model runs, and with ``--profile`` where its time goes.

    kiln bench model.onnx                          median, p10, p90 latency and calls/s
    kiln bench model.rly --params w.npz --profile  and the per-kernel table (exe.profile)
    kiln bench model.kiln --inputs in.npz --repeat 200 --threads 1

A .rly or .onnx model is built first (``--params``, ``--opt-level``, ``--target`` as for
``kiln build``); a .kiln file runs as it was compiled. Inputs come from ``--inputs`` (as for
``kiln run``) or, when none are given, are random arrays of @main's parameter types, the same
on every run for one ``--seed``: floats from a standard normal distribution, integers
uniform in [0, 4) — valid as indices into any axis of at least 4 elements, as token ids and
as counts — and booleans uniform. A parameter of symbolic shape needs ``--inputs``.

After ``--warmup`` calls (untimed), ``--repeat`` calls are timed one by one with a monotonic
clock; the median, 10th and 90th percentiles are printed, and calls/s is the number of
calls over their total time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.cli.common import (
    Progress,
    add_debug,
    add_progress,
    add_trust,
    check_file,
    float_in,
    int_in,
    load_executable,
    read_model,
)
from kiln.cli.compile import build_model, compile_options
from kiln.cli.inputs import (
    INT_HIGH,
    Input,
    executable_inputs,
    model_inputs,
    random_inputs,
    read_inputs,
)
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.runtime.build import Executable

__all__ = ["INT_HIGH", "cmd_bench", "random_inputs"]  # random_inputs: kiln/cli/inputs.py

def _executable(args: argparse.Namespace, progress: Progress
                ) -> tuple[Executable, list[Any], str]:
    """The executable, its arguments (checked before a model is built), and where they came
    from."""

    def arguments(inputs: list[Input]) -> tuple[list[Any], str]:
        if args.inputs:
            return read_inputs(args.inputs, inputs), "inputs from " + args.inputs
        return random_inputs(inputs, args.seed, "bench"), f"random inputs (seed {args.seed})"

    if Path(args.model).suffix.lower() in (".rly", ".onnx"):
        check_file(args.params, "--params")
        model = read_model(args.model, args, "bench", progress)
        values, where = arguments(model_inputs(model))
        progress.step("building")
        return build_model(model, args, progress), values, where
    if Path(args.model).suffix.lower() != ".kiln":
        raise Error(f"{args.model}: kiln bench reads .rly, .onnx and .kiln files")
    if args.params:
        raise Error("--params binds weights when building: give it with a .rly or .onnx model")
    if args.target != "llvm":
        raise Error("--target chooses what a model is built for; a .kiln file is already "
                    "compiled")
    if not Path(args.model).is_file():
        raise Error(f"{args.model}: no such file")
    progress.step(f"loading {args.model}")
    exe = load_executable(args)
    if args.threads is not None:
        exe.set_threads(args.threads)
    values, where = arguments(executable_inputs(exe))
    return exe, values, where


def _percentile(sorted_times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(sorted_times), q))


def cmd_bench(args: argparse.Namespace) -> int:
    from kiln.codegen.threads import num_threads
    from kiln.target import Target

    check_file(args.inputs, "--inputs")
    progress = Progress(args.progress)
    exe, arguments, inputs = _executable(args, progress)
    progress.step(f"{args.warmup} warm-up calls")
    for _ in range(args.warmup):
        exe(*arguments)
    repeat = args.repeat
    budget = args.time_budget
    if repeat is None and budget is None:  # about a second's worth, from 10 to 1000 calls
        start = time.perf_counter()
        exe(*arguments)
        repeat = min(1000, max(10, int(1.0 / max(time.perf_counter() - start, 1e-6))))
    progress.step(f"{repeat} timed calls" if repeat is not None else
                  f"timed calls for {budget:g} s")
    times: list[float] = []
    began = time.perf_counter()
    while (len(times) < repeat if repeat is not None
           else time.perf_counter() - began < budget or len(times) < 3):
        start = time.perf_counter()
        exe(*arguments)
        times.append(time.perf_counter() - start)
    repeat = len(times)
    profile = None
    if args.profile:
        progress.step("profiling")
        profile = exe.profile(*arguments, repeat=repeat)
    nthreads = exe.threads
    times.sort()
    median = _percentile(times, 50)
    stats = exe.stats()
    target = exe.target
    machine = target.describe() if isinstance(target, Target) else str(target)
    count = nthreads if nthreads is not None else num_threads()
    if args.json:
        record = {"model": str(args.model), "signature": exe.signature, "calls": repeat,
                  "warmup": args.warmup, "threads": count, "inputs": inputs,
                  "executor": stats.executor, "kernels": stats.kernels, "target": machine,
                  "seconds": {"min": times[0], "median": median,
                              "p10": _percentile(times, 10), "p90": _percentile(times, 90),
                              "max": times[-1]},
                  "calls_per_second": repeat / sum(times)}
        if profile is not None:
            record["profile"] = [
                {"kernel": r.kernel, "calls": r.calls, "total_seconds": r.total,
                 "share": r.share, "flops": r.flops, "gflops": r.gflops,
                 "operators": list(r.ops), "source": r.location} for r in profile.rows]
        print(json.dumps(record, indent=2))
        return 0
    print(f"{args.model}: {exe.signature}")
    print(f"  {stats.kernels} kernels, {stats.executor} executor, "
          f"{count} thread{'s' if count != 1 else ''}, {inputs}")
    print(f"  target {machine}")
    print(f"  {repeat} calls after {args.warmup} warm-up: min {times[0] * 1e3:.3f} ms, "
          f"median {median * 1e3:.3f} ms, p10 {_percentile(times, 10) * 1e3:.3f} ms, "
          f"p90 {_percentile(times, 90) * 1e3:.3f} ms, {repeat / sum(times):.1f} calls/s")
    if profile is not None:
        print()
        print(profile)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="time a model; --profile: where the time goes, kernel by kernel",
        description="Build (or load) a model and time calls of it: median, 10th and 90th "
        "percentile latency and calls per second. Without --inputs, random inputs of @main's "
        "parameter types (floats standard normal, integers in [0, 4), seeded). --profile adds "
        "a table of every kernel: calls, total and mean time, share, FLOPs and GFLOP/s, its "
        "fused operators and its source location.")
    bench.add_argument("model", help="a Relay text file (.rly), an ONNX model (.onnx) or an "
                       "executable (.kiln)")
    bench.add_argument("--inputs", help="an .npz of the model's inputs (as for kiln run); "
                       "default: random inputs")
    budget = bench.add_mutually_exclusive_group()
    budget.add_argument("--repeat", type=int_in(1), metavar="N",
                        help="timed calls (default: about a second's worth, 10 to 1000)")
    budget.add_argument("--time-budget", type=float_in(0.0), metavar="SECONDS",
                        help="time calls for this long instead (at least 3 calls)")
    bench.add_argument("--warmup", type=int_in(0), default=3, metavar="N",
                       help="untimed calls first (default 3)")
    bench.add_argument("--threads", type=int_in(1), metavar="N",
                       help="threads a parallel loop may use (default: KILN_NUM_THREADS, else "
                       "every core)")
    bench.add_argument("--seed", type=int_in(0), default=0, metavar="N",
                       help="seed of the random inputs (default 0)")
    bench.add_argument("--profile", action="store_true",
                       help="also print the per-kernel profile table")
    bench.add_argument("--json", action="store_true",
                       help="print the figures (and the profile) as one JSON object")
    compile_options(bench)
    add_progress(bench)
    add_trust(bench)
    add_debug(bench)
    bench.set_defaults(run=cmd_bench)
