"""shape_of and the dyn.* operators (shapes as tensors) against PyTorch and numpy formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.ty import ANY, TensorType

from .helpers import check, covers, infer, rand


@covers("shape_of")
@pytest.mark.parametrize("shape", [(), (3,), (2, 0, 4)])
def test_shape_of(shape) -> None:
    x = np.zeros(shape, "float32")
    check("shape_of", [x], np.array(torch.zeros(shape).shape, "int32"))
    check("shape_of", [x], np.array(shape, "int64"), dtype="int64")


@covers("dyn.reshape")
def test_dyn_reshape_against_torch() -> None:
    x = rand(np.random.default_rng(0), (2, 3, 4))
    for shape in ([6, -1], [4, 6], [-1], [1, 24, 1]):
        check("dyn.reshape", [x, np.array(shape)], torch.from_numpy(x).reshape(shape).numpy())
    # 0 copies the input's dimension (ONNX and Relay), unless allowzero
    check("dyn.reshape", [x, np.array([0, 12])], x.reshape(2, 12))
    empty = np.zeros((0, 3), "float32")
    check("dyn.reshape", [empty, np.array([3, 0])], empty.reshape(3, 0), allowzero=1)


def test_dyn_reshape_relation_knows_the_rank_or_the_constant_shape() -> None:
    x = TensorType((ANY, 4), "float32")
    s = TensorType((3,), "int64")
    assert infer("dyn.reshape", [x, s]) == TensorType((ANY, ANY, ANY), "float32")
    got = infer("dyn.reshape", [TensorType((2, 4), "float32"), TensorType((2,), "int64")],
                [None, np.array([4, -1])])
    assert got == TensorType((4, 2), "float32")
    with pytest.raises(kiln.Error, match="static length"):
        infer("dyn.reshape", [x, TensorType((ANY,), "int64")])
    with pytest.raises(kiln.Error, match="int"):
        infer("dyn.reshape", [x, TensorType((2,), "float32")])


def test_dyn_reshape_of_the_wrong_size_is_an_error() -> None:
    op = kiln.op.get("dyn.reshape")
    with pytest.raises(kiln.Error, match="cannot reshape"):
        op.compute([np.zeros((2, 3)), np.array([4, 2])], op.normalize_attrs({}))
    with pytest.raises(kiln.Error, match="1-D integer"):
        op.compute([np.zeros((2, 3)), np.array([[6]])], op.normalize_attrs({}))


@covers("dyn.broadcast_to")
def test_dyn_broadcast_to_against_torch() -> None:
    x = rand(np.random.default_rng(1), (3, 1))
    for shape in ([3, 4], [2, 3, 5], [3, 1]):
        want = torch.from_numpy(x).broadcast_to(shape).numpy()
        check("dyn.broadcast_to", [x, np.array(shape)], want)
    op = kiln.op.get("dyn.broadcast_to")
    with pytest.raises(kiln.Error, match="does not broadcast"):
        op.compute([x, np.array([2, 4])], op.normalize_attrs({}))


@covers("dyn.full", "dyn.zeros", "dyn.ones")
def test_dyn_full_zeros_ones_against_torch() -> None:
    shape = np.array([2, 3])
    check("dyn.full", [np.array(2.5, "float32"), shape], torch.full((2, 3), 2.5).numpy())
    check("dyn.full", [np.array(7, "int32"), shape], np.full((2, 3), 7.0), dtype="float64")
    check("dyn.zeros", [shape], torch.zeros(2, 3, dtype=torch.int64).numpy(), dtype="int64")
    check("dyn.ones", [shape], torch.ones(2, 3).numpy())


def test_dyn_full_refuses_what_it_may_not_allocate(monkeypatch) -> None:
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "1M")
    op = kiln.op.get("dyn.zeros")
    with pytest.raises(kiln.Error, match="more than the limit"):
        op.compute([np.array([1 << 20, 1 << 20])], op.normalize_attrs({}))
    with pytest.raises(kiln.Error, match="negative dimension"):
        op.compute([np.array([-3])], op.normalize_attrs({}))


@covers("dyn.strided_slice")
def test_dyn_strided_slice_against_torch() -> None:
    x = rand(np.random.default_rng(2), (5, 6))
    t = torch.from_numpy(x)
    check("dyn.strided_slice", [x, np.array([1, 0]), np.array([4, 6]), np.array([1, 2])],
          t[1:4, 0:6:2].numpy())
    check("dyn.strided_slice", [x, np.array([-2]), np.array([5]), np.array([1])],
          t[-2:5].numpy())
    # slice_mode "size": end holds sizes, -1 meaning "to the end"
    check("dyn.strided_slice", [x, np.array([1, 2]), np.array([2, -1]), np.array([1, 1])],
          t[1:3, 2:].numpy(), slice_mode="size")


@covers("argwhere")
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 0, 3), ()])
def test_argwhere_against_torch(shape) -> None:
    x = rand(np.random.default_rng(3), shape) if shape else np.array(1.5, "float32")
    cond = np.asarray(x > 0.5)
    want = torch.nonzero(torch.from_numpy(cond)).numpy().astype("int32")
    op = kiln.op.get("argwhere")
    got = op.compute([cond], op.normalize_attrs({}))  # a count of the data: no static type
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert infer("argwhere", [TensorType((ANY, 4), "bool")]) == TensorType((ANY, 2), "int32")
