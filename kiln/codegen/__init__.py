"""Code generation: loop-IR kernels to machine code through LLVM (llvmlite).

Three stages, one file each: emit (emit.py, with emit_expr.py and arith.py: the loop IR
as an LLVM module), verify and compile (compile.py, target.py: LLVM's verifier, the
O3 pipeline for a `kiln.Target` — this CPU by default —, an object file), and load
(library.py: machine code linked into the process, kernels callable from Python or from
other native code; never for a target this host cannot run). cache.py keeps
machine code on disk; threads.py runs parallel loops on kiln's own thread pool (pool.py);
program.py emits a whole static SSA program as one entry point that calls its kernels (the
native executor's).

    lib = compile_kernels([kernel])          # KernelLibrary
    lib[kernel.name](*inputs, *outputs)      # a KernelFunction
    blob = lib.object_code                   # save ...
    lib2 = KernelLibrary.from_object(blob, [kernel])  # ... and load, with no compiler work
"""

from kiln.codegen.cache import DiskCache, fingerprint, kernel_symbol
from kiln.codegen.compile import assembly, compile_ir, compile_kernels, llvm_ir, optimized_ir
from kiln.codegen.emit import emit_kernel, status_messages
from kiln.codegen.library import CompiledKernel, ForeignKernel, KernelLibrary, LibraryStats
from kiln.codegen.program import NotStatic, ProgramCode, emit_program
from kiln.codegen.target import Machine, check_runnable, host_target, machine
from kiln.codegen.threads import (
    flush_denormals,
    num_threads,
    set_num_threads,
    set_spin_ms,
    spin_ms,
    threads,
)

__all__ = [
    "CompiledKernel", "DiskCache", "ForeignKernel", "KernelLibrary", "LibraryStats", "Machine",
    "NotStatic", "ProgramCode", "assembly", "check_runnable", "compile_ir", "compile_kernels",
    "emit_kernel", "emit_program", "fingerprint", "flush_denormals", "host_target",
    "kernel_symbol",
    "llvm_ir", "machine", "num_threads", "optimized_ir", "set_num_threads", "set_spin_ms",
    "spin_ms", "status_messages",
    "threads",
]
