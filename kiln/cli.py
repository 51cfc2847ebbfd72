"""The `kiln` command.

    kiln optimize model.rly                      the standard pipeline, Relay text out
    kiln optimize --passes fold-constant,fuse-ops model.rly -o out.rly
    kiln optimize --list                         every pass, with its opt level

Errors are one line on stderr and a non-zero exit status; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kiln.errors import Error


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
