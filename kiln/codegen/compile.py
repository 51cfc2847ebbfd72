"""Compile: loop-IR kernels to machine code (emit → verify → optimize → object file).

`compile_kernels` is the entry point of code generation. For each distinct kernel (by
fingerprint; identical kernels under different names share code) it looks in the disk
cache; on a miss it runs the three stages — emit the LLVM module (emit.py), verify it with
LLVM's verifier, then optimize at the requested level for the host CPU and emit an object
file (target.py) — and stores the result. The objects are then linked into one
`KernelLibrary`. LLVM rejecting generated code is a kiln bug: an `InternalError` with
LLVM's message.

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
from kiln.codegen.target import HostTarget, host_target
from kiln.errors import InternalError
from kiln.loops.ir import Kernel
from kiln.loops.verify import verify


def llvm_ir(kernel: Kernel, opt_level: int = 3) -> str:
    """The LLVM IR text emitted for ``kernel`` (before optimization), for reading."""
    t = host_target(opt_level)
    return str(emit_kernel(verify(kernel), kernel_symbol(kernel), t.triple, t.data_layout))


def optimized_ir(kernel: Kernel, opt_level: int = 3) -> str:
    """The LLVM IR of ``kernel`` after the optimizer, for reading."""
    t = host_target(opt_level)
    module = _parse(llvm_ir(kernel, opt_level), kernel.name)
    t.optimize(module)
    return str(module)


def assembly(kernel: Kernel, opt_level: int = 3) -> str:
    """The machine code of ``kernel`` as assembly text, for reading."""
    t = host_target(opt_level)
    module = _parse(llvm_ir(kernel, opt_level), kernel.name)
    t.optimize(module)
    return t.machine.emit_assembly(module)


def _parse(text: str, what: str) -> llvm.ModuleRef:
    try:
        module = llvm.parse_assembly(text)
        module.verify()
    except RuntimeError as exc:
        raise InternalError(f"LLVM rejected the code generated for {what}: {exc}") from None
    return module


def compile_ir(text: str, target: HostTarget, what: str) -> tuple[bytes, tuple[str, ...]]:
    """Verify, optimize and compile LLVM IR text: the object file and its global symbols."""
    module = _parse(text, what)
    target.optimize(module)
    exported = tuple(f.name for f in module.functions
                     if not f.is_declaration and f.linkage == llvm.Linkage.external)
    return target.emit_object(module), exported


def compile_kernels(
    kernels: Sequence[Kernel],
    opt_level: int = 3,
    *,
    modules: Sequence[str] = (),
    cache: bool = True,
) -> KernelLibrary:
    """Machine code for ``kernels`` (and extra LLVM IR ``modules``), linked and loaded.

    Each kernel is verified first (every access proven in bounds). With ``cache``, machine
    code comes from and goes to `DiskCache.default()` (``$KILN_CACHE``).
    """
    t0 = time.perf_counter()
    target = host_target(opt_level)
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
        key = cache_key(fp, target.key)
        data = disk.get(key) if disk is not None else None
        if data is not None:
            stats.cache_hits += 1
        else:
            verify(k)
            k0 = time.perf_counter()
            text = str(emit_kernel(k, symbol, target.triple, target.data_layout))
            k1 = time.perf_counter()
            data, _ = compile_ir(text, target, f"kernel {k.name}")
            k2 = time.perf_counter()
            stats.emit_seconds += k1 - k0
            stats.llvm_seconds += k2 - k1
            stats.per_kernel[k.name] = k2 - k0
            stats.compiled += 1
            if disk is not None:
                disk.put(key, data)
        objects[symbol] = ObjectCode((symbol,), data)
    for i, text in enumerate(modules):
        key = cache_key("module:" + hashlib.sha256(text.encode()).hexdigest(), target.key)
        cached = disk.get(key) if disk is not None else None
        module_symbols = _defined_symbols(text) if cached is not None else None
        if cached is not None and module_symbols is not None:
            data, exported = cached, module_symbols
            stats.cache_hits += 1
        else:
            data, exported = compile_ir(text, target, f"module {i}")
            stats.compiled += 1
            if disk is not None:
                disk.put(key, data)
        objects[f"module:{i}"] = ObjectCode(exported, data)
    stats.distinct = len(objects)
    target_info = {"triple": target.triple, "cpu": target.cpu, "features": target.features,
                   "llvm": target.llvm_version, "opt_level": opt_level}
    library = KernelLibrary(kernels, list(objects.values()), target_info, stats)
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
