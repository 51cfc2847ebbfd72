"""nn.batch_norm, nn.layer_norm and nn.dropout against PyTorch (inference semantics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import SymDim, TensorType, TupleType

from .helpers import covers, infer, rand, run

T = torch.from_numpy


@covers("nn.batch_norm")
@pytest.mark.parametrize("axis", [1, -1, 0])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False)])
def test_batch_norm_against_torch(axis: int, center: bool, scale: bool) -> None:
    rng = np.random.default_rng(axis + 3)
    x = rand(rng, (2, 3, 4, 5))
    c = x.shape[axis]
    gamma, beta, mean = rand(rng, (c,)), rand(rng, (c,)), rand(rng, (c,))
    var = rand(rng, (c,), low=0.1, high=2.0)
    moved = T(x).movedim(axis, 1)  # torch normalizes along dimension 1
    expected = F.batch_norm(
        moved,
        T(mean),
        T(var),
        T(gamma) if scale else None,
        T(beta) if center else None,
        training=False,
        eps=1e-3,
    )
    out, out_mean, out_var = run(
        "nn.batch_norm",
        x,
        gamma,
        beta,
        mean,
        var,
        axis=axis,
        epsilon=1e-3,
        center=center,
        scale=scale,
    )
    np.testing.assert_allclose(out, expected.movedim(1, axis).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out_mean, mean)
    np.testing.assert_array_equal(out_var, var)


def test_batch_norm_relation() -> None:
    n = SymDim("n")
    vec = TensorType((3,))
    ty = infer("nn.batch_norm", [TensorType((n, 3, 8)), vec, vec, vec, vec])
    assert ty == TupleType((TensorType((n, 3, 8)), vec, vec))
    with pytest.raises(kiln.TypeCheckError, match=r"moving_var has shape \(4,\) .* 3 elements"):
        infer("nn.batch_norm", [TensorType((2, 3)), vec, vec, vec, TensorType((4,))])
    with pytest.raises(kiln.TypeCheckError, match="out of range"):
        infer("nn.batch_norm", [TensorType((2, 3)), vec, vec, vec, vec], axis=2)


@covers("nn.layer_norm")
@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, False)])
def test_layer_norm_against_torch(axis: int, center: bool, scale: bool) -> None:
    rng = np.random.default_rng(axis + 7)
    x = rand(rng, (3, 4, 5))
    c = x.shape[axis]
    gamma, beta = rand(rng, (c,)), rand(rng, (c,))
    moved = T(x).movedim(axis, -1)  # torch normalizes over the last dimensions
    expected = F.layer_norm(
        moved, (c,), T(gamma) if scale else None, T(beta) if center else None, eps=1e-5
    ).movedim(-1, axis)
    out = run("nn.layer_norm", x, gamma, beta, axis=axis, center=center, scale=scale)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_relation() -> None:
    with pytest.raises(kiln.TypeCheckError, match=r"gamma has shape \(4,\)"):
        infer("nn.layer_norm", [TensorType((2, 3)), TensorType((4,)), TensorType((3,))])
    with pytest.raises(kiln.TypeCheckError, match="floating-point"):
        infer("nn.layer_norm", [TensorType((2, 3), "int32")] + [TensorType((3,), "int32")] * 2)


@covers("nn.dropout")
def test_dropout_is_the_identity_at_inference() -> None:
    x = rand(np.random.default_rng(0), (3, 4))
    out, mask = run("nn.dropout", x, rate=0.3)
    expected = F.dropout(T(x), p=0.3, training=False).numpy()
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(mask, np.ones((3, 4), "float32"))
    assert infer("nn.dropout", [TensorType((2,))]) == TupleType((TensorType((2,)),) * 2)
