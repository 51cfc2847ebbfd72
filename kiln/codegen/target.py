"""The host target: LLVM initialization, the CPU kiln compiles for, and the O3 pipeline.

kiln compiles for the machine it runs on: the target machine is made from the process
triple with the host CPU's name and features (``znver3`` with AVX2 and FMA here), so the
optimizer may use every instruction the CPU has. `Target.key` names all of that, plus the
LLVM version and the code generator's version; it is part of every machine-code cache key,
and saved libraries record it so that a file is never run on a CPU lacking its features.

llvmlite serializes every call into LLVM behind one process-wide lock, so one target per
process is enough; it is created on first use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm

# Bump when emitted code changes meaning or form (part of every cache key and symbol).
CODEGEN_VERSION = "kiln-codegen-4"

_init_lock = threading.Lock()
_initialized = False


def initialize() -> None:
    """Initialize LLVM's native target once per process."""
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            _initialized = True


@dataclass(frozen=True)
class HostTarget:
    """The target machine for this CPU at one optimization level."""

    triple: str
    cpu: str
    features: str
    opt_level: int
    machine: llvm.TargetMachine

    @property
    def llvm_version(self) -> str:
        return ".".join(str(v) for v in llvm.llvm_version_info)

    @property
    def key(self) -> str:
        """Everything about the target that changes the machine code."""
        return (f"{CODEGEN_VERSION}|{self.triple}|{self.cpu}|{self.features}|"
                f"llvm-{self.llvm_version}|O{self.opt_level}")

    @property
    def data_layout(self) -> str:
        return str(self.machine.target_data)

    def optimize(self, module: llvm.ModuleRef) -> None:
        """Run the new pass manager's default pipeline at this opt level, in place."""
        pto = llvm.create_pipeline_tuning_options(speed_level=self.opt_level)
        if self.opt_level >= 2:
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            pto.loop_unrolling = True
            pto.loop_interleaving = True
        pb = llvm.create_pass_builder(self.machine, pto)
        pm = pb.getModulePassManager()
        pm.run(module, pb)

    def new_machine(self) -> llvm.TargetMachine:
        """Another target machine like this one (an execution engine takes ownership of
        the machine it is given)."""
        return _create_machine(self.triple, self.cpu, self.features, self.opt_level)

    def emit_object(self, module: llvm.ModuleRef) -> bytes:
        """Machine code (an ELF relocatable object) for an optimized module."""
        return bytes(self.machine.emit_object(module))


def host_cpu() -> tuple[str, str]:
    """The host CPU's name and its feature string (``+avx2,+fma,...``)."""
    initialize()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@cache
def host_target(opt_level: int = 3) -> HostTarget:
    """The (cached) target machine for this CPU at ``opt_level`` (0–3)."""
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, not {opt_level!r}")
    initialize()
    triple = llvm.get_process_triple()
    cpu, features = host_cpu()
    machine = _create_machine(triple, cpu, features, opt_level)
    return HostTarget(triple, cpu, features, opt_level, machine)


def _create_machine(triple: str, cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
    # The JIT code model: loaded code may sit anywhere relative to libgomp and libc.
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=opt_level, reloc="default", codemodel="jitdefault",
        jit=True)


def missing_features(features: str) -> list[str]:
    """The ``+feature``s of ``features`` that this CPU lacks (machine code for it would fault)."""
    _, host = host_cpu()
    have = {f[1:] for f in host.split(",") if f.startswith("+")}
    return sorted(f[1:] for f in features.split(",") if f.startswith("+") and f[1:] not in have)
