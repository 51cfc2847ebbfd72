"""Reductions: sum, mean, prod, amax/amin, max/min with indices, argmax/argmin, any/all, var,
vector norms.

torch writes "every axis" as ``dim=None`` or ``dim=[]``; kiln as ``axis=None``. torch's
indices are int64 and kiln's argmax gives int32, so indices are cast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr
from kiln.op import abs as abs_
from kiln.op import all as all_
from kiln.op import any as any_
from kiln.op import (
    argmax,
    argmin,
    cast,
    divide,
    mean,
    multiply,
    not_equal,
    power,
    prod,
    sqrt,
    subtract,
)
from kiln.op import max as max_
from kiln.op import min as min_
from kiln.op import sum as sum_

# torch's dim argument: one axis, several, or None / [] for all of them
Dims = int | Sequence[int] | None


def _axes(n: AtenCall, x: Expr, dim: Dims) -> list[int] | None:
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    rank = n.rank(x)
    return sorted({axis(d, rank, n) for d in dims})


def _reduction(fn: Callable[..., Expr]) -> Callable[..., Expr]:
    def convert(n: AtenCall, x: Expr, dim: Dims = None, keepdim: bool = False,
                *_: object) -> Expr:
        axes = _axes(n, x, dim)
        return fn(n.tensor(x, n.out.dtype), axis=axes, keepdims=bool(keepdim))

    return convert


converter("aten.sum.dim_IntList")(_reduction(sum_))
converter("aten.mean.dim")(_reduction(mean))
converter("aten.amax.default")(_reduction(max_))
converter("aten.amin.default")(_reduction(min_))


@converter("aten.sum.default", "aten.mean.default", "aten.prod.default", "aten.max.default",
           "aten.min.default")
def reduce_all(n: AtenCall, x: Expr, *_: object) -> Expr:
    fn = {"sum": sum_, "mean": mean, "prod": prod, "max": max_, "min": min_}[n.target.split(".")[1]]
    return fn(n.tensor(x, n.out.dtype))


@converter("aten.prod.dim_int")
def prod_dim(n: AtenCall, x: Expr, dim: int, keepdim: bool = False, *_: object) -> Expr:
    return prod(n.tensor(x, n.out.dtype), axis=_axes(n, x, dim), keepdims=bool(keepdim))


@converter("aten.max.dim", "aten.min.dim")
def max_dim(n: AtenCall, x: Expr, dim: int, keepdim: bool = False) -> list[Expr]:
    largest = n.target == "aten.max.dim"
    axes = _axes(n, x, dim)
    values = (max_ if largest else min_)(x, axis=axes, keepdims=bool(keepdim))
    index = (argmax if largest else argmin)(x, axis=axes, keepdims=bool(keepdim))
    return [values, cast(index, dtype="int64")]


@converter("aten.argmax.default", "aten.argmin.default")
def arg_reduce(n: AtenCall, x: Expr, dim: int | None = None, keepdim: bool = False) -> Expr:
    fn = argmax if n.target == "aten.argmax.default" else argmin
    if dim is None and keepdim:
        raise n.error("argmax over every axis with keepdim=True is not supported")
    return cast(fn(x, axis=_axes(n, x, dim), keepdims=bool(keepdim)), dtype=n.out.dtype)


def _truth(n: AtenCall, x: Expr) -> Expr:
    return x if n.dtype(x) == "bool" else not_equal(x, n.tensor(0, n.dtype(x)))


@converter("aten.any.dim", "aten.any.dims", "aten.any.default",
           "aten.all.dim", "aten.all.dims", "aten.all.default")
def any_all(n: AtenCall, x: Expr, dim: Dims = None, keepdim: bool = False) -> Expr:
    fn = any_ if n.target.startswith("aten.any") else all_
    out = fn(_truth(n, x), axis=_axes(n, x, dim), keepdims=bool(keepdim))
    return out if n.out.dtype == "bool" else cast(out, dtype=n.out.dtype)


@converter("aten.var.correction")
def var(n: AtenCall, x: Expr, dim: Dims = None, correction: float | None = None,
        keepdim: bool = False) -> Expr:
    axes = _axes(n, x, dim)
    shape = n.static_shape(x, "var")
    count = 1
    for a in axes if axes is not None else range(len(shape)):
        count *= shape[a]
    dof = count - (1.0 if correction is None else float(correction))
    dtype = n.out.dtype
    centered = subtract(x, mean(x, axis=axes, keepdims=True))
    total = sum_(multiply(centered, centered), axis=axes, keepdims=bool(keepdim))
    return divide(total, n.tensor(float(dof), dtype))


@converter("aten.linalg_vector_norm.default")
def vector_norm(n: AtenCall, x: Expr, ord: float = 2, dim: Dims = None, keepdim: bool = False,
                dtype: str | None = None) -> Expr:
    """``‖x‖_p`` over ``dim``: (Σ|x|ᵖ)^(1/p), with p = 2, 1, ±inf and 0 spelled out."""
    out = n.out.dtype
    axes = _axes(n, x, dim)
    keep = bool(keepdim)
    x = n.tensor(x, out)
    p = float(ord)
    if p == 2:
        return sqrt(sum_(multiply(x, x), axis=axes, keepdims=keep))
    if p == float("inf"):
        return max_(abs_(x), axis=axes, keepdims=keep)
    if p == float("-inf"):
        return min_(abs_(x), axis=axes, keepdims=keep)
    if p == 0:
        return sum_(cast(not_equal(x, n.tensor(0.0, out)), dtype=out), axis=axes, keepdims=keep)
    if p == 1:
        return sum_(abs_(x), axis=axes, keepdims=keep)
    total = sum_(power(abs_(x), n.tensor(p, out)), axis=axes, keepdims=keep)
    return power(total, n.tensor(1.0 / p, out))
