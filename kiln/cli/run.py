"""``kiln run``: a compiled executable, a Relay program or an ONNX model on inputs from an .npz.

Inputs are found by name — the parameter names of ``@main``, or for an ONNX model the graph's
input names — or in order as numpy's ``savez`` names unnamed arrays (``arr_0``, ``arr_1``, ...).
A missing or unknown name is an error before anything runs; the executable checks dtypes and
shapes. Results are printed (shape, dtype, a few values) or written to an .npz, named after the
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
    flat_outputs,
    read_model,
    read_npz,
)
from kiln.cli.compile import build_model, compile_options
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.runtime.build import Executable


def arrange_inputs(path: str | None, user_names: list[str], kiln_names: list[str]
                   ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The arrays of ``path`` as positional and keyword arguments of @main (kiln's names)."""
    shown = ", ".join(repr(n) for n in user_names)
    if path is None:
        if user_names:
            raise Error(f"the model takes inputs {shown}: give them with --inputs file.npz")
        return [], {}
    arrays = read_npz(path, "inputs") or {}
    positional: list[np.ndarray] = []
    while f"arr_{len(positional)}" in arrays:
        positional.append(arrays.pop(f"arr_{len(positional)}"))
    if len(positional) > len(user_names):
        raise Error(f"{path} has {len(positional)} unnamed arrays (arr_0, ...), but the model "
                    f"takes {len(user_names)} inputs: {shown or 'none'}")
    to_kiln = dict(zip(user_names, kiln_names)) | dict(zip(kiln_names, kiln_names))
    named: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key not in to_kiln:
            raise Error(f"{path} has an array {key!r}, which is not an input of the model "
                        f"(its inputs: {shown or 'none'})")
        named[to_kiln[key]] = value
    given = set(kiln_names[:len(positional)]) | set(named)
    missing = [u for u, k in zip(user_names, kiln_names) if k not in given]
    if missing:
        raise Error(f"{path} lacks input{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(repr(m) for m in missing)} (the model takes {shown})")
    twice = [u for u, k in zip(user_names, kiln_names[:len(positional)]) if k in named]
    if twice:
        raise Error(f"{path} gives input {twice[0]!r} twice: by position and by name")
    return positional, named


def output_arrays(exe: Executable, result: object) -> dict[str, np.ndarray]:
    """A result as named arrays: each output by its name (``exe.outputs``), the fields of a
    tuple in it as ``name_0``, ``name_1``, ..."""
    out: dict[str, np.ndarray] = {}
    for name, value in exe.named_outputs(result).items():
        out.update(flat_outputs(value, [name]))
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from kiln.runtime.artifact import load

    progress = Progress(args.progress)
    suffix = Path(args.model).suffix.lower()
    if suffix in (".rly", ".onnx"):
        model = read_model(args.model, args, "run", progress)
        progress.step("building")
        exe = build_model(model, args)
    else:
        if args.params:
            raise Error("--params binds weights when building: give it with a .rly or .onnx "
                        "model")
        if not Path(args.model).is_file():
            raise Error(f"{args.model}: no such file")
        exe = load(args.model)
    # Weights are bound when building: what remains of @main's parameters are the inputs,
    # known by the model's own names (an ONNX graph's, kept in .rly and .kiln files too).
    kiln_names = [p.hint for p in exe.program.main.params]
    user_names = [i.name for i in exe.inputs]
    positional, named = arrange_inputs(args.inputs, user_names, kiln_names)
    progress.step("running")
    start = time.perf_counter()
    result = exe(*positional, **named)
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
    run.add_argument("--inputs", help="an .npz of the model's inputs")
    run.add_argument("-o", "--output", help="write the results to this .npz (named after the "
                     "model's outputs, such as an ONNX graph's; else output, or output_0, "
                     "output_1, ... for a tuple) instead of printing them")
    run.add_argument("--time", action="store_true", help="report how long the call took")
    compile_options(run)
    add_progress(run)
    add_debug(run)
    run.set_defaults(run=cmd_run)
