"""nn.conv2d_int8_tiled (an 8-bit conv2d on a weight packed in AMX tiles): its reference and
relation against an int64 convolution written here. Its lowerings (the AMX kernel, and the
plain loops reading the tiles) are checked by the lowering sweep (tests/loops/op_cases.py)
and tests/loops/test_int8_amx.py."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType
from kiln.op.nn.int8_tiled import pack_tiled_conv_weight, unpack_tiled_conv_weight

from .helpers import check, covers, infer
from .test_nn_int8_packed import conv_int64, rand8


@covers("nn.conv2d_int8_tiled")
@pytest.mark.parametrize("da,dw", [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"),
                                   ("int8", "uint8")])
@pytest.mark.parametrize("o,c,k,stride,form,steps", [
    (20, 40, 3, 1, "channels", 9), (5, 6, 1, 2, "channels", 1), (33, 70, 3, 2, "channels", 18),
    (20, 3, 5, 2, "taps", 2), (5, 6, 1, 1, "taps", 1), (17, 30, 3, 1, "taps", 6)])
def test_conv2d_int8_tiled_against_numpy(da: str, dw: str, o: int, c: int, k: int,
                                         stride: int, form: str, steps: int) -> None:
    rng = np.random.default_rng(o * c * k)
    x, w = rand8(rng, (2, c, 6, 7), da), rand8(rng, (o, c, k, k), dw)
    wt = pack_tiled_conv_weight(w, form)
    assert wt.shape == (-(-o // 16), steps, 16, 16) and wt.dtype == np.int32
    np.testing.assert_array_equal(unpack_tiled_conv_weight(wt, o, c, (k, k), dw, form), w)
    want = conv_int64(x, w, stride, 1).astype(np.int32)
    check("nn.conv2d_int8_tiled", [x, wt], want, strides=stride, padding=1, channels=o,
          kernel_size=(k, k), out_dtype="int32", weight_dtype=dw, form=form)


def test_tiles_hold_the_weight_in_the_documented_order() -> None:
    # word (t, s, r, w): the 4 bytes of W[16t + r, 64cb + 4w + i, ky, kx], s = (ky·kw + kx)·CB
    # + cb, read back here byte by byte
    rng = np.random.default_rng(3)
    w = rand8(rng, (18, 70, 2, 3), "int8")
    wt = pack_tiled_conv_weight(w)
    cb = 2
    raw = wt.astype("<i4").view(np.uint8).reshape(wt.shape[:3] + (16, 4))
    for o, ch, ky, kx in [(0, 0, 0, 0), (17, 69, 1, 2), (5, 64, 0, 1), (16, 3, 1, 0)]:
        t, r = divmod(o, 16)
        s = (ky * 3 + kx) * cb + ch // 64
        byte = raw[t, s, r, (ch % 64) // 4, ch % 4]
        assert np.int8(byte.view(np.int8)) == w[o, ch, ky, kx]
    assert not raw[1, :, 2:].any() and not raw[:, 1::2, :, 2:].any()  # zeros past the weight
    # "taps": word g = (c·kh + ky)·NQ + q holds W[o, c, ky, 4q .. 4q + 3]
    wt = pack_tiled_conv_weight(w, "taps")
    raw = wt.astype("<i4").view(np.uint8).reshape(wt.shape[:3] + (16, 4))
    for o, ch, ky, kx in [(0, 0, 0, 0), (17, 69, 1, 2), (5, 64, 0, 1), (16, 3, 1, 0)]:
        t, r = divmod(o, 16)
        s, word = divmod((ch * 2 + ky) * 1 + kx // 4, 16)
        assert raw[t, s, r, word, kx % 4].view(np.int8) == w[o, ch, ky, kx]
        assert raw[t, s, r, word, 3] == 0  # kx = 3 is past the kernel row of 3


def test_conv2d_int8_tiled_rejects_a_mismatched_weight() -> None:
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 40 output channels"):
        infer("nn.conv2d_int8_tiled", [TensorType((1, 64, 4, 4), "uint8"),
                                       TensorType((2, 9, 16, 16), "int32")],
              channels=40, kernel_size=(3, 3), out_dtype="int32")
    with pytest.raises(kiln.TypeCheckError, match="one channel group"):
        infer("nn.conv2d_int8_tiled", [TensorType((1, 64, 4, 4), "uint8"),
                                       TensorType((1, 9, 16, 16), "int32")],
              channels=16, kernel_size=(3, 3), out_dtype="int32", groups=2)
    with pytest.raises(kiln.TypeCheckError, match="int32 tiles"):
        infer("nn.conv2d_int8_tiled", [TensorType((1, 64, 4, 4), "uint8"),
                                       TensorType((1, 9, 16, 16), "int8")],
              channels=16, kernel_size=(3, 3), out_dtype="int32")


@covers("nn.conv2d_int8_tiled")
def test_conv2d_int8_tiled_pads_with_its_pad_value() -> None:
    rng = np.random.default_rng(8)
    x, w = rand8(rng, (1, 36, 5, 4), "uint8"), rand8(rng, (6, 36, 3, 3), "int8")
    padded = np.pad(x, ((0, 0), (0, 0), (2, 1), (1, 2)), constant_values=77)
    want = conv_int64(padded, w, 1, 0).astype(np.int32)
    check("nn.conv2d_int8_tiled", [x, pack_tiled_conv_weight(w)], want,
          padding=(2, 1, 1, 2), channels=6, kernel_size=(3, 3), out_dtype="int32",
          weight_dtype="int8", pad_value=77)


@covers("nn.dense_int8_tiled")
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("units,k", [(3, 5), (17, 64), (40, 130)])
def test_dense_int8_tiled_against_numpy(dtype: str, units: int, k: int) -> None:
    from kiln.op.nn.int8_tiled import pack_tiled_dense_weight, unpack_tiled_dense_weight

    rng = np.random.default_rng(units * k)
    x, w = rand8(rng, (2, 3, k), dtype), rand8(rng, (units, k), dtype)
    wt = pack_tiled_dense_weight(w)
    assert wt.shape == (-(-units // 16), -(-k // 64), 16, 16) and wt.dtype == np.int32
    np.testing.assert_array_equal(unpack_tiled_dense_weight(wt, units, k, dtype), w)
    # word (r, c) of tile (t, s) holds W[16t + c, 64s + 4r .. 4r + 3], read back here
    raw = wt.astype("<i4").view(np.uint8).reshape(wt.shape + (4,))
    for o, p in [(0, 0), (units - 1, k - 1), (units // 2, k // 3)]:
        assert raw[o // 16, p // 64, (p % 64) // 4, o % 16, p % 4] == w[o, p].astype(np.uint8)
    want = (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.int32)
    check("nn.dense_int8_tiled", [x, wt], want, units=units, k=k, weight_dtype=dtype)
    with pytest.raises(kiln.TypeCheckError, match="cannot hold"):
        infer("nn.dense_int8_tiled", [TensorType((2, k), dtype), TensorType((9, 9, 16, 16),
                                                                            "int32")],
              units=units, k=k, weight_dtype=dtype)
