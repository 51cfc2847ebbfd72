"""The `kiln` command.

    kiln import model.onnx -o model.rly           ONNX → Relay text (weights in its metadata)
    kiln show model.onnx                          an ONNX model's summary
    kiln show --level ssa model.rly               the program at a level: relay, fused, ssa, loops
    kiln run model.onnx --inputs in.npz           import, build and run (also .rly and .kiln)
    kiln graph model.onnx -o model.svg            a picture of the graph, fused groups outlined
    kiln optimize model.rly                       the standard pipeline, Relay text out
    kiln optimize --passes fold-constant,fuse-ops model.rly -o out.rly
    kiln optimize --list                          every pass, with its opt level
    kiln build model.rly -o model.kiln            compile to an executable file
    kiln bench model.onnx --profile               latency, and the time of every kernel
    kiln export model.onnx -o model.so            a C-callable shared library and model.h

One file per subcommand. Errors are one line on stderr and a non-zero exit status: 1 for a
kiln.Error (a bad file, model or input), 2 for bad arguments, 3 for a bug in kiln (an
InternalError or any other exception); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kiln.cli import bench, export, graph, import_cmd, run, show
from kiln.cli import compile as compile_cmd
from kiln.errors import Error, InternalError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks, and type-check after every pass")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import_cmd.add_parser(sub)
    show.add_parser(sub)
    run.add_parser(sub)
    graph.add_parser(sub)
    compile_cmd.add_parsers(sub)
    export.add_parser(sub)
    bench.add_parser(sub)
    return parser


def one_line(err: Error) -> str:
    """An error as one line: its first line when it points at source, else all lines joined."""
    text = err.render() or type(err).__name__
    if err.span is not None:
        return text.splitlines()[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()).replace(
        ":;", ":")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kiln`` command with ``argv`` (default: sys.argv); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.debug:
            raise
        if isinstance(e, InternalError) or not isinstance(e, Error):
            # A bug in kiln: still one line, but said to be one, with its status of its own.
            what = e.message if isinstance(e, Error) else f"{type(e).__name__}: {e}"
            print(f"kiln: internal error, a bug in kiln: {' '.join(str(what).split())[:400]} "
                  "(run with --debug for the traceback)", file=sys.stderr)
            return 3
        print(f"kiln: {one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
