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
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import llvmlite.binding as llvm

from kiln.codegen.cache import DiskCache, cache_key, fingerprint, kernel_symbol
from kiln.codegen.emit import emit_kernel
from kiln.codegen.library import KernelLibrary, LibraryStats, ObjectCode
from kiln.codegen.target import Machine, machine
from kiln.errors import InternalError
from kiln.loops.ir import Kernel
from kiln.loops.verify import verify
from kiln.target import Target


def llvm_ir(kernel: Kernel, opt_level: int = 3, target: Target | str | None = None) -> str:
    """The LLVM IR text emitted for ``kernel`` (before optimization), for reading."""
    t = machine(_target(target), opt_level)
    return str(emit_kernel(verify(kernel), kernel_symbol(kernel), t.triple, t.data_layout))


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
    objects: dict[str, ObjectCode] = {}
    seen_names: set[str] = set()
    for k in kernels:
        if k.name in seen_names:
            raise InternalError(f"two kernels to compile are named {k.name}")
        seen_names.add(k.name)
        fp = fingerprint(k)
        symbol = kernel_symbol(k, fp)
        if symbol in objects:
            continue
        key = cache_key(fp, tm.key)
        data = disk.get(key) if disk is not None else None
        if data is not None:
            stats.cache_hits += 1
        else:
            verify(k)
            k0 = time.perf_counter()
            text = str(emit_kernel(k, symbol, tm.triple, tm.data_layout))
            k1 = time.perf_counter()
            data, _ = compile_ir(text, tm, f"kernel {k.name}")
            k2 = time.perf_counter()
            stats.emit_seconds += k1 - k0
            stats.llvm_seconds += k2 - k1
            stats.per_kernel[k.name] = k2 - k0
            stats.compiled += 1
            if disk is not None:
                disk.put(key, data)
        objects[symbol] = ObjectCode((symbol,), data)
    for i, text in enumerate(modules):
        key = cache_key("module:" + hashlib.sha256(text.encode()).hexdigest(), tm.key)
        cached = disk.get(key) if disk is not None else None
        module_symbols = _defined_symbols(text) if cached is not None else None
        if cached is not None and module_symbols is not None:
            data, exported = cached, module_symbols
            stats.cache_hits += 1
        else:
            data, exported = compile_ir(text, tm, f"module {i}")
            stats.compiled += 1
            if disk is not None:
                disk.put(key, data)
        objects[f"module:{i}"] = ObjectCode(exported, data)
    stats.distinct = len(objects)
    library = KernelLibrary(kernels, list(objects.values()), tm.target, opt_level, stats)
    stats.seconds = time.perf_counter() - t0
    return library


def _defined_symbols(text: str) -> tuple[str, ...] | None:
    """Global functions an LLVM IR module defines (parsed, not optimized), or None."""
    try:
        module = llvm.parse_assembly(text)
    except RuntimeError:
        return None
    return tuple(f.name for f in module.functions
                 if not f.is_declaration and f.linkage == llvm.Linkage.external)
