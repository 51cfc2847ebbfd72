"""nn.dense_int8_packed (an 8-bit dense on a weight prepacked for the int8 GEMM) against
numpy's int64 matrix product."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType
from kiln.op.nn.int8_packed import pack_int8_weight, unpack_int8_weight

from .helpers import check, covers, infer


def rand8(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@covers("nn.dense_int8_packed")
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("units,k,nr,group", [(3, 5, 8, 4), (17, 9, 16, 2), (16, 1, 16, 4),
                                              (5, 6, 8, 2)])
def test_dense_int8_packed_against_numpy(dtype: str, units: int, k: int, nr: int,
                                         group: int) -> None:
    rng = np.random.default_rng(units * k)
    x, w = rand8(rng, (2, 3, k), dtype), rand8(rng, (units, k), dtype)
    wp = pack_int8_weight(w, nr, group)
    assert wp.shape == (-(-units // nr), -(-k // group) + 1, nr) and wp.dtype == np.int32
    np.testing.assert_array_equal(unpack_int8_weight(wp, units, k, dtype, group), w)
    # the last lane group holds the column sums
    sums = wp[:, -1, :].reshape(-1)[:units]
    np.testing.assert_array_equal(sums, w.astype(np.int64).sum(axis=1))
    want = (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.int32)
    check("nn.dense_int8_packed", [x, wp], want, units=units, k=k, weight_dtype=dtype,
          group=group)


def test_dense_int8_packed_rejects_a_mismatched_weight() -> None:
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 40 units"):
        infer("nn.dense_int8_packed", [TensorType((2, 5), "int8"),
                                       TensorType((2, 3, 16), "int32")],
              units=40, k=5, weight_dtype="int8", group=2)
    with pytest.raises(kiln.TypeCheckError, match="int32 panels"):
        infer("nn.dense_int8_packed", [TensorType((2, 5), "int8"),
                                       TensorType((1, 3, 16), "int8")],
              units=4, k=5, weight_dtype="int8", group=2)


def conv_int64(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """An NCHW / OIHW convolution in int64, written here (the oracle)."""
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, _, kh, kw = w.shape
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky:ky + stride * (oh - 1) + 1:stride,
                       kx:kx + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx].astype(np.int64))
    return out


@covers("nn.conv2d_int8_packed")
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("o,c,k,mr,group,stride", [(7, 5, 3, 14, 4, 1), (3, 6, 1, 2, 2, 2),
                                                   (16, 9, 3, 8, 4, 2), (5, 2, 2, 6, 2, 1)])
def test_conv2d_int8_packed_against_numpy(dtype: str, o: int, c: int, k: int, mr: int,
                                          group: int, stride: int) -> None:
    from kiln.op.nn.int8_packed import pack_int8_conv_weight, unpack_int8_conv_weight

    rng = np.random.default_rng(o * c * k)
    x, w = rand8(rng, (2, c, 6, 7), "uint8"), rand8(rng, (o, c, k, k), dtype)
    wp = pack_int8_conv_weight(w, 1, mr, group)
    assert wp.shape == (1, -(-o // mr), -(-c // group) * k * k + 1, mr) and wp.dtype == np.int32
    np.testing.assert_array_equal(unpack_int8_conv_weight(wp, o, c, (k, k), dtype, group), w)
    # the last lane group holds each output channel's weight sum
    sums = wp[0, :, -1, :].reshape(-1)[:o]
    np.testing.assert_array_equal(sums, w.astype(np.int64).sum(axis=(1, 2, 3)))
    want = conv_int64(x, w, stride, 1).astype(np.int32)
    check("nn.conv2d_int8_packed", [x, wp], want, strides=stride, padding=1, channels=o,
          kernel_size=(k, k), out_dtype="int32", weight_dtype=dtype, group=group)


def test_conv2d_int8_packed_rejects_a_mismatched_weight() -> None:
    with pytest.raises(kiln.TypeCheckError, match="cannot hold 40 output channels"):
        infer("nn.conv2d_int8_packed", [TensorType((1, 5, 4, 4), "uint8"),
                                        TensorType((1, 2, 19, 14), "int32")],
              channels=40, kernel_size=(3, 3), out_dtype="int32", group=4)
    with pytest.raises(kiln.TypeCheckError, match="out_dtype must be int32"):
        infer("nn.conv2d_int8_packed", [TensorType((1, 5, 4, 4), "uint8"),
                                        TensorType((1, 1, 19, 14), "int32")],
              channels=4, kernel_size=(3, 3), group=4)


@covers("nn.conv2d_int8_packed")
def test_conv2d_int8_packed_pads_with_its_pad_value() -> None:
    from kiln.op.nn.int8_packed import pack_int8_conv_weight

    rng = np.random.default_rng(5)
    x, w = rand8(rng, (1, 3, 5, 4), "uint8"), rand8(rng, (6, 3, 3, 3), "int8")
    padded = np.pad(x, ((0, 0), (0, 0), (2, 1), (1, 2)), constant_values=77)
    want = conv_int64(padded, w, 1, 0).astype(np.int32)
    check("nn.conv2d_int8_packed", [x, pack_int8_conv_weight(w, 1, 4, 4)], want,
          padding=(2, 1, 1, 2), channels=6, kernel_size=(3, 3), out_dtype="int32",
          weight_dtype="int8", group=4, pad_value=77)
    with pytest.raises(kiln.TypeCheckError, match="pad_value 300 is not a uint8"):
        infer("nn.conv2d_int8_packed", [TensorType((1, 3, 5, 4), "uint8"),
                                        TensorType((1, 2, 28, 4), "int32")],
              channels=6, kernel_size=(3, 3), out_dtype="int32", pad_value=300)
