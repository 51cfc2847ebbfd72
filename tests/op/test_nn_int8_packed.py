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
