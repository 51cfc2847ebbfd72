"""nn.dense_int8_packed: a constant 8-bit dense weight packed ahead of time for the int8 GEMM.

The int8 GEMM (kiln/loops/int8_gemm.py) packs the weight of an 8-bit ``nn.dense`` into
int32 panels on every call. When the weight is a constant, the alter-layout pass
(kiln/transform/alter_layout.py) does it once at compile time: ``nn.dense(x, W,
out_dtype="int32")`` becomes ``nn.dense_int8_packed(x, Wp)`` and the kernel reads the panels
straight from the constant, column sums included.

``Wp`` is int32 of shape ``(NT, KG + 1, NR)``: for column tile t, lane group p < KG and
column j, ``Wp[t, p, j]`` packs ``W[t·NR + j, g·p + q]`` for q < g, lowest first — g = 4
bytes (the VNNI forms) or g = 2 int16 (the others; ``group``) — zero where the column or
the K index is past the weight; ``Wp[t, KG, j]`` is the column's sum Σₚ W[t·NR + j, p] (for
int8 × int8 on VNNI, whose epilogue subtracts 128 times it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, reduce
from kiln.loops.ir import INDEX, Binary, Cast, Const, Select
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import as_array, check_dims_equal, require_rank, shape_str, tensor_args
from kiln.op.registry import Attr, OpPattern, register

EIGHT_BIT = ("int8", "uint8")


def pack_int8_weight(w: np.ndarray, nr: int, group: int) -> np.ndarray:
    """``W`` (units, K) of int8 or uint8 as the panels described in the module docstring."""
    units, k = w.shape
    tiles, kg = -(-units // nr), -(-k // group)
    lane = np.int8 if group == 4 else np.int16  # the bits each value takes in a lane
    padded = np.zeros((tiles * nr, kg * group), dtype=np.int64)
    padded[:units, :k] = w
    values = padded.astype(lane) if group == 2 else (padded & 255).astype(np.uint8)
    words = np.ascontiguousarray(values).view("<i4").reshape(tiles * nr, kg)
    sums = padded.sum(axis=1).astype(np.int32).reshape(tiles * nr, 1)
    rows = np.concatenate([words.astype(np.int32), sums], axis=1)  # (tiles·nr, kg + 1)
    return np.ascontiguousarray(rows.reshape(tiles, nr, kg + 1).transpose(0, 2, 1))


def unpack_int8_weight(wp: np.ndarray, units: int, k: int, dtype: str, group: int
                       ) -> np.ndarray:
    """The (units, K) weight of ``dtype`` held in panels ``wp``."""
    tiles, kp, nr = wp.shape
    words = np.ascontiguousarray(wp[:, :kp - 1, :].transpose(0, 2, 1)).astype("<i4")
    lane = np.int8 if group == 4 else np.int16
    values = words.view(lane).reshape(tiles * nr, (kp - 1) * group)
    return values[:units, :k].astype(dtype)


class DenseInt8PackedAttrs(Attrs):
    __slots__ = ()
    units: int
    k: int
    weight_dtype: str
    group: int


def _relation(arg_types: Sequence[Type], attrs: DenseInt8PackedAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    if data.dtype not in EIGHT_BIT or attrs.weight_dtype not in EIGHT_BIT:
        raise TypeCheckError(f"data ({data.dtype}) and weight_dtype ({attrs.weight_dtype}) "
                             "must be int8 or uint8")
    if weight.dtype != "int32":
        raise TypeCheckError(f"the packed weight must be int32 panels, not {weight.dtype}")
    if attrs.group not in (2, 4):
        raise TypeCheckError(f"group must be 2 or 4, got {attrs.group}")
    require_rank(weight, "packed weight (tiles, groups + 1, lanes)", 3)
    if data.ndim < 1:
        raise TypeCheckError("data must have at least one dimension, but is a scalar")
    check_dims_equal(data.shape[-1], attrs.k,
                     f"data of shape {shape_str(data.shape)} has not k={attrs.k} inputs")
    tiles, kp, nr = weight.shape
    if isinstance(tiles, int) and isinstance(kp, int) and isinstance(nr, int):
        if kp != -(-attrs.k // attrs.group) + 1 or not (tiles - 1) * nr < attrs.units \
                <= tiles * nr:
            raise TypeCheckError(
                f"packed weight of shape {shape_str(weight.shape)} cannot hold {attrs.units} "
                f"units of {attrs.k} inputs in groups of {attrs.group}")
    return TensorType((*data.shape[:-1], attrs.units), "int32")


def _compute(arrays: list[np.ndarray], attrs: DenseInt8PackedAttrs) -> np.ndarray:
    x, wp = np.asarray(arrays[0]), np.asarray(arrays[1])
    w = unpack_int8_weight(wp, attrs.units, attrs.k, attrs.weight_dtype, attrs.group)
    return as_array(np.matmul(x.astype(np.int64), w.astype(np.int64).T), "int32")


def _lower(inputs: list, attrs: DenseInt8PackedAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_kernels

    out = oplib.out_tensor_type(out_type)
    x, wp = inputs
    if isinstance(wp, BufferTensor) and min(x.shape) > 0:
        t = int8_kernels.dense_prepacked(x, wp.buffer, attrs.units, out.static_shape,
                                         attrs.weight_dtype, attrs.group)
        if t is not None:
            return t
    # A plain reduction reading the panels (a layout this build would not have chosen):
    # value q of a lane is its bits (8 or 16) from 8q (16q), sign-extended unless uint8.
    nr, group = wp.shape[2], attrs.group
    bits = 32 // group

    def weight(j: LExpr, p: LExpr) -> LExpr:
        word = Cast(INDEX, wp(j // nr, p // group, j % nr))
        q = p % group
        scale: LExpr = Const(2 ** (bits * (group - 1)), INDEX)
        for s in reversed(range(group - 1)):
            scale = Select(Binary("eq", q, Const(s, INDEX)), Const(2 ** (bits * s), INDEX),
                           scale)
        v = (word // scale) % (2 ** bits)
        if attrs.weight_dtype != "uint8":
            v = Select(Binary("ge", v, Const(2 ** (bits - 1), INDEX)), v - 2 ** bits, v)
        return v

    def body(o: tuple, r: tuple) -> LExpr:
        return Binary("mul", Cast(INDEX, x(*o[:-1], r[0])), weight(o[-1], r[0]))

    return reduce(out.static_shape, "int32", (attrs.k,), "add", body, Const(0, INDEX),
                  lambda v, o: Cast("int32", v), INDEX)


dense_int8_packed = register(
    "nn.dense_int8_packed",
    inputs=("data", "weight"),
    attrs_type=DenseInt8PackedAttrs,
    attrs=(
        Attr("units", kind="int", doc="output size (the panels are padded)"),
        Attr("k", kind="int", doc="inputs per unit (the panels pad K to whole groups)"),
        Attr("weight_dtype", "int8", kind="dtype", doc="the packed weight's int8 or uint8"),
        Attr("group", 4, kind="int", doc="values per int32 lane: 4 bytes or 2 int16"),
    ),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ W.T in int32 with an 8-bit W packed in int8 GEMM panels: see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_lower),
)
