"""The one switch point between loop-IR kernels and something that runs them.

``compile_kernels(kernels, target)`` gives a `KernelSet`: a `KernelFunction` per kernel
name, plus what saving needs. Targets:

- ``"llvm"``: machine code from `kiln.codegen` (LLVM through llvmlite, cached on disk);
  when kiln.codegen cannot be imported, the loop evaluator instead (``backend`` says which);
- ``"evaluator"``: always the loop-IR evaluator (`EvaluatedKernel`) — exact and very slow,
  for tests on tiny shapes and for checking the code generator.

`load_kernels` maps previously compiled machine code back (no compiler work), or rebuilds
evaluated kernels from their loop IR.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import Error
from kiln.loops.ir import Kernel
from kiln.runtime.kernel import EvaluatedKernel, KernelFunction

TARGETS = ("llvm", "evaluator")
NATIVE, EVALUATOR = "native", "evaluator"


@dataclass
class KernelSet:
    """Compiled kernels by name, and how they were made."""

    functions: dict[str, KernelFunction] = field(default_factory=dict)
    backend: str = EVALUATOR  # "native" (machine code) or "evaluator"
    library: Any = None  # kiln.codegen's KernelLibrary, for native kernels
    compile_seconds: float = 0.0
    cache_hits: int = 0
    loaded: bool = False  # mapped back from a saved executable (nothing may be compiled)
    program_code: bytes | None = None  # a saved whole-program entry point's machine code

    def object_code(self) -> bytes | None:
        """The machine code of every kernel, as kiln.codegen exports it (None if evaluated)."""
        if self.library is None:
            return None
        code = getattr(self.library, "object_code", None)
        if callable(code):
            code = code()
        return bytes(code) if code is not None else None


def _codegen() -> Any:
    try:
        import kiln.codegen as codegen
    except ImportError:
        return None
    return codegen if hasattr(codegen, "compile_kernels") else None


def native_available() -> bool:
    """Whether kiln.codegen is there to make machine code."""
    return _codegen() is not None


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise Error(f"unknown target {target!r}; kiln compiles for {', '.join(TARGETS)}")


def _cache_hits(library: Any) -> int:
    for name in ("cache_hits", "hits"):
        v = getattr(library, name, None)
        if isinstance(v, int):
            return v
    stats = getattr(library, "stats", None)
    hits = stats.get("cache_hits") if isinstance(stats, dict) else getattr(stats, "cache_hits",
                                                                            None)
    return hits if isinstance(hits, int) else 0


def compile_kernels(kernels: Sequence[Kernel], target: str = "llvm",
                    opt_level: int = 3) -> KernelSet:
    """A `KernelFunction` for each kernel (by name), made for ``target``."""
    check_target(target)
    start = time.perf_counter()
    codegen = _codegen() if target == "llvm" else None
    if codegen is None or not kernels:
        out = KernelSet({k.name: EvaluatedKernel(k) for k in kernels},
                        NATIVE if codegen is not None else EVALUATOR)
    else:
        lib = codegen.compile_kernels(list(kernels), opt_level=min(max(opt_level, 0), 3))
        out = KernelSet({k.name: lib[k.name] for k in kernels}, NATIVE, lib)
        out.cache_hits = _cache_hits(lib)
    out.compile_seconds = time.perf_counter() - start
    return out


def load_kernels(kernels: Sequence[Kernel], backend: str,
                 object_code: bytes | None) -> KernelSet:
    """Kernels saved by an executable: machine code mapped back, or evaluated loop IR."""
    if backend == EVALUATOR or not kernels:
        return KernelSet({k.name: EvaluatedKernel(k) for k in kernels}, backend, loaded=True)
    codegen = _codegen()
    if codegen is None:
        raise Error("this file holds machine code, and loading it needs kiln.codegen "
                    "(llvmlite), which cannot be imported here")
    if object_code is None:
        raise Error("the file says it holds machine code but has none")
    loader = getattr(getattr(codegen, "KernelLibrary", None), "from_object", None)
    if loader is None:
        raise Error("this kiln.codegen cannot load machine code saved in a file")
    lib = loader(object_code, list(kernels))
    return KernelSet({k.name: lib[k.name] for k in kernels}, NATIVE, lib, loaded=True)


def host_target() -> dict[str, str]:
    """The CPU and LLVM the machine code would be made for (saved beside it)."""
    info = {"cpu": "", "features": "", "llvm": ""}
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return info
    try:
        info["cpu"] = llvm.get_host_cpu_name()
        info["features"] = llvm.get_host_cpu_features().flatten()
        info["llvm"] = ".".join(str(x) for x in llvm.llvm_version_info)
    except Exception:  # noqa: BLE001 - only informative
        pass
    return info
