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


@pytest.mark.parametrize("spec", ["llvm", "llvm -mattr=-avx512f"])
def test_channel_blocks_compiled(spec: str) -> None:
    # the compiled NCHW <-> NCHW[b]c moves (a block and a row a task, kiln/op/layout.py),
    # large enough for the thread pool, two images, a row that fills no vector; into
    # blocks and out of them with fused consumers (a slice of the channels, an add), one
    # and two threads, against numpy's reshapes
    target = kiln.Target.parse(spec)
    b = target.lanes("float32")
    x = np.random.default_rng(3).standard_normal((2, 3 * b, 28, 30)).astype("float32")
    r = np.random.default_rng(4).standard_normal((2, 2 * b + 5, 28, 30)).astype("float32")
    blocked = x.reshape(2, 3, b, 28, 30).transpose(0, 1, 3, 4, 2)
    v, vr = kiln.var("x", shape=x.shape), kiln.var("r", shape=r.shape)
    into = kiln.op.layout_transform(v, src_layout="NCHW", dst_layout=f"NCHW{b}c")
    back = kiln.op.layout_transform(kiln.op.multiply(into, kiln.const(np.float32(2.0))),
                                    src_layout=f"NCHW{b}c", dst_layout="NCHW")
    sliced = kiln.op.add(kiln.op.strided_slice(back, begin=[0], end=[2 * b + 5], axes=[1]), vr)
    mod = kiln.IRModule.from_expr(kiln.Function([v, vr], kiln.Tuple([into, back, sliced])))
    exe = kiln.build(mod, target=target)
    results = []
    for count in (1, 2):
        exe.set_threads(count)
        results.append([np.asarray(o) for o in exe(x, r)])
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)
    got_into, got_back, got_sliced = results[0]
    np.testing.assert_array_equal(got_into, blocked)
    np.testing.assert_array_equal(got_back, 2 * x)
    np.testing.assert_array_equal(got_sliced, 2 * x[:, :2 * b + 5] + r)
    # out of blocks and sliced in one kernel (the padding channels convert-layout drops)
    w = kiln.var("w", shape=blocked.shape)
    alone = kiln.op.strided_slice(kiln.op.layout_transform(
        w, src_layout=f"NCHW{b}c", dst_layout="NCHW"), begin=[0], end=[2 * b + 5], axes=[1])
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([w], alone)), target=target)
    assert len([k for k in exe.program.kernels.values() if k.kernel is not None]) == 1
    np.testing.assert_array_equal(exe(blocked), x[:, :2 * b + 5])
    # moves to and from other layouts keep the general lowering: NHWC -> NCHW, NCHW -> NHWC
    nhwc = kiln.var("n", shape=(2, 28, 30, 3 * b))
    both = kiln.Tuple([kiln.op.layout_transform(nhwc, src_layout="NHWC", dst_layout="NCHW"),
                       kiln.op.layout_transform(v, src_layout="NCHW", dst_layout="NHWC")])
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([nhwc, v], both)), target=target)
    to_nchw, to_nhwc = exe(x.transpose(0, 2, 3, 1), x)
    np.testing.assert_array_equal(to_nchw, x)
    np.testing.assert_array_equal(to_nhwc, x.transpose(0, 2, 3, 1))


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
