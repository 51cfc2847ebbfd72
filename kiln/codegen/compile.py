"""Compile: loop-IR kernels to machine code (emit → verify → optimize → object file).

`compile_kernels` is the entry point of code generation. For each distinct kernel (by
fingerprint; identical kernels under different names share code) it looks in the disk
cache; on a miss it runs the three stages — emit the LLVM module (emit.py), verify it with
LLVM's verifier, then optimize at the requested level for the `kiln.Target` (default: this
machine) and emit an object file (target.py) — and stores the result. The objects are then
linked into one `KernelLibrary` (loaded into the process only when this host can run
them). LLVM rejecting generated code is a kiln bug: an `InternalError` with LLVM's message.

``modules`` lets another part of kiln (the whole-program executor) add LLVM IR of its own
that calls kernels by their symbols (`kernel_symbol`); it is compiled, cached and linked the
same way, and saved with the library.

A cache hit is checked before it is used: its object file must be one kiln's ELF reader
understands (for a target this host runs) and define the symbols expected of it. An entry
that fails — or a library that will not link from its cached objects — is deleted and its
code compiled again from the IR, so a damaged cache costs time, never a build.

Progress: each kernel compiled is logged at INFO on the ``kiln.codegen.compile`` logger
(``compiling kernel 3/57 fused_nn_conv2d``), each hit at DEBUG, and `compile_progress`
installs a callback told of every kernel done (for the command line's progress line). The
library prints nothing by itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import llvmlite.binding as llvm

from kiln.codegen import elf
from kiln.codegen.cache import DiskCache, cache_key, fingerprint, kernel_symbol
from kiln.codegen.emit import emit_kernel
from kiln.codegen.library import KernelLibrary, LibraryStats, ObjectCode
from kiln.codegen.target import Machine, machine
from kiln.errors import Error, InternalError
from kiln.loops.ir import Kernel
from kiln.loops.verify import verify
from kiln.target import Target

log = logging.getLogger(__name__)


def llvm_ir(kernel: Kernel, opt_level: int = 3, target: Target | str | None = None) -> str:
    """The LLVM IR text emitted for ``kernel`` (before optimization), for reading."""
    t = machine(_target(target), opt_level)
    return str(emit_kernel(verify(kernel), kernel_symbol(kernel), t.triple, t.data_layout,
                           t.target.features))


def optimized_ir(kernel: Kernel, opt_level: int = 3, target: Target | str | None = None) -> str:
    """The LLVM IR of ``kernel`` after the optimizer, for reading."""
    t = machine(_target(target), opt_level)
    module = _parse(llvm_ir(kernel, opt_level, t.target), kernel.name)
    t.optimize(module)
    return str(module)


def assembly(kernel: Kernel, opt_level: int = 3, target: Target | str | None = None) -> str:
    """The machine code of ``kernel`` for ``target`` (default: this CPU) as assembly text."""
    t = machine(_target(target), opt_level)
    module = _parse(llvm_ir(kernel, opt_level, t.target), kernel.name)
    t.optimize(module)
    return t.emit_assembly(module)


def _target(target: Target | str | None) -> Target:
    return Target.host() if target is None else Target.parse(target)


def _parse(text: str, what: str) -> llvm.ModuleRef:
    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise InternalError(f"LLVM rejected the code generated for {what}: {exc}") from None
    return module


def compile_ir(text: str, tm: Machine, what: str) -> tuple[bytes, tuple[str, ...]]:
    """Verify, optimize and compile LLVM IR text for the target machine ``tm``: the object
    file and its global symbols."""
    module = _parse(text, what)
    tm.optimize(module)
    exported = tuple(f.name for f in module.functions
                     if not f.is_declaration and f.linkage == llvm.Linkage.external)
    return tm.emit_object(module), exported


# --- progress ---------------------------------------------------------------------------------

# ``callback(done, total, what)`` after each kernel or module of a `compile_kernels` call.
ProgressCallback = Callable[[int, int, str], None]
_PROGRESS: contextvars.ContextVar[ProgressCallback | None] = contextvars.ContextVar(
    "kiln_compile_progress", default=None)


@contextlib.contextmanager
def compile_progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Within the block, `compile_kernels` calls ``callback(done, total, what)`` after each
    kernel or module it compiles or finds in the cache."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


# --- cache hits that can be trusted ------------------------------------------------------------


def usable_object(data: bytes, symbols: Sequence[str], target: Target) -> str | None:
    """Why an object file from the cache cannot stand for code defining ``symbols`` (None:
    it can). For a target this host runs it must be an ELF object kiln reads; an object for
    another machine is checked only when it is one."""
    if not target.is_host and not data.startswith(b"\x7fELF"):
        return None
    try:
        table = elf.symbols(data)
    except elf.MalformedObject as exc:
        return f"not an object file kiln can load ({exc})"
    missing = [s for s in symbols if s not in table.defined]
    if missing:
        return f"it does not define {', '.join(missing)}"
    return None


def cached_object(disk: DiskCache | None, key: str, symbols: Sequence[str], target: Target,
                  what: str) -> bytes | None:
    """The object under ``key`` if it is there and usable (`usable_object`); a bad one is
    deleted."""
    if disk is None:
        return None
    data = disk.get(key)
    if data is None:
        return None
    why = usable_object(data, symbols, target)
    if why is not None:
        log.warning("the cached machine code of %s is unusable: %s; deleted, compiling it "
                    "again", what, why)
        disk.delete(key)
        return None
    return data


@dataclass
class _Job:
    """One object file to make: where it is cached, how to make it, what it defines."""

    name: str  # the symbol of a kernel, "module:i" for a module
    key: str
    what: str
    make_text: Callable[[], str]
    symbols: tuple[str, ...] | None  # what it defines; None: a module's, read from its IR
    kernel: str | None = None  # the kernel's name, for its compile time in the stats
    from_cache: bool = False


def compile_kernels(
    kernels: Sequence[Kernel],
    target: Target | str | None = None,
    opt_level: int = 3,
    *,
    modules: Sequence[str] = (),
    cache: bool = True,
) -> KernelLibrary:
    """Machine code for ``kernels`` (and extra LLVM IR ``modules``) for ``target`` (default:
    this machine), linked — and loaded, when this host can run it.

    Each kernel is verified first (every access proven in bounds). With ``cache``, machine
    code comes from and goes to `DiskCache.default()` (``$KILN_CACHE``), keyed by the
    target's fingerprint, the kernel's content, the LLVM version and the opt level.
    """
    if isinstance(target, int) and not isinstance(target, bool):
        raise TypeError("compile_kernels(kernels, target, opt_level): pass opt_level by name")
    t0 = time.perf_counter()
    tm = machine(_target(target), opt_level)
    disk = DiskCache.default() if cache else None
    stats = LibraryStats(kernels=len(kernels))
    report = _PROGRESS.get()
    jobs: list[_Job] = []
    objects: dict[str, ObjectCode] = {}
    total = len(kernels) + len(modules)

    def make(job: _Job) -> None:
        k0 = time.perf_counter()
        text = job.make_text()
        k1 = time.perf_counter()
        data, exported = compile_ir(text, tm, job.what)
        k2 = time.perf_counter()
        stats.emit_seconds += k1 - k0
        stats.llvm_seconds += k2 - k1
        if job.kernel is not None:
            stats.per_kernel[job.kernel] = k2 - k0
        stats.compiled += 1
        job.from_cache = False
        objects[job.name] = ObjectCode(job.symbols if job.symbols is not None else exported,
                                       data)
        if disk is not None:
            disk.put(job.key, data)

    def run(job: _Job, label: str) -> None:
        jobs.append(job)
        if disk is not None:
            expected = job.symbols if job.symbols is not None else defined_symbols(
                job.make_text())
            data = (cached_object(disk, job.key, expected, tm.target, job.what)
                    if expected is not None else None)
            if data is not None and expected is not None:
                log.debug("cache hit: %s", label)
                stats.cache_hits += 1
                job.from_cache = True
                objects[job.name] = ObjectCode(expected, data)
                return
            log.debug("cache miss: %s", label)
        log.info("compiling %s", label)
        make(job)

    seen_names: set[str] = set()
    for done, k in enumerate(kernels, 1):
        if k.name in seen_names:
            raise InternalError(f"two kernels to compile are named {k.name}")
        seen_names.add(k.name)
        fp = fingerprint(k)
        symbol = kernel_symbol(k, fp)
        if symbol not in objects:
            run(_Job(symbol, cache_key(fp, tm.key), f"kernel {k.name}",
                     partial(_kernel_text, k, symbol, tm), (symbol,), k.name),
                f"kernel {done}/{total} {k.name}")
        if report is not None:
            report(done, total, k.name)
    for i, text in enumerate(modules):
        done = len(kernels) + i + 1
        key = cache_key("module:" + hashlib.sha256(text.encode()).hexdigest(), tm.key)
        run(_Job(f"module:{i}", key, f"module {i}", partial(str, text), None),
            f"module {done}/{total}")
        if report is not None:
            report(done, total, f"module {i}")
    stats.distinct = len(objects)
    try:
        library = KernelLibrary(kernels, list(objects.values()), tm.target, opt_level, stats)
    except (Error, RuntimeError) as exc:  # RuntimeError: LLVM refusing an object file
        stale = [job for job in jobs if job.from_cache]
        if not stale:
            raise
        # Some cached object does not link (a symbol it needs, or defines, is wrong): none of
        # them is trusted any more.
        log.warning("the cached machine code does not link (%s); compiling %d objects again",
                    exc, len(stale))
        for job in stale:
            if disk is not None:
                disk.delete(job.key)
            stats.cache_hits -= 1
            make(job)
        library = KernelLibrary(kernels, list(objects.values()), tm.target, opt_level, stats)
    stats.seconds = time.perf_counter() - t0
    return library


def _kernel_text(k: Kernel, symbol: str, tm: Machine) -> str:
    verify(k)
    return str(emit_kernel(k, symbol, tm.triple, tm.data_layout, tm.target.features))


def defined_symbols(text: str) -> tuple[str, ...] | None:
    """Global functions an LLVM IR module defines (parsed, not optimized), or None."""
    try:
        module = llvm.parse_assembly(text)
    except RuntimeError:
        return None
    return tuple(f.name for f in module.functions
                 if not f.is_declaration and f.linkage == llvm.Linkage.external)
