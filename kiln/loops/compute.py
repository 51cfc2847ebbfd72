"""Tensors during lowering: how an operator says what its output element is.

An operator's lowering (``OpDef.lower``, beside its other rules) receives its inputs as
`Tensor`s — something with a shape and dtype that can be read at indices — and returns the
`Tensor` of its result, in one of three forms:

- `compute(shape, dtype, fn)`: the element at ``idx`` is the scalar expression ``fn(*idx)``.
  Elementwise, broadcast and injective operators use this; the lowering of a fused kernel
  inlines such tensors into their consumers, so a fused group has no intermediate buffers.
- `reduce(shape, dtype, extents, combine, body, init, finalize)`: the element at ``idx``
  combines ``body(idx, r)`` over the reduction indices ``r``.
- `extern(shape, dtype, emit)`: the operator writes its own loop nest (dense and conv2d with
  their packed micro-kernels, pooling, softmax...). ``emit(write)`` returns a statement that
  calls ``write(idx, value)`` for each output element; `write` applies the fused elementwise
  consumers (the epilogue: bias, relu, add) and stores, so they run while values are fresh.

Reading a `reduce` or `extern` tensor at the indices its consumer is being written at gives
the value being written (the epilogue case); reading it anywhere else makes the lowering
driver materialize it into a local buffer first (`NeedsBuffer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.errors import InternalError
from kiln.loops.ir import (
    INDEX,
    Buffer,
    Const,
    Expr,
    Load,
    Stmt,
    Var,
)

Indices = tuple[Expr, ...]
WriteFn = Callable[[Indices, Expr], Stmt]


class Tensor:
    """A value of a lowered program: a shape, a dtype, and elements to read."""

    shape: tuple[int, ...]
    dtype: str
    # The knobs a lowering chose for this tensor (a GEMM's tiles), for kernel.attrs["schedules"].
    schedule: dict[str, Any] | None = None

    def __call__(self, *idx: Expr) -> Expr:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.shape)


class BufferTensor(Tensor):
    """A tensor held in a buffer (a kernel argument or a materialized intermediate)."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer
        self.shape = buffer.shape
        self.dtype = buffer.dtype

    def __call__(self, *idx: Expr) -> Expr:
        return Load(self.buffer, tuple(idx))


_EPOCH = [0]


def new_epoch() -> None:
    """Forget every `ComputeTensor`'s shared reads (see below).

    The lowering driver starts a new epoch for each element write and each attempt: a read
    cached in one may mention a variable bound only there (the value being written).
    """
    _EPOCH[0] += 1


class ComputeTensor(Tensor):
    """An element-by-element definition, inlined where it is read.

    Reading it twice at the same index objects (within one epoch) gives the same expression
    object, so shared subexpressions stay shared (the code generator emits each node once).
    """

    def __init__(self, shape: Sequence[int], dtype: str, fn: Callable[..., Expr]) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.fn = fn
        self._memo: dict[tuple[int, ...], tuple[Indices, Expr]] = {}
        self._epoch = _EPOCH[0]

    def __call__(self, *idx: Expr) -> Expr:
        if len(idx) != len(self.shape):
            raise InternalError(f"a rank-{len(self.shape)} tensor read with {len(idx)} indices")
        if self._epoch != _EPOCH[0]:
            self._memo.clear()
            self._epoch = _EPOCH[0]
        key = tuple(id(i) for i in idx)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        value = self.fn(*idx)
        if value.dtype != self.dtype:
            raise InternalError(f"a compute of dtype {self.dtype} produced {value.dtype}")
        self._memo[key] = (idx, value)  # keep idx alive so ids stay unique
        return value


class NeedsBuffer(Exception):
    """Raised when a reduce/extern tensor is read other than at its write indices."""

    def __init__(self, tensor: MaterializedTensor) -> None:
        super().__init__("a tensor must be materialized")
        self.tensor = tensor


class MaterializedTensor(Tensor):
    """Base of reduce and extern tensors: written by a loop nest of their own.

    While the driver emits that loop nest, ``current`` holds (indices, value-var) of the
    element being written; reading the tensor at those very indices gives the value.
    After `materialize`, reads load from the buffer.
    """

    def __init__(self, shape: Sequence[int], dtype: str) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.current: tuple[Indices, Var] | None = None
        self.buffer: Buffer | None = None

    def __call__(self, *idx: Expr) -> Expr:
        if self.buffer is not None:
            return Load(self.buffer, tuple(idx))
        if self.current is not None:
            cur_idx, value = self.current
            if len(idx) == len(cur_idx) and all(a is b for a, b in zip(idx, cur_idx)):
                return value
        raise NeedsBuffer(self)

    def emit(self, write: WriteFn) -> Stmt:
        raise NotImplementedError


class ReduceTensor(MaterializedTensor):
    """``out[idx] = finalize(combine over r of body(idx, r), idx)``, starting from ``init``."""

    def __init__(
        self,
        shape: Sequence[int],
        dtype: str,
        extents: Sequence[int],
        combine: str,
        body: Callable[[Indices, Indices], Expr],
        init: Expr,
        finalize: Callable[[Expr, Indices], Expr] | None = None,
        acc_dtype: str | None = None,
    ) -> None:
        super().__init__(shape, dtype)
        self.extents = tuple(int(e) for e in extents)
        self.combine = combine  # a Binary op name: add, mul, max, min, and, or
        self.body = body
        self.init = init
        self.finalize = finalize
        self.acc_dtype = acc_dtype or init.dtype

    def emit(self, write: WriteFn) -> Stmt:
        from kiln.loops.reduce_emit import emit_reduce

        return emit_reduce(self, write)


class ExternTensor(MaterializedTensor):
    """An operator that writes its own loop nest: ``emit(write) -> Stmt``."""

    def __init__(self, shape: Sequence[int], dtype: str, emit: Callable[[WriteFn], Stmt]) -> None:
        super().__init__(shape, dtype)
        self._emit = emit

    def emit(self, write: WriteFn) -> Stmt:
        return self._emit(write)


def compute(shape: Sequence[int], dtype: str, fn: Callable[..., Expr]) -> ComputeTensor:
    """A tensor whose element at ``idx`` is ``fn(*idx)``."""
    return ComputeTensor(shape, dtype, fn)


def reduce(
    shape: Sequence[int],
    dtype: str,
    extents: Sequence[int],
    combine: str,
    body: Callable[[Indices, Indices], Expr],
    init: Expr,
    finalize: Callable[[Expr, Indices], Expr] | None = None,
    acc_dtype: str | None = None,
) -> ReduceTensor:
    """A reduction over ``extents`` (see `ReduceTensor`)."""
    return ReduceTensor(shape, dtype, extents, combine, body, init, finalize, acc_dtype)


def extern(shape: Sequence[int], dtype: str, emit: Callable[[WriteFn], Stmt]) -> ExternTensor:
    """A tensor written by its own loop nest (see `ExternTensor`)."""
    return ExternTensor(shape, dtype, emit)


def broadcast_indices(
    in_shape: Sequence[int], out_shape: Sequence[int], out_idx: Indices
) -> Indices:
    """Numpy broadcasting: the indices into a tensor of ``in_shape`` for an output element.

    Trailing axes align; an input axis of size 1 facing a larger output axis is read at 0.
    Where the sizes match, the very same index objects are passed on (so elementwise reads
    stay recognizable).
    """
    offset = len(out_idx) - len(in_shape)
    if offset < 0:
        raise InternalError(f"cannot broadcast shape {tuple(in_shape)} to rank {len(out_idx)}")
    return tuple(
        out_idx[offset + k] if d == out_shape[offset + k] else Const(0, INDEX)
        for k, d in enumerate(in_shape)
    )
