"""nn.dense, nn.batch_matmul and nn.bias_add against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import ANY, SymDim, TensorType

from .helpers import check, covers, infer, rand

T = torch.from_numpy


@covers("nn.dense")
@pytest.mark.parametrize("seed", range(5))
def test_dense_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = tuple(rng.integers(1, 4, size=rng.integers(0, 3)))
    k, units = (int(v) for v in rng.integers(1, 6, size=2))
    x = rand(rng, (*batch, k))
    w = rand(rng, (units, k))
    expected = F.linear(T(x), T(w)).numpy()
    check("nn.dense", [x, w], expected, rtol=1e-5, atol=1e-5)
    check("nn.dense", [x, w], expected, rtol=1e-5, atol=1e-5, units=units)


def test_dense_integer_inputs_with_wider_output() -> None:
    rng = np.random.default_rng(0)
    x, w = rand(rng, (3, 4), "int8", -100, 100), rand(rng, (2, 4), "int8", -100, 100)
    expected = (T(x).to(torch.int64) @ T(w).to(torch.int64).T).to(torch.int32).numpy()
    check("nn.dense", [x, w], expected, out_dtype="int32")


def test_dense_mismatch_names_both_shapes_and_the_dimension() -> None:
    with pytest.raises(kiln.TypeCheckError) as info:
        infer("nn.dense", [TensorType((1, 784)), TensorType((10, 500))])
    message = info.value.message
    assert "(1, 784)" in message and "(10, 500)" in message
    assert "784" in message and "500" in message and "dimension 1 of weight" in message
    with pytest.raises(kiln.TypeCheckError, match="units=7 .* 10 units"):
        infer("nn.dense", [TensorType((1, 5)), TensorType((10, 5))], units=7)
    with pytest.raises(kiln.TypeCheckError, match="dtype"):
        infer("nn.dense", [TensorType((1, 5)), TensorType((10, 5), "float64")])


def test_dense_keeps_symbolic_batch() -> None:
    n = SymDim("n")
    assert infer("nn.dense", [TensorType((n, 5)), TensorType((3, ANY))]) == TensorType((n, 3))


@covers("nn.batch_matmul")
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("batches", [(2, 2), (1, 3), (3, 1)])
def test_batch_matmul_against_torch(transpose_a: bool, transpose_b: bool, batches) -> None:
    rng = np.random.default_rng(3)
    m, k, n = 2, 3, 4
    x = rand(rng, (batches[0], k, m) if transpose_a else (batches[0], m, k))
    y = rand(rng, (batches[1], n, k) if transpose_b else (batches[1], k, n))
    a = T(x).transpose(1, 2) if transpose_a else T(x)
    b = T(y).transpose(1, 2) if transpose_b else T(y)
    expected = torch.matmul(a, b).numpy()
    check(
        "nn.batch_matmul",
        [x, y],
        expected,
        rtol=1e-5,
        atol=1e-6,
        transpose_a=transpose_a,
        transpose_b=transpose_b,
    )


def test_batch_matmul_relation_errors() -> None:
    with pytest.raises(kiln.TypeCheckError, match="reduction dimension: 3 in x but 4 in y"):
        infer("nn.batch_matmul", [TensorType((2, 2, 3)), TensorType((2, 5, 4))])
    with pytest.raises(kiln.TypeCheckError, match="batch sizes 2 and 3"):
        infer("nn.batch_matmul", [TensorType((2, 2, 3)), TensorType((3, 5, 3))])
    with pytest.raises(kiln.TypeCheckError, match="rank 3"):
        infer("nn.batch_matmul", [TensorType((2, 3)), TensorType((2, 5, 3))])


@covers("nn.bias_add")
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_bias_add_against_torch(axis: int) -> None:
    rng = np.random.default_rng(axis + 10)
    x = rand(rng, (2, 3, 4))
    b = rand(rng, (x.shape[axis],))
    view = [1, 1, 1]
    view[axis] = -1
    check("nn.bias_add", [x, b], (T(x) + T(b).view(view)).numpy(), axis=axis)


def test_bias_add_relation_errors() -> None:
    with pytest.raises(kiln.TypeCheckError, match=r"bias of shape \(4,\) .* dimension 1"):
        infer("nn.bias_add", [TensorType((2, 3, 4)), TensorType((4,))])
    with pytest.raises(kiln.TypeCheckError, match="out of range"):
        infer("nn.bias_add", [TensorType((2, 3)), TensorType((3,))], axis=2)
