"""Position-independent object files for `kiln export`: kernels and a program entry for a Target.

The in-process code generator (compile.py, target.py) makes machine code for MCJIT to map into
this process: the JIT code model, the default relocation model. A shared library needs
position-independent code instead (``-fPIC``: calls through the PLT, globals through the GOT),
and may be for another machine than this one (``aarch64-linux-gnu``), so `kiln export` compiles
its own objects here: the same LLVM IR (emit.py, program.py), verified, optimized with the same
pipeline, and emitted for the Target with ``reloc="pic"``. A library whose kernels have a
parallel loop also gets kiln's thread pool (pool.py), compiled the same way for its Target.
They are cached on disk beside the JIT objects, under keys that say PIC and name the target;
a cached object that is not one, or lacks the symbols expected of it, is deleted and compiled
again (compile.py's `cached_object`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import llvmlite.binding as llvm

from kiln.codegen.cache import DiskCache, cache_key, fingerprint, kernel_symbol
from kiln.codegen.compile import cached_object, defined_symbols
from kiln.codegen.emit import emit_kernel
from kiln.codegen.pool import pool_ir
from kiln.codegen.target import Machine, initialize_all, machine_features
from kiln.errors import Error, InternalError
from kiln.loops.ir import Kernel
from kiln.loops.verify import verify
from kiln.target import Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PicMachine:
    """A `Machine` (kiln/codegen/target.py: its optimizer pipeline and object emission) whose
    LLVM target machine makes position-independent code."""

    machine: Machine

    @property
    def target(self) -> Target:
        return self.machine.target

    @property
    def opt_level(self) -> int:
        return self.machine.opt_level

    @property
    def data_layout(self) -> str:
        return self.machine.data_layout

    @property
    def key(self) -> str:
        """Everything that changes the object code: part of each cache key."""
        return f"{self.machine.key}|pic"


def pic_machine(target: Target, opt_level: int) -> PicMachine:
    """A target machine for ``target`` at ``opt_level`` (0-3), emitting PIC."""
    initialize_all()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as exc:
        raise Error(f"LLVM cannot generate code for {target.triple!r}: {exc}") from None
    tm = llvm_target.create_target_machine(
        cpu=target.cpu, features=machine_features(target), opt=opt_level, reloc="pic",
        codemodel="default")
    return PicMachine(Machine(target, opt_level, tm))


def _compile(text: str, pm: PicMachine, what: str) -> bytes:
    """Verify, optimize and emit one module."""
    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise InternalError(f"LLVM rejected the code generated for {what}: {exc}") from None
    pm.machine.optimize(module)
    return pm.machine.emit_object(module)


def _kernel_text(k: Kernel, symbol: str, pm: PicMachine) -> str:
    return str(emit_kernel(verify(k), symbol, pm.target.triple, pm.data_layout,
                           pm.target.features))


@dataclass
class ExportObjects:
    """The object files of an exported library, and what making them cost."""

    kernel_symbols: dict[str, str]  # kernel name -> its symbol
    objects: list[tuple[str, bytes]]  # (a file name, the object's bytes)
    compiled: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    per_object: dict[str, float] = field(default_factory=dict)


def compile_export_objects(kernels: Sequence[Kernel], entry_text: str, pm: PicMachine,
                           entry_opt_level: int, cache: bool = True) -> ExportObjects:
    """PIC objects for ``kernels`` (one per distinct kernel) and the program entry's IR."""
    t0 = time.perf_counter()
    disk = DiskCache.default() if cache else None
    out = ExportObjects({}, [])
    done: set[str] = set()

    def build(name: str, key: str, make_text: Callable[[], str], what: str,
              machine: PicMachine, symbols: tuple[str, ...] | None) -> None:
        expected = symbols if symbols is not None or disk is None else defined_symbols(
            make_text())
        data = (cached_object(disk, key, expected, machine.target, what)
                if expected is not None else None)
        if data is not None:
            log.debug("cache hit: %s (position-independent)", what)
            out.cache_hits += 1
        else:
            log.info("compiling %s (position-independent)", what)
            s = time.perf_counter()
            data = _compile(make_text(), machine, what)
            out.per_object[name] = time.perf_counter() - s
            out.compiled += 1
            if disk is not None:
                disk.put(key, data)
        out.objects.append((f"{name}.o", data))

    for k in kernels:
        fp = fingerprint(k)
        symbol = kernel_symbol(k, fp)
        out.kernel_symbols[k.name] = symbol
        if symbol in done:
            continue
        done.add(symbol)
        build(symbol, cache_key(fp, pm.key),
              partial(_kernel_text, k, symbol, pm),
              f"kernel {k.name}", pm, (symbol,))
    entry_pm = pm if entry_opt_level == pm.opt_level else pic_machine(pm.target,
                                                                       entry_opt_level)
    digest = hashlib.sha256(entry_text.encode()).hexdigest()
    build("program", cache_key("module:" + digest, entry_pm.key), lambda: entry_text,
          "the program's entry point", entry_pm, None)
    out.seconds = time.perf_counter() - t0
    return out


def compile_pool_object(pm: PicMachine, cache: bool = True) -> tuple[str, bytes]:
    """The thread pool (``kiln_parallel_for``, pool.py) as a PIC object for ``pm``'s target:
    a file name and its bytes."""
    text = pool_ir(pm.target.triple)
    key = cache_key("pool:" + hashlib.sha256(text.encode()).hexdigest(), pm.key)
    disk = DiskCache.default() if cache else None
    symbols = defined_symbols(text) if disk is not None else None
    data = (cached_object(disk, key, symbols, pm.target, "kiln's thread pool")
            if symbols is not None else None)
    if data is None:
        data = _compile(text, pm, "kiln's thread pool")
        if disk is not None:
            disk.put(key, data)
    return "kiln_pool.o", data


__all__ = ["ExportObjects", "PicMachine", "compile_export_objects", "compile_pool_object",
           "pic_machine"]
