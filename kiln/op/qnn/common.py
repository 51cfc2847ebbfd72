"""What the qnn operators share: their scale and zero-point arguments, TVM's fixed-point
rescaling (numpy and as core operators), and the table of canonical forms.

A scale is a float32 tensor and a zero point an int32 tensor, each a scalar (per tensor) or a
1-D vector with one entry per element of the data's ``axis`` (per channel), as in Relay.

Every qnn operator has a *canonical form*: the same integers computed by core operators
(Relay's qnn canonicalization, TVM's ``src/relay/qnn/op/*.cc``). The `qnn-canonicalize` pass
(kiln/transform/qnn_canonicalize.py) replaces each qnn call by its form before compilation, so
``qnn.dense`` runs as an ``nn.dense`` of 8-bit integers accumulating in int32 (the integer GEMM
kernels) plus zero-point corrections. A form that needs a value at compile time (requantize's
fixed-point multiplier comes from constant scales) fails with a `kiln.Error` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.expr import Call, Constant, Expr, const
from kiln.ir.ty import TensorType, Type
from kiln.op.common import normalize_axis, shape_str, tensor_arg

QUANTIZED_DTYPES = ("int8", "uint8", "int16", "uint16", "int32")

# The canonical form of each qnn operator: (call, argument types) -> an expression of core
# operators computing the same integers. Filled by the family files next to each operator.
Canonical = Callable[[Call, Sequence[Any]], Expr]
CANONICAL: dict[str, Canonical] = {}


def canonical(name: str) -> Callable[[Canonical], Canonical]:
    """Register ``fn`` as the canonical form of operator ``name``."""

    def wrap(fn: Canonical) -> Canonical:
        CANONICAL[name] = fn
        return fn

    return wrap


def qrange(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def require_quantized(t: TensorType, what: str, allowed: Sequence[str] = QUANTIZED_DTYPES) -> None:
    if t.dtype not in allowed:
        raise TypeCheckError(f"{what} must have dtype {' or '.join(allowed)}, but has dtype "
                             f"{t.dtype}")


def check_param(t: Type, what: str, dtype: str, data: TensorType | None, axis: int,
                allow_vector: bool = True) -> TensorType | None:
    """A scale (``dtype`` float32) or zero point (int32): a scalar, or a vector with one entry
    per element of the data's ``axis``."""
    p = tensor_arg(t, what)
    if p is None:
        return None
    if p.dtype != dtype:
        raise TypeCheckError(f"{what} must have dtype {dtype}, but has dtype {p.dtype}")
    if p.ndim == 0 or (p.ndim == 1 and p.shape[0] == 1):
        return p
    if p.ndim != 1 or not allow_vector:
        raise TypeCheckError(f"{what} must be a scalar{' or a 1-D vector' if allow_vector else ''}"
                             f", but has shape {shape_str(p.shape)}")
    if data is not None and data.ndim > 0:
        a = normalize_axis(axis, data.ndim)
        length, dim = p.shape[0], data.shape[a]
        if isinstance(length, int) and isinstance(dim, int) and length != dim:
            raise TypeCheckError(
                f"{what} has {length} entries, but axis {axis} of the data (shape "
                f"{shape_str(data.shape)}) has {dim}: a per-channel {what.split()[-1]} has one "
                f"entry per element of the axis")
    return p


def along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A scalar as it is; a vector shaped to broadcast along ``axis`` of a rank-``ndim`` array."""
    v = np.asarray(values)
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = v.shape[0]
    return v.reshape(shape)


def along_expr(e: Expr, t: TensorType, axis: int, ndim: int) -> Expr:
    """``along`` for an expression of type ``t``."""
    from kiln import op

    if t.ndim == 0:
        return e
    if t.shape[0] == 1:
        return op.reshape(e, newshape=[])
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return op.reshape(e, newshape=shape)


# --- fixed-point rescaling (TVM's GetFixedPointMultiplierShift and FixedPointMultiply) -----


def fixed_point(ratio: float) -> tuple[int, int]:
    """(multiplier, shift) with ratio ≈ multiplier * 2**(shift - 31), multiplier in Q31."""
    if ratio == 0.0:
        return 0, 0
    significand, exponent = np.frexp(ratio)
    # std::round: halves away from zero.
    m = int(np.floor(abs(significand) * 2**31 + 0.5)) * (1 if significand >= 0 else -1)
    if m == 2**31:
        m //= 2
        exponent += 1
    return m, int(exponent)


ROUNDINGS = ("None", "UPWARD", "TONEAREST")


def rounding_mode(rounding: str) -> str:
    """TVM's rounding names; "None" is the default, UPWARD."""
    if rounding not in ROUNDINGS:
        raise TypeCheckError(f"rounding must be one of {', '.join(ROUNDINGS)}, not {rounding!r}")
    return "UPWARD" if rounding == "None" else rounding


def multipliers(in_scale: np.ndarray, out_scale: np.ndarray) -> list[tuple[int, int, int]]:
    """(multiplier, left shift, total right shift) for each channel of in_scale / out_scale,
    the ratio computed in double from the float32 scales (as TVM does)."""
    ins = np.asarray(in_scale, np.float32).reshape(-1).astype(np.float64)
    outs = np.asarray(out_scale, np.float32).reshape(-1).astype(np.float64)
    n = max(ins.size, outs.size)
    out = []
    for i in range(n):
        ratio = float(ins[i % ins.size] / outs[i % outs.size])
        if not np.isfinite(ratio) or ratio < 0:
            raise Error(f"requantize: the scale ratio {ratio} is not a finite non-negative number")
        m, shift = fixed_point(ratio)
        left, right = max(shift, 0), 31 + max(-shift, 0)
        if right > 62:
            raise Error(f"requantize: the scale ratio {ratio} is too small for a 64-bit "
                        "fixed-point multiply (below 2**-31)")
        out.append((m, left, right))
    return out


def fixed_point_multiply_np(x: np.ndarray, in_scale: np.ndarray, out_scale: np.ndarray,
                            axis: int, rounding: str) -> np.ndarray:
    """int32 ``x`` times in_scale / out_scale in TVM's int64 fixed point; int64 result."""
    table = multipliers(in_scale, out_scale)
    x = np.asarray(x).astype(np.int64)
    m = along(np.array([t[0] for t in table], np.int64), axis, x.ndim)
    left = along(np.array([t[1] for t in table], np.int64), axis, x.ndim)
    right = along(np.array([t[2] for t in table], np.int64), axis, x.ndim)
    with np.errstate(over="ignore"):
        v = (x << left) * m
        half = np.int64(1) << (right - 1)
        if rounding == "TONEAREST":
            half = np.where(v >= 0, half, half - 1)
        v = (v + half) >> right
    return v.astype(np.int32).astype(np.int64)


def fixed_point_multiply_expr(x: Expr, ndim: int, in_scale: np.ndarray, out_scale: np.ndarray,
                              axis: int, rounding: str) -> Expr:
    """The same as core operators on an int32 expression of rank ``ndim``: int32 result."""
    from kiln import op

    table = multipliers(in_scale, out_scale)

    def param(values: list[int]) -> Constant:
        return Constant(along(np.array(values, np.int64), axis, ndim))

    v = op.cast(x, dtype="int64")
    # x << left, then * m: one product by m * 2**left (the product wraps in int64 alike).
    v = op.multiply(v, param([t[0] << t[1] for t in table]))
    half: Expr = param([1 << (t[2] - 1) for t in table])
    if rounding == "TONEAREST":
        half = op.where(op.greater_equal(v, const(0, "int64")), half,
                        param([(1 << (t[2] - 1)) - 1 for t in table]))
    v = op.add(v, half)
    v = op.right_shift(v, param([t[2] for t in table]))  # floor(v / 2**right)
    return op.cast(v, dtype="int32")


def constant_value(e: Expr, what: str, opname: str) -> np.ndarray:
    """The value of a constant argument; a kiln.Error saying the canonical form needs one."""
    if isinstance(e, Constant):
        return np.asarray(e.data)
    raise Error(f"{opname}: {what} must be a constant to compile (the fixed-point multiplier "
                "is computed at compile time, as in TVM's canonicalization)", e.span)


def is_zero(e: Expr) -> bool:
    """Whether ``e`` is a constant whose every element is 0."""
    return isinstance(e, Constant) and not np.any(np.asarray(e.data))


def requantize_expr(x: Expr, x_type: TensorType, in_scale: np.ndarray, in_zp: Expr,
                    out_scale: np.ndarray, out_zp: Expr, axis: int, rounding: str,
                    out_dtype: str) -> Expr:
    """TVM's requantize canonical form (int64 compute), on any integer expression."""
    from kiln import op

    ndim = x_type.ndim
    v = x if x_type.dtype == "int32" else op.cast(x, dtype="int32")
    if not is_zero(in_zp):
        v = op.subtract(v, in_zp)
    same = (np.asarray(in_scale).size == 1 and np.asarray(out_scale).size == 1
            and float(np.float32(in_scale).reshape(-1)[0])
            == float(np.float32(out_scale).reshape(-1)[0]))
    if not same:
        v = fixed_point_multiply_expr(v, ndim, in_scale, out_scale, axis, rounding)
    if not is_zero(out_zp):
        v = op.add(v, out_zp)
    lo, hi = qrange(out_dtype)
    if out_dtype != "int32":
        v = op.clip(v, a_min=float(lo), a_max=float(hi))
        v = op.cast(v, dtype=out_dtype)
    return v


def requantize_np(x: np.ndarray, in_scale: np.ndarray, in_zp: np.ndarray,
                  out_scale: np.ndarray, out_zp: np.ndarray, axis: int, rounding: str,
                  out_dtype: str) -> np.ndarray:
    """requantize_expr's numbers, in numpy."""
    x = np.asarray(x).astype(np.int64)
    a = axis % x.ndim if x.ndim else 0
    v = (x - along(np.asarray(in_zp, np.int64), a, x.ndim)).astype(np.int32)
    v = fixed_point_multiply_np(v, in_scale, out_scale, a, rounding)
    v = v + along(np.asarray(out_zp, np.int64), a, x.ndim)
    lo, hi = qrange(out_dtype)
    return np.clip(v, lo, hi).astype(out_dtype)


def scalar_expr_minus(e: Expr, k: int) -> Expr:
    """A zero point moved by -k: a constant when it is one."""
    from kiln import op

    if isinstance(e, Constant):
        return Constant((np.asarray(e.data).astype(np.int64) - k).astype(np.int32))
    return op.subtract(e, const(k, "int32"))


def to_int8(x: Expr, t: TensorType, zp: Expr) -> tuple[Expr, Expr]:
    """uint8 data as int8 (x - 128, exact) with its zero point moved alike; int8 as it is.

    nn.dense and nn.batch_matmul take operands of one dtype, and the int8 GEMM kernels take
    int8: (x - 128) - (zp - 128) = x - zp, so the corrections stay exact.
    """
    from kiln import op

    if t.dtype == "int8":
        return x, zp
    if t.dtype != "uint8":
        raise Error(f"compiler bug: to_int8 of {t.dtype}")
    shifted: Expr
    if isinstance(x, Constant):
        shifted = Constant((np.asarray(x.data).astype(np.int16) - 128).astype(np.int8))
    else:
        shifted = op.cast(op.subtract(op.cast(x, dtype="int16"), const(128, "int16")),
                          dtype="int8")
    return shifted, scalar_expr_minus(zp, 128)
