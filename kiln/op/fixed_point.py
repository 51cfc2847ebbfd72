"""fixed_point_multiply: TVM's integer rescaling, x * multiplier * 2**(shift - 31), rounded.

Bit for bit as TVM lowers ``tir.q_multiply_shift(x, multiplier, 31, shift)``: in int64, x is
shifted left by ``shift`` when it is positive, multiplied by ``multiplier``, and then
``2**(s - 1)`` is added before an arithmetic right shift by ``s = 31 + max(-shift, 0)``
(rounding halves toward +inf); the result is truncated to int32 (wrapping as C does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor, compute
from kiln.loops.ir import Binary, Const
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import tensor_arg
from kiln.op.registry import Attr, OpPattern, register


class FixedPointMultiplyAttrs(Attrs):
    __slots__ = ()
    multiplier: int
    shift: int


def _shifts(attrs: FixedPointMultiplyAttrs) -> tuple[int, int]:
    """(left shift, total right shift) of TVM's q_multiply_shift with q = 31."""
    if not -(2**31) <= attrs.multiplier < 2**31:
        raise TypeCheckError(f"multiplier {attrs.multiplier} does not fit int32")
    if not -31 <= attrs.shift <= 31:
        raise TypeCheckError(f"shift {attrs.shift} must be between -31 and 31")
    return max(attrs.shift, 0), 31 + max(-attrs.shift, 0)


def _relation(arg_types: Sequence[Type], attrs: FixedPointMultiplyAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    if data.dtype != "int32":
        raise TypeCheckError(f"data must have dtype int32 (TVM's q_multiply_shift), but has "
                             f"dtype {data.dtype}")
    _shifts(attrs)
    return data


def _compute(arrays: list[np.ndarray], attrs: FixedPointMultiplyAttrs) -> np.ndarray:
    left, right = _shifts(attrs)
    x = np.asarray(arrays[0]).astype(np.int64)
    with np.errstate(over="ignore"):
        x = (x << np.int64(left)) * np.int64(attrs.multiplier)
        x = (x + (np.int64(1) << np.int64(right - 1))) >> np.int64(right)
    return x.astype(np.int32)


def _lower(inputs: list[Tensor], attrs: FixedPointMultiplyAttrs, out_type: Type) -> Tensor:
    left, right = _shifts(attrs)
    (x,) = inputs

    def element(*i: LExpr) -> Binary:
        v = oplib.convert(x(*i), "int64")
        # Shifts by constants: x << k is x * 2**k (wrapping), x >> k is floor(x / 2**k).
        v = Binary("mul", v, Const(2**left * attrs.multiplier, "int64"))
        v = Binary("add", v, Const(2 ** (right - 1), "int64"))
        return Binary("floordiv", v, Const(2**right, "int64"))

    return compute(x.shape, "int32", lambda *i: oplib.convert(element(*i), "int32"))


fixed_point_multiply = register(
    "fixed_point_multiply",
    inputs=("data",),
    attrs_type=FixedPointMultiplyAttrs,
    attrs=(
        Attr("multiplier", kind="int", doc="the int32 fixed-point multiplier (Q31)"),
        Attr("shift", kind="int", doc="a power of two applied too (left if positive)"),
    ),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.ELEMWISE,
    doc="Each int32 element times multiplier * 2**(shift - 31), rounded as TVM does.",
    differentiable=False,
    lower=_lower,
)

__all__ = ["fixed_point_multiply"]
