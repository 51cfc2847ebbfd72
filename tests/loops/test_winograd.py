"""Winograd's F(m×m, 3×3) convolution (kiln/loops/winograd.py), compiled, against PyTorch.

The transforms satisfy the 1-D identity for both tile sizes; the kernel, reached through
alter-layout on a constant weight, matches torch's conv2d (in float64) on awkward shapes:
channels that fill no panel, tiles that fill no B panel, asymmetric padding, several
images, a fused epilogue with a residual, one and two threads bit for bit, the AVX2 Target;
tiles that stick out of the output's bottom and right. `choose` keeps it to the layers
where it pays.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.loops import winograd
from kiln.loops.schedule import target_scope
from kiln.op import nn
from kiln.runtime.compiler import native_available
from kiln.target import Target
from kiln.transform import PassContext

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(17)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


@pytest.fixture(autouse=True)
def nchw_kernel() -> Iterator[None]:
    # the NCHW kernel's tests: constant weights stay NCHW (convert-layout would give them
    # to the blocked kernel, tested in test_nchwc_kernels.py)
    with PassContext(config={"convert-layout": False}):
        yield


@pytest.mark.parametrize("m", winograd.TILES)
def test_transforms_compute_a_correlation(m: int) -> None:
    bt, g, at = winograd.matrices(m)
    assert bt.shape == (m + 2, m + 2) and g.shape == (m + 2, 3) and at.shape == (m, m + 2)
    for _ in range(5):
        d, f = RNG.standard_normal(m + 2), RNG.standard_normal(3)
        want = [sum(d[i + k] * f[k] for k in range(3)) for i in range(m)]
        np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), want, rtol=1e-12, atol=1e-12)


def reference(x: np.ndarray, w: np.ndarray, padding: tuple) -> np.ndarray:
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    return torch.nn.functional.conv2d(torch.from_numpy(xp),
                                      torch.from_numpy(w.astype(np.float64))).numpy()


def algorithms(exe: kiln.Executable) -> list[str]:
    """The Winograd kernels' recorded algorithms (none: the direct kernel ran)."""
    return [sched["algorithm"] for d in exe.program.kernels.values() if d.kernel is not None
            for _, sched in d.kernel.attrs.get("schedules", ()) if "algorithm" in sched]


# (N, C, H, W), O, padding (top, left, bottom, right), m, whether the Winograd kernel runs
CASES = [
    ((1, 16, 8, 8), 24, (1, 1, 1, 1), 4, True),
    ((1, 16, 8, 8), 24, (1, 1, 1, 1), 2, True),
    ((2, 5, 10, 6), 7, (2, 1, 0, 1), 2, True),  # asymmetric padding, two images, 5 channels
    ((1, 33, 12, 20), 40, (1, 1, 1, 1), 4, True),  # 15 tiles: part of one B panel
    ((1, 20, 8, 72), 70, (1, 1, 1, 1), 4, True),  # 18 tiles a row: two vectors of them
    ((1, 64, 20, 20), 70, (1, 1, 1, 1), 4, True),  # 70 channels: a partial row tile
    # tiles sticking out of the output: 5×8 in 2×2 tiles of 4, 13×13 in 7×7 tiles of 2,
    # asymmetric padding and two images with partial tiles both ways
    ((1, 8, 7, 10), 8, (0, 0, 0, 0), 4, True),
    ((1, 12, 13, 13), 16, (1, 1, 1, 1), 2, True),
    ((2, 9, 11, 15), 10, (1, 2, 1, 0), 4, True),
]


@pytest.mark.parametrize("spec", ["llvm", "llvm -mattr=-avx512f"])
@pytest.mark.parametrize("xs,o,padding,m,fast", CASES)
def test_winograd_conv2d(xs: tuple, o: int, padding: tuple, m: int, fast: bool, spec: str,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(winograd, "choose", lambda *args: m)
    wshape = (o, xs[1], 3, 3)
    x = kiln.var("x", shape=xs, dtype="float32")
    w = kiln.var("w", shape=wshape, dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.conv2d(x, w, padding=padding)))
    a = RNG.standard_normal(xs).astype(np.float32)
    b = RNG.standard_normal(wshape).astype(np.float32)
    target = Target.parse(spec)
    with target_scope(target):
        exe = kiln.build(mod, target=target, params={"w": b})
    assert algorithms(exe) == ([f"winograd F({m}x{m}, 3x3)"] if fast else [])
    want = reference(a, b, padding)
    scale = np.abs(want).max()
    np.testing.assert_allclose(exe(a), want, rtol=0, atol=2e-6 * scale * np.sqrt(xs[1]))


def test_winograd_epilogue_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # relu(conv + bias) + residual, in parallel; one and two threads bit for bit
    monkeypatch.setattr(winograd, "choose", lambda *args: 4)
    xs, o = (1, 24, 32, 32), 20
    x = kiln.var("x", shape=xs, dtype="float32")
    r = kiln.var("r", shape=(1, o, 32, 32), dtype="float32")
    w = RNG.standard_normal((o, 24, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    conv = nn.conv2d(x, kiln.const(w), padding=(1, 1))
    body = kiln.op.add(nn.relu(nn.bias_add(conv, kiln.const(bias))), r)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, r], body)))
    assert algorithms(exe) == ["winograd F(4x4, 3x3)"]
    a = RNG.standard_normal(xs).astype(np.float32)
    res = RNG.standard_normal((1, o, 32, 32)).astype(np.float32)
    want = np.maximum(reference(a, w, (1, 1, 1, 1)) + bias.reshape(1, -1, 1, 1), 0) + res
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(a, res))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_choose_takes_the_layers_where_it_pays() -> None:
    def pick(c: int, o: int, size: int, stride: int = 1, kernel: int = 3) -> int | None:
        out = (size + 2 - kernel) // stride + 1
        return winograd.choose((1, c, size, size), (o, c, kernel, kernel), (stride, stride),
                               (1, 1, 1, 1), (1, 1), 1, (1, o, out, out))

    assert pick(64, 64, 56) == 4  # ResNet-18's first stages
    assert pick(128, 128, 28) == 4
    assert pick(256, 256, 14) == 2  # in tiles of 4, 16 × 16 pixels for 14 × 14: 31 % more
    assert pick(64, 64, 55) == 4  # 14 × 14 tiles of 4 for 55 × 55: 3.7 % more
    assert pick(256, 256, 13) == 2  # in tiles of 2, 16 % more
    assert pick(512, 512, 7) is None  # 16 tiles of 2 read 16.8 MB of weight for 49 pixels
    assert pick(512, 512, 14) == 2  # VGG's: 49 tiles of 2, 16.8 MB
    assert pick(256, 256, 56) == 4  # 9.4 MB
    assert pick(384, 384, 28) == 4  # 21.2 MB
    assert pick(512, 512, 28) == 2  # not 37.7 MB in tiles of 4
    assert pick(96, 96, 20) == 4  # 25 tiles of 4
    assert pick(96, 96, 16) == 2  # 16 tiles of 4 are too few, 64 of 2 are not
    assert pick(64, 64, 10) == 2  # 25 tiles of 2
    assert pick(64, 64, 8) is None  # 16 tiles of 2
    assert pick(64, 128, 56, stride=2) is None
    assert pick(64, 64, 56, kernel=5) is None
    assert pick(4, 64, 56) is None  # too few channels for the products


def test_a_tuning_log_chooses_the_algorithm_of_a_convolution_it_can_compute() -> None:
    from kiln.loops.tunable import ScheduleOverrides, overrides_scope

    def pick(c: int, size: int, stride: int = 1) -> int | None:
        out = (size + 2 - 3) // stride + 1
        return winograd.chosen((1, c, size, size), (c, c, 3, 3), (stride, stride),
                               (1, 1, 1, 1), (1, 1), 1, (1, c, out, out))

    space = winograd.algorithm_space((1, 64, 56, 56), (64, 64, 3, 3), (1, 1, 1, 1),
                                     (1, 64, 56, 56))
    assert space.key == ("conv_algorithm x=1x64x56x56 w=64x64x3x3 padding=1x1x1x1 "
                         "out=1x64x56x56")
    assert space.values("m") == (4, 0, 2)  # the rule's first, then the direct kernel
    small = winograd.algorithm_space((1, 512, 7, 7), (512, 512, 3, 3), (1, 1, 1, 1),
                                     (1, 512, 7, 7))
    assert small.values("m") == (0, 2, 4)
    with winograd.recorded_algorithms() as seen:
        assert (pick(64, 56), pick(512, 7), pick(64, 56, stride=2)) == (4, None, None)
    assert [s.key for s in seen] == [space.key, small.key]  # not the strided one
    logged = ScheduleOverrides({space.key: {"m": 0}, small.key: {"m": 2}}, "test")
    with overrides_scope(logged):
        assert (pick(64, 56), pick(512, 7), pick(64, 28)) == (None, 2, 4)
