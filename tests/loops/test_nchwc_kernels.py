"""The kernels of nn.contrib_conv2d_NCHWc (kiln/loops/nchwc_kernels.py), compiled, against PyTorch.

The direct kernel (3×3 with border rows and columns, strides, dilation, asymmetric padding,
the 7×7 stem read from plain NCHW data, 1×1 in rows and over the flattened pixels) and the
depthwise one (stride 1 and 2, dilated, 5×5, several images), each for this machine and for it
without AVX-512; a fused epilogue; one and two threads bit for bit. The blocked inputs are
made, and the results read back, with numpy reshapes (tests/op/helpers.py), not kiln's layout
code.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.loops.nchwc_kernels import tile_shape
from kiln.loops.schedule import target_scope
from kiln.op import nn
from kiln.runtime.compiler import native_available
from kiln.target import Target

from ..op.helpers import blocked, blocked_kernel, unblocked

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(11)
TARGETS = ["llvm", "llvm -mattr=-avx512f"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def reference(x: np.ndarray, w: np.ndarray, strides, padding, dilation, groups) -> np.ndarray:
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    return torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(w.astype(np.float64)),
                                      stride=strides, dilation=dilation, groups=groups).numpy()


def build(xshape, w: np.ndarray, bi: int, bo: int, depthwise: bool, epilogue=None, **attrs):
    """The blocked convolution of a constant weight, built; the kernel it got."""
    x = kiln.var("x", shape=xshape, dtype="float32")
    wb = blocked_kernel(w, 1 if depthwise else bi, bo)
    y = nn.contrib_conv2d_nchwc(
        x, kiln.const(wb), data_layout=f"NCHW{bi}c" if bi > 1 else "NCHW",
        kernel_layout=f"OIHW{1 if depthwise else bi}i{bo}o", out_layout=f"NCHW{bo}c",
        channels=w.shape[0], kernel_size=w.shape[2:],
        groups=w.shape[0] if depthwise else 1, **attrs)
    if epilogue is not None:
        y = epilogue(y)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], y)))
    kinds = {s[1].get("kernel") for k in exe.program.kernels.values() if k.kernel is not None
             for s in k.kernel.attrs.get("schedules", [])}
    return exe, kinds


# (N, C, H, W), (O, kh, kw), strides, padding (top, left, bottom, right), dilation, blocked data
DIRECT = [
    ((1, 32, 9, 11), (32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True),  # border rows, columns
    ((2, 16, 10, 13), (48, 3, 3), (2, 1), (1, 0, 2, 1), (1, 1), True),  # 3 blocks, asymmetric
    ((1, 16, 12, 12), (32, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), True),  # dilated
    ((1, 3, 23, 23), (16, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), False),  # a stem, plain NCHW
    ((1, 32, 7, 7), (160, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True),  # flattened pixels
    ((1, 48, 15, 31), (64, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True),  # 1×1 in rows
    ((1, 32, 14, 14), (64, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), True),  # strided 1×1
    ((1, 16, 4, 3), (16, 5, 5), (1, 1), (3, 3, 3, 3), (1, 1), True),  # windows past the image
]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,ws,strides,padding,dilation,in_blocks", DIRECT)
def test_direct(xs, ws, strides, padding, dilation, in_blocks, spec) -> None:
    target = Target.parse(spec)
    b = target.lanes("float32")
    o, kh, kw = ws
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal((o, xs[1], kh, kw)).astype(np.float32)
    want = reference(x, w, strides, padding, dilation, 1)
    bi = b if in_blocks else 1
    with target_scope(target):
        exe, kinds = build((xs[0], xs[1] // bi, xs[2], xs[3], bi) if in_blocks else xs, w, bi, b,
                           False, strides=strides, padding=padding, dilation=dilation)
    assert kinds == {"nchwc direct"}
    got = exe(blocked(x, bi) if in_blocks else x)
    np.testing.assert_allclose(unblocked(got), want, rtol=1e-4, atol=2e-5 * xs[1] * kh * kw)


DEPTHWISE = [
    ((1, 32, 13, 17), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 32, 14, 15), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # stride 2, two images
    ((1, 16, 12, 12), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),  # dilated
    ((1, 16, 11, 20), (5, 5), (1, 2), (2, 1, 2, 3), (1, 1)),  # 5×5, asymmetric
    ((1, 48, 3, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # every pixel at a border
]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,k,strides,padding,dilation", DEPTHWISE)
def test_depthwise(xs, k, strides, padding, dilation, spec) -> None:
    target = Target.parse(spec)
    b = target.lanes("float32")
    c = xs[1]
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    want = reference(x, w, strides, padding, dilation, c)
    with target_scope(target):
        exe, kinds = build((xs[0], c // b, xs[2], xs[3], b), w, b, b, True, strides=strides,
                           padding=padding, dilation=dilation)
    assert kinds == {"nchwc depthwise"}
    np.testing.assert_allclose(unblocked(exe(blocked(x, b))), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depthwise", [False, True])
def test_epilogue_and_threads(depthwise: bool) -> None:
    # clip(conv + shift, 0, 6) as MobileNetV2 has it, large enough for the thread pool
    b = Target.host().lanes("float32")
    c, size = 4 * b, 28
    x = RNG.standard_normal((1, c, size, size)).astype(np.float32)
    w = RNG.standard_normal((c, 1 if depthwise else c, 3, 3)).astype(np.float32)
    shift = RNG.standard_normal((c, 1, 1)).astype(np.float32)
    shift_b = blocked(shift.reshape(1, c, 1, 1), b)

    def epilogue(y):
        return kiln.op.clip(kiln.op.add(y, kiln.const(shift_b[0])), a_min=0.0, a_max=6.0)

    exe, _ = build((1, c // b, size, size, b), w, b, b, depthwise, epilogue,
                   padding=(1, 1, 1, 1))
    want = np.clip(reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), c if depthwise else 1)
                   + shift, 0, 6)
    xb = blocked(x, b)
    exe.set_threads(1)
    one = exe(xb)
    exe.set_threads(2)
    two = exe(xb)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(unblocked(one), want, rtol=1e-4, atol=1e-3)


def test_tile_shape_fills_the_registers() -> None:
    avx512 = Target.parse("llvm -mcpu=sapphirerapids")
    avx2 = Target.parse("llvm -mcpu=znver3")
    assert tile_shape(56, 2, 16, avx512) == (14, 2)  # the GEMM's 14 × 2 vectors
    assert tile_shape(56, 4, 16, avx512) == (7, 4)  # as many, fewer broadcasts
    assert tile_shape(7, 60, 16, avx512) == (7, 4)  # a 7-pixel row: 4 blocks
    assert tile_shape(7, 10, 16, avx512) == (4, 5)  # 10 blocks: 5 of them, 4 + 3 pixels
    assert tile_shape(112, 1, 16, avx512) == (28, 1)  # one block: 28 pixels
    assert tile_shape(56, 2, 8, avx2) == (6, 2)  # AVX2: 12 accumulators
    assert tile_shape(3, 1, 16, avx512) == (3, 1)  # fewer pixels than registers
    # 8 blocks of a 3×3 layer's weight (K = 1152) come from L2: 4 pixels or more a tile
    assert tile_shape(10, 8, 16, avx512) == (3, 8)  # (K unknown: the most accumulators)
    assert tile_shape(10, 8, 16, avx512, k=128 * 9) == (5, 4)
    assert tile_shape(9, 32, 16, avx512, k=512 * 9) == (5, 4)
    assert tile_shape(10, 8, 16, avx512, k=32) == (3, 8)  # 16 KiB of weight: L1's
    assert tile_shape(7, 60, 16, avx512, k=512 * 9) == (7, 4)
    assert tile_shape(10, 8, 8, avx2, k=128 * 9) == tile_shape(10, 8, 8, avx2)


def test_a_row_of_ten_pixels_in_tiles_of_five() -> None:
    # 128 channels at 10×10 in blocks of the host's lanes: the tile the rule gives (4 or
    # more pixels where its weight comes from L2) computes the oracle's result
    b = Target.host().lanes("float32")
    x = RNG.standard_normal((1, 128, 10, 10)).astype(np.float32)
    w = RNG.standard_normal((128, 128, 3, 3)).astype(np.float32)
    exe, kinds = build((1, 128 // b, 10, 10, b), w, b, b, False, padding=(1, 1, 1, 1))
    assert kinds == {"nchwc direct"}
    tiles = {(s[1]["pixels"], s[1]["blocks"]) for k in exe.program.kernels.values()
             if k.kernel is not None for s in k.kernel.attrs.get("schedules", [])}
    assert tiles == {tile_shape(10, 128 // b, b, Target.host(), k=128 * 9)}
    assert b != 16 or tiles == {(5, 4)}
    want = reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_allclose(unblocked(exe(blocked(x, b))), want, rtol=1e-4, atol=2e-5 * 1152)


# (N, C, H, W), O, padding: 3×3 stride-1 convolutions Winograd's algorithm takes
WINOGRAD = [
    ((1, 32, 28, 28), 32, 1),  # F(4×4), whole tiles
    ((2, 16, 27, 26), 48, 1),  # the last tiles stick out; two images
    ((1, 32, 30, 30), 64, 0),  # no padding
    ((1, 16, 20, 21), 16, 2),  # windows past the image by two at every edge
    ((1, 192, 14, 14), 192, 1),  # F(2×2): F(4×4)'s transformed weight would be too large
]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,o,pad", WINOGRAD)
def test_winograd_on_blocked_data(xs, o, pad, spec) -> None:
    # convert-layout gives the blocked Winograd kernel (kiln/loops/winograd_nchwc.py) the
    # convolutions winograd.choose takes; relu after it, fused, then a 1×1 convolution (a
    # convolution alone stays NCHW)
    target = Target.parse(spec)
    x = RNG.standard_normal(xs).astype(np.float32)
    w = (RNG.standard_normal((o, xs[1], 3, 3)) / 3).astype(np.float32)
    w2 = (RNG.standard_normal((o, o, 1, 1)) / np.sqrt(o)).astype(np.float32)
    v = kiln.var("x", shape=xs, dtype="float32")
    y = nn.conv2d(nn.relu(nn.conv2d(v, kiln.const(w), padding=(pad, pad))), kiln.const(w2))
    with target_scope(target):
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([v], y)), target=target)
    algos = {s[1].get("algorithm") for k in exe.program.kernels.values()
             if k.kernel is not None for s in k.kernel.attrs.get("schedules", [])}
    b = target.lanes("float32")
    assert any(a and a.endswith(f"NCHW{b}c") for a in algos), algos
    want = reference(np.maximum(reference(x, w, (1, 1), (pad,) * 4, (1, 1), 1), 0), w2,
                     (1, 1), (0,) * 4, (1, 1), 1)
    np.testing.assert_allclose(exe(x), want, rtol=1e-3, atol=1e-3)


def test_winograd_group_rule() -> None:
    from kiln.loops.winograd_nchwc import group_rule

    assert group_rule(196, 2, 14) == (14, 1)  # ResNet's 56²: 14 groups of 14, 7 a thread
    assert group_rule(49, 2, 14) == (13, 1)  # 28²: 13, 13, 13 and the last 10
    assert group_rule(196, 2, 6) == (5, 5)  # AVX2's 6-row tiles: 25 tiles in 5 of 5 rows
    assert group_rule(30, 2, 6) == (5, 3)  # groups of 24 would leave one thread 6: 15, 15
    assert group_rule(20, 2, 14) == (12, 1)  # two groups, 12 and 8
    assert group_rule(4, 2, 14) == (14, 0)  # too few tiles for a group a thread: no groups


@pytest.mark.parametrize("spec", TARGETS)
def test_winograd_groups_and_threads(spec: str) -> None:
    # The blocked Winograd kernel runs a group of tiles a task, the last group short
    # (28² in 4×4 tiles: 49 of them); one and two threads, and the whole image in three
    # steps (group 0, through a tuning override), give the same bits, and torch's result.
    from kiln.loops import winograd_nchwc
    from kiln.loops.tunable import ScheduleOverrides, overrides_scope

    target = Target.parse(spec)
    b = target.lanes("float32")
    c, size = 2 * b, 28
    x = RNG.standard_normal((1, c, size, size)).astype(np.float32)
    w = (RNG.standard_normal((c, c, 3, 3)) / 3).astype(np.float32)
    w2 = (RNG.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    v = kiln.var("x", shape=x.shape, dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([v], nn.conv2d(nn.relu(nn.conv2d(
        v, kiln.const(w), padding=(1, 1))), kiln.const(w2))))
    blocked_shape = (1, c // b, size, size, b)
    with target_scope(target):
        space = winograd_nchwc.space(blocked_shape, blocked_shape, (1, 1), 4, target)
        grouped = kiln.build(mod, target=target)
        whole = {**space.default, "group": 0, "parallel": "batch"}
        assert space.default["group"] > 0 and space.legal(whole)
        with overrides_scope(ScheduleOverrides({space.key: whole})):
            three_steps = kiln.build(mod, target=target)
    groups = {s[1]["group"] for e in (grouped, three_steps) for k in e.program.kernels.values()
              if k.kernel is not None for s in k.kernel.attrs.get("schedules", [])
              if "group" in s[1]}
    assert groups == {0, space.default["group"]}
    results = []
    for exe in (grouped, three_steps):
        for count in (1, 2):
            exe.set_threads(count)
            results.append(exe(x))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    want = reference(np.maximum(reference(x, w, (1, 1), (1,) * 4, (1, 1), 1), 0), w2,
                     (1, 1), (0,) * 4, (1, 1), 1)
    np.testing.assert_allclose(results[0], want, rtol=1e-3, atol=1e-3)
