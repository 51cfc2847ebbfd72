"""The `kiln` command.

    kiln optimize model.rly                      the standard pipeline, Relay text out
    kiln optimize --passes fold-constant,fuse-ops model.rly -o out.rly
    kiln optimize --list                         every pass, with its opt level
    kiln build model.rly -o model.kiln           compile to an executable file
    kiln run model.kiln --inputs in.npz          run it (a .rly is built first)
    kiln show --level ssa model.rly              the program at a level: relay, fused, ssa, loops

Errors are one line on stderr and a non-zero exit status; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.runtime.build import Executable


def _read_module(path: str):  # noqa: ANN202
    from kiln.text import parse

    p = Path(path)
    if not p.is_file():
        raise Error(f"{path}: no such file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"{path}: cannot read it as text ({e})") from None
    return parse(text, source_name=str(path))


def _read_params(path: str | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise Error(f"{path}: cannot read parameters from it ({e})") from None


def cmd_optimize(args: argparse.Namespace) -> int:
    from kiln.text import astext
    from kiln.transform import DumpIR, PassContext, PassTimingInstrument, Sequential, get_pass
    from kiln.transform import list_passes as all_passes
    from kiln.transform.bind_params import bind_params
    from kiln.transform.pipeline import optimize

    if args.list:
        for info in all_passes():
            doc = info.doc.splitlines()[0] if info.doc else ""
            print(f"{info.name:<28} opt_level {info.opt_level}  {doc}")
        return 0
    if not args.model:
        raise Error("kiln optimize needs a model file (or --list)")
    mod = _read_module(args.model)
    params = _read_params(args.params)
    timing = PassTimingInstrument()
    instruments = [timing] if args.time else []
    if args.dump_before or args.dump_after:
        instruments.append(DumpIR(args.dump_before or [], args.dump_after or [], sys.stderr))
    disabled = [n for n in (args.disable or "").split(",") if n]
    with PassContext(opt_level=args.opt_level, disabled_pass=disabled, instruments=instruments,
                     debug=args.debug):
        if args.passes:
            if params:
                mod = bind_params(mod, params)
            names = [n.strip() for n in args.passes.split(",") if n.strip()]
            mod = Sequential([get_pass(n) for n in names], name="passes")(mod)
        else:
            mod = optimize(mod, opt_level=args.opt_level, params=params)
    text = astext(mod)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    if args.time:
        print(timing.render(), file=sys.stderr)
    return 0


def _build(path: str, args: argparse.Namespace) -> Executable:
    from kiln.runtime.build import build

    return build(_read_module(path), target=args.target, opt_level=args.opt_level,
                 params=_read_params(args.params))


def cmd_build(args: argparse.Namespace) -> int:
    exe = _build(args.model, args)
    out = args.output or str(Path(args.model).with_suffix(".kiln"))
    exe.save(out)
    if args.stats:
        print(exe.stats(), file=sys.stderr)
    print(f"kiln: wrote {out} ({Path(out).stat().st_size} bytes): {exe.signature}",
          file=sys.stderr)
    return 0


def _read_inputs(path: str | None, names: list[str]) -> tuple[list[np.ndarray], dict]:
    """Arrays by parameter name, or in order as numpy's savez names them (arr_0, ...)."""
    if path is None:
        if names:
            raise Error(f"the program takes {', '.join('%' + n for n in names)}: give them "
                        "with --inputs file.npz")
        return [], {}
    arrays = _read_params(path) or {}
    positional = [arrays.pop(f"arr_{i}") for i in range(len(arrays)) if f"arr_{i}" in arrays]
    return positional, arrays


def _flat_outputs(value: object, name: str = "output") -> dict[str, np.ndarray]:
    from kiln.eval.values import ConstructorValue

    out: dict[str, np.ndarray] = {}
    stack: list[tuple[str, object]] = [(name, value)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, np.ndarray):
            out[key] = v
        elif isinstance(v, tuple):
            stack.extend((f"{key}_{i}", f) for i, f in reversed(list(enumerate(v))))
        else:
            kind = v.name if isinstance(v, ConstructorValue) else type(v).__name__
            raise Error(f"{key} is a {kind} value, which an .npz file cannot hold")
    return dict(sorted(out.items()))


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from kiln.runtime.artifact import load

    if args.model.endswith(".rly"):
        exe = _build(args.model, args)
    else:
        if args.params:
            raise Error("--params binds weights when building: give it with a .rly model")
        exe = load(args.model)
    names = [p.hint for p in exe.program.main.params]
    positional, named = _read_inputs(args.inputs, names)
    start = time.perf_counter()
    result = exe(*positional, **named)
    elapsed = time.perf_counter() - start
    if args.output:
        outputs = _flat_outputs(result)
        try:
            np.savez(args.output, **outputs)
        except OSError as e:
            raise Error(f"{args.output}: cannot write it ({e.strerror or e})") from None
    else:
        try:
            outputs = _flat_outputs(result)
        except Error:
            print(repr(result))
        else:
            with np.printoptions(threshold=20, edgeitems=3, precision=5):
                for key, v in outputs.items():
                    print(f"{key}: {v.dtype}{list(v.shape)} = {v}")
    if args.time:
        print(f"kiln: ran in {elapsed * 1e3:.3f} ms", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from kiln.infer import infer_types
    from kiln.ssa import lower_kernels, lower_module, plan_memory
    from kiln.text import astext
    from kiln.transform.pipeline import optimize

    mod = _read_module(args.model)
    if args.level == "relay":
        text = astext(infer_types(mod))
    else:
        fused = optimize(mod, opt_level=args.opt_level, params=_read_params(args.params))
        if args.level == "fused":
            text = astext(fused)
        else:
            program = lower_module(fused)
            plan = plan_memory(program)
            if args.level == "ssa":
                text = f"{program}\n// {plan}\n"
            else:
                lower_kernels(program)
                text = "\n\n".join(
                    str(k.kernel) if k.kernel is not None else
                    f"// kernel @{k.name} has symbolic shapes: it is lowered for the shapes "
                    "it meets when run" for k in program.kernels.values()) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _compile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", help="an .npz of weights to bind to @main's parameters by name")
    p.add_argument("--opt-level", type=int, default=3, choices=range(5), metavar="N",
                   help="optimization level 0-4 (default 3)")
    p.add_argument("--target", default="llvm", choices=("llvm", "evaluator"),
                   help="llvm: machine code (default); evaluator: the loop-IR interpreter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks, and type-check after every pass")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    opt = sub.add_parser("optimize", help="optimize a Relay program",
                         description="Run kiln's optimization passes on a Relay text file.")
    opt.add_argument("model", nargs="?", help="a Relay text file (.rly)")
    opt.add_argument("--passes", help="comma-separated pass names (default: the standard "
                     "pipeline of kiln.optimize)")
    opt.add_argument("--opt-level", type=int, default=3, help="optimization level (default 3)")
    opt.add_argument("--disable", help="comma-separated pass names to skip")
    opt.add_argument("--params", help="an .npz of weights to bind to @main's parameters by name")
    opt.add_argument("-o", "--output", help="write the result here instead of stdout")
    opt.add_argument("--list", action="store_true", help="list every pass and exit")
    opt.add_argument("--time", action="store_true", help="report the time each pass takes")
    opt.add_argument("--dump-before", action="append", metavar="PASS",
                     help="print the IR before this pass ('*' for all)")
    opt.add_argument("--dump-after", action="append", metavar="PASS",
                     help="print the IR after this pass ('*' for all)")
    opt.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="show tracebacks, and type-check after every pass")
    opt.set_defaults(run=cmd_optimize)

    bld = sub.add_parser("build", help="compile a Relay program to an executable file",
                         description="Optimize, fuse, lower and compile a Relay program; write "
                         "one file that `kiln run` (or kiln.load) runs without recompiling.")
    bld.add_argument("model", help="a Relay text file (.rly)")
    bld.add_argument("-o", "--output", help="the executable to write (default: MODEL.kiln)")
    _compile_options(bld)
    bld.add_argument("--stats", action="store_true", help="print kernels, memory and times")
    bld.set_defaults(run=cmd_build)

    run = sub.add_parser("run", help="run an executable (or a .rly, built first)",
                         description="Run @main of a compiled executable on inputs from an "
                         ".npz file (arrays named after the parameters, or arr_0, arr_1, ... "
                         "in order).")
    run.add_argument("model", help="an executable (.kiln) or a Relay text file (.rly)")
    run.add_argument("--inputs", help="an .npz of the arguments of @main")
    run.add_argument("-o", "--output", help="write the results to this .npz (output, or "
                     "output_0, output_1, ... for a tuple) instead of printing them")
    run.add_argument("--time", action="store_true", help="report how long the call took")
    _compile_options(run)
    run.set_defaults(run=cmd_run)

    show = sub.add_parser("show", help="print a program at one level of the compiler",
                          description="Print a Relay program as kiln sees it at a level: "
                          "relay (typed text), fused (after kiln.optimize), ssa (the SSA "
                          "program with its memory plan), loops (the loop IR of each kernel).")
    show.add_argument("model", help="a Relay text file (.rly)")
    show.add_argument("--level", required=True, choices=("relay", "fused", "ssa", "loops"),
                      help="which level to print")
    show.add_argument("-o", "--output", help="write the text here instead of stdout")
    show.add_argument("--params", help="an .npz of weights to bind to @main's parameters")
    show.add_argument("--opt-level", type=int, default=3, choices=range(5), metavar="N",
                      help="optimization level 0-4 (default 3)")
    show.set_defaults(run=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except Error as e:
        if args.debug:
            raise
        first = e.render().splitlines()[0] if e.render() else type(e).__name__
        print(f"kiln: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
