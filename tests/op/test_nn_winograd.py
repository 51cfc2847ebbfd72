"""nn.conv2d_winograd (a 3×3 stride-1 conv2d on a weight transformed for Winograd) against
PyTorch's conv2d, evaluated (the weight recovered from its transform) and its type rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import TensorType
from kiln.loops.winograd import pack_weight
from kiln.op.nn.winograd import unpack_weight

from .helpers import blocked, check, covers, infer, rand


@covers("nn.conv2d_winograd")
@pytest.mark.parametrize("c,o,m,mr,kp,pad", [(3, 8, 4, 6, 3, 1), (5, 7, 2, 4, 8, 0),
                                             (16, 20, 4, 13, 16, 2)])
def test_conv2d_winograd_against_torch(c: int, o: int, m: int, mr: int, kp: int,
                                       pad: int) -> None:
    rng = np.random.default_rng(c * o)
    x, w = rand(rng, (2, c, 8, 9)), rand(rng, (o, c, 3, 3))
    up = pack_weight(w, m, mr, kp)
    assert up.shape == ((m + 2) ** 2, -(-o // mr), kp, mr)
    np.testing.assert_allclose(unpack_weight(up, o, c), w, rtol=1e-5, atol=1e-5)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
    check("nn.conv2d_winograd", [x, up], want, rtol=1e-4, atol=1e-4, padding=(pad, pad),
          channels=o, kernel_size=(3, 3))


def test_conv2d_winograd_type_rules() -> None:
    data = TensorType((1, 4, 8, 8))
    with pytest.raises(kiln.TypeCheckError, match="channels and kernel_size"):
        infer("nn.conv2d_winograd", [data, TensorType((36, 1, 4, 8))])
    with pytest.raises(kiln.TypeCheckError, match="first axis must be"):
        infer("nn.conv2d_winograd", [data, TensorType((25, 1, 4, 8))], channels=8,
              kernel_size=(3, 3))
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 20 output channels"):
        infer("nn.conv2d_winograd", [data, TensorType((36, 1, 4, 8))], channels=20,
              kernel_size=(3, 3))
    with pytest.raises(kiln.TypeCheckError, match="stride 1"):
        infer("nn.conv2d_winograd", [data, TensorType((36, 1, 4, 8))], channels=8,
              kernel_size=(3, 3), strides=(2, 2))
    out = infer("nn.conv2d_winograd", [data, TensorType((16, 2, 4, 8))], channels=12,
                kernel_size=(3, 3), padding=(1, 1))
    assert out == TensorType((1, 12, 8, 8))


@covers("nn.conv2d_winograd")
@pytest.mark.parametrize("m", [4, 2])
def test_conv2d_winograd_on_blocked_data(m: int) -> None:
    # data and result in NCHW4c (what convert-layout makes with the Target's lanes)
    rng = np.random.default_rng(m)
    x, w = rand(rng, (1, 8, 7, 6)), rand(rng, (12, 8, 3, 3))
    up = pack_weight(w, m, 8, 8)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    check("nn.conv2d_winograd", [blocked(x, 4), up], blocked(want, 4), rtol=1e-4, atol=1e-4,
          padding=(1, 1), channels=12, kernel_size=(3, 3), data_layout="NCHW4c",
          out_layout="NCHW4c")


def test_conv2d_winograd_blocked_type_rules() -> None:
    up = TensorType((36, 2, 8, 8))
    out = infer("nn.conv2d_winograd", [TensorType((1, 2, 7, 6, 4)), up], channels=12,
                kernel_size=(3, 3), padding=(1, 1), data_layout="NCHW4c", out_layout="NCHW4c")
    assert out == TensorType((1, 3, 7, 6, 4))
    with pytest.raises(kiln.TypeCheckError, match="the same NCHW"):
        infer("nn.conv2d_winograd", [TensorType((1, 2, 7, 6, 4)), up], channels=12,
              kernel_size=(3, 3), data_layout="NCHW4c", out_layout="NCHW")
    with pytest.raises(kiln.TypeCheckError, match="must come in blocks of 4"):
        infer("nn.conv2d_winograd", [TensorType((1, 2, 7, 6, 4)), up], channels=10,
              kernel_size=(3, 3), data_layout="NCHW4c")
