"""`export_library`: a model as a shared library that a C program links and calls, no Python.

    lib = export_library(mod, "model.so", target="llvm", params=weights)
    print(lib.prototype)     # int model_run(const float *data, float *output)

writes ``model.so`` and its header ``model.h``. The steps, for a Level-1 module: optimize and
fuse, lower to the SSA program, plan memory, lower each kernel to loop IR (as `kiln.build`
does); or take the program of an `Executable` as it is. Then, for the Target (this machine, or
another such as ``aarch64-linux-gnu``):

1. the program's entry point as LLVM IR (kiln/codegen/program.py) — only a *static* program
   has one, anything else is a `kiln.Error` saying why;
2. position-independent objects of every kernel and of the entry (kiln/codegen/export_objects.py);
3. the weights as one raw file, embedded by the wrapper as a read-only section;
4. the header and the C wrapper (kiln/runtime/export_c.py): the ``ctx`` table of constant and
   kernel addresses, ``<name>_run`` with one pointer per tensor, ``<name>_error``;
5. ``cc -shared`` (``aarch64-linux-gnu-gcc`` for that triple) links it all, with a version
   script that exports only the ``<name>_*`` functions; when a kernel has a parallel loop,
   with kiln's thread pool (kiln/codegen/pool.py, compiled for the Target) and
   ``-lpthread``.

See docs/export.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.expr import Expr
from kiln.ir.module import IRModule
from kiln.ir.ty import TupleType, Type
from kiln.runtime.export_c import (
    CTensor,
    WrapperParts,
    c_identifier,
    render_header,
    render_wrapper,
    run_prototype,
    version_script,
)
from kiln.ssa.ir import Program
from kiln.target import Target

# Past this, PC-relative references from code to its constant pools could overflow.
MAX_WEIGHT_BYTES = 1 << 31
_ALIGN = 64


@dataclass(frozen=True)
class ExportedLibrary:
    """What `export_library` wrote."""

    library: Path
    header: Path
    name: str  # the C prefix: <name>_run, <name>_error, <NAME>_INPUT_0_COUNT, ...
    prototype: str  # int <name>_run(...)
    inputs: tuple[CTensor, ...]
    outputs: tuple[CTensor, ...]
    target: Target
    workspace_bytes: int
    weight_bytes: int
    compiled: int  # objects compiled (the others came from the disk cache)


def _program_of(model: Any, params: Mapping[str, Any] | None, opt_level: int,
                target: Target) -> Program:
    """The SSA program to export, each static kernel lowered to loop IR."""
    from kiln.runtime.build import Executable

    if isinstance(model, Executable):
        if params:
            raise Error("export_library: params are bound when an Executable is built; "
                        "pass the module instead to bind them here")
        return model.program
    if isinstance(model, Expr):
        model = IRModule.from_expr(model)
    if not isinstance(model, IRModule):
        raise Error(f"export_library takes an IRModule, a function or a kiln.Executable, not "
                    f"{type(model).__name__}")
    from kiln.runtime.backend import lower

    return lower(model, target, opt_level, params, upto="decompose-math").program


def _leaf_names(types: Sequence[Type], names: Sequence[str]) -> list[str]:
    """A name for each tensor of ``types`` (tuples flattened: ``name_0``, ``name_1``, ...)."""
    out: list[str] = []
    stack: list[tuple[str, Type]] = list(reversed(list(zip(names, types))))
    while stack:
        name, t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(reversed([(f"{name}_{i}", f) for i, f in enumerate(t.fields)]))
        else:
            out.append(name)
    return out


def _tensors(program: Program, code: Any, input_names: Sequence[str] | None,
             output_names: Sequence[str] | None) -> tuple[list[CTensor], list[CTensor]]:
    main = program.main
    names = list(input_names) if input_names is not None else [p.hint for p in main.params]
    if len(names) != len(main.params):
        raise Error(f"input_names has {len(names)} names, but @main has {len(main.params)} "
                    "parameters")
    ret = main.ret_type
    if output_names is None:
        roots = [("output", ret)]
    elif isinstance(ret, TupleType) and len(output_names) == len(ret.fields) != 1:
        roots = list(zip(output_names, ret.fields))
    elif len(output_names) == 1:
        roots = [(output_names[0], ret)]
    else:
        raise Error(f"output_names has {len(output_names)} names for @main's result "
                    f"{ret}")
    in_names = _leaf_names([p.type for p in main.params], names)
    out_names = _leaf_names([t for _, t in roots], [n for n, _ in roots])
    taken: set[str] = set()
    ins = [CTensor(n, c_identifier(n, taken), t) for n, t in zip(in_names, code.inputs)]
    outs = [CTensor(n, c_identifier(n, taken), t) for n, t in zip(out_names, code.outputs)]
    if len(ins) != len(code.inputs) or len(outs) != len(code.outputs):
        raise InternalError("the entry point's tensors do not match @main's type")
    return ins, outs


def _weights(constants: Sequence[np.ndarray]) -> tuple[bytes, list[int]]:
    """All constants as one blob, each at a 64-byte-aligned offset, and the offsets."""
    parts: list[bytes] = []
    offsets: list[int] = []
    size = 0
    for c in constants:
        data = np.ascontiguousarray(c)
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        pad = (-size) % _ALIGN
        parts.append(b"\0" * pad)
        size += pad
        offsets.append(size)
        raw = data.tobytes()
        parts.append(raw)
        size += len(raw)
    return b"".join(parts), offsets


def default_cc(target: Target) -> str:
    """The C compiler that links for ``target``: ``$CC`` or ``cc`` for this architecture
    (whatever the CPU), else the GNU cross compiler named by the triple
    (``aarch64-linux-gnu-gcc``)."""
    if target.arch == Target.host().arch:
        return os.environ.get("CC", "cc")
    parts = target.triple.split("-")
    system = "-".join(p for p in parts[1:] if p not in ("unknown", "pc"))
    return f"{target.arch}-{system or 'linux-gnu'}-gcc"


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise Error(f"{path}: cannot write the library there: it is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise Error(f"{path}: cannot write the library there: no directory {parent}")
    if not os.access(parent, os.W_OK):
        raise Error(f"{path}: cannot write the library there: the directory is not writable")


def _link(cc: str, out: Path, sources: list[str], threads: bool, cwd: str) -> None:
    cmd = [cc, "-shared", "-fPIC", "-O2", "-std=gnu11", "-o", str(out), *sources,
           "-Wl,--version-script=exports.map", "-Wl,--no-undefined", "-Wl,-z,noexecstack",
           f"-Wl,-soname,{out.name}"]
    if threads:
        cmd += ["-lpthread"]
    cmd += ["-lm"]
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Error(f"kiln export could not run {cc}: {exc}") from None
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[:800]
        raise Error(f"{cc} failed to link {out.name} (status {done.returncode}): {detail}")


def export_library(
    model: Any,
    path: str | os.PathLike,
    target: str | Target = "llvm",
    *,
    params: Mapping[str, Any] | None = None,
    opt_level: int = 3,
    name: str | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    cc: str | None = None,
) -> ExportedLibrary:
    """Write ``model`` (an IRModule, function or `Executable`) as a shared library at ``path``
    and its C header beside it (same name, ``.h``); see docs/export.md.

    ``target`` is a `kiln.Target` or its spec (``"llvm"``, ``"llvm -mattr=-avx512f"``,
    ``"aarch64-linux-gnu"``); ``params`` binds weights of a module by name; ``name`` is the
    C prefix (default: the file's stem); ``input_names``/``output_names`` name the tensors in
    the header (default: @main's parameters, and ``output``); ``cc`` is the C compiler that
    links (default: `default_cc`).
    """
    from kiln.codegen import elf
    from kiln.codegen.emit import status_messages, uses_tiles
    from kiln.codegen.export_objects import (
        compile_export_objects,
        compile_pool_object,
        pic_machine,
    )
    from kiln.codegen.pool import PARALLEL_FOR_SYMBOL
    from kiln.codegen.program import NotStatic, emit_program
    from kiln.runtime.native import entry_opt_level

    if isinstance(target, str) and target.split()[:1] == ["evaluator"]:
        raise Error("kiln export makes machine code; 'evaluator' is not a machine (use "
                    "'llvm' or a triple such as 'aarch64-linux-gnu')")
    tgt = Target.parse(target)
    if isinstance(opt_level, bool) or not isinstance(opt_level, int) or not 0 <= opt_level <= 4:
        raise Error(f"opt_level must be an integer from 0 to 4, got {opt_level!r}")
    out = Path(path)
    _check_writable(out)
    cc = cc or default_cc(tgt)
    if shutil.which(cc) is None:
        raise Error(f"kiln export needs the C compiler {cc!r} to link a library for "
                    f"{tgt.triple}, and it is not installed (for aarch64: apt-get install "
                    "gcc-aarch64-linux-gnu, or `make cross-tools`)")
    header_path = out.with_suffix(".h")
    if header_path == out:
        raise Error(f"{out}: that is where the header goes; name the library .so")
    prefix = c_identifier(name if name is not None else out.stem.split(".")[0] or "model",
                          set())
    if name is not None and prefix != name:
        raise Error(f"the library name {name!r} is not a C identifier (e.g. {prefix!r})")

    program = _program_of(model, params, opt_level, tgt)
    pm = pic_machine(tgt, min(opt_level, 3))
    try:
        code = emit_program(program, tgt.triple, pm.data_layout)
    except NotStatic as exc:
        raise Error(f"cannot export this program as a C library: {exc}. kiln export takes "
                    "static programs only (tensors of static shape and tuples of them, "
                    "branches, loops, calls that do not recurse) — the ones the native "
                    "executor runs; the VM runs the others, from Python") from None
    kernels = []
    for kernel_name in code.kernels:
        k = program.kernels[kernel_name].kernel
        if k is None:
            raise InternalError(f"kernel {kernel_name} has no loop IR to export")
        kernels.append(k)
    inputs, outputs = _tensors(program, code, input_names, output_names)
    blob, offsets = _weights(program.constants)
    if len(blob) > MAX_WEIGHT_BYTES:
        raise Error(f"the model has {len(blob)} bytes of weights; kiln export embeds at most "
                    f"{MAX_WEIGHT_BYTES} bytes in a library")
    objects = compile_export_objects(kernels, code.text, pm,
                                     entry_opt_level(code, min(opt_level, 3)))
    needed: set[str] = set()
    for _, data in objects.objects:
        try:
            needed |= elf.symbols(data).undefined
        except elf.MalformedObject:
            needed.add(PARALLEL_FOR_SYMBOL)  # unknown: link the pool to be safe
    threaded = PARALLEL_FOR_SYMBOL in needed
    if threaded:
        objects.objects.append(compile_pool_object(pm))
    signature = _signature(program)
    with tempfile.TemporaryDirectory(prefix="kiln-export-") as tmp:
        sources = []
        for file_name, data in objects.objects:
            Path(tmp, file_name).write_bytes(data)
            sources.append(file_name)
        if program.constants:
            Path(tmp, "weights.bin").write_bytes(blob)
        parts = WrapperParts(
            prefix=prefix, header=header_path.name, entry_symbol=code.symbol,
            kernel_symbols=[objects.kernel_symbols[k.name] for k in kernels],
            kernel_messages=[status_messages(k) for k in kernels], constant_offsets=offsets,
            weights_file="weights.bin" if program.constants else None,
            tiles=any(uses_tiles(k) for k in kernels))
        header = render_header(prefix, out.name, inputs, outputs, code.stack_bytes,
                               f"{tgt.triple}, CPU {tgt.cpu}", signature)
        Path(tmp, header_path.name).write_text(header)
        Path(tmp, "wrapper.c").write_text(render_wrapper(parts, inputs, outputs))
        Path(tmp, "exports.map").write_text(version_script(prefix))
        _link(cc, Path(tmp, out.name), ["wrapper.c", *sources], threaded, tmp)
        _install(Path(tmp, out.name), out)
        _install(Path(tmp, header_path.name), header_path)
    return ExportedLibrary(out, header_path, prefix, run_prototype(prefix, inputs, outputs),
                           tuple(inputs), tuple(outputs), tgt, code.stack_bytes, len(blob),
                           objects.compiled)


def _install(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temporary file beside it, then rename."""
    tmp = dst.with_name(f".{dst.name}.kiln-tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise Error(f"{dst}: cannot write it ({e.strerror or e})") from None


def _signature(program: Program) -> str:
    from kiln.text.printer import type_text

    main = program.main
    params = ", ".join(f"%{p.hint}: {type_text(p.type)}" for p in main.params)
    return f"@{program.entry}({params}) -> {type_text(main.ret_type)}"


__all__ = ["ExportedLibrary", "default_cc", "export_library"]
