"""The one switch point between loop-IR kernels and something that runs them.

``compile_kernels(kernels, target, opt_level)`` gives a `KernelSet`: a `KernelFunction` per
kernel name, plus what saving needs. ``target`` is

- a `kiln.Target`, or a spec string `Target.parse` reads (``"llvm"``: this machine;
  ``"llvm -mattr=-avx512f"``, ``"aarch64-linux-gnu"``, ...): machine code from
  `kiln.codegen` (LLVM through llvmlite, cached on disk). Code for a target this host cannot
  run is made and can be saved, but its kernels raise `kiln.Error` when called;
- ``"evaluator"``: not a machine but the loop-IR evaluator (`EvaluatedKernel`) — exact and
  very slow, for tests on tiny shapes and for checking the code generator.

`load_kernels` maps previously compiled machine code back (no compiler work), or rebuilds
evaluated kernels from their loop IR.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.errors import Error
from kiln.loops.ir import Kernel
from kiln.runtime.kernel import EvaluatedKernel, KernelFunction
from kiln.target import Target

if TYPE_CHECKING:  # kiln.codegen imports kiln.runtime.kernel: imported where used
    from kiln.codegen.library import KernelLibrary

NATIVE, EVALUATOR = "native", "evaluator"


@dataclass
class KernelSet:
    """Compiled kernels by name, and how they were made."""

    functions: dict[str, KernelFunction] = field(default_factory=dict)
    backend: str = EVALUATOR  # "native" (machine code) or "evaluator"
    library: KernelLibrary | None = None  # the machine code of native kernels
    compile_seconds: float = 0.0
    cache_hits: int = 0
    loaded: bool = False  # mapped back from a saved executable (nothing may be compiled)
    program_code: bytes | None = None  # a saved whole-program entry point's machine code
    target: Target | None = None  # what native kernels were built for (None: evaluated)
    opt_level: int = 3
    # Check every call from the VM against the kernel's signature: the program came from a
    # file whose seal does not count, so its types are not right by construction.
    checked_calls: bool = False

    def __post_init__(self) -> None:
        # unsaid, the target is the library's; native kernels without one: this machine's
        if self.target is None and self.library is not None:
            self.target, self.opt_level = self.library.target, self.library.opt_level
        elif self.target is None and self.backend == NATIVE:
            self.target = Target.host()

    def object_code(self) -> bytes | None:
        """The machine code of every kernel, as kiln.codegen exports it (None if evaluated)."""
        return self.library.object_code if self.library is not None else None


def native_available() -> bool:
    """Whether machine code can be made here (kiln.codegen and llvmlite are always there)."""
    return True


def resolve_target(target: Target | str) -> Target | None:
    """The machine ``target`` names, or None for the ``"evaluator"`` backend; `kiln.Error`
    for a spec that names neither."""
    if isinstance(target, str) and target.strip() == EVALUATOR:
        return None
    return Target.parse(target)


def check_target(target: Target | str) -> None:
    """Raise `kiln.Error` unless ``target`` is a machine or ``"evaluator"``."""
    resolve_target(target)


def compile_kernels(kernels: Sequence[Kernel], target: Target | str = "llvm",
                    opt_level: int = 3) -> KernelSet:
    """A `KernelFunction` for each kernel (by name), made for ``target``."""
    from kiln.codegen.compile import compile_kernels as compile_native

    machine = resolve_target(target)
    opt_level = min(max(opt_level, 0), 3)
    start = time.perf_counter()
    if machine is None:
        out = KernelSet({k.name: EvaluatedKernel(k) for k in kernels}, EVALUATOR)
    elif not kernels:
        out = KernelSet({}, NATIVE, target=machine, opt_level=opt_level)
    else:
        lib = compile_native(list(kernels), machine, opt_level=opt_level)
        out = KernelSet({k.name: lib[k.name] for k in kernels}, NATIVE, lib,
                        target=machine, opt_level=opt_level)
        out.cache_hits = lib.stats.cache_hits
    out.compile_seconds = time.perf_counter() - start
    return out


def load_kernels(kernels: Sequence[Kernel], backend: str,
                 object_code: bytes | None) -> KernelSet:
    """Kernels saved by an executable: machine code mapped back, or evaluated loop IR.
    Machine code for a target this host cannot run raises `kiln.Error`."""
    from kiln.codegen.library import KernelLibrary

    if backend == EVALUATOR or not kernels:
        return KernelSet({k.name: EvaluatedKernel(k) for k in kernels}, backend, loaded=True)
    if object_code is None:
        raise Error("the file says it holds machine code but has none")
    lib = KernelLibrary.from_object(object_code, list(kernels))
    return KernelSet({k.name: lib[k.name] for k in kernels}, NATIVE, lib, loaded=True)
