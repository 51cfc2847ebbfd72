"""``kiln import``: an ONNX model to Relay text.

kiln's text format has no place for named parameters — its metadata section holds constants,
referenced from the program as ``meta[relay.Constant][i]`` — so by default the weights are bound
into the program as constants, which the metadata section stores exactly (base64 of the bytes):
the text alone is the whole model, and ``kiln run`` / ``kiln build`` take it as it is. With
``--save-params weights.npz`` the weights stay parameters of ``@main`` after the graph's inputs
and go to that file instead, for ``--params weights.npz`` later.
"""

from __future__ import annotations

import argparse

import numpy as np

from kiln.cli.common import Progress, add_debug, add_progress, file_kind, import_onnx, write_text
from kiln.errors import Error


def cmd_import(args: argparse.Namespace) -> int:
    from kiln.text import astext

    file_kind(args.model, (".onnx",), "import")
    progress = Progress(args.progress)
    params_as = "params" if args.save_params else "constants"
    imported = import_onnx(args.model, progress, params_as=params_as)
    progress.step("printing Relay text")
    text = astext(imported.module)
    if args.save_params:
        try:
            np.savez(args.save_params, **imported.params)
        except OSError as e:
            raise Error(f"{args.save_params}: cannot write it ({e.strerror or e})") from None
    write_text(text, args.output)
    progress.step(f"wrote {args.output or 'stdout'} ({len(text):,} characters)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    imp = sub.add_parser("import", help="convert an ONNX model to Relay text",
                         description="Import an ONNX model and write it as Relay text. The "
                         "graph's inputs become @main's parameters; its weights are bound as "
                         "constants stored in the text's metadata section (or, with "
                         "--save-params, stay parameters and go to an .npz).")
    imp.add_argument("model", help="an ONNX model (.onnx)")
    imp.add_argument("-o", "--output", help="the Relay text file to write (default: stdout)")
    imp.add_argument("--save-params", metavar="NPZ", help="keep the weights as parameters of "
                     "@main and write them to this .npz (for --params of run, build, ...)")
    add_progress(imp)
    add_debug(imp)
    imp.set_defaults(run=cmd_import)
