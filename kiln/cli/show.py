"""``kiln show``: a model at one level of the compiler, or an ONNX model's summary.

``kiln show model.onnx`` summarizes the file (`kiln.frontend.onnx.summary`, which reads the
model without converting it); ``--level`` prints a Relay
program or an imported ONNX model as kiln sees it: ``relay`` (typed text), ``fused`` (after
kiln.optimize, weights bound), ``ssa`` (the SSA program and its memory plan) or ``loops`` (each
kernel's loop IR). A compiled executable (.kiln) shows its signature and SSA program. Relay
text is for reading: a constant of more than a few elements (a weight) is shown by its dtype
and shape only unless ``--show-constants`` (``kiln import`` and ``kiln optimize -o`` write
text that parses).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kiln.cli.common import (
    ELIDE_CONSTANTS,
    Progress,
    add_debug,
    add_progress,
    add_show_constants,
    add_trust,
    check_file,
    file_kind,
    int_in,
    load_executable,
    read_model,
    write_text,
)
from kiln.errors import Error

if TYPE_CHECKING:
    import numpy as np

    from kiln.ir.module import IRModule

LEVELS = ("relay", "fused", "ssa", "loops")


def level_text(mod: IRModule, params: dict[str, np.ndarray], level: str,
               opt_level: int, elide_constants: int | None = None) -> str:
    """The text of a module at ``level`` (``params`` bound from ``fused`` on; Relay text with
    `astext`'s ``elide_constants``)."""
    from kiln.infer import infer_types
    from kiln.runtime.backend import lower
    from kiln.text import astext
    from kiln.transform.pipeline import optimize

    if level == "relay":
        return astext(infer_types(mod), elide_constants=elide_constants)
    if level == "fused":
        return astext(optimize(mod, opt_level=opt_level, params=params or None),
                      elide_constants=elide_constants)
    low = lower(mod, opt_level=opt_level, params=params or None,
                upto="plan-memory" if level == "ssa" else "decompose-math")
    program = low.program
    if level == "ssa":
        return f"{program}\n// {low.plan}\n"
    return "\n\n".join(
        str(k.kernel) if k.kernel is not None else
        f"// kernel @{k.name} has symbolic shapes: it is lowered for the shapes "
        "it meets when run" for k in program.kernels.values()) + "\n"


def cmd_show(args: argparse.Namespace) -> int:
    kind = file_kind(args.model, (".rly", ".onnx", ".kiln"), "show")
    if kind == ".kiln":

        if args.level not in (None, "ssa"):
            raise Error(f"{args.model} is a compiled executable: kiln show prints its SSA "
                        f"program (--level ssa), not --level {args.level}")
        exe = load_executable(args)
        write_text(f"// {exe.signature}\n{exe.program}\n", args.output)
        return 0
    if kind == ".onnx" and args.level is None:
        from kiln.frontend.onnx.summary import summary

        write_text(summary(args.model), args.output)
        return 0
    check_file(args.params, "--params")
    model = read_model(args.model, args, "show", Progress(args.progress))
    elide = None if args.show_constants else ELIDE_CONSTANTS
    write_text(level_text(model.module, model.params, args.level or "relay", args.opt_level,
                          elide), args.output)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    show = sub.add_parser("show", help="summarize a model, or print it at one level of the "
                          "compiler",
                          description="Without --level: an ONNX model's summary (inputs, "
                          "outputs, operators with counts, parameter count, types), a Relay "
                          "program's typed text, an executable's SSA program. With --level: "
                          "relay (typed text), fused (after kiln.optimize, weights bound), ssa "
                          "(the SSA program with its memory plan), loops (the loop IR of each "
                          "kernel).")
    show.add_argument("model", help="an ONNX model (.onnx), a Relay text file (.rly) or an "
                      "executable (.kiln)")
    show.add_argument("--level", choices=LEVELS, help="which level to print")
    show.add_argument("-o", "--output", help="write the text here instead of stdout")
    show.add_argument("--params", help="an .npz of weights to bind to @main's parameters")
    show.add_argument("--opt-level", type=int_in(0, 4), default=3, metavar="N",
                      help="optimization level 0-4 (default 3)")
    add_show_constants(show, "by default")
    add_progress(show)
    add_trust(show)
    add_debug(show)
    show.set_defaults(run=cmd_show)


