"""Helpers shared by the gradient rules of the operator families.

A gradient rule is a function ``gradient(call, out_grad) -> list[Expr | None]`` registered with
its operator. ``call`` is the forward call: its arguments are typed variables (their
``checked_type`` is known) and ``call.checked_type`` is the result type; using ``call`` itself in
an adjoint expression refers to the forward result, which automatic differentiation computes
once and shares. ``out_grad`` is the adjoint of the result (a tuple for operators returning
tuples). The rule returns one adjoint expression per input, built from operator calls, or None
for an input that has no gradient (integer indices, a boolean condition, an argument used only
for its shape).

The builders here look operators up by name when called, so this module can be imported by
every family file.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import Error
from kiln.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.op import registry


def call(name: str, *args: object, **attrs: object) -> Call:
    """A call of the operator ``name`` (its builder, looked up when needed)."""
    return registry.get(name)(*args, **attrs)


def tensor_type(e: Expr) -> TensorType:
    """The checked tensor type of a forward argument or result."""
    t = e.checked_type
    if not isinstance(t, TensorType):
        raise Error(f"a gradient rule expected a tensor, found a value of type {t}")
    return t


def dtype(e: Expr) -> str:
    return tensor_type(e).dtype


def static_shape(e: Expr, op: str) -> tuple[int, ...]:
    """The shape of ``e``, which the gradient of ``op`` needs to know before run time."""
    t = tensor_type(e)
    if not t.is_static:
        raise Error(
            f"the gradient of {op} needs the static shape of its argument, but it has type {t}"
        )
    return t.static_shape


def scalar(value: float, dt: str) -> Constant:
    """A scalar constant of a dtype."""
    return Constant(np.asarray(value, dtype=dt))


def zeros_like(e: Expr) -> Call:
    return call("zeros_like", e)


def unbroadcast(g: Expr, arg: Expr, out_type: Type) -> Expr:
    """``g`` (shaped like the broadcast result) summed back to the shape of ``arg``."""
    at = arg.checked_type
    if isinstance(at, TensorType) and isinstance(out_type, TensorType):
        if at.is_static and at.shape == out_type.shape:
            return g
    return call("collapse_sum_like", g, arg)


def fields(e: Expr, n: int) -> list[Expr]:
    """The fields of a tuple-valued expression, projected unless it is a tuple literal."""
    if isinstance(e, Tuple):
        return list(e.fields)
    return [TupleGetItem(e, i) for i in range(n)]


def tuple_size(e: Expr) -> int:
    t = e.checked_type
    if not isinstance(t, TupleType):
        raise Error(f"a gradient rule expected a tuple, found a value of type {t}")
    return len(t.fields)


def keepdims_shape(g: Expr, data: Expr, axes: Sequence[int], keepdims: bool) -> Expr:
    """The adjoint of a reduction's result with the reduced axes put back as size 1."""
    if keepdims:
        return g
    t = tensor_type(data)
    if t.is_static:
        shape = [1 if i in axes else d for i, d in enumerate(t.shape)]
        return call("reshape", g, newshape=shape)
    for a in sorted(axes):
        g = call("expand_dims", g, axis=a)
    return g


def along(vector: Expr, ndim: int, axis: int) -> Expr:
    """A 1-D vector shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    trailing = ndim - 1 - axis
    if trailing == 0:
        return vector
    return call("expand_dims", vector, axis=1, num_newaxis=trailing)


def reshape_to(g: Expr, data: Expr) -> Expr:
    """``g`` reshaped to the shape of ``data`` (statically when it is known)."""
    t = tensor_type(data)
    if t.is_static:
        return call("reshape", g, newshape=list(t.shape))
    return call("reshape_like", g, data)


def element_count(data: Expr, axes: Sequence[int]) -> Expr:
    """How many elements of ``data`` each reduced element covers, as a keepdims tensor/scalar."""
    t = tensor_type(data)
    sizes = [t.shape[a] for a in axes]
    known = [s for s in sizes if isinstance(s, int)]
    if len(known) == len(sizes):
        return scalar(float(np.prod(known, dtype=np.int64)), t.dtype)
    return call("sum", call("ones_like", data), axis=list(axes), keepdims=True)


# Rows a stage of `sum_over_rows` sums together, where a long run of rows is left: a block
# whose cache lines stay in L1 while the kept axis is swept (see there).
ROW_BLOCK = 16


def sum_over_rows(e: Expr, like: Expr, axis: int) -> Expr:
    """The sum of ``e`` (of the type of ``like``, a forward value) over every axis but
    ``axis`` (Relay's ``sum(e, axis=[axis], exclude=True)``): a bias's or a normalization's
    parameter gradient. Summed one axis at a time, the shortest first; a last axis of more
    than `ROW_BLOCK` rows before the kept one in stages of `ROW_BLOCK` rows.

    A reduction is lowered one result element at a time, its loop over the reduced elements
    innermost (kiln/loops/reduce_emit.py), and that loop is a chain of dependent additions.
    Over a long run it waits on the addition's latency at every element (a batch norm's
    per-channel sum over 8x112x112 values: 6.8 ms; over the batch first, chains of 8 that
    the core overlaps, then the rows, then the columns: 3.3 ms). Over rows before the kept
    axis, each result element also reads a column, a cache line per row: at 1024 floats a
    row (4 KiB apart, one L1 set) every read missed (a transformer bias's gradient over
    8x128 tokens: 7-14 ms; the 8 first, 0.65 ms). Where one run of rows is all there is
    (a [1024, 1024] tensor), blocks of 16 rows are summed first: their 16 lines stay in L1
    while the columns are swept (1.0-1.5 ms)."""
    t = tensor_type(like)
    if not t.is_static or t.ndim < 2:
        return call("sum", e, axis=[axis], exclude=True)
    shape = list(t.static_shape)
    keep = axis % t.ndim
    reduced = [a for a in range(t.ndim) if a != keep]
    while len(reduced) > 1:
        a = min(reduced, key=lambda r: (shape[r], r))
        e = call("sum", e, axis=[a])
        del shape[a]
        keep -= keep > a
        reduced = [r - (r > a) for r in reduced if r != a]
    (a,) = reduced
    rows = shape[a]
    if a == 0 and keep == 1 and len(shape) == 2:  # rows of a [rows, k] matrix
        k = shape[1]
        while rows > ROW_BLOCK and rows % ROW_BLOCK == 0:
            rows //= ROW_BLOCK
            e = call("sum", call("reshape", e, newshape=[rows, ROW_BLOCK, k]), axis=[1])
    return call("sum", e, axis=[a])
