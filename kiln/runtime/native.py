"""The whole-program native executor: one call from Python per inference.

A static SSA program (tensors of static shape, tuples, branches, loops by tail recursion,
calls between functions that do not recurse) compiles to one native entry point
(kiln/codegen/program.py) that calls every kernel itself, with no Python between them. A
call of the executable checks its inputs (kiln/runtime/inputs.py), allocates the result
arrays, and makes one ctypes call — which releases the GIL, so calls from several Python
threads run at once. Each thread has its own scratch stack (the frames: arenas and slots),
so concurrent calls never share intermediate memory.

The factory declines (returns None, and the VM runs the program) for anything else: ADTs,
closures, references, recursion that is not a loop, symbolic shapes, kernels not compiled to
machine code. The entry point's machine code is built for the kernels' `kiln.Target`, cached
on disk like a kernel's and saved in the executable's file; loading maps it back with no
compiler work. For a target this host cannot run, the entry point is built (to be saved)
but calling the executor raises `kiln.Error`.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.codegen.compile import compile_kernels
from kiln.codegen.library import CompiledKernel, ForeignKernel, KernelLibrary, data_pointer
from kiln.codegen.program import STATUS_SHIFT, NotStatic, ProgramCode, emit_program
from kiln.codegen.target import check_runnable, machine
from kiln.errors import Error, InternalError
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.runtime.aligned import frozen_constant
from kiln.runtime.compiler import NATIVE, KernelSet
from kiln.runtime.executor import register_executor
from kiln.runtime.vm import Specializer, _rebuild
from kiln.ssa.ir import Program
from kiln.ssa.memory import check_entry

_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p)
_ALIGN = 64


def _flatten_into(value: Any, out: list[np.ndarray]) -> None:
    """The arrays of a (nested) tuple of arrays, in order, appended to ``out``."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(v)


class NativeExecutor:
    """Runs a static program through its compiled entry point."""

    name = "native"

    def __init__(self, program: Program, kernels: KernelSet, code: ProgramCode,
                 library: KernelLibrary) -> None:
        self.program = program
        self.code = code
        self.library = library  # keeps the entry point's machine code mapped
        self.kernels = kernels  # ... and the kernels'
        self._pointer = data_pointer
        self._kernel_functions = [kernels.functions[name] for name in code.kernels]
        self._fn: Callable[..., int] | None = None
        # the entry that writes results in the caller's arrays directly (program.py), for
        # `run`'s fresh arrays; absent in a file saved before it existed
        self._direct: Callable[..., int] | None = None
        if library.runnable:  # else: built to be saved, for another machine
            self._fn = _ENTRY(library.function_address(code.symbol))
            if code.direct_symbol is not None and library.defines(code.direct_symbol):
                self._direct = _ENTRY(library.function_address(code.direct_symbol))
        # read-only, on 64-byte boundaries (kiln/runtime/aligned.py); the table below
        # points into them
        self._constants = constants = [frozen_constant(c) for c in program.constants]
        table = [data_pointer(c) for c in constants]
        if self._fn is not None:
            table += [f.address for f in self._kernel_functions
                      if isinstance(f, CompiledKernel)]
        self._ctx = (ctypes.c_void_p * max(len(table), 1))(*table)
        self._n_in = len(code.inputs)
        self._ins_type = ctypes.c_void_p * max(self._n_in, 1)
        self._outs_type = ctypes.c_void_p * max(len(code.outputs), 1)
        self._outputs = [(t.static_shape, np.dtype(t.dtype)) for t in code.outputs]
        self._ret_type: Type = program.main.ret_type
        self._tuple_result = isinstance(self._ret_type, TupleType)
        self._simple = all(isinstance(p.type, TensorType) for p in program.main.params)
        self._local = threading.local()
        self.results_allocated = 0  # result arrays `run` has allocated (run_into: none)

    @property
    def object_code(self) -> bytes:
        """The entry point's machine code, for saving (kiln.codegen's library blob)."""
        return bytes(self.library.object_code)

    def _thread_state(self) -> tuple[int, Any, Any]:
        """This thread's scratch stack (64-byte aligned) and argument tables: concurrent
        calls from several threads never share them."""
        local = self._local
        state = getattr(local, "state", None)
        if state is None:
            raw = np.empty(self.code.stack_bytes + _ALIGN, np.uint8)
            local.raw = raw  # kept alive with the thread
            stack = raw.ctypes.data + (-raw.ctypes.data) % _ALIGN
            state = local.state = (stack, self._ins_type(), self._outs_type())
        return state

    def run(self, args: list[Any]) -> Any:
        if self._simple:
            leaves = args
        else:
            leaves = []
            for a in args:
                _flatten_into(a, leaves)
        outs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        self.results_allocated += len(outs)
        self.run_into(leaves, outs, fresh=True)
        if self._tuple_result:
            return _rebuild(self._ret_type, outs)
        return outs[0]

    def run_into(self, leaves: list[np.ndarray], outs: list[np.ndarray],
                 fresh: bool = False) -> None:
        """Run on the input arrays ``leaves`` (tuples flattened, checked by the caller),
        writing the results into the caller's arrays ``outs`` (flattened, of the result's
        shapes and dtypes, C-contiguous): nothing is allocated.

        An output array may be one of the inputs (donation: kiln/train's weights): the
        entry point writes its results only at the end, once every kernel has read its
        inputs, so a result computed from the input it overwrites is right. A result that
        is itself a copy of a donated input is not (`kiln.ssa.memory.donation_hazards`
        says which; give those a scratch array). ``fresh``: ``outs`` overlap nothing (new
        arrays), so the kernels may write them directly (the direct entry, when the program
        has one).
        """
        fn = self._direct if fresh and self._direct is not None else self._fn
        if fn is None:  # built for another machine: check_runnable says why it cannot run here
            check_runnable(self.library.target, "this program")
            raise InternalError("the program's entry point is not loaded")
        if len(leaves) != self._n_in or len(outs) != len(self._outputs):
            raise InternalError(f"the native entry point takes {self._n_in} arrays and "
                                f"{len(self._outputs)} results, got {len(leaves)} and "
                                f"{len(outs)}")
        stack, ins, out_ptrs = self._thread_state()
        ptr = self._pointer
        for i, a in enumerate(leaves):
            ins[i] = ptr(a)
        for i, o in enumerate(outs):
            out_ptrs[i] = ptr(o)
        status = fn(self._ctx, ins, out_ptrs, stack)
        if status:
            self._fail(status)

    def _fail(self, status: int) -> None:
        k = (status >> STATUS_SHIFT) - 1
        if 0 <= k < len(self._kernel_functions):
            f = self._kernel_functions[k]
            if isinstance(f, CompiledKernel):  # what the entry point calls when it runs
                f.fail(status & ((1 << STATUS_SHIFT) - 1))
        raise InternalError(f"the program's entry point returned the unknown status {status}")


# The entry point is glue — pointer tables, calls, branches, copies — whose speed hardly
# matters next to the kernels it calls; LLVM's O3 on a function of thousands of calls takes
# minutes (50 s for 3,000 here, against 1 s at O0). Large programs get the quick O0.
LARGE_PROGRAM = 256  # call sites


def entry_opt_level(code: ProgramCode, opt_level: int) -> int:
    """The optimization level for a program's entry point (not its kernels')."""
    return min(opt_level, 2) if code.call_sites <= LARGE_PROGRAM else 0


def make_native_executor(program: Program, kernels: KernelSet,
                         specialize: Specializer | None = None) -> NativeExecutor | None:
    """The native executor for ``program``, or None when it is not static (the VM runs it).

    Built: the entry point is emitted and compiled (cached on disk). Loaded from a file
    (``kernels.loaded``): its saved machine code is mapped back, or None when the file has
    none — loading never compiles.
    """
    if kernels.backend != NATIVE or kernels.target is None:
        return None
    if kernels.loaded and kernels.program_code is None:
        return None
    tm = machine(kernels.target, kernels.opt_level)
    try:
        code = emit_program(program, tm.triple, tm.data_layout)
    except NotStatic:
        return None
    check_entry(code.stack_bytes, code.outputs)  # kiln.Error beyond KILN_MAX_ALLOC_BYTES
    if any(name not in kernels.functions for name in code.kernels):
        return None
    native = CompiledKernel if kernels.target.is_host else ForeignKernel
    if not all(isinstance(f, native) for f in kernels.functions.values()):
        return None  # some kernel is not machine code of this library (or evaluated)
    if kernels.loaded:
        assert kernels.program_code is not None
        library = KernelLibrary.from_object(kernels.program_code, [])
        if not library.defines(code.symbol):
            raise Error("the saved native entry point was compiled from another program")
    else:
        modules = [code.text] + ([code.direct_text] if code.direct_text else [])
        library = compile_kernels([], kernels.target, entry_opt_level(code, kernels.opt_level),
                                  modules=modules)
        kernels.compile_seconds += library.stats.seconds
        kernels.cache_hits += library.stats.cache_hits
    return NativeExecutor(program, kernels, code, library)


register_executor("native", make_native_executor, priority=10)
