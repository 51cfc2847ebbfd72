"""``kiln export``: a Relay or ONNX model as a C-callable shared library and its header."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.cli.common import Progress, add_debug, add_progress, check_file, int_in, read_model


def cmd_export(args: argparse.Namespace) -> int:
    from kiln.runtime.export import export_library

    check_file(args.params, "--params")
    progress = Progress(args.progress)
    model = read_model(args.model, args, "export", progress)
    out = args.output or str(Path(args.model).with_suffix(".so"))
    progress.step(f"exporting for {args.target}")
    lib = export_library(model.module, out, args.target, params=model.params or None,
                         opt_level=args.opt_level, name=args.name,
                         # an ONNX graph's own names; Relay's are @main's, as bound
                         input_names=model.input_names if model.kind == "onnx" else None,
                         output_names=model.output_names, cc=args.cc)
    print(f"kiln: wrote {lib.library} ({lib.library.stat().st_size} bytes, "
          f"{lib.weight_bytes} of them weights) and {lib.header} for {lib.target.triple}: "
          f"{lib.prototype}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="compile a model to a C-callable shared library",
        description="Compile a Relay text file or an ONNX model (its weights bound as "
        "constants) to a shared library with a C entry point, and write its header beside "
        "it: MODEL.so and MODEL.h, which a C program includes and links without Python. "
        "Only static programs (tensors of static shape) can be exported. See docs/export.md.")
    p.add_argument("model", help="a Relay text file (.rly) or an ONNX model (.onnx)")
    p.add_argument("-o", "--output", help="the library to write (default: MODEL.so); the "
                   "header gets the same name with .h")
    p.add_argument("--target", default="llvm",
                   help="the machine: 'llvm' (this one, the default), 'llvm -mattr=-avx512f', "
                   "'llvm -mcpu=NAME' or a triple such as 'aarch64-linux-gnu'")
    p.add_argument("--name", help="the C prefix of the functions and macros (default: the "
                   "output's file name, e.g. model_run)")
    p.add_argument("--params", help="an .npz of weights to bind to @main's parameters by name")
    p.add_argument("--opt-level", type=int_in(0, 4), default=3, metavar="N",
                   help="optimization level 0-4 (default 3)")
    p.add_argument("--cc", help="the C compiler that links (default: cc, or "
                   "TRIPLE-gcc for another architecture)")
    add_progress(p)
    add_debug(p)
    p.set_defaults(run=cmd_export)
