"""The fast conv2d kernels (kiln/loops/conv_kernels.py), compiled, against PyTorch.

Implicit GEMM (with and without the padded copy of the input, grouped, dilated, strided,
K larger than the GEMM's kc) and the direct depthwise kernel (stride 1 and 2, a channel
multiplier), alone and with a fused epilogue; one and two threads give identical results.
Each case is scheduled and compiled for this machine and for it without AVX-512 (AVX2 code).
Padding may be asymmetric in kiln, so the oracle pads with numpy and runs torch's conv2d
unpadded.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.loops.schedule import target_scope
from kiln.op import nn
from kiln.runtime.compiler import native_available
from kiln.target import Target
from kiln.transform import PassContext

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(9)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


@pytest.fixture(autouse=True)
def nchw_kernels() -> Iterator[None]:
    # these are the NCHW kernels' tests: constant weights stay NCHW (convert-layout would
    # give them to the blocked kernels, tested in test_nchwc_kernels.py)
    with PassContext(config={"convert-layout": False}):
        yield


def reference(x: np.ndarray, w: np.ndarray, strides: tuple, padding: tuple, dilation: tuple,
              groups: int) -> np.ndarray:
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    out = torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(w.astype(np.float64)),
                                     stride=strides, dilation=dilation, groups=groups)
    return out.numpy()


# (N, C, H, W), (O, kh, kw), strides, padding (top, left, bottom, right), dilation, groups
CASES = [
    ((1, 3, 17, 19), (8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 5, 9, 11), (7, 3, 2), (2, 1), (1, 0, 2, 1), (1, 1), 1),
    ((1, 3, 23, 23), (16, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),  # ResNet's first layer
    ((1, 12, 10, 10), (20, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # no padding: no copy
    ((1, 6, 12, 12), (6, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilated
    ((1, 8, 9, 9), (12, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),  # grouped
    ((2, 40, 6, 6), (33, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # K = 360 > kc
    ((1, 8, 13, 13), (8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8),  # depthwise
    ((2, 6, 14, 15), (6, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 6),  # depthwise, stride 2
    ((1, 4, 9, 9), (8, 5, 3), (1, 2), (2, 1, 0, 1), (2, 1), 4),  # depthwise ×2 channels
    ((1, 3, 11, 13), (3, 3, 3), (1, 3), (1, 2, 1, 0), (1, 2), 3),  # column phases, dilated
    # depthwise planes: only the padding zeroed, each row copied once for every phase
    ((1, 3, 12, 40), (3, 3, 3), (2, 3), (3, 3, 3, 3), (1, 1), 3),  # padding past the kernel
    ((1, 2, 3, 2), (2, 3, 3), (1, 2), (2, 3, 2, 3), (1, 1), 2),  # a phase of only padding
    ((1, 2, 5, 37), (2, 2, 3), (2, 2), (0, 0, 0, 0), (2, 2), 2),  # unpadded, dilated
    # more stride phases than MAX_PHASES: the input as im2col rows (a ViT's patches)
    ((1, 3, 32, 32), (8, 4, 4), (4, 4), (0, 0, 0, 0), (1, 1), 1),
    ((1, 4, 13, 14), (6, 3, 3), (3, 2), (1, 2, 0, 1), (2, 1), 1),  # padded, dilated
    ((1, 8, 12, 12), (8, 3, 3), (3, 3), (1, 1, 1, 1), (1, 1), 2),  # grouped
    ((1, 64, 32, 32), (16, 4, 4), (4, 4), (0, 0, 0, 0), (1, 1), 1),  # K 1024: pixels as rows
    # depthwise read in place (stride 1, up to 3×3, a padded plane past L1): the windows
    # inside the image vectorized, the border tested tap by tap
    ((1, 2, 130, 131), (2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    ((1, 2, 128, 140), (4, 2, 3), (1, 1), (0, 2, 1, 0), (1, 1), 2),  # ×2, 2×3, pad 2 left
    ((2, 2, 129, 129), (2, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 2),  # unpadded, two images
    # depthwise planes past L1 in bands of output rows, each from a copy of its own rows
    ((1, 2, 130, 131), (2, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2),  # stride 2
    ((1, 2, 120, 126), (4, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 2),  # dilated, ×2
    ((1, 2, 112, 112), (2, 5, 5), (1, 1), (2, 2, 1, 3), (1, 1), 2),  # 5×5, asymmetric
    # depthwise on maps whose rows fit twice in a vector: the flat kernel
    ((1, 5, 4, 4), (5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 5),
    ((2, 3, 7, 8), (6, 3, 3), (2, 2), (1, 1, 1, 0), (2, 1), 3),  # strided, dilated, ×2
    ((2, 48, 7, 7), (48, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 48),  # 3 blocks of 16 channels
    ((1, 12, 8, 8), (24, 3, 3), (2, 2), (1, 0, 1, 1), (1, 1), 12),  # ×2, blocks of 8
    # K ≥ TRANSPOSED_MIN_K: with the weight packed, pixels are the GEMM's rows
    ((1, 115, 7, 7), (20, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # whole rows, K padded
    ((1, 116, 15, 15), (24, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # strided, 8 px rows
    ((1, 128, 28, 28), (6, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # two tiles a row
    ((1, 64, 5, 30), (8, 4, 4), (1, 1), (1, 2, 2, 1), (1, 1), 1),  # ow 30: tiles of 10
    ((1, 64, 5, 29), (8, 4, 4), (1, 1), (1, 2, 2, 1), (1, 1), 1),  # ow 29: stays columns
    # 1×1, stride 1, unpadded: a plane is the image itself
    ((2, 16, 9, 7), (24, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 8, 6, 6), (12, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),  # grouped
    ((1, 8, 4, 4), (8, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # fewer pixels than a tile
]


TARGETS = ["llvm", "llvm -mattr=-avx512f"]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,ws,strides,padding,dilation,groups", CASES)
def test_conv2d(xs: tuple, ws: tuple, strides: tuple, padding: tuple, dilation: tuple,
                groups: int, spec: str) -> None:
    o, kh, kw = ws
    wshape = (o, xs[1] // groups, kh, kw)
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    body = nn.conv2d(x, w, strides=strides, padding=padding, dilation=dilation, groups=groups)
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], body))
    target = Target.parse(spec)
    a = RNG.standard_normal(xs).astype(np.float32)
    b = RNG.standard_normal(wshape).astype(np.float32)
    want = reference(a, b, strides, padding, dilation, groups)
    k = wshape[1] * kh * kw
    with target_scope(target):
        exe = kiln.build(mod, target=target)
        packed = kiln.build(mod, target=target, params={"w": b})  # weight packed ahead
    np.testing.assert_allclose(exe(a, b), want, rtol=1e-4, atol=2e-5 * k)
    np.testing.assert_allclose(packed(a), want, rtol=1e-4, atol=2e-5 * k)


@pytest.mark.parametrize("groups,size", [(1, 30), (16, 30), (96, 7), (16, 128)])
def test_conv2d_epilogue_and_threads(groups: int, size: int) -> None:
    # relu(conv + bias) + residual, large enough to run in parallel (7×7 depthwise: the flat
    # kernel, its channels in blocks; 128×128: read in place, its plane past L1)
    o = max(groups, 16)
    xs = (1, o, size, size)
    wshape = (o, xs[1] // groups, 3, 3)
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    bias = kiln.var("b", shape=(o,), dtype="float32")
    r = kiln.var("r", shape=(1, o, size, size), dtype="float32")
    conv = nn.conv2d(x, w, padding=(1, 1), groups=groups)
    body = kiln.op.add(nn.relu(nn.bias_add(conv, bias)), r)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w, bias, r], body)))
    args = [RNG.standard_normal(s).astype(np.float32)
            for s in (xs, wshape, (o,), (1, o, size, size))]
    conv_ref = reference(args[0], args[1], (1, 1), (1, 1, 1, 1), (1, 1), groups)
    want = np.maximum(conv_ref + args[2].reshape(1, -1, 1, 1), 0) + args[3]
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(*args))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("spec", TARGETS)
def test_conv2d_plans_and_threads(spec: str) -> None:
    # Both plans (pixels as columns, pixels as rows) with the weight packed ahead, a fused
    # epilogue, one and two threads bit for bit; the plan is the one conv_plan promises.
    from kiln.loops.conv_kernels import conv_plan

    target = Target.parse(spec)
    for xs, o in (((1, 32, 20, 20), 24), ((1, 128, 6, 6), 40)):
        wshape = (o, xs[1], 3, 3)
        x = kiln.var("x", shape=xs, dtype="float32")
        w = kiln.var("w", shape=wshape, dtype="float32")
        body = nn.relu(nn.conv2d(x, w, padding=(1, 1)))
        mod = kiln.IRModule.from_expr(kiln.Function([x, w], body))
        a = RNG.standard_normal(xs).astype(np.float32)
        b = RNG.standard_normal(wshape).astype(np.float32)
        with target_scope(target):
            plan = conv_plan(xs, wshape, (1, 1), (1, 1), (1, 1), 1, (1, o) + xs[2:])
            exe = kiln.build(mod, target=target, params={"w": b})
        assert plan.pixels == ("rows" if xs[1] * 9 >= 1024 else "columns")
        results = []
        for count in (1, 2):
            with threads(count):
                results.append(exe(a))
        np.testing.assert_array_equal(results[0], results[1])
        want = np.maximum(reference(a, b, (1, 1), (1,) * 4, (1, 1), 1), 0)
        np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=2e-5 * xs[1] * 9)


# several images, the weight an input (a training step's): the kernel packs the weight once
# per call, and splits the images between the threads (each image's product on one thread),
# or, on small maps, makes all the images' pixels the rows of one product
BATCH_CASES = [
    ((4, 16, 12, 12), (24, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "parallel"),  # columns
    ((4, 128, 9, 9), (40, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "parallel"),  # K 1152: rows
    ((2, 100, 9, 9), (70, 3, 3), (1, 1), (1, 0, 1, 2), (1, 1), 1, "parallel"),  # K 900 padded
    ((6, 16, 24, 24), (24, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2, "parallel"),  # grouped
    ((8, 3, 64, 64), (16, 4, 4), (4, 4), (0, 0, 0, 0), (1, 1), 1, "parallel"),  # im2col rows
    ((8, 3, 29, 29), (16, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, "parallel"),  # a stem's shape
    # folded: small maps, whole output rows a tile (one on AVX2, two on AVX-512: tiles that
    # cross from one image to the next), the last tile past the last image
    ((5, 128, 5, 6), (40, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "rows"),
    ((3, 130, 13, 11), (36, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, "rows"),  # 7×6, K padded
    ((4, 1024, 5, 5), (20, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "rows"),  # 1×1, K 1024
]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,ws,strides,padding,dilation,groups,images", BATCH_CASES)
def test_conv2d_images_with_weight_input(xs: tuple, ws: tuple, strides: tuple, padding: tuple,
                                         dilation: tuple, groups: int, images: str,
                                         spec: str) -> None:
    from dataclasses import replace

    from kiln.runtime.backend import lower

    o, kh, kw = ws
    wshape = (o, xs[1] // groups, kh, kw)
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    body = nn.relu(nn.conv2d(x, w, strides=strides, padding=padding, dilation=dilation,
                             groups=groups))
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], body))
    target = replace(Target.parse(spec), cores=2)  # as on a two-core machine, whatever this is
    a = RNG.standard_normal(xs).astype(np.float32)
    b = RNG.standard_normal(wshape).astype(np.float32)
    with target_scope(target):
        low = lower(mod, target, 3, upto="lower-kernels")
        exe = kiln.build(mod, target=target)
        packed = kiln.build(mod, target=target, params={"w": b})  # weight packed ahead
    (schedule,) = [d.kernel.attrs["schedules"][0][1] for d in low.program.kernels.values()]
    assert schedule["weight"] == "packed per call"
    assert schedule["images"] == images
    if images == "parallel":
        assert schedule["parallel"] is None
    results = []
    for count in (1, 2, 3):
        with threads(count):
            results.append(exe(a, b))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    want = np.maximum(reference(a, b, strides, padding, dilation, groups), 0)
    atol = 2e-5 * wshape[1] * kh * kw
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(packed(a), want, rtol=1e-4, atol=atol)


def test_resnet_small_layers_fold_their_images() -> None:
    # ResNet-18's 512-channel 7×7 layers at batch 8 on AVX-512: one product over the 392
    # pixels in tiles of two output rows (14 pixels; 7 per image left 14 accumulators of 32
    # registers idle), all the rows in one block, each thread one block of the channels;
    # one image, or a 14×14 map, keeps the plan of its own
    from dataclasses import replace

    from kiln.loops.conv_kernels import _folded_plan

    t = replace(Target.parse("llvm -mcpu=sapphirerapids"), l1d=48 << 10, l2=2 << 20,
                l3=32 << 20, cores=2)
    plan = _folded_plan((8, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                        (8, 512, 7, 7), t)
    assert plan is not None and plan.pixels == "rows" and plan.rows_per_tile == 2
    assert (plan.schedule.mr, plan.schedule.mc) == (14, 392)
    assert plan.schedule.parallel == "n" and plan.schedule.nc == 256
    assert _folded_plan((1, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                        (1, 512, 7, 7), t) is None
    assert _folded_plan((8, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                        (8, 256, 14, 14), t) is None


def test_images_share_threads_only_when_they_split_evenly() -> None:
    from kiln.loops.conv_kernels import _images_split

    assert _images_split(8, 2) and _images_split(2, 2) and _images_split(9, 2)
    assert not _images_split(3, 2)  # two images on one thread, one on the other: columns
    assert not _images_split(1, 2) and not _images_split(8, 1)
    assert _images_split(12, 4) and not _images_split(6, 4) and _images_split(16, 4)


def test_many_stride_phases_take_im2col_rows() -> None:
    # a ViT's 16×16 stride-16 patches would be 256 phase planes (each its loops to compile:
    # minutes); the kernel reads im2col rows instead, and agrees with torch
    from kiln.runtime.backend import lower

    x = kiln.var("x", shape=(1, 3, 64, 64), dtype="float32")
    w = kiln.var("w", shape=(24, 3, 16, 16), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.conv2d(x, w, strides=(16, 16))))
    b = RNG.standard_normal((24, 3, 16, 16)).astype(np.float32)
    low = lower(mod, "llvm", 3, {"w": b}, upto="lower-kernels")
    decls = low.program.kernels.values()
    inputs = {d.kernel.attrs["schedules"][0][1].get("input") for d in decls}
    assert inputs == {"im2col"}
    a = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = kiln.build(mod, params={"w": b})(a)
    np.testing.assert_allclose(got, reference(a, b, (16, 16), (0,) * 4, (1, 1), 1),
                               rtol=1e-4, atol=2e-5 * 768)


def test_pointwise_conv2d() -> None:
    # the exact ResNet-18 / MobileNetV2 layers run in benchmarks/native.py (checked there
    # against torch); here, one pointwise layer of MobileNet's shape, small
    x = kiln.var("x", shape=(1, 24, 20, 20), dtype="float32")
    w = kiln.var("w", shape=(40, 24, 1, 1), dtype="float32")
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], nn.conv2d(x, w))))
    a = RNG.standard_normal((1, 24, 20, 20)).astype(np.float32)
    b = RNG.standard_normal((40, 24, 1, 1)).astype(np.float32)
    np.testing.assert_allclose(exe(a, b), reference(a, b, (1, 1), (0,) * 4, (1, 1), 1),
                               rtol=1e-4, atol=1e-4)


# 1×1, stride 1, unpadded, the weight a constant: B is the image, packed per block by the
# GEMM (no copy into phase planes). Pixels not a whole number of tiles, groups, several
# images (serial, or one per thread), K over several blocks, a fused bias, relu and residual
POINTWISE_CASES = [
    ((1, 24, 20, 20), 40, 1),
    ((1, 144, 14, 14), 24, 1),  # MobileNetV2's projection, small: 196 pixels
    ((3, 16, 9, 7), 24, 1),
    ((2, 32, 12, 11), 48, 1),
    ((1, 16, 10, 10), 12, 2),
    ((1, 600, 7, 7), 20, 1),  # K 600: several K blocks (partial sums in Cp)
]


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("xs,o,groups", POINTWISE_CASES)
def test_pointwise_reads_the_image_as_b(spec: str, xs: tuple, o: int, groups: int) -> None:
    target = Target.parse(spec)
    wshape = (o, xs[1] // groups, 1, 1)
    oshape = (xs[0], o) + xs[2:]
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    bias = kiln.var("b", shape=(o,), dtype="float32")
    r = kiln.var("r", shape=oshape, dtype="float32")
    body = kiln.op.add(nn.relu(nn.bias_add(nn.conv2d(x, w, groups=groups), bias)), r)
    mod = kiln.IRModule.from_expr(kiln.Function([x, w, bias, r], body))
    wv = RNG.standard_normal(wshape).astype(np.float32)
    with target_scope(target):
        exe = kiln.build(mod, target=target, params={"w": wv})
    (f,) = exe.kernels.functions.values()
    (sched,) = [s for op, s in f.kernel.attrs["schedules"] if op.startswith("nn.conv2d")]
    assert sched["input"] == "packed per block"
    args = [RNG.standard_normal(s).astype(np.float32) for s in (xs, (o,), oshape)]
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(*args))
    np.testing.assert_array_equal(results[0], results[1])
    conv = reference(args[0], wv, (1, 1), (0,) * 4, (1, 1), groups)
    want = np.maximum(conv + args[1].reshape(1, -1, 1, 1), 0) + args[2]
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=2e-5 * xs[1])


def test_short_k_epilogue_stores_vectors() -> None:
    # With K = 24 the GEMM's epilogue weighs as much as its K loop: its loop over a tile's
    # rows must not be vectorized (LLVM gathered from the tile and scattered to C, 4 rows a
    # vector, once it had unrolled the columns: 60 % of the kernel's time)
    from kiln.codegen.compile import assembly

    t = Target.parse("llvm")
    if not (t.arch == "x86_64" and t.has("avx512f")):
        pytest.skip("the scatter appeared with AVX-512 (the host has none)")
    x = kiln.var("x", shape=(1, 24, 28, 28), dtype="float32")
    w = kiln.var("w", shape=(96, 24, 1, 1), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.relu(nn.conv2d(x, w))))
    wv = RNG.standard_normal((96, 24, 1, 1)).astype(np.float32)
    with target_scope(t):
        exe = kiln.build(mod, target=t, params={"w": wv})
    (f,) = exe.kernels.functions.values()
    code = assembly(f.kernel, target=t)
    assert "vscatter" not in code and "vgather" not in code


@pytest.mark.slow
@pytest.mark.parametrize("c,size,o,kernel,stride,pad,groups", [
    (3, 224, 64, 7, 2, 3, 1), (64, 56, 64, 3, 1, 1, 1), (64, 56, 128, 1, 2, 0, 1),
    (256, 14, 256, 3, 1, 1, 1), (512, 7, 512, 3, 1, 1, 1), (96, 112, 96, 3, 2, 1, 96),
])
def test_model_layers(c: int, size: int, o: int, kernel: int, stride: int, pad: int,
                      groups: int) -> None:
    xs, wshape = (1, c, size, size), (o, c // groups, kernel, kernel)
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    body = nn.conv2d(x, w, strides=(stride, stride), padding=(pad, pad), groups=groups)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], body)))
    a = RNG.standard_normal(xs).astype(np.float32)
    b = (RNG.standard_normal(wshape) * 0.1).astype(np.float32)
    want = reference(a, b, (stride, stride), (pad,) * 4, (1, 1), groups)
    np.testing.assert_allclose(exe(a, b), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("spec,groups", [("llvm -mcpu=znver3", 1), ("llvm -mcpu=znver3", 2),
                                         ("llvm -mcpu=znver4", 1)])
def test_tap_offsets_cost_two_instructions_a_step(spec: str, groups: int) -> None:
    # The implicit GEMM's K step reads its tap's offset from a table and bounds it for the
    # verifier with a power-of-two mask (a load and an `and`), not a clamp to [0, max]
    # (five instructions with a cmov): the K loop of the micro-kernel has no cmov, and
    # besides a load, a mask and the tap's address (an `lea`, where the loop is unrolled
    # and the steps' broadcasts share it) a step, at most 4 scalar instructions (the
    # counters, the compare and the jump that the unrolled steps share). Compiled for Zen 3
    # (AVX2) and Zen 4 (AVX-512), not run; 7×7, too few tiles for Winograd's kernel.
    from kiln.codegen import assembly
    from kiln.runtime.backend import lower
    from tests.loops.test_gemm import _micro_kernel_loop

    x = kiln.var("x", shape=(1, 32, 7, 7), dtype="float32")
    w = kiln.var("w", shape=(32, 32 // groups, 3, 3), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.conv2d(
        x, w, padding=(1, 1), groups=groups)))
    b = RNG.standard_normal((32, 32 // groups, 3, 3)).astype(np.float32)
    t = Target.parse(spec)
    low = lower(mod, t, 3, {"w": b}, upto="lower-kernels")
    kernels = [d.kernel for d in low.program.kernels.values()
               if d.kernel is not None and d.kernel.attrs.get("schedules")]
    assert len(kernels) == 1
    body = _micro_kernel_loop(assembly(kernels[0], target=t))
    ops = [line.split()[0] for line in body[1:] if line.strip()]
    assert any(op.startswith("vfmadd") for op in ops)
    scalar = [op for op in ops if not op.startswith("v")]
    steps = sum(op.startswith("and") for op in scalar)  # the masks: one a step
    assert steps >= 1 and not [op for op in scalar if op.startswith("cmov")], body
    assert len(scalar) <= 3 * steps + 4, body


@pytest.mark.parametrize("spec", TARGETS)
def test_consumers_reading_maps_run_on_the_staged_image(spec: str) -> None:
    # a training step's data adjoint: where(mask > 0, conv, 0) plus a residual, fused after
    # a convolution whose images each run on one thread with pixels as rows: the results
    # are staged per image and the consumers run channel by channel (_staged); one, two and
    # three threads bit for bit, numpy's result
    from dataclasses import replace

    from kiln.loops.conv_kernels import _reads_maps
    from kiln.runtime.backend import lower

    xs, wshape = (4, 64, 20, 20), (64, 64, 3, 3)
    x, w = (kiln.var(n, shape=s, dtype="float32") for n, s in (("x", xs), ("w", wshape)))
    mask, res = (kiln.var(n, shape=(4, 64, 20, 20), dtype="float32") for n in ("m", "r"))
    conv = nn.conv2d(x, w, padding=(1, 1))
    body = kiln.op.add(kiln.op.where(kiln.op.greater(mask, kiln.const(np.float32(0))), conv,
                                     kiln.op.zeros_like(conv)), res)
    mod = kiln.IRModule.from_expr(kiln.Function([x, w, mask, res], body))
    target = replace(Target.parse(spec), cores=2)
    with target_scope(target):
        low = lower(mod, target, 3, upto="lower-kernels")
        exe = kiln.build(mod, target=target)
    (schedule,) = [d.kernel.attrs["schedules"][0][1] for d in low.program.kernels.values()]
    assert (schedule["pixels"], schedule["images"]) == ("rows", "parallel")
    a, b = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(wshape).astype(
        np.float32)
    m, r = (RNG.standard_normal((4, 64, 20, 20)).astype(np.float32) for _ in range(2))
    results = []
    for count in (1, 2, 3):
        with threads(count):
            results.append(exe(a, b, m, r))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    want = np.where(m > 0, reference(a, b, (1, 1), (1, 1, 1, 1), (1, 1), 1), 0) + r
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=2e-5 * 576)

    # what counts as reading a map: a tensor indexed by the pixel, not the output itself or
    # a per-channel bias
    from kiln.loops.ir import Binary, Buffer, Load, Store

    out, bias = Buffer("out", (1, 2, 3, 4), "float32"), Buffer("bias", (2,), "float32")
    other = Buffer("other", (1, 2, 3, 4), "float32")
    assert not _reads_maps(lambda i, v: Store(out, i, v), "float32")
    assert not _reads_maps(lambda i, v: Store(out, i, Binary("add", v, Load(bias, (i[1],)))),
                           "float32")
    assert _reads_maps(lambda i, v: Store(out, i, Binary("add", v, Load(other, i))), "float32")


def test_flat_depthwise_blocks_leave_every_core_a_block() -> None:
    from kiln.loops.conv_kernels import flat_block

    assert flat_block(960, 2) == 16  # MobileNetV2's 7×7 layers: 60 blocks
    assert flat_block(16, 2) == 8  # two blocks, one a thread
    assert flat_block(16, 32) == 1  # more cores than channels: a channel a block
    assert flat_block(24, 1) == 8
    assert flat_block(5, 2) == 1
