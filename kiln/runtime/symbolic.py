"""The boundary of a symbolic kernel: the dims it is called with, checked against the arrays.

A symbolic kernel (`kiln.loops.ir.Kernel.dims`) is compiled once for every size: its
buffers' shapes name dimension variables whose values the caller passes after the buffers.
The loop verifier proved every access in bounds *given* that those values are the arrays'
sizes, so this is where that is made true: `bind_dims` reads each dim off the arrays and
refuses (`kiln.Error`) arrays whose shapes do not agree with the kernel's or with each other
— never a call that would read or write outside an array.

`BoundKernel` is a symbolic kernel seen at one concrete shape: what the VM caches per shape
(nothing is compiled for it) and calls like any other `KernelFunction`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.loops.ir import Buffer, Kernel, Var


def _shape_text(b: Buffer) -> str:
    return "[" + ", ".join(d.name if isinstance(d, Var) else str(d) for d in b.shape) + "]"


# per kernel: for each parameter its dtype, rank, output-ness and each axis's size (an
# int) or dim (its position in kernel.dims, as a str key), and where each dim is first read
_Plan = tuple[tuple[tuple[np.dtype, int, bool, tuple[int | str, ...]], ...],
              tuple[tuple[int, int], ...]]
_PLANS: weakref.WeakKeyDictionary[Kernel, _Plan] = weakref.WeakKeyDictionary()


def _plan(kernel: Kernel) -> _Plan:
    plan = _PLANS.get(kernel)
    if plan is None:
        slot = {id(d): str(k) for k, d in enumerate(kernel.dims)}
        params = tuple((np.dtype(b.dtype), b.ndim, k >= len(kernel.inputs),
                        tuple(slot[id(d)] if isinstance(d, Var) else int(d) for d in b.shape))
                       for k, b in enumerate(kernel.params))
        first: dict[int, tuple[int, int]] = {}
        for k, (_, _, _, sizes) in enumerate(params):
            for axis, d in enumerate(sizes):
                if isinstance(d, str):
                    first.setdefault(int(d), (k, axis))
        plan = _PLANS[kernel] = (params, tuple(first.get(k, (-1, -1))
                                               for k in range(len(kernel.dims))))
    return plan


def bind_dims(kernel: Kernel, arrays: Sequence[Any]) -> tuple[int, ...]:
    """The values of ``kernel.dims`` that ``arrays`` (inputs then outputs) have, every
    array checked: a C-contiguous, aligned ndarray of the buffer's dtype and rank, its
    static sizes equal, its symbolic sizes agreeing across arrays; outputs writable."""
    # The common case, fast (the VM calls a kernel per instruction): every check passes.
    params_plan, first = _plan(kernel)
    if len(arrays) == len(params_plan) and all(k >= 0 for k, _ in first):
        values = [arrays[k].shape[axis] if type(arrays[k]) is np.ndarray
                  and arrays[k].ndim > axis else -1 for k, axis in first]
        for (dtype, ndim, is_out, sizes), a in zip(params_plan, arrays):
            if (type(a) is not np.ndarray or a.dtype != dtype or a.ndim != ndim
                    or not a.flags.c_contiguous or not a.flags.aligned
                    or (is_out and not a.flags.writeable)
                    or any((values[int(d)] if isinstance(d, str) else d) != n
                           for d, n in zip(sizes, a.shape))):
                break
        else:
            return tuple(values)
    return _bind_dims_slowly(kernel, arrays)


def _bind_dims_slowly(kernel: Kernel, arrays: Sequence[Any]) -> tuple[int, ...]:
    """`bind_dims` checking each array in turn, for the message of what is wrong."""
    params = kernel.params
    if len(arrays) != len(params):
        raise Error(f"kernel {kernel.name} takes {len(params)} arrays, got {len(arrays)}")
    values: dict[int, int] = {}
    first: dict[int, str] = {}
    for k, (b, a) in enumerate(zip(params, arrays)):
        if not isinstance(a, np.ndarray) or a.dtype != np.dtype(b.dtype) or a.ndim != b.ndim:
            raise Error(f"kernel {kernel.name}: {b.name} must be a {b.dtype}{_shape_text(b)} "
                        f"array, got {getattr(a, 'dtype', type(a).__name__)}"
                        f"{list(getattr(a, 'shape', ()))}")
        if not a.flags.c_contiguous or not a.flags.aligned:
            raise Error(f"kernel {kernel.name}: {b.name} is not C-contiguous and aligned")
        if k >= len(kernel.inputs) and not a.flags.writeable:
            raise Error(f"kernel {kernel.name}: the output {b.name} is read-only")
        for axis, (d, n) in enumerate(zip(b.shape, a.shape)):
            if isinstance(d, Var):
                got = values.setdefault(id(d), n)
                first.setdefault(id(d), f"axis {axis} of {b.name}")
                if got != n:
                    raise Error(
                        f"kernel {kernel.name}: {b.name} has size {n} on axis {axis} "
                        f"(the dim {d.name}), but {first[id(d)]} is {got}: the arrays' "
                        f"shapes {[list(x.shape) for x in arrays]} do not agree")
            elif d != n:
                raise Error(f"kernel {kernel.name}: {b.name} must be a {b.dtype}"
                            f"{_shape_text(b)} array, got {a.dtype}{list(a.shape)}")
    missing = [d.name for d in kernel.dims if id(d) not in values]
    if missing:
        raise Error(f"kernel {kernel.name}: no array gives the dims {', '.join(missing)}")
    return tuple(values[id(d)] for d in kernel.dims)


def concrete_buffers(kernel: Kernel, dims: Sequence[int]) -> tuple[list[Buffer], list[Buffer]]:
    """The kernel's inputs and outputs with ``dims`` put in for its dimension variables."""
    value = {id(d): int(n) for d, n in zip(kernel.dims, dims)}

    def fix(b: Buffer) -> Buffer:
        return Buffer(b.name, tuple(value[id(d)] if isinstance(d, Var) else d
                                    for d in b.shape), b.dtype, b.scope)

    return [fix(b) for b in kernel.inputs], [fix(b) for b in kernel.outputs]


class BoundKernel:
    """A symbolic kernel's compiled code, seen at one concrete shape (no compilation).

    ``kernel`` is the symbolic kernel's loop IR at that shape (its dims constants), for
    allocating outputs, profiles and messages; the call runs the symbolic kernel's machine
    code, which checks the arrays against its signature (`bind_dims`).
    """

    def __init__(self, generic: Any, dims: Sequence[int], name: str) -> None:
        from kiln.loops.generalize import instantiate

        self.generic = generic  # a KernelFunction of a symbolic kernel
        self.dims = tuple(int(n) for n in dims)
        # the loop IR at this shape (Python only, no compilation): what profiles count
        self.kernel = instantiate(generic.kernel, self.dims, name)

    def __call__(self, *arrays: np.ndarray) -> None:
        self.generic(*arrays)

    def __repr__(self) -> str:
        return f"<BoundKernel {self.kernel.name} of {self.generic!r}>"
