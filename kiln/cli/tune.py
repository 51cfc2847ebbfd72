"""``kiln tune``: search a model's kernel schedules on this machine, into a tuning log.

    kiln tune model.onnx -o model.tunelog --budget 120s
    kiln build model.onnx --tuning-log model.tunelog      (also kiln run, kiln bench)

The model (.rly or .onnx, ``--params`` as for ``kiln build``) is built and profiled on random
inputs, then its kernels are tuned for about ``--budget`` (``90``, ``90s``, ``2m``), split by
their share of its time (kiln/tune/tuner.py). A progress line shows the kernels done, the
best speedup so far (of the model's kernel time, estimated) and the time left; Ctrl-C stops
the search and keeps what was found (each entry is flushed as it is found). At the end, a
table of each kernel's default and tuned time and how long the search took to find it.
An existing log is appended to.
"""

from __future__ import annotations

import argparse
import sys

from kiln.cli.common import Progress, add_debug, add_progress, check_file, read_model
from kiln.cli.compile import compile_options
from kiln.errors import Error


def parse_budget(text: str) -> float:
    """Seconds from ``120``, ``120s``, ``2m`` or ``1.5h``."""
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}
    value = text.strip().lower()
    unit = 1.0
    if value and value[-1] in scale:
        unit, value = scale[value[-1]], value[:-1]
    try:
        seconds = float(value) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time budget (seconds, or with s, m or h: 90, 90s, 2m)") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"the budget must be at least 0 s, not {text!r}")
    return seconds


class _Line:
    """The progress line: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.last = -1.0

    def __call__(self, p: object) -> None:
        from kiln.tune import TuneProgress

        assert isinstance(p, TuneProgress)
        if not self.progress.enabled:
            return
        text = (f"kiln: tuning kernels {p.kernels_done}/{p.kernels_total}, best speedup "
                f"{p.best_speedup:.2f}x, {p.seconds_left:.0f} s left")
        stream = self.progress.stream
        if self.progress.tty:
            end = "\n" if p.kernels_done == p.kernels_total else ""
            print(f"\r{text}\033[K", end=end, file=stream, flush=True)
        elif p.kernels_done == p.kernels_total or int(p.seconds_left) // 10 != self.last:
            self.last = int(p.seconds_left) // 10
            print(text, file=stream, flush=True)


def cmd_tune(args: argparse.Namespace) -> int:
    from kiln.tune import tune

    check_file(args.params, "--params")
    if args.target == "evaluator":
        raise Error("kiln tune measures machine code; --target evaluator has nothing to tune")
    progress = Progress(args.progress)
    model = read_model(args.model, args, "tune", progress)
    out = args.output or str(_default_log(args.model))
    progress.step(f"tuning for {args.budget:g} s into {out}")
    try:
        result = tune(model.module, model.params or None, budget_s=args.budget, log=out,
                      target=args.target, progress=_Line(progress), seed=args.seed)
    except KeyboardInterrupt:
        print(f"\nkiln: interrupted; what was found is kept in {out}", file=sys.stderr)
        return 130
    print(result)
    for key in result.skipped:
        print(f"kiln: not tunable alone, left at its default: {key}", file=sys.stderr)
    return 0


def _default_log(model: str) -> str:
    from pathlib import Path

    return str(Path(model).with_suffix(".tunelog"))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="search a model's kernel schedules into a tuning log",
                       description="Build a Relay or ONNX model, profile it, and search the "
                       "schedules of its kernels on this machine for about --budget, each "
                       "kernel by its share of the model's time; every candidate is compiled "
                       "alone and checked against the default schedule's result. The best "
                       "schedules go to a tuning log (JSON lines) that kiln build/run/bench "
                       "--tuning-log, kiln.build(tuning_log=) and KILN_TUNING_LOG use.")
    p.add_argument("model", help="a Relay text file (.rly) or an ONNX model (.onnx)")
    p.add_argument("-o", "--output", help="the tuning log to write or append to "
                   "(default: MODEL.tunelog)")
    p.add_argument("--budget", type=parse_budget, default=120.0, metavar="TIME",
                   help="time to spend searching: 120, 120s, 2m (default 120 s)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the random inputs and of the random search (default 0)")
    compile_options(p, tuning_log=False)
    add_progress(p)
    add_debug(p)
    p.set_defaults(run=cmd_tune)
