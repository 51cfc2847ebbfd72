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
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.cli.common import Progress, add_debug, add_progress, read_model
from kiln.cli.compile import build_model, compile_options
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.ir.ty import Type
    from kiln.runtime.build import Executable

INT_HIGH = 4  # random integer inputs are drawn from [0, INT_HIGH)


def random_inputs(exe: Executable, seed: int) -> list[Any]:
    """Random arguments for @main of ``exe`` (the rule in this module's docstring)."""
    from kiln.ir.ty import TensorType, TupleType
    from kiln.text.printer import type_text

    rng = np.random.default_rng(seed)

    def tensor(t: TensorType, name: str) -> np.ndarray:
        if not t.is_static:
            raise Error(f"@main's parameter %{name} has type {type_text(t)}, of symbolic "
                        "shape: give its inputs with --inputs file.npz")
        shape, dtype = t.static_shape, np.dtype(t.dtype)
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        if dtype.kind in "iu":
            return rng.integers(0, INT_HIGH, shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(bool)
        raise Error(f"@main's parameter %{name} is a {t.dtype} tensor, which kiln bench "
                    "cannot make up: give its inputs with --inputs file.npz")

    args: list[Any] = []
    for p in exe.program.main.params:
        # A tuple parameter: its fields in order, rebuilt bottom-up (no recursion).
        made: list[Any] = []
        stack: list[tuple[Type, bool]] = [(p.type, False)]
        while stack:
            t, ready = stack.pop()
            if isinstance(t, TupleType):
                if ready:
                    n = len(t.fields)
                    fields = tuple(made[len(made) - n:]) if n else ()
                    del made[len(made) - n:]
                    made.append(fields)
                else:
                    stack.append((t, True))
                    stack.extend((f, False) for f in reversed(t.fields))
            elif isinstance(t, TensorType):
                made.append(tensor(t, p.hint))
            else:
                raise Error(f"@main's parameter %{p.hint} has type {type_text(p.type)}, which "
                            "kiln bench cannot make up: give its inputs with --inputs file.npz")
        args.append(made[0])
    return args


def _executable(args: argparse.Namespace, progress: Progress
                ) -> tuple[Executable, list[str], list[str]]:
    """The executable, and the names a user gives its inputs by beside kiln's names."""
    from kiln.runtime.artifact import load

    if Path(args.model).suffix.lower() in (".rly", ".onnx"):
        model = read_model(args.model, args, "bench", progress)
        progress.step("building")
        exe = build_model(model, args)
        kiln_names = [p.hint for p in exe.program.main.params]
        return exe, model.input_names if model.kind == "onnx" else kiln_names, kiln_names
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
    exe = load(args.model)
    names = [p.hint for p in exe.program.main.params]
    return exe, names, names


def _percentile(sorted_times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(sorted_times), q))


def cmd_bench(args: argparse.Namespace) -> int:
    from kiln.cli.run import arrange_inputs
    from kiln.codegen.threads import num_threads, threads
    from kiln.target import Target

    for flag, value, least in (("--repeat", args.repeat, 1), ("--warmup", args.warmup, 0),
                               ("--threads", args.threads, 1)):
        if value is not None and value < least:
            raise Error(f"{flag} must be at least {least}, got {value}")
    progress = Progress(args.progress)
    exe, user_names, kiln_names = _executable(args, progress)
    if args.inputs:
        positional, named = arrange_inputs(args.inputs, user_names, kiln_names)
        inputs = "inputs from " + args.inputs
    else:
        positional, named = random_inputs(exe, args.seed), {}
        inputs = f"random inputs (seed {args.seed})"
    nthreads = args.threads
    with threads(nthreads) if nthreads is not None else contextlib.nullcontext():
        progress.step(f"{args.warmup} warm-up calls")
        for _ in range(args.warmup):
            exe(*positional, **named)
        repeat = args.repeat
        if repeat is None:  # about a second's worth, from 10 to 1000 calls
            start = time.perf_counter()
            exe(*positional, **named)
            repeat = min(1000, max(10, int(1.0 / max(time.perf_counter() - start, 1e-6))))
        progress.step(f"{repeat} timed calls")
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            exe(*positional, **named)
            times.append(time.perf_counter() - start)
        profile = None
        if args.profile:
            progress.step("profiling")
            profile = exe.profile(*positional, repeat=repeat, **named)
    times.sort()
    median = _percentile(times, 50)
    stats = exe.stats()
    target = exe.target
    machine = target.describe() if isinstance(target, Target) else str(target)
    print(f"{args.model}: {exe.signature}")
    count = nthreads if nthreads is not None else num_threads()
    print(f"  {stats.kernels} kernels, {stats.executor} executor, "
          f"{count} thread{'s' if count != 1 else ''}, {inputs}")
    print(f"  target {machine}")
    print(f"  {repeat} calls after {args.warmup} warm-up: median {median * 1e3:.3f} ms, "
          f"p10 {_percentile(times, 10) * 1e3:.3f} ms, p90 {_percentile(times, 90) * 1e3:.3f} ms, "
          f"{repeat / sum(times):.1f} calls/s")
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
    bench.add_argument("--repeat", type=int, metavar="N",
                       help="timed calls (default: about a second's worth, 10 to 1000)")
    bench.add_argument("--warmup", type=int, default=3, metavar="N",
                       help="untimed calls first (default 3)")
    bench.add_argument("--threads", type=int, metavar="N",
                       help="threads a parallel loop may use (default: KILN_NUM_THREADS, else "
                       "every core)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs "
                       "(default 0)")
    bench.add_argument("--profile", action="store_true",
                       help="also print the per-kernel profile table")
    compile_options(bench)
    add_progress(bench)
    add_debug(bench)
    bench.set_defaults(run=cmd_bench)
