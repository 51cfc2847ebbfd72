"""Machine code in the process: a `KernelLibrary` of callable `CompiledKernel`s.

A library is a set of object files (one per distinct kernel, plus any extra modules such
as a whole-program entry point) linked into one MCJIT execution engine: symbols resolve
between its objects, and against kiln's thread pool, libc and libm of the process. Kernels
are called through ctypes (which releases the GIL) with an array of data pointers, after
`check_arrays` has checked every argument; a nonzero status raises `kiln.EvalError` with
the message of the `Check` (or allocation) that failed.

A library built for a `kiln.Target` this host cannot run (another architecture, or
features this CPU lacks) holds its object files but loads nothing: its kernels are
`ForeignKernel`s, which raise `kiln.Error` when called, and it can still be saved.

`KernelLibrary.object_code` is one self-describing blob (a format version, the target it
was compiled for — its spec string, fingerprint and fields —, the objects and the symbols
each defines, a SHA-256 over everything); `KernelLibrary.from_object` maps it back into a
process with no compiler work. A blob that is truncated or corrupted, compiled for a target
this host cannot run, or that does not define the kernels it is given raises `kiln.Error`
— never a crash.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from kiln.codegen import elf
from kiln.codegen.cache import kernel_symbol
from kiln.codegen.emit import status_messages
from kiln.codegen.target import check_runnable, llvm_version, machine
from kiln.codegen.threads import ensure_runtime
from kiln.errors import Error, EvalError, InternalError
from kiln.ir.dtype import dtype_of
from kiln.loops.ir import Buffer, Kernel
from kiln.runtime.kernel import check_arrays
from kiln.runtime.pointers import data_pointer
from kiln.target import Target

FORMAT_VERSION = 2
_MAGIC = b"KILNLIB\x02"
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)


@dataclass
class ObjectCode:
    """One object file and the global symbols it defines."""

    symbols: tuple[str, ...]
    data: bytes


@dataclass
class LibraryStats:
    """What building a library cost (all zero for a library loaded from object code)."""

    kernels: int = 0
    distinct: int = 0
    cache_hits: int = 0
    compiled: int = 0
    emit_seconds: float = 0.0
    llvm_seconds: float = 0.0
    seconds: float = 0.0
    per_kernel: dict[str, float] = field(default_factory=dict)


def _byte_strides(b: Buffer) -> tuple[int, ...]:
    """The strides of a C-contiguous numpy array of the buffer's shape and dtype."""
    if b.size == 0:  # numpy's own rule for empty arrays (allocating nothing)
        return np.empty(b.shape, b.dtype).strides
    return tuple(s * dtype_of(b.dtype).itemsize for s in b.strides)


class CompiledKernel:
    """A kernel in machine code: ``f(*inputs, *outputs)`` fills the outputs in place."""

    def __init__(self, kernel: Kernel, symbol: str, address: int,
                 library: KernelLibrary) -> None:
        self.kernel = kernel
        self.symbol = symbol
        self.address = address
        self.library = library  # keeps the machine code mapped
        self._fn = _ENTRY(address)
        self._args_type = ctypes.c_void_p * (len(kernel.params) + len(kernel.dims))
        # a symbolic kernel's sizes come with each call: kiln/runtime/symbolic.py checks them
        self._expected = () if kernel.is_symbolic else tuple(
            (b.shape, np.dtype(b.dtype), _byte_strides(b)) for b in kernel.params)
        self._first_output = len(kernel.inputs)
        self._messages = status_messages(kernel)

    def __call__(self, *arrays: np.ndarray) -> None:
        if self.kernel.is_symbolic:
            from kiln.runtime.symbolic import bind_dims

            dims = bind_dims(self.kernel, arrays)  # raises kiln.Error on a mismatch
            status = self._fn(self._args_type(*[data_pointer(a) for a in arrays], *dims))
            if status:
                self.fail(status)
            return
        if not self._fast_check(arrays):
            check_arrays(self.kernel, arrays)  # raises, saying what is wrong
        status = self._fn(self._args_type(*[data_pointer(a) for a in arrays]))
        if status:
            self.fail(status)

    def unchecked(self) -> tuple[Callable[[Any], int], Any]:
        """(entry, argument array type) for a caller whose arrays are right by construction
        (the VM's own registers: allocated to the kernel's shapes, results of kernels,
        inputs checked at the boundary): ``entry(args_type(*pointers))`` returns the status
        (nonzero: `fail`), skipping the per-call check of `__call__`."""
        if self.kernel.is_symbolic:
            raise InternalError(f"kernel {self.kernel.name} is symbolic: its sizes are "
                                "checked on every call")
        return self._fn, self._args_type

    def _fast_check(self, arrays: tuple) -> bool:
        """What `check_arrays` checks, for the common case (exact ndarrays, all good)."""
        if len(arrays) != len(self._expected):
            return False
        for k, (a, (shape, dtype, strides)) in enumerate(zip(arrays, self._expected)):
            if (type(a) is not np.ndarray or a.shape != shape or a.strides != strides
                    or (a.dtype is not dtype and a.dtype != dtype)):
                return False
            if k >= self._first_output and not a.flags.writeable:
                return False
        return True

    def fail(self, status: int) -> None:
        """Raise the error a nonzero status stands for."""
        if 1 <= status <= len(self._messages):
            raise EvalError(self._messages[status - 1])
        raise InternalError(f"kernel {self.kernel.name} returned the unknown status {status}")

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.kernel.name} at {self.address:#x}>"


class ForeignKernel:
    """A kernel in machine code for a target this host cannot run: calling it raises."""

    def __init__(self, kernel: Kernel, symbol: str, target: Target) -> None:
        self.kernel = kernel
        self.symbol = symbol
        self.target = target

    def __call__(self, *arrays: np.ndarray) -> None:
        check_runnable(self.target, f"kernel {self.kernel.name}")
        raise InternalError(f"kernel {self.kernel.name} was never loaded")

    def __repr__(self) -> str:
        return f"<ForeignKernel {self.kernel.name} for {self.target.triple}>"


class KernelLibrary(Mapping[str, "CompiledKernel | ForeignKernel"]):
    """Compiled kernels by name, and the machine code they live in."""

    def __init__(self, kernels: Sequence[Kernel], objects: Sequence[ObjectCode],
                 target: Target, opt_level: int = 3, stats: LibraryStats | None = None
                 ) -> None:
        self.target = target
        self.opt_level = opt_level
        self.objects = list(objects)
        self.stats = stats or LibraryStats(kernels=len(kernels))
        self.runnable = target.is_host  # else: machine code to save, never to load here
        self._exported = {s for o in self.objects for s in o.symbols}
        self._engine = None
        if self.runnable:
            ensure_runtime()
            _check_symbols(self.objects)
            tm = machine(target, opt_level).new_machine()
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
            for o in self.objects:
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(o.data))
            self._engine.finalize_object()
        self._kernels: dict[str, CompiledKernel | ForeignKernel] = {}
        for k in kernels:
            if k.name in self._kernels:
                raise InternalError(f"two kernels of one library are named {k.name}")
            symbol = kernel_symbol(k)
            if symbol not in self._exported:
                raise Error(f"the machine code does not define kernel {k.name} (symbol "
                            f"{symbol}): it was compiled from different kernels or by "
                            "another version of kiln")
            self._kernels[k.name] = (
                CompiledKernel(k, symbol, self.function_address(symbol), self)
                if self.runnable else ForeignKernel(k, symbol, target))

    # --- the mapping -------------------------------------------------------------------------

    def __getitem__(self, name: str) -> CompiledKernel | ForeignKernel:
        return self._kernels[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    def symbol(self, name: str) -> str:
        """The native symbol of kernel ``name`` (``i32 sym(ptr args)``)."""
        return self._kernels[name].symbol

    def address(self, name: str) -> int:
        """The native address of kernel ``name``'s entry point."""
        return self.function_address(self._kernels[name].symbol)

    def defines(self, symbol: str) -> bool:
        """Whether one of the library's objects defines the global ``symbol``."""
        return symbol in self._exported

    def function_address(self, symbol: str) -> int:
        """The address of any global symbol the library defines (e.g. a program's entry)."""
        if symbol not in self._exported:
            raise InternalError(f"the library does not define the symbol {symbol}")
        if self._engine is None:
            check_runnable(self.target, "this library")
            raise InternalError("a runnable library has no execution engine")
        address = self._engine.get_function_address(symbol)
        if not address:
            raise InternalError(f"the symbol {symbol} did not resolve")
        return address

    # --- saving and loading ------------------------------------------------------------------

    @property
    def object_code(self) -> bytes:
        """All the library's machine code as one blob, for `from_object`."""
        info = {**self.target.to_json(), "llvm": llvm_version(), "opt_level": self.opt_level}
        return pack_library(info, self.objects)

    @classmethod
    def from_object(cls, object_code: bytes, kernels: Sequence[Kernel]) -> KernelLibrary:
        """Map machine code from `object_code` back in, with no compiler work; `kiln.Error`
        if this host cannot run the target it was built for."""
        info, objects = unpack_library(object_code)
        try:
            target = Target.from_json(info)
            opt_level = int(info.get("opt_level", 3))
        except (Error, KeyError, TypeError, ValueError) as exc:
            raise Error(f"not valid kiln machine code: its target is malformed ({exc})"
                        ) from None
        check_runnable(target, "this machine code")
        return cls(kernels, objects, target, opt_level)


_process = ctypes.CDLL(None)


def _resolvable(symbol: str) -> bool:
    """Whether MCJIT will find ``symbol`` outside the library (LLVM's table, the process)."""
    if llvm.address_of_symbol(symbol):
        return True
    try:
        getattr(_process, symbol)
    except AttributeError:
        return False
    return True


def _check_symbols(objects: Sequence[ObjectCode]) -> None:
    """Every symbol the objects need resolves (MCJIT would otherwise call address 0)."""
    tables = []
    for o in objects:
        try:
            tables.append(elf.symbols(o.data))
        except elf.MalformedObject as exc:
            raise Error(f"not valid kiln machine code: {exc}") from None
    defined = set().union(*(t.defined for t in tables)) if tables else set()
    missing = sorted({s for t in tables for s in t.undefined
                      if s not in defined and not _resolvable(s)})
    if missing:
        raise Error(f"the machine code needs {', '.join(missing)}, which this process does "
                    "not provide")


def pack_library(target: dict, objects: Sequence[ObjectCode]) -> bytes:
    """The blob `unpack_library` reads: magic, header length, JSON header, objects, SHA-256."""
    header = json.dumps({
        "format": FORMAT_VERSION, "target": target,
        "objects": [{"symbols": list(o.symbols), "size": len(o.data)} for o in objects],
    }, sort_keys=True).encode()
    body = _MAGIC + struct.pack("<Q", len(header)) + header + b"".join(o.data for o in objects)
    return body + hashlib.sha256(body).digest()


def unpack_library(blob: bytes) -> tuple[dict, list[ObjectCode]]:
    """The target and objects of a library blob; `kiln.Error` if it is not an intact one."""
    def bad(why: str) -> Error:
        return Error(f"not valid kiln machine code: {why}")

    blob = bytes(blob)
    if len(blob) < len(_MAGIC) + 8 + 32 or not blob.startswith(_MAGIC[:7]):
        raise bad("too short or wrong magic number")
    if blob[:8] != _MAGIC:
        raise bad(f"format version {blob[7]}, this kiln reads {FORMAT_VERSION}")
    body, digest = blob[:-32], blob[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise bad("checksum mismatch (truncated or corrupted)")
    (hlen,) = struct.unpack_from("<Q", body, 8)
    start = 16 + hlen
    if start > len(body):
        raise bad("header runs past the end")
    try:
        header = json.loads(body[16:start].decode())
        target = header["target"]
        entries = header["objects"]
        objects = []
        offset = start
        for e in entries:
            size = int(e["size"])
            if size < 0 or offset + size > len(body):
                raise bad("an object runs past the end")
            objects.append(ObjectCode(tuple(str(s) for s in e["symbols"]),
                                      body[offset:offset + size]))
            offset += size
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise bad(f"malformed header ({exc})") from None
    if offset != len(body) or not isinstance(target, dict):
        raise bad("inconsistent sizes")
    return target, objects
