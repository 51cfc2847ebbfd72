"""Building blocks for operator lowerings (the ``lower=`` rule beside each operator).

A lowering is ``lower(inputs, attrs, out_type) -> Tensor`` (or a tuple of them for an
operator with a tuple result): ``inputs`` are `Tensor`s (a tuple argument arrives as a tuple
of Tensors), ``out_type`` is the call's checked type, always static. The helpers here cover the
common shapes of operator:

- `unary(fn)` / `binary(fn)`: elementwise and broadcasting operators from a scalar function;
- `reduction(combine, init, finalize)`: sum/max/... over ``axis``/``keepdims``/``exclude``;
- `dtype_const`, `int_divide`, ...: scalar pieces with kiln's semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.ir.ty import TensorType, Type
from kiln.loops.compute import Tensor, broadcast_indices, compute, reduce
from kiln.loops.ir import INDEX, Binary, Const, Expr, Unary

LowerFn = Callable[[list[Any], Any, Type], Any]


def out_tensor_type(out_type: Type) -> TensorType:
    assert isinstance(out_type, TensorType)
    return out_type


def dtype_const(value: float | int | bool, dtype: str) -> Const:
    """A constant of a tensor dtype (Python value converted as numpy would)."""
    if dtype == "bool":
        return Const(bool(value), dtype)
    if dtype.startswith("float"):
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def unary(fn: str | Callable[[Expr], Expr]) -> LowerFn:
    """An elementwise operator: ``fn`` is a loop-IR unary op name or a scalar function."""
    scalar = (lambda x: Unary(fn, x)) if isinstance(fn, str) else fn

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        (x,) = inputs
        return compute(out.shape, out.dtype, lambda *i: scalar(x(*i)))  # type: ignore[arg-type]

    return lower


def binary(fn: str | Callable[[Expr, Expr], Expr]) -> LowerFn:
    """A broadcasting binary operator: ``fn`` is a loop-IR binary op name or a function."""
    scalar = (lambda a, b: Binary(fn, a, b)) if isinstance(fn, str) else fn

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        a, b = inputs
        shape = tuple(out.shape)

        def element(*i: Expr) -> Expr:
            return scalar(a(*broadcast_indices(a.shape, shape, i)),
                          b(*broadcast_indices(b.shape, shape, i)))

        return compute(shape, out.dtype, element)  # type: ignore[arg-type]

    return lower


def reduced_axes(ndim: int, axis: Sequence[int] | int | None, exclude: bool) -> list[int]:
    """The axes a reduction runs over, from Relay's ``axis``/``exclude`` attributes."""
    if axis is None:
        axes = list(range(ndim))
    else:
        axes = sorted({a % ndim for a in ((axis,) if isinstance(axis, int) else axis)})
    if exclude:
        axes = [k for k in range(ndim) if k not in axes]
    return axes


def reduction(
    combine: str,
    init: Callable[[str], Expr],
    finalize: Callable[[Expr, int], Expr] | None = None,
    acc_dtype: Callable[[str], str] | None = None,
) -> LowerFn:
    """A reduction operator with Relay's ``axis``, ``keepdims`` and ``exclude`` attributes.

    ``init(dtype)`` gives the starting value, ``finalize(acc, count)`` post-processes the
    accumulated value (mean divides by the count).
    """

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        (x,) = inputs
        axes = reduced_axes(x.ndim, attrs["axis"], attrs["exclude"])
        kept = [k for k in range(x.ndim) if k not in axes]
        extents = [x.shape[k] for k in axes]
        count = 1
        for e in extents:
            count *= e
        acc = acc_dtype(x.dtype) if acc_dtype else x.dtype

        def body(o: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
            idx: list[Expr] = [Const(0, INDEX)] * x.ndim
            outer = list(o)
            if attrs["keepdims"]:
                outer = [o[k] for k in kept]
            for k, v in zip(kept, outer):
                idx[k] = v
            for k, v in zip(axes, r):
                idx[k] = v
            value = x(*idx)
            return value if value.dtype == acc else _cast(acc, value)

        fin = None
        if finalize is not None:
            def fin(a: Expr, o: tuple[Expr, ...]) -> Expr:
                return finalize(a, count)
        if acc != out.dtype:
            inner = fin

            def fin(a: Expr, o: tuple[Expr, ...]) -> Expr:  # noqa: F811
                return _cast(out.dtype, inner(a, o) if inner else a)

        return reduce(out.shape, out.dtype, extents, combine, body,  # type: ignore[arg-type]
                      init(acc), fin, acc)

    return lower


def _cast(dtype: str, e: Expr) -> Expr:
    from kiln.loops.ir import Cast

    return Cast(dtype, e)


def reshape_indices(
    in_shape: Sequence[int], out_shape: Sequence[int], idx: Sequence[Expr]
) -> tuple[Expr, ...]:
    """The input indices of a reshape: through the row-major flat position."""
    if tuple(in_shape) == tuple(out_shape):
        return tuple(idx)
    flat: Expr = Const(0, INDEX)
    step = 1
    for i, d in reversed(list(zip(idx, out_shape))):
        if d != 1:
            flat = flat + i * step
        step *= d
    out: list[Expr] = []
    step = 1
    strides = []
    for d in reversed(in_shape):
        strides.append(step)
        step *= d
    strides.reverse()
    for d, s in zip(in_shape, strides):
        out.append(Const(0, INDEX) if d == 1 else (flat // s) % d)
    return tuple(out)
