"""LLVM's side of a `kiln.Target`: initialization, target machines, the O3 pipeline.

`machine(target, opt_level)` is the LLVM target machine for a `kiln.Target` (triple, CPU
name and feature string) at one optimization level, cached per process; the code generator
optimizes and emits object files with it. `Machine.key` names everything that changes the
machine code for given LLVM IR — the target's fingerprint, the LLVM version, kiln's codegen
version, the opt level — and is part of every machine-code cache key.

Every target gets the same relocation and code model (JIT-default: loaded code may sit
anywhere relative to libc and kiln's thread pool), so that an object's bytes depend only on the key,
whichever machine made it. Machine code for a target this host cannot run (another
architecture, or features this CPU lacks) is made the same way and never loaded.

llvmlite serializes every call into LLVM behind one process-wide lock, so one machine per
(target, opt level) is enough; it is created on first use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm

from kiln.errors import Error
from kiln.target import Target

# Bump when emitted code changes meaning or form (part of every cache key and symbol).
CODEGEN_VERSION = "kiln-codegen-10"

_init_lock = threading.Lock()
_initialized: set[str] = set()


def initialize() -> None:
    """Initialize LLVM's native target once per process."""
    with _init_lock:
        if "native" not in _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            _initialized.add("native")


def initialize_all() -> None:
    """Initialize every target LLVM was built with (for code of another architecture)."""
    initialize()
    with _init_lock:
        if "all" not in _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized.add("all")


def llvm_version() -> str:
    return ".".join(str(v) for v in llvm.llvm_version_info)


@dataclass(frozen=True)
class Machine:
    """The LLVM target machine for one `Target` at one optimization level."""

    target: Target
    opt_level: int
    machine: llvm.TargetMachine

    @property
    def triple(self) -> str:
        return self.target.triple

    @property
    def key(self) -> str:
        """Everything that changes the machine code for given LLVM IR (for cache keys)."""
        return (f"{CODEGEN_VERSION}|{self.target.fingerprint}|llvm-{llvm_version()}|"
                f"O{self.opt_level}")

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
        return _create_machine(self.target, self.opt_level)

    def emit_object(self, module: llvm.ModuleRef) -> bytes:
        """Machine code (an ELF relocatable object) for an optimized module."""
        return bytes(self.machine.emit_object(module))

    def emit_assembly(self, module: llvm.ModuleRef) -> str:
        return str(self.machine.emit_assembly(module))


@cache
def machine(target: Target | None = None, opt_level: int = 3) -> Machine:
    """The (cached) target machine for ``target`` (default: this CPU) at ``opt_level``."""
    if opt_level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level must be 0, 1, 2 or 3, not {opt_level!r}")
    target = target or Target.host()
    return Machine(target, opt_level, _create_machine(target, opt_level))


def host_target(opt_level: int = 3) -> Machine:
    """The target machine for this CPU at ``opt_level`` (``machine(Target.host(), ...)``)."""
    return machine(Target.host(), opt_level)


def _create_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    initialize()
    if target.arch != Target.host().arch:
        initialize_all()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as exc:
        raise Error(f"LLVM cannot generate code for {target.triple}: {str(exc).strip()}"
                    ) from None
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=machine_features(target), opt=opt_level, reloc="default",
        codemodel="jitdefault", jit=True)


def machine_features(target: Target) -> str:
    """LLVM's feature string for ``target``'s machine code: its features, and on AVX-512
    the whole vector width for the loops LLVM vectorizes itself.

    LLVM's tuning of the Intel CPUs with AVX-512 from Skylake-SP on (``prefer-256-bit``)
    vectorizes loops 8 floats at a time, to spare the clock of chips that slowed down for
    512-bit instructions; kiln's own vectors (the GEMMs') were 16 wide all along. With the
    tuning off, on a Sapphire Rapids-class VM (2 threads): a softmax over 32×128×128 floats,
    whose exponentials had been 4 × 8 lanes a step, 557 -> 352 µs; whole models, both
    builds in one process, alternated: MobileNetV2 4.27 -> 4.13 ms, ViT block 13.8 -> 13.3,
    GPT block 15.7 -> 15.4, the 4-layer encoder 3.57 -> 3.52, ResNet-18 even."""
    features = target.llvm_features
    if "avx512f" in target.features:
        features += ",-prefer-256-bit"
    return features


def check_runnable(target: Target, what: str = "this machine code") -> None:
    """Raise `kiln.Error` unless this host can run code built for ``target``."""
    if target.is_host:
        return
    host = Target.host()
    if target.arch != host.arch:
        why = f"this host is {host.triple}"
    else:
        lacking = sorted(target.features - host.features)
        shown = ", ".join(lacking[:8]) + (", ..." if len(lacking) > 8 else "")
        why = f"this host's CPU ({host.cpu}) lacks {shown}"
    raise Error(f"{what} was built for {target.triple} ({target.cpu}); {why}, so it cannot "
                "run here; use kiln export to write it out for that machine")
