"""The `kiln` command.

    kiln import model.onnx -o model.rly           ONNX → Relay text (weights in its metadata)
    kiln show model.onnx                          an ONNX model's summary
    kiln show --level ssa model.rly               the program at a level: relay, fused, ssa, loops
    kiln run model.onnx --inputs in.npz           import, build and run (also .rly and .kiln)
    kiln run model.onnx --random --seed 1         ... on random inputs of @main's types
    kiln graph model.onnx -o model.svg            a picture of the graph, fused groups outlined
    kiln optimize model.rly                       the standard pipeline, Relay text out
    kiln optimize --passes fold-constant,fuse-ops model.rly -o out.rly
    kiln optimize --list                          every pass, with its opt level
    kiln build model.rly -o model.kiln            compile to an executable file
    kiln bench model.onnx --profile --threads 4   latency, and the time of every kernel
    kiln tune model.onnx -o model.tunelog --budget 120s   search kernel schedules (a log)
    kiln build model.onnx --tuning-log model.tunelog      ... and build with them
    kiln export model.onnx -o model.so            a C-callable shared library and model.h
    kiln cache info                               where the machine-code cache is, its size
    kiln cache clear                              empty it
    kiln --version                                kiln's version and LLVM's

One file per subcommand. Errors are one line on stderr and a non-zero exit status: 1 for a
kiln.Error (a bad file, model or input), 2 for bad arguments, 3 for a bug in kiln (an
InternalError or any other exception); ``--debug`` shows the traceback instead.

kiln logs through the standard `logging` module, on the ``kiln`` logger and those below it
(``kiln.codegen.compile``, ``kiln.cli``, ...); the library itself configures nothing. The
command writes them to stderr: warnings by default, ``-v`` adds what is done (each kernel
compiled), ``-vv`` debugging detail (cache hits and misses), ``-q`` only errors.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from kiln.cli import bench, cache, export, graph, import_cmd, run, show, tune
from kiln.cli import compile as compile_cmd
from kiln.cli.common import add_verbosity
from kiln.errors import Error, InternalError


class _Version(argparse.Action):
    """``--version``: kiln's version and the LLVM it generates code with (read only when
    asked: it loads llvmlite)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """``kiln 0.1.0 (LLVM 20.1.8 through llvmlite 0.45.0)``."""
    import llvmlite

    import kiln
    from kiln.codegen.target import llvm_version

    return f"kiln {kiln.__version__} (LLVM {llvm_version()} through llvmlite " \
        f"{llvmlite.__version__})"


class _StderrHandler(logging.StreamHandler):
    """Log records to whatever sys.stderr is when they are written (tests replace it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def log_level(verbose: int, quiet: bool) -> int:
    """The level -v/-q ask for: WARNING by default, INFO, DEBUG, or ERROR."""
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler")
    parser.add_argument("--version", action=_Version, help="print kiln's version and exit")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks, and type-check after every pass")
    add_verbosity(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import_cmd.add_parser(sub)
    show.add_parser(sub)
    run.add_parser(sub)
    graph.add_parser(sub)
    compile_cmd.add_parsers(sub)
    export.add_parser(sub)
    bench.add_parser(sub)
    tune.add_parser(sub)
    cache.add_parser(sub)
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
    if args.verbose and args.quiet:
        parser.error("-v/--verbose and -q/--quiet contradict each other")
    # kiln's loggers to stderr for this command only (the library configures none).
    logger = logging.getLogger("kiln")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(
        "kiln: %(name)s: %(message)s" if args.verbose >= 2 else "kiln: %(message)s"))
    saved_level = logger.level
    logger.setLevel(log_level(args.verbose, args.quiet))
    logger.addHandler(handler)
    try:
        return _run(args)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved_level)


def _run(args: argparse.Namespace) -> int:
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
