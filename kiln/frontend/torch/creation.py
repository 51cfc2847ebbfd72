"""Tensors made from nothing or from another's shape: full, zeros/ones-like, empty, arange,
scalar_tensor, triangles. Shapes and dtypes are the ones torch recorded for the result.
"""

from __future__ import annotations

import numpy as np

from kiln.frontend.runtime_shapes import triangle as triangle_mask
from kiln.frontend.torch.registry import AtenCall, converter
from kiln.ir import Expr, const
from kiln.op import (
    arange,
    cast,
    dyn,
    full,
    full_like,
    where,
)


def _filled(n: AtenCall, value: object, like: Expr | None = None) -> Expr:
    """The result's shape and dtype filled with ``value``."""
    dtype = n.out.dtype
    if isinstance(value, Expr):
        raise n.error("a fill value computed by the model is not supported")
    fill = n.tensor(value, dtype)
    if n.out.is_static:
        return full(fill, shape=n.out.static_shape, dtype=dtype)
    if like is not None and tuple(n.shape(like)) == tuple(n.out.shape):
        return full_like(like if n.dtype(like) == dtype else cast(like, dtype=dtype), fill)
    return dyn.full(fill, n.shape_tensor(n.out_sizes), dtype=dtype)  # sizes at run time


@converter("aten.full.default")
def full_(n: AtenCall, _size: object, value: object, *_: object) -> Expr:
    return _filled(n, value)


@converter("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format")
def zeros(n: AtenCall, _size: object, *_: object) -> Expr:
    return _filled(n, 1 if n.target == "aten.ones.default" else 0)


@converter("aten.full_like.default")
def full_like_(n: AtenCall, x: Expr, value: object, *_: object) -> Expr:
    return _filled(n, value, x)


@converter("aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default")
def zeros_like(n: AtenCall, x: Expr, *_: object) -> Expr:
    return _filled(n, 1 if n.target == "aten.ones_like.default" else 0, x)


@converter("aten.new_full.default")
def new_full(n: AtenCall, _x: Expr, _size: object, value: object, *_: object) -> Expr:
    return _filled(n, value)


@converter("aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default")
def new_zeros(n: AtenCall, _x: Expr, _size: object, *_: object) -> Expr:
    return _filled(n, 1 if n.target == "aten.new_ones.default" else 0)


@converter("aten.scalar_tensor.default")
def scalar_tensor(n: AtenCall, value: object, *_: object) -> Expr:
    return n.tensor(value, n.out.dtype)


@converter("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def arange_(n: AtenCall, *args: object) -> Expr:
    count = {"aten.arange.default": 1, "aten.arange.start": 2}.get(n.target, 3)
    bounds = list(args[:count])
    if count == 1:
        bounds = [0, *bounds]
    dtype = n.out.dtype
    # numbers, or sizes computed when the program runs (arange then runs on the host)
    start, end, step = (n.tensor(b, dtype) for b in [*bounds, 1][:3])
    return arange(start, end, step, dtype=dtype)


@converter("aten.triu.default", "aten.tril.default")
def triangle(n: AtenCall, x: Expr, diagonal: int = 0) -> Expr:
    upper = n.target == "aten.triu.default"
    if n.rank(x) < 2:
        raise n.error(f"triu/tril takes a tensor of rank 2 or more, not rank {n.rank(x)}")
    if not all(isinstance(d, int) for d in n.shape(x)[-2:]):  # sizes known when it runs
        height, width = n.sizes(x)[-2:]
        keep = triangle_mask(n.tensor(height, "int64"), n.tensor(width, "int64"), diagonal, upper)
        return where(keep, x, const(0, n.dtype(x)))
    rows, cols = n.static_shape(x, "triu/tril")[-2:]
    mask = (np.triu if upper else np.tril)(np.ones((rows, cols), dtype=bool), k=diagonal)
    return where(const(mask), x, const(0, n.dtype(x)))
