"""nn.dropout_train: dropout in training mode, its mask drawn from an explicit key.

A kiln extension (not in TVM). ``nn.dropout_train(data, key, rate=r)`` keeps each element
with probability ``1 - r`` and scales the kept ones by ``1 / (1 - r)``. There is no hidden
global state: the randomness is a counter-based hash (JAX's design; Salmon et al.'s
"Parallel random numbers: as easy as 1, 2, 3") of

    (seed, counter) = key,  an int64 tensor of shape (2,), each taken modulo 2**32,
    stream,                 an attribute telling apart dropouts that share a key,
    the element's row-major index (modulo 2**32),

so an element's fate depends on nothing else: not on the executor, the schedule or the
number of threads. The numpy reference and the loop IR compute the same 32-bit integer hash
with the same integer operations (`_Bits` below), so `kiln.interpret` and `kiln.build`
agree bit for bit. The output is linear in ``data`` with the key fixed, so the gradient is
the same dropout of the cotangent: the same mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor, compute
from kiln.loops.ir import Binary, Const, Select
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import require_dtype, shape_str, tensor_arg
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpPattern, register

_M32 = 0xFFFFFFFF
_NUMPY = {"and": np.bitwise_and, "xor": np.bitwise_xor, "add": np.add, "mul": np.multiply,
          "floordiv": np.floor_divide}

# A value of the hash: an int64 numpy array or scalar, or a loop-IR int64 expression.
Value = Any


class _Bits:
    """Unsigned 32-bit arithmetic on values held in int64 (numpy arrays or loop-IR
    expressions): every intermediate stays below 2**49, so no int64 operation overflows
    and both sides compute exactly the same bits. A shift right is a floor division (the
    values are never negative); the loop IR has no shift."""

    def __init__(self, ir: bool) -> None:
        self._ir = ir

    def k(self, value: int) -> Value:
        return Const(value, "int64") if self._ir else np.int64(value)

    def op(self, name: str, a: Value, b: Value) -> Value:
        return Binary(name, a, b) if self._ir else _NUMPY[name](a, b)

    def u32(self, a: Value) -> Value:
        return self.op("and", a, self.k(_M32))

    def shr(self, a: Value, bits: int) -> Value:
        return self.op("floordiv", a, self.k(1 << bits))

    def add(self, a: Value, b: Value) -> Value:
        return self.u32(self.op("add", a, b))

    def mul(self, a: Value, c: int) -> Value:
        """``a * c mod 2**32`` as (low 16 bits of a) * c + ((high 16 bits of a) * c) << 16."""
        lo = self.op("and", a, self.k(0xFFFF))
        hi = self.shr(a, 16)
        high = self.op("mul", self.op("and", self.op("mul", hi, self.k(c)), self.k(0xFFFF)),
                       self.k(1 << 16))
        return self.u32(self.op("add", self.op("mul", lo, self.k(c)), high))

    def fmix(self, h: Value) -> Value:
        """MurmurHash3's 32-bit finalizer: a bijection in which every input bit flips each
        output bit with probability about 1/2."""
        h = self.op("xor", h, self.shr(h, 16))
        h = self.mul(h, 0x85EBCA6B)
        h = self.op("xor", h, self.shr(h, 13))
        h = self.mul(h, 0xC2B2AE35)
        return self.op("xor", h, self.shr(h, 16))

    def bits(self, seed: Value, counter: Value, stream: int, index: Value) -> Value:
        """32 random bits (as an int64 in [0, 2**32)) for one element."""
        k1 = self.fmix(self.add(self.u32(seed), self.k((0x9E3779B9 * (stream + 1)) & _M32)))
        k2 = self.fmix(self.add(self.op("xor", k1, self.u32(counter)), self.k(0x7F4A7C15)))
        h = self.fmix(self.add(self.u32(index), k2))
        return self.fmix(self.op("xor", h, k1))


def random_bits(key: np.ndarray, shape: Sequence[int], stream: int = 0) -> np.ndarray:
    """The 32 random bits of each element of a tensor of ``shape`` under ``key`` (int64 in
    [0, 2**32)): the numbers nn.dropout_train draws."""
    k = np.asarray(key, dtype=np.int64)
    index = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    return np.asarray(_Bits(ir=False).bits(k[0], k[1], stream, index), dtype=np.int64)


def keep_threshold(rate: float) -> int:
    """An element is kept when its 32 bits are below this: probability 1 - rate."""
    return min(round((1.0 - rate) * 2.0**32), 2**32)


class DropoutTrainAttrs(Attrs):
    __slots__ = ()
    rate: float
    stream: int


def _relation(arg_types: Sequence[Type], attrs: DropoutTrainAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    key = tensor_arg(arg_types[1], "key")
    if data is None or key is None:
        return None
    require_dtype(data, "data", "float")
    if key.dtype != "int64" or key.shape != (2,):
        raise TypeCheckError(f"dropout_train's key must be an int64 tensor of shape (2,) "
                             f"(seed, counter), got {key.dtype}{shape_str(key.shape)}")
    if not 0.0 <= attrs.rate < 1.0:
        raise TypeCheckError(f"dropout rate must lie in [0, 1), got {attrs.rate}")
    return data


def _dropout_train(arrays: list[np.ndarray], attrs: DropoutTrainAttrs) -> np.ndarray:
    x, key = np.asarray(arrays[0]), np.asarray(arrays[1])
    keep = random_bits(key, x.shape, attrs.stream) < keep_threshold(attrs.rate)
    scale = np.asarray(1.0 / (1.0 - attrs.rate), dtype=x.dtype)
    return np.where(keep, x * scale, np.zeros((), x.dtype)).astype(x.dtype, copy=False)


def _gradient(c: Call, g: Expr) -> list[Expr | None]:
    # linear in data for a fixed key: the cotangent goes through the same mask
    attrs = DropoutTrainAttrs.view(c.attrs)
    return [call("nn.dropout_train", g, c.args[1], rate=attrs.rate, stream=attrs.stream), None]


def _lower(inputs: list[Tensor], attrs: DropoutTrainAttrs, out: Type) -> Tensor:
    x, key = inputs
    dt = x.dtype
    b = _Bits(ir=True)
    seed, counter = key(Const(0)), key(Const(1))
    scale = oplib.dtype_const(1.0 / (1.0 - attrs.rate), dt)
    threshold = Const(keep_threshold(attrs.rate), "int64")

    def element(*i: LExpr) -> LExpr:
        index: LExpr = Const(0)
        for axis, extent in enumerate(x.shape):  # the row-major element index
            index = Binary("add", Binary("mul", index, Const(extent)), i[axis]) if axis else i[0]
        bits = b.bits(seed, counter, attrs.stream, index)
        return Select(Binary("lt", bits, threshold), Binary("mul", x(*i), scale),
                      oplib.dtype_const(0, dt))

    return compute(x.shape, dt, element)


dropout_train = register(
    "nn.dropout_train",
    inputs=("data", "key"),
    attrs_type=DropoutTrainAttrs,
    attrs=(Attr("rate", 0.5, kind="float", doc="the probability of dropping an element"),
           Attr("stream", 0, kind="int",
                doc="tells apart the masks of dropouts that share a key")),
    relation=_relation,
    compute=_dropout_train,
    pattern=OpPattern.OPAQUE,
    doc="Training-mode dropout (kiln extension): each element kept with probability "
        "1 - rate, scaled by 1 / (1 - rate), the mask a hash of (key, stream, index).",
    gradient=_gradient,
    lower=_lower,
)

__all__ = ["DropoutTrainAttrs", "dropout_train", "keep_threshold", "random_bits"]
