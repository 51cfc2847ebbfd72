"""nn.dense_packed (a dense on a weight prepacked for the GEMM) against PyTorch's linear."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import TensorType
from kiln.op.nn.packed import (
    pack_conv_weight,
    pack_dense_weight,
    unpack_conv_weight,
    unpack_dense_weight,
)

from .helpers import check, covers, infer, rand


@covers("nn.dense_packed")
@pytest.mark.parametrize("units,k,nr,kp", [(3, 5, 8, 5), (17, 4, 16, 8), (16, 1, 16, 1)])
def test_dense_packed_against_torch(units: int, k: int, nr: int, kp: int) -> None:
    rng = np.random.default_rng(units)
    x, w = rand(rng, (2, 3, k)), rand(rng, (units, k))
    wp = pack_dense_weight(w, nr, kp)
    assert wp.shape == (-(-units // nr), kp, nr)
    np.testing.assert_array_equal(unpack_dense_weight(wp, units, k), w)
    check("nn.dense_packed", [x, wp], F.linear(torch.from_numpy(x), torch.from_numpy(w)).numpy(),
          rtol=1e-5, atol=1e-5, units=units)


def test_dense_packed_rejects_a_weight_too_small() -> None:
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 40 units"):
        infer("nn.dense_packed", [TensorType((2, 5)), TensorType((2, 5, 16))], units=40)
    with pytest.raises(kiln.TypeCheckError, match="cannot hold"):
        infer("nn.dense_packed", [TensorType((2, 9)), TensorType((1, 5, 16))], units=4)


@covers("nn.conv2d_packed")
@pytest.mark.parametrize("c,o,groups,k,mr,kp,stride,pad", [
    (3, 8, 1, 3, 6, 27, 1, 1), (4, 6, 2, 3, 12, 20, 2, 0), (5, 7, 1, 1, 6, 5, 1, 0),
])
def test_conv2d_packed_against_torch(c: int, o: int, groups: int, k: int, mr: int, kp: int,
                                     stride: int, pad: int) -> None:
    rng = np.random.default_rng(c * o)
    x, w = rand(rng, (2, c, 7, 8)), rand(rng, (o, c // groups, k, k))
    wp = pack_conv_weight(w, groups, mr, kp)
    np.testing.assert_array_equal(unpack_conv_weight(wp, o, c // groups, (k, k)), w)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=pad,
                    groups=groups).numpy()
    check("nn.conv2d_packed", [x, wp], want, rtol=1e-5, atol=1e-5, strides=(stride, stride),
          padding=(pad, pad), groups=groups, channels=o, kernel_size=(k, k))


def test_conv2d_packed_needs_its_geometry() -> None:
    with pytest.raises(kiln.TypeCheckError, match="channels and kernel_size"):
        infer("nn.conv2d_packed", [TensorType((1, 3, 5, 5)), TensorType((1, 2, 27, 6))])
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 20 output channels"):
        infer("nn.conv2d_packed", [TensorType((1, 3, 5, 5)), TensorType((1, 2, 27, 6))],
              channels=20, kernel_size=(3, 3))
