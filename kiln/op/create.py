"""Operators that create tensors: zeros, ones, full, zeros_like, ones_like, full_like, arange.

The registered operators keep Relay's exact argument lists; the builders at the end accept
what Relay's Python API accepts (``arange(10)``, ``full(0.5, (2, 3))``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kiln.errors import EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr, const
from kiln.ir.ty import ANY, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor, compute
from kiln.loops.ir import INDEX, Binary
from kiln.loops.ir import Expr as LExpr
from kiln.op import grad_helpers as gh
from kiln.op.common import shape_str, tensor_arg
from kiln.op.registry import Attr, OpPattern, register

# --- tensor creation ----------------------------------------------------------------------


def _shape_attr(shape: Sequence[int]) -> tuple[int, ...]:
    if any(d < 0 for d in shape):
        raise TypeCheckError(f"shape {list(shape)} must not have negative dimensions")
    return tuple(shape)


class InitAttrs(Attrs):
    """The attributes of zeros, ones and full (whose dtype '' means fill_value's)."""

    __slots__ = ()
    shape: tuple[int, ...]
    dtype: str


def _const_relation(arg_types: Sequence[Type], attrs: InitAttrs) -> Type | None:
    return TensorType(_shape_attr(attrs.shape), attrs.dtype)


def _lower_filled(value: float) -> oplib.LowerFn:
    """Every element the same constant, of the result's dtype."""
    def lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
        out = oplib.out_tensor_type(out_type)
        return compute(out.static_shape, out.dtype, lambda *i: oplib.dtype_const(value, out.dtype))

    return lower


def _lower_full(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    """The scalar argument (``fill_value``, last) converted to the result's dtype everywhere."""
    out = oplib.out_tensor_type(out_type)
    fill = inputs[-1]
    return compute(out.static_shape, out.dtype, lambda *i: oplib.convert(fill(), out.dtype))


INIT_ATTRS = (
    Attr("shape", kind="ints", doc="the shape of the result"),
    Attr("dtype", "float32", kind="dtype", doc="the dtype of the result"),
)

_zeros = register(
    "zeros",
    inputs=(),
    attrs_type=InitAttrs,
    attrs=INIT_ATTRS,
    relation=_const_relation,
    compute=lambda arrays, attrs: np.zeros(attrs.shape, attrs.dtype),
    pattern=OpPattern.ELEMWISE,
    doc="A tensor of zeros.",
    differentiable=False,
    lower=_lower_filled(0),
)
_ones = register(
    "ones",
    inputs=(),
    attrs_type=InitAttrs,
    attrs=INIT_ATTRS,
    relation=_const_relation,
    compute=lambda arrays, attrs: np.ones(attrs.shape, attrs.dtype),
    pattern=OpPattern.ELEMWISE,
    doc="A tensor of ones.",
    differentiable=False,
    lower=_lower_filled(1),
)


def _scalar_arg(t: Type, what: str) -> TensorType | None:
    s = tensor_arg(t, what)
    if s is not None and s.ndim != 0:
        raise TypeCheckError(f"{what} must be a scalar, but has shape {shape_str(s.shape)}")
    return s


def _full_relation(arg_types: Sequence[Type], attrs: InitAttrs) -> Type | None:
    fill = _scalar_arg(arg_types[0], "fill_value")
    if fill is None:
        return None
    return TensorType(_shape_attr(attrs.shape), attrs.dtype or fill.dtype)


def _filled(shape: Sequence[int], value: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.full(shape, np.asarray(value).astype(dtype), dtype)


def _fill_grad(c: Call, fill_value: Expr, g: Expr) -> Expr | None:
    """Every element is the fill value: its adjoint is the sum of the result's."""
    dtype = gh.dtype(fill_value)
    if not dtype_of(dtype).is_float:
        return None
    total = gh.call("sum", g)
    return total if gh.dtype(c) == dtype else gh.call("cast", total, dtype=dtype)


_full = register(
    "full",
    inputs=("fill_value",),
    attrs_type=InitAttrs,
    attrs=(
        Attr("shape", kind="ints", doc="the shape of the result"),
        Attr("dtype", "", kind="dtype", doc="the dtype of the result; '': fill_value's"),
    ),
    relation=_full_relation,
    compute=lambda arrays, attrs: _filled(
        attrs.shape, arrays[0], attrs.dtype or np.asarray(arrays[0]).dtype.name
    ),
    pattern=OpPattern.ELEMWISE,
    doc="A tensor with every element equal to a scalar.",
    gradient=lambda c, g: [_fill_grad(c, c.args[0], g)],
    lower=_lower_full,
)


def _like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    return tensor_arg(arg_types[0], "data")


zeros_like = register(
    "zeros_like",
    inputs=("data",),
    relation=_like_relation,
    compute=lambda arrays, attrs: np.zeros_like(arrays[0]),
    pattern=OpPattern.ELEMWISE,
    doc="Zeros of the shape and dtype of data.",
    gradient=lambda c, g: [None],  # the values of data do not matter, only its shape
    lower=_lower_filled(0),
)
ones_like = register(
    "ones_like",
    inputs=("data",),
    relation=_like_relation,
    compute=lambda arrays, attrs: np.ones_like(arrays[0]),
    pattern=OpPattern.ELEMWISE,
    doc="Ones of the shape and dtype of data.",
    gradient=lambda c, g: [None],
    lower=_lower_filled(1),
)


def _full_like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    fill = _scalar_arg(arg_types[1], "fill_value")
    return None if data is None or fill is None else data


full_like = register(
    "full_like",
    inputs=("data", "fill_value"),
    relation=_full_like_relation,
    compute=lambda arrays, attrs: _filled(
        np.shape(arrays[0]), arrays[1], np.asarray(arrays[0]).dtype.name
    ),
    pattern=OpPattern.ELEMWISE,
    doc="A tensor like data with every element equal to fill_value (converted to its dtype).",
    gradient=lambda c, g: [None, _fill_grad(c, c.args[1], g)],
    lower=_lower_full,
)


def _arange_length(start: object, stop: object, step: object) -> int:
    start, stop, step = (float(np.asarray(v)) for v in (start, stop, step))
    if step == 0:
        raise TypeCheckError("arange needs a nonzero step")
    return max(0, math.ceil((stop - start) / step))


class ArangeAttrs(Attrs):
    __slots__ = ()
    dtype: str


def _arange_relation(
    arg_types: Sequence[Type], attrs: ArangeAttrs, values: Sequence[np.ndarray | None]
) -> Type | None:
    names = ("start", "stop", "step")
    given = [_scalar_arg(t, name) for t, name in zip(arg_types, names, strict=True)]
    args = [a for a in given if a is not None]
    if len(args) < len(given):
        return None
    for a, name in zip(args, names, strict=True):
        if a.dtype != attrs.dtype:
            raise TypeCheckError(
                f"{name} has dtype {a.dtype} but arange's dtype is {attrs.dtype}; "
                "they must be the same"
            )
    if any(v is None for v in values):
        return TensorType((ANY,), attrs.dtype)
    return TensorType((_arange_length(*values),), attrs.dtype)


def _arange(arrays: list[np.ndarray], attrs: ArangeAttrs) -> np.ndarray:
    try:
        n = _arange_length(*arrays)
    except TypeCheckError as e:
        raise EvalError(e.message) from None
    wide = np.float64 if dtype_of(attrs.dtype).is_float else np.int64
    start, step = (np.asarray(v).astype(wide) for v in (arrays[0], arrays[2]))
    ramp: np.ndarray = np.arange(n, dtype=wide)
    return (start + ramp * step).astype(attrs.dtype)


def _lower_arange(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    # As the reference: start + i * step in float64 (or int64), then converted.
    start, _, step = inputs
    wide = "float64" if dtype_of(out.dtype).is_float else INDEX

    def element(i: LExpr) -> LExpr:
        at = Binary("add", oplib.convert(start(), wide),
                    Binary("mul", oplib.convert(i, wide), oplib.convert(step(), wide)))
        return oplib.convert(at, out.dtype)

    return compute(out.static_shape, out.dtype, element)


_arange_op = register(
    "arange",
    inputs=("start", "stop", "step"),
    attrs_type=ArangeAttrs,
    attrs=(Attr("dtype", "float32", kind="dtype", doc="the dtype of the result and bounds"),),
    relation=_arange_relation,
    compute=_arange,
    pattern=OpPattern.INJECTIVE,
    doc="Evenly spaced values start, start+step, ... up to (not including) stop.",
    needs_values=True,
    differentiable=False,
    lower=_lower_arange,
)


# --- builders in the style of Relay's Python API -------------------------------------------


def zeros(shape: Sequence[int] | int, dtype: str = "float32") -> Call:
    """``zeros(shape, dtype)``: a call making a tensor of zeros."""
    return _zeros(shape=shape, dtype=dtype)


def ones(shape: Sequence[int] | int, dtype: str = "float32") -> Call:
    """``ones(shape, dtype)``: a call making a tensor of ones."""
    return _ones(shape=shape, dtype=dtype)


def full(fill_value: object, shape: Sequence[int] | int = (), dtype: str = "") -> Call:
    """``full(fill_value, shape, dtype)``: a tensor filled with a scalar."""
    if not isinstance(fill_value, Expr):
        fill_value = const(fill_value, dtype or None)
    return _full(fill_value, shape=shape, dtype=dtype)


def arange(start: object, stop: object = None, step: object = None, dtype: str = "float32") -> Call:
    """``arange(stop)`` or ``arange(start, stop, step)`` as Relay's Python API has it."""
    if stop is None:
        start, stop = 0, start
    if step is None:
        step = 1
    bounds = [v if isinstance(v, Expr) else const(v, dtype) for v in (start, stop, step)]
    return _arange_op(*bounds, dtype=dtype)

# fmt: off
__all__ = ["arange", "full", "full_like", "ones", "ones_like", "zeros", "zeros_like"]
# fmt: on
