"""``kiln run``: a compiled executable, a Relay program or an ONNX model on inputs from an .npz.

Inputs are found by name — the parameter names of ``@main``, or for an ONNX model the graph's
input names — or in order as numpy's ``savez`` names unnamed arrays (``arr_0``, ``arr_1``,
...); ``--random`` makes them up from @main's parameter types instead (kiln/cli/inputs.py). A
missing or unknown name, a wrong dtype or shape is an error before anything is compiled.
Results are printed (shape, dtype, a few values) or written to an .npz, named after the
model's outputs (``exe.outputs``: an ONNX graph's output names, which .rly and .kiln files made
from it keep), else ``output`` (``output_0``, ``output_1``, ... for a tuple).
"""

from __future__ import annotations

import argparse
import sys
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
    flat_outputs,
    int_in,
    load_executable,
    read_model,
)
from kiln.cli.compile import build_model, compile_options
from kiln.cli.inputs import executable_inputs, model_inputs, random_inputs, read_inputs
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.runtime.build import Executable


def output_arrays(exe: Executable, result: object) -> dict[str, np.ndarray]:
    """A result as named arrays: each output by its name (``exe.outputs``), the fields of a
    tuple in it as ``name_0``, ``name_1``, ..."""
    out: dict[str, np.ndarray] = {}
    for name, value in exe.named_outputs(result).items():
        out.update(flat_outputs(value, [name]))
    return out


def cmd_run(args: argparse.Namespace) -> int:

    check_file(args.inputs, "--inputs")
    progress = Progress(args.progress)
    suffix = Path(args.model).suffix.lower()
    if suffix in (".rly", ".onnx"):
        check_file(args.params, "--params")
        model = read_model(args.model, args, "run", progress)
        # The inputs are checked against @main's types before the (long) build.
        inputs = model_inputs(model)
        arguments = (random_inputs(inputs, args.seed, "run") if args.random
                     else read_inputs(args.inputs, inputs))
        progress.step("building")
        exe = build_model(model, args, progress)
    else:
        if args.params:
            raise Error("--params binds weights when building: give it with a .rly or .onnx "
                        "model")
        if not Path(args.model).is_file():
            raise Error(f"{args.model}: no such file")
        exe = load_executable(args)
        if args.threads is not None:
            exe.set_threads(args.threads)
        inputs = executable_inputs(exe)
        arguments = (random_inputs(inputs, args.seed, "run") if args.random
                     else read_inputs(args.inputs, inputs))
    progress.step("running")
    start = time.perf_counter()
    result = exe(*arguments)
    elapsed = time.perf_counter() - start
    if args.output:
        outputs = output_arrays(exe, result)
        try:
            # (as dict[str, Any]: savez's stub would check every key against allow_pickle)
            arrays: dict[str, Any] = outputs
            np.savez(args.output, **arrays)
        except OSError as e:
            raise Error(f"{args.output}: cannot write it ({e.strerror or e})") from None
    else:
        try:
            outputs = output_arrays(exe, result)
        except Error:
            print(repr(result))
        else:
            with np.printoptions(threshold=20, edgeitems=3, precision=5):
                for key, v in outputs.items():
                    print(f"{key}: {v.dtype}{list(v.shape)} = {v}")
    if args.time:
        print(f"kiln: ran in {elapsed * 1e3:.3f} ms", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run an executable, a Relay program or an ONNX model",
                         description="Run @main of a compiled executable (.kiln), or of a Relay "
                         "program or ONNX model built first, on inputs from an .npz file: arrays "
                         "named after the inputs (an ONNX graph's input names, or @main's "
                         "parameter names), or arr_0, arr_1, ... in order.")
    run.add_argument("model", help="an executable (.kiln), a Relay text file (.rly) or an ONNX "
                     "model (.onnx)")
    given = run.add_mutually_exclusive_group()
    given.add_argument("--inputs", help="an .npz of the model's inputs")
    given.add_argument("--random", action="store_true",
                       help="random inputs of @main's parameter types instead (floats standard "
                       "normal, integers in [0, 4), booleans uniform; seeded by --seed)")
    run.add_argument("--seed", type=int_in(0), default=0, metavar="N",
                     help="seed of --random's inputs (default 0)")
    run.add_argument("--threads", type=int_in(1), metavar="N",
                     help="threads a parallel loop may use (default: KILN_NUM_THREADS, else "
                     "every core)")
    run.add_argument("-o", "--output", help="write the results to this .npz (named after the "
                     "model's outputs, such as an ONNX graph's; else output, or output_0, "
                     "output_1, ... for a tuple) instead of printing them")
    run.add_argument("--time", action="store_true", help="report how long the call took")
    compile_options(run)
    add_trust(run)
    add_progress(run)
    add_debug(run)
    run.set_defaults(run=cmd_run)
