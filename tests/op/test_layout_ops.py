"""layout_transform, copy and fixed_point_multiply against formulas written here: numpy
reshapes and transposes for the blocked layouts, Python integers for TVM's rounding."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType

from .helpers import check, covers, infer


@covers("layout_transform")
def test_nchw_to_nchw8c_and_back() -> None:
    x = np.arange(2 * 16 * 3 * 5, dtype="float32").reshape(2, 16, 3, 5)
    # NCHW8c[n, c0, h, w, c1] = NCHW[n, c0 * 8 + c1, h, w]
    blocked = x.reshape(2, 2, 8, 3, 5).transpose(0, 1, 3, 4, 2)
    check("layout_transform", [x], blocked, src_layout="NCHW", dst_layout="NCHW8c")
    check("layout_transform", [blocked], x, src_layout="NCHW8c", dst_layout="NCHW")
    # NHWC from NCHW8c: unblock, then move C last
    check("layout_transform", [blocked], x.transpose(0, 2, 3, 1),
          src_layout="NCHW8c", dst_layout="NHWC")
    # re-blocking 8c -> 4c
    check("layout_transform", [blocked], x.reshape(2, 4, 4, 3, 5).transpose(0, 1, 3, 4, 2),
          src_layout="NCHW8c", dst_layout="NCHW4c")


def test_kernel_blocking_oihw4i4o() -> None:
    w = np.arange(8 * 12 * 3 * 3, dtype="int32").reshape(8, 12, 3, 3)
    # OIHW4i4o[o0, i0, h, w, i1, o1] = OIHW[o0 * 4 + o1, i0 * 4 + i1, h, w]
    expected = w.reshape(2, 4, 3, 4, 3, 3).transpose(0, 2, 4, 5, 3, 1)
    check("layout_transform", [w], expected, src_layout="OIHW", dst_layout="OIHW4i4o")
    check("layout_transform", [expected], w, src_layout="OIHW4i4o", dst_layout="OIHW")


def test_layout_transform_relation() -> None:
    t = infer("layout_transform", [TensorType((1, 32, 7, 7), "float32")],
              src_layout="NCHW", dst_layout="NCHW16c")
    assert t == TensorType((1, 2, 7, 7, 16), "float32")
    with pytest.raises(kiln.TypeCheckError, match="cannot be split into blocks of 16"):
        infer("layout_transform", [TensorType((1, 3, 7, 7), "float32")],
              src_layout="NCHW", dst_layout="NCHW16c")
    with pytest.raises(kiln.TypeCheckError, match="same axes"):
        infer("layout_transform", [TensorType((1, 3, 7, 7), "float32")],
              src_layout="NCHW", dst_layout="NCDW")
    with pytest.raises(kiln.TypeCheckError, match="has 4 in the axis of block 8c"):
        infer("layout_transform", [TensorType((1, 2, 7, 7, 4), "float32")],
              src_layout="NCHW8c", dst_layout="NCHW")


TVM_TEXT = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 16, 4, 4), float32]) -> Tensor[(1, 16, 4, 4), float32] {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW8c");
  %1 = nn.relu(%0);
  %2 = copy(%1);
  layout_transform(%2, src_layout="NCHW8c", dst_layout="NCHW")
}
"""


@covers("copy")
@pytest.mark.parametrize("target", ["evaluator", "llvm"])
def test_tvm_text_with_layout_transforms_builds(target: str) -> None:
    mod = kiln.parse(TVM_TEXT)
    x = np.random.default_rng(0).standard_normal((1, 16, 4, 4)).astype("float32")
    np.testing.assert_array_equal(kiln.interpret(mod, x), np.maximum(x, 0))
    np.testing.assert_array_equal(kiln.build(mod, target=target)(x), np.maximum(x, 0))
    check("copy", [x], x.copy())


def _q_multiply_shift(v: int, multiplier: int, shift: int) -> int:
    """TVM's q_multiply_shift(v, multiplier, 31, shift) with Python's unbounded integers."""
    left, right = max(shift, 0), 31 + max(-shift, 0)
    r = ((v << left) * multiplier + (1 << (right - 1))) >> right
    r &= 2**32 - 1
    return r - 2**32 if r >= 2**31 else r


@covers("fixed_point_multiply")
@pytest.mark.parametrize(("multiplier", "shift"),
                         [(1073741824, 0), (1395864371, -3), (2147483647, 1), (1717986918, -10),
                          (-1073741824, 2), (1431655765, 5)])
def test_fixed_point_multiply_is_bit_exact(multiplier: int, shift: int) -> None:
    rng = np.random.default_rng(abs(multiplier) % 1000 + shift)
    edges = [0, 1, -1, 2, -2, 3, -3, 2**31 - 1, -(2**31), 12345, -12345]
    x = np.concatenate([np.array(edges), rng.integers(-(2**31), 2**31, 200)]).astype("int32")
    expected = np.array([_q_multiply_shift(int(v), multiplier, shift) for v in x], "int32")
    check("fixed_point_multiply", [x], expected, multiplier=multiplier, shift=shift)


def test_fixed_point_multiply_rounds_halves_up() -> None:
    # multiplier 2**30 is 0.5: 1 * 0.5 rounds to 1, -1 * 0.5 to 0, 3 * 0.5 to 2, -3 * 0.5 to -1
    check("fixed_point_multiply", [np.array([1, -1, 3, -3], "int32")],
          np.array([1, 0, 2, -1], "int32"), multiplier=2**30, shift=0)


def test_fixed_point_multiply_in_tvm_text_builds() -> None:
    mod = kiln.parse('#[version = "0.0.5"]\n'
                     "def @main(%x: Tensor[(6), int32]) -> Tensor[(6), int32] {\n"
                     "  fixed_point_multiply(%x, multiplier=1395864371, shift=-3)\n}\n")
    x = np.array([100, -100, 7, 2**31 - 1, -(2**31), 0], "int32")
    expected = np.array([_q_multiply_shift(int(v), 1395864371, -3) for v in x], "int32")
    np.testing.assert_array_equal(kiln.build(mod)(x), expected)
    with pytest.raises(kiln.TypeCheckError, match="int32"):
        infer("fixed_point_multiply", [TensorType((2,), "int8")], multiplier=1, shift=0)
