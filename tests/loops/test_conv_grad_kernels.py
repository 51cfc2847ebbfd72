"""The blocked weight gradient of conv2d (kiln/loops/conv_grad_kernels.py), compiled, against
PyTorch's ``torch.nn.grad.conv2d_weight`` in float64; conv2d's whole gradient (the data's by
stride phases, kiln/op/nn/conv.py) against torch's autograd.

Strided (phase planes), ResNet's 7×7 stride-2 first layer, 1×1 stride 2, dilated, padded
unevenly, K longer than the GEMM's kc, output channels that fill no whole tile, more stride
phases than the planes take (im2col), alone and with fused producers and consumers; one and
two threads give identical results; AVX-512 and AVX2 code.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.loops.schedule import target_scope
from kiln.op import nn
from kiln.runtime.compiler import native_available
from kiln.target import Target

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def reference(g: np.ndarray, x: np.ndarray, kernel: tuple, strides: tuple, padding: tuple,
              dilation: tuple) -> np.ndarray:
    """dW by torch, in float64, the data padded by numpy (kiln's padding may be uneven)."""
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    shape = (g.shape[1], x.shape[1], *kernel)
    return torch.nn.grad.conv2d_weight(torch.from_numpy(xp), shape,
                                       torch.from_numpy(g.astype(np.float64)),
                                       stride=strides, dilation=dilation).numpy()


def out_size(size: int, pad: int, k: int, s: int, d: int) -> int:
    return (size + pad - d * (k - 1) - 1) // s + 1


def inputs(xs: tuple, o: int, kernel: tuple, strides: tuple, padding: tuple, dilation: tuple
           ) -> tuple[np.ndarray, np.ndarray]:
    top, left, bottom, right = padding
    oh = out_size(xs[2], top + bottom, kernel[0], strides[0], dilation[0])
    ow = out_size(xs[3], left + right, kernel[1], strides[1], dilation[1])
    g = RNG.standard_normal((xs[0], o, oh, ow)).astype(np.float32)
    return g, RNG.standard_normal(xs).astype(np.float32)


# (N, C, H, W), O, (kh, kw), strides, padding (top, left, bottom, right), dilation
CASES = [
    ((2, 3, 9, 11), 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 4, 10, 10), 7, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # ResNet's strided 3×3
    ((2, 3, 23, 23), 16, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),  # ResNet's first layer
    ((2, 12, 10, 10), 20, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),  # the downsampling 1×1
    ((1, 6, 12, 12), 6, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),  # dilated
    ((2, 5, 9, 8), 9, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2)),  # uneven everything
    ((3, 40, 6, 6), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # K = 108 images' pixels > kc
    ((1, 3, 16, 16), 8, (4, 4), (4, 4), (0, 0, 0, 0), (1, 1)),  # 16 phases: im2col rows
    # channels in whole tiles of B: read in place from a channels-last copy
    ((2, 64, 10, 10), 33, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 32, 12, 11), 6, (3, 2), (1, 2), (2, 1, 0, 2), (2, 1)),  # uneven, dilated
    ((3, 32, 8, 8), 14, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
]
# every case for this machine, a few also without AVX-512 (AVX2 code: other tiles)
RUNS = [(*case, "llvm") for case in CASES] + [
    (*case, "llvm -mattr=-avx512f") for case in (CASES[2], CASES[5], CASES[8])]


def build(xs: tuple, o: int, kernel: tuple, strides: tuple, padding: tuple, dilation: tuple,
          target: Target) -> kiln.Executable:
    g, _ = inputs(xs, o, kernel, strides, padding, dilation)
    gv = kiln.var("g", shape=g.shape, dtype="float32")
    x = kiln.var("x", shape=xs, dtype="float32")
    body = nn.conv2d_backward_weight(gv, x, kernel_size=kernel, strides=strides,
                                     padding=padding, dilation=dilation, channels=o)
    return kiln.build(kiln.IRModule.from_expr(kiln.Function((gv, x), body)), target=target)


@pytest.mark.parametrize("xs,o,kernel,strides,padding,dilation,spec", RUNS)
def test_backward_weight(xs: tuple, o: int, kernel: tuple, strides: tuple, padding: tuple,
                         dilation: tuple, spec: str) -> None:
    target = Target.parse(spec)
    g, x = inputs(xs, o, kernel, strides, padding, dilation)
    with target_scope(target):
        exe = build(xs, o, kernel, strides, padding, dilation, target)
    want = reference(g, x, kernel, strides, padding, dilation)
    k = g.shape[0] * g.shape[2] * g.shape[3]
    np.testing.assert_allclose(exe(g, x), want, rtol=1e-4, atol=2e-5 * k)


@pytest.mark.parametrize("channels,layout", [(8, None), (64, "channels last"),
                                             (256, None)])
def test_the_blocked_kernel_lowers_it(channels: int, layout: str | None) -> None:
    from kiln.runtime.backend import lower

    xs, o = (2, channels, 12, 12), 16
    g = kiln.var("g", shape=(2, o, 6, 6), dtype="float32")
    x = kiln.var("x", shape=xs, dtype="float32")
    body = nn.conv2d_backward_weight(g, x, kernel_size=(3, 3), strides=(2, 2), padding=(1, 1))
    low = lower(kiln.IRModule.from_expr(kiln.Function((g, x), body)), "llvm", 3, {},
                upto="lower-kernels")
    found = [d.kernel.attrs["schedules"][0][1] for d in low.program.kernels.values()
             if d.kernel is not None]
    assert [(a.get("kernel"), a.get("input")) for a in found] == [
        ("conv2d backward weight", layout)]


def test_fused_producer_consumer_and_threads() -> None:
    # the relu's adjoint fused before (where(x > 0, g, 0)), an SGD update after, large
    # enough to run in parallel: one and two threads bit for bit
    xs, o = (2, 32, 20, 20), 48
    g, x = inputs(xs, o, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    pre = RNG.standard_normal(g.shape).astype(np.float32)
    w = RNG.standard_normal((o, 32, 3, 3)).astype(np.float32)
    gv, xv, pv, wv = (kiln.var(n, shape=a.shape, dtype="float32")
                      for n, a in (("g", g), ("x", x), ("p", pre), ("w", w)))
    masked = kiln.op.where(kiln.op.greater(pv, kiln.const(np.float32(0))), gv,
                           kiln.op.zeros_like(gv))
    dw = nn.conv2d_backward_weight(masked, xv, kernel_size=(3, 3), padding=(1, 1))
    body = kiln.op.subtract(wv, kiln.op.multiply(kiln.const(np.float32(0.1)), dw))
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function((gv, xv, pv, wv), body)))
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(g, x, pre, w))
    np.testing.assert_array_equal(results[0], results[1])
    want = w - 0.1 * reference(np.where(pre > 0, g, 0), x, (3, 3), (1, 1), (1, 1, 1, 1),
                               (1, 1))
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-3)


# conv2d's gradient: (N, C, H, W), (O, C, kh, kw), strides, padding (top, left, bottom, right)
GRAD_CASES = [
    ((2, 6, 11, 11), (10, 6, 3, 3), (2, 2), (1, 1, 1, 1)),  # odd size: phases of two sizes
    ((1, 4, 12, 12), (6, 4, 1, 1), (2, 2), (0, 0, 0, 0)),  # odd phases reached by no tap
    ((1, 3, 13, 14), (5, 3, 3, 2), (3, 2), (2, 0, 1, 1)),  # mixed strides, uneven padding
    ((1, 3, 9, 9), (5, 3, 2, 2), (2, 2), (3, 3, 0, 2)),  # padding past the kernel
    ((1, 3, 6, 6), (4, 3, 3, 3), (1, 1), (4, 3, 0, 2)),  # stride 1: one phase
]


@pytest.mark.parametrize("xs,ws,strides,padding", GRAD_CASES)
def test_conv2d_gradient_matches_torch_autograd(xs: tuple, ws: tuple, strides: tuple,
                                                padding: tuple) -> None:
    # kiln.grad of a convolution's loss, compiled: the weight's gradient is
    # nn.conv2d_backward_weight, the data's a convolution per stride phase, both equal to
    # torch's autograd
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    xv = kiln.var("x", shape=xs, dtype="float32")
    wv = kiln.var("w", shape=ws, dtype="float32")
    y = nn.conv2d(xv, wv, strides=strides, padding=padding)
    loss = kiln.op.sum(kiln.op.multiply(y, y))
    grad = kiln.grad(kiln.Function((xv, wv), loss), mode="first_order")
    text = kiln.astext(grad)
    assert "nn.conv2d_backward_weight" in text and "nn.conv2d_transpose" not in text
    _, (dx, dw) = kiln.build(kiln.IRModule.from_expr(grad))(x, w)
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    tw = torch.from_numpy(w.astype(np.float64)).requires_grad_()
    top, left, bottom, right = padding
    xp = torch.nn.functional.pad(tx, (left, right, top, bottom))
    (torch.nn.functional.conv2d(xp, tw, stride=strides) ** 2).sum().backward()
    assert tw.grad is not None and tx.grad is not None
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_a_weight_gradient_past_l2_takes_long_k_blocks() -> None:
    """Where the weight gradient (C) does not fit in half of L2, K (the pixels) is cut into
    blocks of up to four L1s of B's micro-panel instead of the GEMM's default half L1, as
    evenly as it goes: C round-trips through memory between blocks (conv_grad_kernels.schedule)."""
    from kiln.loops import conv_grad_kernels as cgk
    from kiln.loops.gemm import GemmSchedule

    spr = Target.parse("llvm -mcpu=sapphirerapids")  # 32 KiB L1, 1 MiB L2
    assert cgk.schedule(512, 4608, 392, spr).kc == 392  # one block, not four
    assert cgk.schedule(256, 2304, 1568, spr).kc == 784  # two of 784, not fourteen
    # a small C (the first layer's 64 x 147) keeps the GEMM's default
    default = GemmSchedule.heuristic(1, 64, 147, 100352, "float32", a_prepacked=True,
                                     target=spr)
    assert cgk.schedule(64, 147, 100352, spr) == default


def test_long_k_blocks_with_a_fused_update_match_torch() -> None:
    # a weight gradient of 160 x 2304 taps (1.5 MB, past half this machine's L2 when it
    # has 2 MiB or less) over K = 1600 pixels, in the phase planes (256 channels), the
    # momentum update of SGD fused in its epilogue, against torch in float64
    xs, o = (4, 256, 20, 20), 160
    g, x = inputs(xs, o, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    v = RNG.standard_normal((o, 256, 3, 3)).astype(np.float32)
    gv, xv, vv = (kiln.var(n, shape=a.shape, dtype="float32")
                  for n, a in (("g", g), ("x", x), ("v", v)))
    dw = nn.conv2d_backward_weight(gv, xv, kernel_size=(3, 3), padding=(1, 1))
    body = kiln.op.add(kiln.op.multiply(kiln.const(np.float32(0.9)), vv), dw)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function((gv, xv, vv), body)), threads=1)
    kernels = [d.ops for d in exe.program.kernels.values()]
    assert any("nn.conv2d_backward_weight" in ops and "add" in ops for ops in kernels)
    want = 0.9 * v + reference(g, x, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(exe(g, x, v), want, rtol=1e-4, atol=2e-5 * 1600)


# The images split between two threads (conv_grad_kernels.chunks): (N, C, H, W), O, kernel,
# strides, padding. Each chunk's K (its images' pixels) is no multiple of kc: padded per chunk.
SPLIT_CASES = [
    ((4, 3, 46, 46), 16, (7, 7), (2, 2), (3, 3, 3, 3)),  # the first layer: phase planes
    ((2, 32, 34, 34), 20, (3, 3), (1, 1), (1, 1, 1, 1)),  # channels last
    ((4, 3, 64, 64), 8, (4, 4), (4, 4), (0, 0, 0, 0)),  # 16 phases: im2col rows
    ((2, 32, 48, 48), 14, (1, 1), (2, 2), (0, 0, 0, 0)),  # the downsampling 1x1
]


@pytest.mark.parametrize("spec", ["llvm", "llvm -mattr=-avx512f"])
@pytest.mark.parametrize("xs,o,kernel,strides,padding", SPLIT_CASES)
def test_images_split_between_threads(xs: tuple, o: int, kernel: tuple, strides: tuple,
                                      padding: tuple, spec: str) -> None:
    # two cores: each thread sums its half of the images into its own gradient, the two
    # added at the end through a fused SGD update; one and two threads bit for bit, and
    # torch's gradient in float64
    from dataclasses import replace

    target = replace(Target.parse(spec), cores=2)
    g, x = inputs(xs, o, kernel, strides, padding, (1, 1))
    w = RNG.standard_normal((o, xs[1], *kernel)).astype(np.float32)
    gv, xv, wv = (kiln.var(n, shape=a.shape, dtype="float32")
                  for n, a in (("g", g), ("x", x), ("w", w)))
    dw = nn.conv2d_backward_weight(gv, xv, kernel_size=kernel, strides=strides,
                                   padding=padding, channels=o)
    body = kiln.op.subtract(wv, kiln.op.multiply(kiln.const(np.float32(0.5)), dw))
    with target_scope(target):
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function((gv, xv, wv), body)),
                         target=target)
    plans = [d.kernel.attrs["schedules"][0][1] for d in exe.program.kernels.values()
             if d.kernel is not None]
    assert [p["images"] for p in plans] == ["split"]
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(g, x, w))
    np.testing.assert_array_equal(results[0], results[1])
    k = g.shape[0] * g.shape[2] * g.shape[3]
    want = w - 0.5 * reference(g, x, kernel, strides, padding, (1, 1))
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=2e-5 * k)
