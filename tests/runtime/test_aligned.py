"""Constants on 64-byte boundaries (kiln/runtime/aligned.py), and the executors that keep them.

numpy gives 16-byte alignment; these tests make arrays 16 bytes off a line on purpose and
check that what an executor holds is aligned, read-only, and equal to what it was given, and
that the results are unchanged (numpy is the oracle).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.op import nn
from kiln.runtime.aligned import ALIGN, aligned_empty, frozen_constant, is_aligned
from kiln.runtime.compiler import native_available

RNG = np.random.default_rng(5)


def off_line(a: np.ndarray, offset: int = 16) -> np.ndarray:
    """A copy of ``a`` whose first element is ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 2 * ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN + offset
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("shape,dtype", [((7, 13), "float32"), ((), "int64"), ((0, 5), "float32"),
                                         ((3, 4, 5), "uint8")])
def test_aligned_empty(shape: tuple, dtype: str) -> None:
    a = aligned_empty(shape, np.dtype(dtype))
    assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
    assert is_aligned(a)


def test_a_misaligned_constant_is_copied_aligned_and_frozen() -> None:
    value = RNG.standard_normal((33, 17)).astype(np.float32)
    given = off_line(value)
    assert not is_aligned(given)
    kept = frozen_constant(given)
    assert is_aligned(kept) and kept.flags.c_contiguous and not kept.flags.writeable
    np.testing.assert_array_equal(kept, value)
    given[0, 0] = 99.0  # the caller's array, written later, changes nothing kept
    assert kept[0, 0] == value[0, 0]


def test_an_aligned_frozen_constant_is_kept_as_it_is() -> None:
    a = aligned_empty((8, 8), np.dtype(np.float32))
    a[...] = 1.0
    a.setflags(write=False)
    assert frozen_constant(a) is a


def test_strided_and_foreign_byte_order_constants() -> None:
    value = RNG.standard_normal((6, 10))
    kept = frozen_constant(value.T)  # not C-contiguous
    assert kept.flags.c_contiguous and is_aligned(kept)
    np.testing.assert_array_equal(kept, value.T)
    swapped = value.astype(">f8")
    kept = frozen_constant(swapped)
    assert kept.dtype.isnative and is_aligned(kept)
    np.testing.assert_array_equal(kept, value)


@pytest.mark.skipif(not native_available(), reason="needs llvmlite")
def test_executors_hold_aligned_constants_and_compute_the_same() -> None:
    # a batch-1 dense (the dot-product kernel reads its weight rows in place) whose weight
    # arrives 16 bytes off a line
    w = off_line(RNG.standard_normal((40, 72)).astype(np.float32))
    b = off_line(RNG.standard_normal(40).astype(np.float32))
    x = kiln.var("x", shape=(1, 72), dtype="float32")
    wv = kiln.var("w", shape=(40, 72), dtype="float32")
    bv = kiln.var("b", shape=(40,), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, wv, bv], nn.bias_add(nn.dense(x, wv), bv)))
    exe = kiln.build(mod, params={"w": w, "b": b})
    held = exe.executor._constants
    assert held and all(is_aligned(c) and not c.flags.writeable for c in held)
    a = RNG.standard_normal((1, 72)).astype(np.float32)
    np.testing.assert_allclose(exe(a), a.astype(np.float64) @ w.T.astype(np.float64) + b,
                               rtol=1e-5, atol=1e-5)
