"""Reductions: sum, mean, prod, max, min, all, any, argmax and argmin (Relay's reduce.cc).

Every reduction takes ``axis`` (None or an empty list: all axes; negative axes count from the
end), ``keepdims`` (reduced axes stay as size 1) and ``exclude`` (reduce the axes *not*
listed). Results keep the input dtype, except argmax/argmin (int32, as TVM) and all/any (bool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import Dim, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Const,
    For,
    IfThenElse,
    LetStmt,
    Load,
    Seq,
    Stmt,
    Store,
    Var,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.oplib import LowerFn
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    as_array,
    normalize_axis,
    require_dtype,
    tensor_arg,
    trunc_divide,
)
from kiln.op.grad_helpers import call, keepdims_shape
from kiln.op.registry import Attr, OpDef, OpPattern, register


def reduce_axes(ndim: int, axis: Sequence[int] | None, exclude: bool) -> tuple[int, ...]:
    """The sorted axes a reduction runs over; a TypeCheckError for bad or repeated axes."""
    if not axis:
        return tuple(range(ndim))
    axes = [normalize_axis(a, ndim) for a in axis]
    if len(set(axes)) != len(axes):
        raise TypeCheckError(f"axis {list(axis)} names the same dimension twice")
    if exclude:
        return tuple(i for i in range(ndim) if i not in axes)
    return tuple(sorted(axes))


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """The shape left after reducing ``axes``: size 1 there with keepdims, else dropped."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


class ReduceAttrs(Attrs):
    __slots__ = ()
    axis: tuple[int, ...] | None
    keepdims: bool
    exclude: bool


class ArgReduceAttrs(ReduceAttrs):
    __slots__ = ()
    select_last_index: bool


REDUCE_ATTRS = (
    Attr("axis", None, kind="ints", optional=True, doc="the axes to reduce; None means all"),
    Attr("keepdims", False, kind="bool", doc="keep reduced axes as size-1 dimensions"),
    Attr("exclude", False, kind="bool", doc="reduce the axes not listed in axis instead"),
)
ARG_REDUCE_ATTRS = (
    Attr("axis", None, kind="ints", optional=True, doc="the axes to reduce; None means all"),
    Attr("keepdims", False, kind="bool", doc="keep reduced axes as size-1 dimensions"),
    Attr("select_last_index", False, kind="bool", doc="on ties, give the last index"),
    Attr("exclude", False, kind="bool", doc="reduce the axes not listed in axis instead"),
)


def _reduce_relation(
    kind: str, result_dtype: str | None = None
) -> Callable[[Sequence[Type], ReduceAttrs], Type | None]:
    def relation(arg_types: Sequence[Type], attrs: ReduceAttrs) -> Type | None:
        data = tensor_arg(arg_types[0], "data")
        if data is None:
            return None
        require_dtype(data, "data", kind)
        axes = reduce_axes(data.ndim, attrs.axis, attrs.exclude)
        shape = reduced_shape(data.shape, axes, attrs.keepdims)
        return TensorType(shape, result_dtype or data.dtype)

    return relation


def _reduction(
    name: str,
    fn: Callable[..., object],
    doc: str,
    *,
    kind: str = "numeric",
    result_dtype: str | None = None,
    differentiable: bool = True,
    gradient: Callable[[Call, Expr], list[Expr | None]] | None = None,
    lower: LowerFn | None = None,
) -> OpDef:
    """Register a reduction computing ``fn(x, axis=axes, keepdims=keepdims)``."""

    def compute(arrays: list[np.ndarray], attrs: ReduceAttrs) -> np.ndarray:
        x = np.asarray(arrays[0])
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        try:
            with np.errstate(all="ignore"):
                out = fn(x, axis=axes, keepdims=attrs.keepdims)
        except ValueError:  # numpy: a max or min over no elements
            raise EvalError(f"{name} over an empty axis of a tensor of shape {x.shape}") from None
        return as_array(out, result_dtype or x.dtype.name)

    return register(
        name,
        inputs=("data",),
        attrs_type=ReduceAttrs,
        attrs=REDUCE_ATTRS,
        relation=_reduce_relation(kind, result_dtype),
        compute=compute,
        pattern=OpPattern.COMM_REDUCE,
        doc=doc,
        differentiable=differentiable,
        gradient=gradient,
        lower=lower,
    )


def _sum(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)  # no promotion of ints


def _prod(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if not dtype_of(x.dtype.name).is_integer:
        return np.mean(x, axis=axis, keepdims=keepdims)
    # Integer mean is the (wrapping) sum divided by the count, truncated, as TVM computes it.
    count = math.prod(x.shape[a] for a in axis)
    if count == 0:
        raise EvalError(f"mean of no elements (a tensor of shape {x.shape})")
    return trunc_divide(_sum(x, axis, keepdims), np.asarray(count, x.dtype))


# Reduction gradients: the adjoint, with the reduced axes restored, spread over the input.


def _axes(c: Call) -> tuple[int, ...]:
    data = gh.tensor_type(c.args[0])
    attrs = ReduceAttrs.view(c.attrs)
    return reduce_axes(data.ndim, attrs.axis, attrs.exclude)


def _spread(c: Call, g: Expr) -> Expr:
    """``g`` (shaped like the result) broadcast back to the input's shape."""
    x = c.args[0]
    keepdims = ReduceAttrs.view(c.attrs).keepdims
    return call("broadcast_to_like", keepdims_shape(g, x, _axes(c), keepdims), x)


def _sum_grad(c: Call, g: Expr) -> list[Expr | None]:
    return [_spread(c, g)]


def _mean_grad(c: Call, g: Expr) -> list[Expr | None]:
    return [_spread(c, g) / gh.element_count(c.args[0], _axes(c))]


def _prod_grad(c: Call, g: Expr) -> list[Expr | None]:
    # The product of the others is prod / x (undefined where x is 0, like the division).
    return [_spread(c, g * c) / c.args[0]]


def _extremum_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Every element equal to the extremum receives the adjoint (ties each get all of it).
    x = c.args[0]
    hit = call("equal", x, _spread(c, c))
    return [call("where", hit, _spread(c, g), gh.zeros_like(x))]


def _mean_lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    # Floats: the sum divided by the count (float16 accumulates in float32, as numpy's mean);
    # integers: the wrapping sum divided by the count, truncated.
    dtype = inputs[0].dtype
    if dtype_of(dtype).is_integer:
        rule = oplib.reduction(
            "add", lambda dt: oplib.dtype_const(0, dt),
            lambda acc, n: Binary("truncdiv", acc, oplib.dtype_const(n, acc.dtype)),
            empty="mean of no elements")
    else:
        rule = oplib.reduction(
            "add", lambda dt: oplib.dtype_const(0, dt),
            lambda acc, n: Binary("div", acc, oplib.dtype_const(n, acc.dtype)),
            acc_dtype=lambda dt: "float32" if dt == "float16" else dt)
    return rule(inputs, attrs, out_type)


sum_ = _reduction(
    "sum",
    _sum,
    "Sum of the elements over the given axes.",
    gradient=_sum_grad,
    lower=oplib.reduction("add", lambda dt: oplib.dtype_const(0, dt)),
)
mean = _reduction(
    "mean",
    _mean,
    "Arithmetic mean over the given axes (integers truncate).",
    gradient=_mean_grad,
    lower=_mean_lower,
)
prod = _reduction(
    "prod",
    _prod,
    "Product of the elements over the given axes.",
    gradient=_prod_grad,
    lower=oplib.reduction("mul", lambda dt: oplib.dtype_const(1, dt)),
)
max_ = _reduction(
    "max",
    np.max,
    "Largest element over the given axes.",
    gradient=_extremum_grad,
    lower=oplib.reduction("max", oplib.lowest, empty="max over an empty axis"),
)
min_ = _reduction(
    "min",
    np.min,
    "Smallest element over the given axes.",
    gradient=_extremum_grad,
    lower=oplib.reduction("min", oplib.highest, empty="min over an empty axis"),
)
all_ = _reduction(
    "all",
    np.all,
    "True where every element over the axes is true.",
    kind="bool",
    differentiable=False,
    lower=oplib.reduction("and", lambda dt: oplib.dtype_const(True, dt)),
)
any_ = _reduction(
    "any",
    np.any,
    "True where some element over the axes is true.",
    kind="bool",
    differentiable=False,
    lower=oplib.reduction("or", lambda dt: oplib.dtype_const(False, dt)),
)


# --- argmax, argmin -----------------------------------------------------------------------


def _arg_lower(name: str, order: str) -> LowerFn:
    """argmax (``order="gt"``) or argmin (``"lt"``): a scan keeping the best value and its
    flat index in two local accumulators. Like numpy, the first NaN wins (the last with
    select_last_index)."""

    def lower(inputs: list[Tensor], attrs: ArgReduceAttrs, out_type: Type) -> Tensor:
        (x,) = inputs
        out = oplib.out_tensor_type(out_type)
        axes = oplib.reduced_axes(x.ndim, attrs.axis, attrs.exclude)
        extents = [x.shape[a] for a in axes]
        if math.prod(extents) == 0:
            return oplib.fail(out.static_shape, out.dtype, f"{name} over an empty axis of a tensor "
                              f"of shape {x.shape}")
        last = bool(attrs.select_last_index)
        strides = [math.prod(extents[k + 1:]) for k in range(len(extents))]

        def element(o: tuple[LExpr, ...], write: oplib.WriteFn) -> Stmt:
            best = Buffer("best", (1,), x.dtype, "local")
            at = Buffer("best_at", (1,), INDEX, "local")
            zero = (Const(0),)
            rs = tuple(Var(f"r{k}") for k in range(len(axes)))
            v = Var("v", x.dtype)
            flat: LExpr = Const(0)
            for r, stride in zip(rs, strides):
                flat = flat + r * stride
            have = Load(best, zero)
            cond: LExpr = Binary({"gt": "ge", "lt": "le"}[order] if last else order, v, have)
            if dtype_of(x.dtype).is_float:
                nan = Binary("ne", v, v)
                if not last:
                    nan = Binary("and", nan, Binary("eq", have, have))
                cond = Binary("or", cond, nan)
            scan: Stmt = LetStmt(
                v, x(*oplib.reduce_index(x.ndim, axes, attrs.keepdims, o, rs)),
                IfThenElse(cond, Seq((Store(best, zero, v), Store(at, zero, flat)))))
            for r, n in reversed(list(zip(rs, extents))):
                scan = For(r, Const(0), Const(n), scan)
            first = x(*oplib.reduce_index(x.ndim, axes, attrs.keepdims, o,
                                          [Const(0)] * len(axes)))
            body = Seq((Store(best, zero, first), Store(at, zero, Const(0)), scan,
                        write(o, oplib.convert(Load(at, zero), out.dtype))))
            return Allocate(best, Allocate(at, body))

        return oplib.elementwise_extern(out.static_shape, out.dtype, element,
                                        work_per_element=math.prod(extents))

    return lower


def _arg_reduction(name: str, fn: Callable[..., np.ndarray], doc: str) -> OpDef:
    """Register argmax or argmin: the index, flattened over the reduced axes, as int32."""

    def compute(arrays: list[np.ndarray], attrs: ArgReduceAttrs) -> np.ndarray:
        x = np.asarray(arrays[0])
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        kept = [i for i in range(x.ndim) if i not in axes]
        n = math.prod(x.shape[a] for a in axes)
        if n == 0:
            raise EvalError(f"{name} over an empty axis of a tensor of shape {x.shape}")
        # Bring the reduced axes to the end and flatten them into one, in row-major order.
        flat = np.transpose(x, kept + list(axes)).reshape([x.shape[i] for i in kept] + [n])
        if attrs.select_last_index:
            index = n - 1 - fn(flat[..., ::-1], axis=-1)
        else:
            index = fn(flat, axis=-1)
        if attrs.keepdims:
            index = np.reshape(index, reduced_shape(x.shape, axes, True))
        return as_array(index, "int32")

    return register(
        name,
        inputs=("data",),
        attrs_type=ArgReduceAttrs,
        attrs=ARG_REDUCE_ATTRS,
        relation=_reduce_relation("numeric", "int32"),
        compute=compute,
        pattern=OpPattern.COMM_REDUCE,
        doc=doc,
        differentiable=False,
        lower=_arg_lower(name, "gt" if name == "argmax" else "lt"),
    )


argmax = _arg_reduction("argmax", np.argmax, "Index (int32) of the largest element over the axes.")
argmin = _arg_reduction("argmin", np.argmin, "Index (int32) of the smallest element over the axes.")

__all__ = ["all_", "any_", "argmax", "argmin", "max_", "mean", "min_", "prod", "sum_"]
