"""Activations, nn.pad and nn.batch_flatten against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import ANY, SymDim, TensorType

from .helpers import check, covers, infer, rand

T = torch.from_numpy


@covers("nn.relu", "nn.leaky_relu")
@pytest.mark.parametrize("seed", range(3))
def test_relu_and_leaky_relu_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, (3, 4))
    check("nn.relu", [x], F.relu(T(x)).numpy())
    xi = rand(rng, (5,), "int32", -5, 5)
    check("nn.relu", [xi], F.relu(T(xi)).numpy())
    check("nn.leaky_relu", [x], F.leaky_relu(T(x), 0.25).numpy())
    check("nn.leaky_relu", [x], F.leaky_relu(T(x), 0.1).numpy(), alpha=0.1)


@covers("nn.softmax", "nn.log_softmax")
@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
def test_softmax_against_torch(axis: int) -> None:
    x = rand(np.random.default_rng(axis + 5), (2, 3, 4), low=-30, high=30)
    check("nn.softmax", [x], torch.softmax(T(x), dim=axis).numpy(), rtol=1e-5, atol=1e-7, axis=axis)
    check(
        "nn.log_softmax",
        [x],
        torch.log_softmax(T(x), dim=axis).numpy(),
        rtol=1e-5,
        atol=1e-5,
        axis=axis,
    )
    with pytest.raises(kiln.TypeCheckError, match="axis 3 is out of range"):
        infer("nn.softmax", [TensorType((2, 3, 4))], axis=3)
    with pytest.raises(kiln.TypeCheckError, match="floating-point"):
        infer("nn.softmax", [TensorType((2,), "int32")])


@covers("nn.pad")
@pytest.mark.parametrize("seed", range(3))
def test_pad_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, (2, 3, 4, 5))
    widths = [tuple(int(v) for v in rng.integers(0, 3, size=2)) for _ in range(4)]
    flat = [v for pair in reversed(widths) for v in pair]  # torch lists the last axis first
    check(
        "nn.pad",
        [x, np.array(1.5, "float32")],
        F.pad(T(x), flat, value=1.5).numpy(),
        pad_width=widths,
    )
    spatial = [(0, 0), (0, 0), *widths[2:]]
    flat = [v for pair in reversed(widths[2:]) for v in pair]
    for mode, torch_mode in (("edge", "replicate"), ("reflect", "reflect")):
        expected = F.pad(T(x), flat, mode=torch_mode).numpy()
        check("nn.pad", [x, np.array(0.0, "float32")], expected, pad_width=spatial, pad_mode=mode)


def test_pad_relation_and_builder() -> None:
    n = SymDim("n")
    scalar = TensorType(())
    ty = infer("nn.pad", [TensorType((n, 3)), scalar], pad_width=[(0, 0), (1, 2)])
    assert ty == TensorType((n, 6))
    ty = infer("nn.pad", [TensorType((n, 3)), scalar], pad_width=[(1, 0), (0, 0)])
    assert ty == TensorType((ANY, 3))
    with pytest.raises(kiln.TypeCheckError, match="2 dimensions"):
        infer("nn.pad", [TensorType((2, 3)), scalar], pad_width=[(1, 1)])
    with pytest.raises(kiln.TypeCheckError, match="at least 4"):
        infer(
            "nn.pad", [TensorType((2, 3)), scalar], pad_width=[(0, 0), (3, 0)], pad_mode="reflect"
        )
    with pytest.raises(kiln.Error, match="non-negative"):
        kiln.op.nn.pad(kiln.var("x", shape=(2,)), [(-1, 0)])
    call = kiln.op.nn.pad(kiln.var("x", shape=(2,)), [(1, 1)])
    assert call.op == kiln.Op("nn.pad") and float(call.args[1].data) == 0.0
    assert call.attrs["pad_width"] == ((1, 1),)


@covers("nn.batch_flatten")
@pytest.mark.parametrize("shape", [(2, 3, 4), (3,), (2, 0, 5), (4, 1)])
def test_batch_flatten_against_torch(shape) -> None:
    x = rand(np.random.default_rng(0), shape)
    expected = torch.flatten(T(x), 1).numpy() if len(shape) > 1 else x.reshape(-1, 1)
    check("nn.batch_flatten", [x], expected)
    n = SymDim("n")
    assert infer("nn.batch_flatten", [TensorType((n, 3, 4))]) == TensorType((n, 12))
    assert infer("nn.batch_flatten", [TensorType((2, n))]) == TensorType((2, n))
