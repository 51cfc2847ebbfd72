"""``kiln optimize`` and ``kiln build``: a Relay or ONNX model through the passes, or to a file
of machine code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.cli.common import (
    ELIDE_CONSTANTS,
    ModelFile,
    Progress,
    add_debug,
    add_progress,
    add_show_constants,
    check_file,
    check_pass_names,
    int_in,
    pass_list,
    read_model,
    write_text,
)
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.runtime.build import Executable
    from kiln.transform import PassContext, PassInstrument, PassTimingInstrument


def check_pass_options(args: argparse.Namespace) -> None:
    """--disable, --dump-before, --dump-after (and --passes) name passes that exist."""
    check_pass_names(pass_list(args.disable), "--disable")
    check_pass_names(args.dump_before or [], "--dump-before", allow_all=True)
    check_pass_names(args.dump_after or [], "--dump-after", allow_all=True)
    check_pass_names(pass_list(getattr(args, "passes", None)), "--passes")


def pass_context(args: argparse.Namespace, timing: PassTimingInstrument) -> PassContext:
    """The PassContext the options ask for: opt level, disabled passes, --time (into
    ``timing``), --dump-before/--dump-after (to stderr; big constants elided unless
    --show-constants), --debug (verify after each pass)."""
    from kiln.transform import PassContext

    instruments: list[PassInstrument] = [timing] if args.time else []
    if args.dump_before or args.dump_after:
        elide = None if args.show_constants else ELIDE_CONSTANTS
        instruments.append(dump_instrument(args.dump_before or [], args.dump_after or [],
                                           elide))
    return PassContext(opt_level=args.opt_level, disabled_pass=pass_list(args.disable),
                       instruments=instruments, debug=getattr(args, "debug", False))


def dump_instrument(before: list[str], after: list[str], elide: int | None) -> PassInstrument:
    """`kiln.transform.DumpIR`'s dumps on stderr, a module printed with ``elide_constants``."""
    from kiln.ir.module import IRModule
    from kiln.text import astext
    from kiln.transform import PassInstrument
    from kiln.transform.pass_manager import IR, PassInfo

    class Dump(PassInstrument):
        def dump(self, when: str, names: list[str], mod: IR, info: PassInfo) -> None:
            if info.name in names or "*" in names:
                text = (astext(mod, elide_constants=elide) if isinstance(mod, IRModule)
                        else mod.text())
                print(f"// ---- IR {when} {info.name} ----\n{text}", file=sys.stderr)

        def run_before_pass(self, mod: IR, info: PassInfo) -> None:
            self.dump("before", before, mod, info)

        def run_after_pass(self, mod: IR, info: PassInfo) -> None:
            self.dump("after", after, mod, info)

    return Dump()


def cmd_optimize(args: argparse.Namespace) -> int:
    from kiln.text import astext
    from kiln.transform import PassTimingInstrument, Sequential, get_pass
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
    check_pass_options(args)
    check_file(args.params, "--params")
    model = read_model(args.model, args, "optimize", Progress(args.progress))
    mod, params = model.module, model.params
    timing = PassTimingInstrument()
    with pass_context(args, timing):
        if args.passes:
            if params:
                mod = bind_params(mod, params)
            mod = Sequential([get_pass(n) for n in pass_list(args.passes)], name="passes")(mod)
        else:
            mod = optimize(mod, opt_level=args.opt_level, params=params or None)
    # Weights elided only for reading on a terminal: a file or a pipe gets text that parses.
    to_terminal = args.output in (None, "-") and sys.stdout.isatty()
    elide = ELIDE_CONSTANTS if to_terminal and not args.show_constants else None
    write_text(astext(mod, elide_constants=elide), args.output)
    if args.time:
        print(timing.render(), file=sys.stderr)
    return 0


def build_model(model: ModelFile, args: argparse.Namespace,
                progress: Progress | None = None) -> Executable:
    """The executable of a model, its weights bound (``--threads``, if the command has it,
    applied to it); ``progress`` shows the kernels compiled."""
    from kiln.codegen.compile import compile_progress
    from kiln.runtime.build import build

    with compile_progress(progress.kernels if progress is not None else None):
        return build(model.module, target=args.target, opt_level=args.opt_level,
                     params=model.params or None, threads=getattr(args, "threads", None),
                     tuning_log=getattr(args, "tuning_log", None))


def list_build_passes() -> str:
    """The whole pipeline of `kiln build`, one pass per line with the IR level it works on."""
    from kiln.runtime.backend import pipeline_steps

    steps = pipeline_steps()
    width = max(len(name) for name, _, _ in steps)
    return "\n".join(f"{name:<{width}}  level {level}  {doc}" for name, level, doc in steps)


def cmd_build(args: argparse.Namespace) -> int:
    from kiln.transform import PassTimingInstrument

    if args.list_passes:
        print(list_build_passes())
        return 0
    if not args.model:
        raise Error("kiln build needs a model file (or --list-passes)")
    check_pass_options(args)
    check_file(args.params, "--params")
    progress = Progress(args.progress)
    model = read_model(args.model, args, "build", progress)
    progress.step("building")
    timing = PassTimingInstrument()
    with pass_context(args, timing):
        exe = build_model(model, args, progress)
    if args.time:
        print(timing.render(), file=sys.stderr)
    out = args.output or str(Path(args.model).with_suffix(".kiln"))
    try:
        exe.save(out)
    except OSError as e:
        raise Error(f"{out}: cannot write it ({e.strerror or e})") from None
    if args.stats:
        print(exe.stats(), file=sys.stderr)
    print(f"kiln: wrote {out} ({Path(out).stat().st_size} bytes): {exe.signature}",
          file=sys.stderr)
    return 0


def compile_options(p: argparse.ArgumentParser, tuning_log: bool = True) -> None:
    p.add_argument("--params", help="an .npz of weights to bind to @main's parameters by name")
    if tuning_log:
        p.add_argument("--tuning-log", metavar="FILE",
                       help="build with the schedules of this `kiln tune` log (default: "
                       "KILN_TUNING_LOG, if set)")
    p.add_argument("--opt-level", type=int_in(0, 4), default=3, metavar="N",
                   help="optimization level 0-4 (default 3)")
    p.add_argument("--target", default="llvm",
                   help="what to compile for: llvm (this machine, the default), "
                   "'llvm -mattr=-avx512f', 'llvm -mcpu=znver3', aarch64-linux-gnu, ...; "
                   "or evaluator (the loop-IR interpreter)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    opt = sub.add_parser("optimize", help="optimize a Relay or ONNX model",
                         description="Run kiln's optimization passes on a Relay text file or "
                         "an ONNX model; write the result as Relay text.")
    opt.add_argument("model", nargs="?", help="a Relay text file (.rly) or an ONNX model (.onnx)")
    opt.add_argument("--passes", help="comma-separated pass names (default: the standard "
                     "pipeline of kiln.optimize)")
    opt.add_argument("--opt-level", type=int_in(0, 4), default=3, metavar="N",
                     help="optimization level 0-4 (default 3)")
    opt.add_argument("--disable", help="comma-separated pass names to skip")
    opt.add_argument("--params", help="an .npz of weights to bind to @main's parameters by name")
    opt.add_argument("-o", "--output", help="write the result here instead of stdout")
    opt.add_argument("--list", action="store_true", help="list every pass and exit")
    opt.add_argument("--time", action="store_true", help="report the time each pass takes")
    opt.add_argument("--dump-before", action="append", metavar="PASS",
                     help="print the IR before this pass ('*' for all)")
    opt.add_argument("--dump-after", action="append", metavar="PASS",
                     help="print the IR after this pass ('*' for all)")
    add_show_constants(opt, "by default, on a terminal and in dumps")
    add_progress(opt)
    add_debug(opt)
    opt.set_defaults(run=cmd_optimize)

    bld = sub.add_parser("build", help="compile a Relay or ONNX model to an executable file",
                         description="Optimize, fuse, lower and compile a Relay program or an "
                         "ONNX model (its weights bound as constants); write one file that "
                         "`kiln run` (or kiln.load) runs without recompiling.")
    bld.add_argument("model", nargs="?",
                     help="a Relay text file (.rly) or an ONNX model (.onnx)")
    bld.add_argument("-o", "--output", help="the executable to write (default: MODEL.kiln)")
    compile_options(bld)
    bld.add_argument("--stats", action="store_true", help="print kernels, memory and times")
    bld.add_argument("--list-passes", action="store_true",
                     help="print every pass of the build pipeline, Level 1 and back end, in "
                     "order, and exit")
    bld.add_argument("--disable", help="comma-separated pass names to skip")
    bld.add_argument("--time", action="store_true", help="report the time each pass takes")
    bld.add_argument("--dump-before", action="append", metavar="PASS",
                     help="print the IR before this pass ('*' for all)")
    bld.add_argument("--dump-after", action="append", metavar="PASS",
                     help="print the IR after this pass ('*' for all): Relay text for Level "
                     "1, the SSA program and loop IR for the back end")
    add_show_constants(bld, "by default, in dumps")
    add_progress(bld)
    add_debug(bld)
    bld.set_defaults(run=cmd_build)
