"""Tensor creation: zeros, ones, full, the *_like forms and arange, against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.ty import ANY, TensorType

from .helpers import check, covers, infer, rand


@covers("zeros", "ones")
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 0, 4)])
def test_zeros_and_ones_against_torch(dtype: str, shape) -> None:
    tdtype = getattr(torch, dtype)
    check("zeros", [], torch.zeros(shape, dtype=tdtype).numpy(), shape=shape, dtype=dtype)
    check("ones", [], torch.ones(shape, dtype=tdtype).numpy(), shape=shape, dtype=dtype)


def test_zeros_default_dtype_is_float32() -> None:
    check("zeros", [], np.zeros((2,), "float32"), shape=[2])


@covers("full")
def test_full_against_torch() -> None:
    value = np.array(2.5, "float32")
    check("full", [value], torch.full((2, 3), 2.5).numpy(), shape=(2, 3))
    # A float fill converted to an integer dtype truncates, as a cast does.
    expected = torch.full((4,), 2.5).to(torch.int32).numpy()
    check("full", [value], expected, shape=[4], dtype="int32")
    with pytest.raises(kiln.TypeCheckError, match="scalar"):
        infer("full", [TensorType((1,))], shape=[2])


@covers("zeros_like", "ones_like", "full_like")
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_like_ops_against_torch(dtype: str) -> None:
    x = rand(np.random.default_rng(0), (2, 3), dtype)
    check("zeros_like", [x], torch.zeros_like(torch.from_numpy(x)).numpy())
    check("ones_like", [x], torch.ones_like(torch.from_numpy(x)).numpy())
    fill = np.array(7.0, "float64")
    check("full_like", [x, fill], torch.full_like(torch.from_numpy(x), 7).numpy())


ARANGES = [
    (0, 5, 1, "float32"),
    (1, 2, 0.3, "float32"),
    (10, 0, -3, "int32"),
    (0, 0, 1, "int64"),
    (-1.5, 2.5, 0.5, "float64"),
]


@covers("arange")
@pytest.mark.parametrize(("start", "stop", "step", "dtype"), ARANGES)
def test_arange_against_torch(start, stop, step, dtype: str) -> None:
    bounds = [np.array(v, dtype) for v in (start, stop, step)]
    expected = torch.arange(start, stop, step, dtype=torch.float64).numpy().astype(dtype)
    check("arange", bounds, expected, rtol=1e-6, dtype=dtype)


def test_arange_past_its_stop_is_empty() -> None:
    bounds = [np.array(v, "int32") for v in (5, 0, 1)]
    check("arange", bounds, np.zeros((0,), "int32"), dtype="int32")


def test_arange_relation_needs_constant_bounds() -> None:
    scalar = TensorType((), "float32")
    assert infer("arange", [scalar] * 3, dtype="float32") == TensorType((ANY,))
    values = [np.array(v, "float32") for v in (0, 10, 3)]
    assert infer("arange", [scalar] * 3, values, dtype="float32") == TensorType((4,))
    with pytest.raises(kiln.TypeCheckError, match="start has dtype int32"):
        infer("arange", [TensorType((), "int32"), scalar, scalar], dtype="float32")
    with pytest.raises(kiln.TypeCheckError, match="nonzero step"):
        infer("arange", [scalar] * 3, [np.array(0, "float32")] * 3, dtype="float32")
    with pytest.raises(kiln.EvalError, match="nonzero step"):
        bounds = [np.array(v, "float32") for v in (0, 1, 0)]
        kiln.op.get("arange").compute(bounds, kiln.op.get("arange").normalize_attrs({}))


def test_creation_builders_follow_relays_python_api() -> None:
    call = kiln.op.arange(5, dtype="int32")
    assert call.op == kiln.Op("arange")
    assert [int(a.data) for a in call.args] == [0, 5, 1]
    assert all(a.data.dtype == np.int32 for a in call.args)
    assert call.attrs["dtype"] == "int32"
    call = kiln.op.zeros((2, 3))
    assert call.op == kiln.Op("zeros") and call.args == ()
    assert call.attrs["shape"] == (2, 3) and call.attrs["dtype"] == "float32"
    call = kiln.op.full(1, (2,), "int8")
    assert call.args[0].data.dtype == np.int8 and call.attrs["dtype"] == "int8"
