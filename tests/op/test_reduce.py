"""Reductions against numpy and plain-Python oracles: axes, negative axes, keepdims, exclude."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.ty import ANY, SymDim, TensorType

from .helpers import check, covers, infer, rand, run


@st.composite
def reductions(draw):
    """A shape, the axis attribute (maybe negative or None), keepdims and exclude."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    ndim = len(shape)
    chosen = draw(st.lists(st.integers(0, max(ndim - 1, 0)), unique=True, max_size=ndim))
    axis = None
    if chosen and draw(st.booleans()):
        axis = [a - ndim if draw(st.booleans()) else a for a in chosen]
    return shape, axis, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2**16))


def reduced_axes(ndim: int, axis: list[int] | None, exclude: bool) -> tuple[int, ...]:
    """The axes Relay reduces, worked out apart from the code under test."""
    if not axis:
        return tuple(range(ndim))
    listed = {a % ndim for a in axis}
    return tuple(i for i in range(ndim) if (i in listed) != exclude)


def _mean_oracle(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if x.dtype.kind == "f":
        return np.mean(x.astype(np.float64), axis=axes, keepdims=keepdims)
    total = np.sum(x.astype(np.int64), axis=axes, keepdims=keepdims)
    count = math.prod(x.shape[a] for a in axes)
    return np.vectorize(lambda s: int(s / count))(total)  # Python truncates toward zero here


def _exact(fn):
    """Floats in float64; integers exactly (Python ints), then wrapped to int32 as C would."""

    def oracle(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        if x.dtype.kind == "f":
            return fn(x.astype(np.float64), axis=axes, keepdims=keepdims)
        exact = np.asarray(fn(x.astype(object), axis=axes, keepdims=keepdims))
        wrap = np.vectorize(lambda v: (int(v) + 2**31) % 2**32 - 2**31, otypes=[np.int64])
        return wrap(exact) if exact.size else exact.astype(np.int64)

    return oracle


REDUCTIONS = {
    "sum": _exact(np.sum),
    "mean": _mean_oracle,
    "prod": _exact(np.prod),
    "max": lambda x, axes, keep: np.amax(x, axis=axes, keepdims=keep),
    "min": lambda x, axes, keep: np.amin(x, axis=axes, keepdims=keep),
    "all": lambda x, axes, keep: np.logical_and.reduce(x, axis=axes, keepdims=keep),
    "any": lambda x, axes, keep: np.logical_or.reduce(x, axis=axes, keepdims=keep),
}


@covers(*REDUCTIONS)
@pytest.mark.parametrize("name", REDUCTIONS)
@settings(max_examples=25, deadline=None)
@given(case=reductions(), use_int=st.booleans())
def test_reduction_against_numpy(name: str, case, use_int: bool) -> None:
    shape, axis, keepdims, exclude, seed = case
    rng = np.random.default_rng(seed)
    dtype = "bool" if name in ("all", "any") else ("int32" if use_int else "float32")
    bound = 1.5 if name == "prod" and dtype == "float32" else 3  # keep float products finite
    x = rand(rng, shape, dtype, -bound, bound)
    axes = reduced_axes(len(shape), axis, exclude)
    expected = np.asarray(REDUCTIONS[name](x, axes, keepdims)).astype(dtype)
    check(name, [x], expected, rtol=1e-5, atol=1e-5, axis=axis, keepdims=keepdims, exclude=exclude)


def _arg_oracle(
    x: np.ndarray, axes: tuple[int, ...], keepdims: bool, pick_max: bool, last: bool
) -> np.ndarray:
    kept = [i for i in range(x.ndim) if i not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(-1, math.prod(x.shape[a] for a in axes))
    out = []
    for row in rows.tolist():
        best = max(row) if pick_max else min(row)
        hits = [i for i, v in enumerate(row) if v == best]
        out.append(hits[-1] if last else hits[0])
    shape = (
        [1 if i in axes else d for i, d in enumerate(x.shape)]
        if keepdims
        else [x.shape[i] for i in kept]
    )
    return np.array(out, dtype="int32").reshape(shape)


@covers("argmax", "argmin")
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@settings(max_examples=30, deadline=None)
@given(case=reductions(), last=st.booleans())
def test_arg_reduction_against_python(name: str, case, last: bool) -> None:
    shape, axis, keepdims, exclude, seed = case
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, "int64", -2, 2)  # small values, so ties are common
    axes = reduced_axes(len(shape), axis, exclude)
    expected = _arg_oracle(x, axes, keepdims, name == "argmax", last)
    check(
        name, [x], expected, axis=axis, keepdims=keepdims, exclude=exclude, select_last_index=last
    )


def test_empty_axis_list_reduces_everything() -> None:
    x = np.arange(6, dtype="float32").reshape(2, 3)
    check("sum", [x], np.array(15.0, "float32"), axis=[])


def test_max_over_nothing_is_an_eval_error() -> None:
    with pytest.raises(kiln.EvalError, match="empty"):
        run("max", np.zeros((2, 0), "float32"), axis=[1])
    with pytest.raises(kiln.EvalError, match="empty"):
        run("argmax", np.zeros((0, 3), "float32"), axis=[0])


def test_reduction_axis_errors() -> None:
    t = TensorType((2, 3))
    with pytest.raises(kiln.TypeCheckError, match="axis 2 is out of range.*rank 2"):
        infer("sum", [t], axis=[2])
    with pytest.raises(kiln.TypeCheckError, match="axis -3 is out of range"):
        infer("argmax", [t], axis=[-3])
    with pytest.raises(kiln.TypeCheckError, match="same dimension twice"):
        infer("mean", [t], axis=[1, -1])
    with pytest.raises(kiln.TypeCheckError, match="bool"):
        infer("all", [t])


def test_reductions_keep_symbolic_dims() -> None:
    n = SymDim("n")
    assert infer("sum", [TensorType((n, 3, ANY))], axis=[1]) == TensorType((n, ANY))
    assert infer("max", [TensorType((n, 3))], axis=[0], keepdims=True) == TensorType((1, 3))
    assert infer("argmin", [TensorType((n, 3))], axis=[0], exclude=True) == TensorType(
        (n,), "int32"
    )
