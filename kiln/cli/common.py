"""What the subcommands share: reading models, weights and inputs, writing results, progress.

A model file is told by its extension: ``.rly`` is Relay text, ``.onnx`` an ONNX model (imported
with `kiln.frontend.onnx`), ``.kiln`` a compiled executable. `read_model` gives the first two as
a `ModelFile`: the module, the weights to bind by name, and how the names a user types (the
ONNX graph's input and output names) map to kiln's.
"""

from __future__ import annotations

import difflib
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from kiln.errors import Error

if TYPE_CHECKING:
    import argparse

    from kiln.frontend.onnx import ImportedModel
    from kiln.ir.module import IRModule

SOURCE_SUFFIXES = (".rly", ".onnx")
ELIDE_CONSTANTS = 16  # printed IR leaves out the data of constants with more elements

log = logging.getLogger("kiln.cli")


@dataclass
class ModelFile:
    """A model read from a file: its module, weights, and the names of its inputs and outputs."""

    path: str
    kind: str  # "relay" or "onnx"
    module: IRModule
    params: dict[str, np.ndarray] = field(default_factory=dict)
    # The names a user gives inputs by, in @main's parameter order, and kiln's names for them.
    input_names: list[str] = field(default_factory=list)
    kiln_inputs: list[str] = field(default_factory=list)
    output_names: list[str] | None = None  # the ONNX graph's outputs; None for Relay text


class Progress:
    """Steps of a long job on stderr, each with its time; silent unless asked or on a TTY
    (then each step is still logged at INFO, which ``-v`` shows)."""

    def __init__(self, enabled: bool | None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        if enabled is None:
            enabled = self.tty
        self.enabled = enabled
        self.start = time.perf_counter()
        self._shown = -1  # the last share of the kernels reported (tenths, off a terminal)

    def step(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            print(f"kiln: [{elapsed:6.2f} s] {message}", file=self.stream, flush=True)
        else:
            log.info(message)

    def kernels(self, done: int, total: int, name: str) -> None:
        """A `kiln.codegen.compile.compile_progress` callback: ``compiling kernels: 12/57``,
        rewritten in place on a terminal, every tenth of the way otherwise."""
        if not self.enabled or total == 0:
            return
        if self.tty:
            end = "\n" if done == total else ""
            print(f"\rkiln: compiling kernels: {done}/{total}", end=end, file=self.stream,
                  flush=True)
            return
        tenth = done * 10 // total
        if tenth != self._shown:
            self._shown = tenth
            print(f"kiln: compiling kernels: {done}/{total}", file=self.stream, flush=True)


def file_kind(path: str, allowed: tuple[str, ...], command: str) -> str:
    """The extension of ``path`` when ``command`` reads such files; a kiln.Error otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in allowed:
        shown = ", ".join(allowed)
        got = f"a {suffix} file" if suffix else "a file without an extension"
        raise Error(f"{path}: kiln {command} reads {shown} files, not {got}")
    if not Path(path).is_file():
        raise Error(f"{path}: no such file")
    return suffix


def read_relay(path: str) -> IRModule:
    """The module in a Relay text file."""
    from kiln.text import parse

    p = Path(path)
    if not p.is_file():
        raise Error(f"{path}: no such file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise Error(f"{path}: cannot read it as text ({e})") from None
    return parse(text, source_name=str(path))


def read_npz(path: str | None, what: str) -> dict[str, np.ndarray] | None:
    """The arrays of an .npz file by name (no pickles)."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise Error(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise Error(f"{path}: cannot read {what} from it ({e})") from None
    except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile and other archive damage
        raise Error(f"{path}: cannot read {what} from it ({type(e).__name__}: {e})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise Error(f"{path}: cannot read {what} from it: it holds one array (an .npy file), "
                    "not an .npz archive of named arrays")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except Exception as e:  # noqa: BLE001 - damaged members of the archive
        raise Error(f"{path}: cannot read {what} from it ({type(e).__name__}: {e})") from None


def import_onnx(path: str, progress: Progress, params_as: str = "params") -> ImportedModel:
    """`kiln.frontend.onnx.import_model` on a file, with progress steps."""
    from kiln.frontend.onnx import import_model, load_model

    progress.step(f"reading {path}")
    proto = load_model(path)
    progress.step(f"converting {len(proto.graph.node)} ONNX nodes "
                  f"({len(proto.graph.initializer)} initializers)")
    imported = import_model(proto, params_as=params_as)
    progress.step("imported and type-checked")
    return imported


def read_model(path: str, args: argparse.Namespace, command: str,
               progress: Progress | None = None) -> ModelFile:
    """A .rly or .onnx model, with the weights of ``--params`` (if the command has it)."""
    kind = file_kind(path, SOURCE_SUFFIXES, command)
    extra = read_npz(getattr(args, "params", None), "parameters") or {}
    if kind == ".rly":
        mod = read_relay(path)
        names = [p.name_hint for p in mod["main"].params] if "main" in mod else []
        return ModelFile(path, "relay", mod, extra, names, names)
    imported = import_onnx(path, progress or Progress(False))
    params = {**imported.params, **extra}
    main = imported.module["main"]
    kiln_inputs = [p.name_hint for p in main.params[:len(imported.inputs)]]
    return ModelFile(path, "onnx", imported.module, params, list(imported.inputs), kiln_inputs,
                     list(imported.outputs))


def write_text(text: str, output: str | None) -> None:
    """Text to a file, or to stdout when there is none."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text)
    except OSError as e:
        raise Error(f"{output}: cannot write it ({e.strerror or e})") from None


def flat_outputs(value: object, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """A result as named arrays: ``names`` for a graph's outputs, else output, output_0, ..."""
    from kiln.eval.values import ConstructorValue

    if names is not None and len(names) > 1 and isinstance(value, tuple) and len(value) == len(
            names):
        roots = list(zip(names, value))
    elif names is not None and len(names) == 1:
        roots = [(names[0], value)]
    else:
        roots = [("output", value)]
    out: dict[str, np.ndarray] = {}
    stack: list[tuple[str, object]] = list(reversed(roots))
    while stack:
        key, v = stack.pop()
        if isinstance(v, np.ndarray):
            out[key] = v
        elif isinstance(v, tuple):
            stack.extend((f"{key}_{i}", f) for i, f in reversed(list(enumerate(v))))
        else:
            kind = v.name if isinstance(v, ConstructorValue) else type(v).__name__
            raise Error(f"{key} is a {kind} value, which an .npz file cannot hold")
    return out if names is not None else dict(sorted(out.items()))


def add_trust(p: argparse.ArgumentParser) -> None:
    """--trust and --key: whose .kiln files may run their own machine code (kiln.load)."""
    p.add_argument("--trust", choices=("local", "key", "any"), default="local",
                   help="for a .kiln file: use its machine code if it was saved by kiln here "
                   "(local, the default), or sealed with a trusted key (key: the config "
                   "directory's trusted-keys/ or --key), or always (any: only for files you "
                   "would run as programs); otherwise it is compiled again from its verified "
                   "loop IR")
    p.add_argument("--key", metavar="FILE", help="a key file (64 hex digits) whose seal counts "
                   "with --trust key")


def load_executable(args: argparse.Namespace):  # noqa: ANN201 -- kiln.Executable
    """The .kiln file ``args.model``, loaded with the --trust/--key the user gave."""
    from kiln.runtime.artifact import load
    from kiln.trust import read_key

    if args.key is not None and args.trust != "key":
        raise Error("--key names a key whose seal counts: give it with --trust key")
    key = read_key(args.key) if args.key is not None else None
    return load(args.model, trust=args.trust, key=key)


def add_debug(p: argparse.ArgumentParser) -> None:
    """The global options after the subcommand too (``kiln run --debug -v ...``): --debug,
    -v/--verbose, -q/--quiet."""
    import argparse

    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks (and type-check after every pass)")
    add_verbosity(p, argparse.SUPPRESS)


def add_verbosity(p: argparse.ArgumentParser, default: object = None) -> None:
    """-v (INFO: steps, each kernel compiled; -vv DEBUG: cache hits and misses) and -q (errors
    only) for kiln's loggers; ``default`` argparse.SUPPRESS after a subcommand."""
    p.add_argument("-v", "--verbose", action="count", default=0 if default is None else default,
                   help="say more on stderr: -v what is done (each kernel compiled), -vv "
                   "debugging detail (cache hits and misses)")
    p.add_argument("-q", "--quiet", action="store_true",
                   default=False if default is None else default,
                   help="print only errors on stderr")


def float_in(above: float) -> Callable[[str], float]:
    """An argparse type: a finite number greater than ``above``."""
    import argparse
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want a number, not {text!r}") from None
        if not math.isfinite(value) or value <= above:
            raise argparse.ArgumentTypeError(f"must be a number above {above:g}, got {text}")
        return value

    return parse


def int_in(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``least`` to ``most`` (None: no upper bound)."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want an integer, not {text!r}") from None
        if value < least or (most is not None and value > most):
            span = f"from {least} to {most}" if most is not None else f"at least {least}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def check_pass_names(names: Iterable[str], option: str, allow_all: bool = False) -> None:
    """Every name is a registered pass ('*' too when ``allow_all``); a kiln.Error with the
    closest name otherwise."""
    from kiln.transform import list_passes

    known = [info.name for info in list_passes()]
    for name in names:
        if name in known or (allow_all and name == "*"):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise Error(f"{option} {name}: no pass is named {name!r}{hint} (kiln optimize --list "
                    "shows them all)")


def pass_list(text: str | None) -> list[str]:
    """Comma-separated pass names."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def check_file(path: str | None, option: str) -> None:
    """A file an option names exists."""
    if path is not None and not Path(path).is_file():
        raise Error(f"{option} {path}: no such file")


def add_show_constants(p: argparse.ArgumentParser, when: str) -> None:
    p.add_argument("--show-constants", action="store_true",
                   help=f"print every constant's data ({when}: a constant of more than "
                   f"{ELIDE_CONSTANTS} elements is shown by dtype and shape only)")


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", default=None,
                   help="show the steps of a long import on stderr (the default on a terminal)")
