"""Helpers for the operator tests: run an operator's relation and reference together."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import kiln.op
from kiln.ir.attrs import Attrs
from kiln.ir.ty import TensorType, TupleType, Type

# The operators some oracle test checks; test_sweep fails for a registered op missing here.
COVERED: set[str] = set()


def covers(*names: str) -> Callable[[Callable], Callable]:
    """Mark a test as checking the listed operators against an independent oracle."""
    for name in names:
        assert kiln.op.lookup(name) is not None, f"covers() names unknown operator {name}"

    def mark(test: Callable) -> Callable:
        COVERED.update(names)
        return test

    return mark


def type_of(value: object) -> Type:
    """The kiln type of a numpy array, or of a tuple/list of them."""
    if isinstance(value, (tuple, list)):
        return TupleType(tuple(type_of(v) for v in value))
    array = np.asarray(value)
    return TensorType(array.shape, array.dtype.name)


def infer(
    name: str, arg_types: Sequence[Type], values: Sequence[object] | None = None, **attrs: object
) -> Type | None:
    """The operator's relation applied to argument types (and constant values if it needs them)."""
    opdef = kiln.op.get(name)
    normalized = opdef.normalize_attrs(attrs)
    if opdef.needs_values:
        vals = list(values) if values is not None else [None] * len(arg_types)
        return opdef.relation(list(arg_types), normalized, vals)
    return opdef.relation(list(arg_types), normalized)


def assert_has_type(value: object, ty: Type | None) -> None:
    """The computed value has exactly the type the relation gave (shape and dtype)."""
    assert ty is not None, "the relation did not give a type for fully known arguments"
    if isinstance(ty, TupleType):
        assert isinstance(value, tuple), f"expected a tuple for {ty}, got {type(value).__name__}"
        assert len(value) == len(ty.fields)
        for v, t in zip(value, ty.fields, strict=True):
            assert_has_type(v, t)
        return
    assert isinstance(ty, TensorType)
    assert isinstance(value, np.ndarray), f"expected an ndarray, got {type(value).__name__}"
    assert value.shape == ty.shape, f"computed shape {value.shape}, relation says {ty.shape}"
    assert value.dtype.name == ty.dtype, f"computed dtype {value.dtype}, relation says {ty.dtype}"


def run(name: str, *args: object, **attrs: object) -> object:
    """Compute an operator on numpy inputs, checking the result against its relation's type."""
    opdef = kiln.op.get(name)
    normalized: Attrs = opdef.normalize_attrs(attrs)
    arrays = [a if isinstance(a, (tuple, list)) else np.asarray(a) for a in args]
    ty = infer(name, [type_of(a) for a in arrays], values=arrays, **attrs)
    out = opdef.compute(arrays, normalized)
    assert_has_type(out, ty)
    return out


def check(
    name: str,
    args: Sequence[object],
    expected: np.ndarray,
    *,
    rtol: float = 1e-6,
    atol: float = 0.0,
    **attrs: object,
) -> np.ndarray:
    """Run an operator and compare with an oracle's answer, dtype included."""
    out = run(name, *args, **attrs)
    assert isinstance(out, np.ndarray)
    expected = np.asarray(expected)
    assert out.dtype == expected.dtype, f"{name}: dtype {out.dtype}, expected {expected.dtype}"
    assert out.shape == expected.shape, f"{name}: shape {out.shape}, expected {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    return out


def rand(
    rng: np.random.Generator,
    shape: Sequence[int],
    dtype: str = "float32",
    low: float = -3.0,
    high: float = 3.0,
) -> np.ndarray:
    """Random values of a dtype: uniform floats, integers in [low, high], or random bools."""
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind in "iu":
        lo = max(int(low), np.iinfo(dtype).min)
        return np.asarray(rng.integers(lo, int(high) + 1, size=shape)).astype(dtype)
    return np.asarray(rng.uniform(low, high, size=shape)).astype(dtype)


def blocked(x: np.ndarray, b: int) -> np.ndarray:
    """NCHW -> NCHW[b]c (channel c0·b + c1 at [n, c0, h, w, c1]), written out with numpy."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def unblocked(y: np.ndarray) -> np.ndarray:
    """NCHW[b]c -> NCHW."""
    n, c0, h, w, c1 = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, c0 * c1, h, w)


def blocked_kernel(w: np.ndarray, ib: int, ob: int) -> np.ndarray:
    """OIHW -> OIHW[ib]i[ob]o: w[o0·ob + o1, i0·ib + i1, y, x] at [o0, i0, y, x, i1, o1]."""
    o, i, kh, kw = w.shape
    split = w.reshape(o // ob, ob, i // ib, ib, kh, kw)
    return np.ascontiguousarray(split.transpose(0, 2, 4, 5, 3, 1))
