"""When kernels run in parallel (the work rule of kiln/loops/schedule.py), and that a product
split across threads agrees with numpy and with itself on one thread.

The rule: a product goes on the thread pool only with `PARALLEL_MIN_WORK_PER_THREAD`
multiply-adds per core (a parallel region below that cost more than it saved, and much
more on a loaded machine), except batch-1 dense, whose weight is read once per call: it is
split over the cores as soon as the weight is at least a quarter of a core's L2 and 512 KiB
(the model's other weights evict it between calls, so it streams from L3 at one core's
bandwidth).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.codegen import threads
from kiln.loops import gemm as g
from kiln.loops import linear_kernels as lk
from kiln.loops.schedule import (
    PARALLEL_MIN_WORK_PER_THREAD,
    NestSchedule,
    weights_fit_split,
    weights_scope,
    worth_parallel,
    worth_parallel_stream,
)
from kiln.loops.tunable import ScheduleOverrides, overrides_scope
from kiln.op import nn
from kiln.target import Target


def test_worth_parallel_counts_work_per_thread() -> None:
    per = PARALLEL_MIN_WORK_PER_THREAD
    assert not worth_parallel(10**9, 1)  # one core: never
    assert worth_parallel(2 * per, 2)
    assert not worth_parallel(2 * per - 1, 2)
    assert not worth_parallel(3 * per, 4)  # more cores need more work


@pytest.mark.parametrize(("batch", "m", "n", "k", "parallel"), [
    (1, 1, 512, 784, False),  # MLP batch 1: serial
    (1, 32, 1024, 256, True),  # LSTM input projection over 32 steps
    (1, 64, 512, 784, True),  # MLP batch 64
    (1, 8, 8, 8, False),
])
def test_gemm_default_parallel_by_work(batch: int, m: int, n: int, k: int,
                                       parallel: bool) -> None:
    s = g.GemmSchedule.default(batch, m, n, k, threads=2)
    assert (s.parallel is not None) == parallel, s
    assert g.GemmSchedule.default(batch, m, n, k, threads=1).parallel is None


def test_dot_kernel_batch1_parallel_by_work_or_weight_size() -> None:
    two = dataclasses.replace(Target.host(), cores=2, l2=1 << 20)
    # under 512 KiB of weight and little work: serial
    assert not lk._dot_parallel(1, 256, 256, "float32", two)
    assert not lk._dot_parallel(1, 100, 1000, "float32", two)
    # an LSTM step's recurrent product (1 MiB of weight) and a batch-1 784×512 layer: every
    # call streams the weight from L3, which two cores read twice as fast
    assert lk._dot_parallel(1, 1024, 256, "float32", two)
    assert lk._dot_parallel(1, 512, 784, "float32", two)
    assert not lk._dot_parallel(1, 1024, 256, "float32", dataclasses.replace(two, l2=8 << 20))
    # with a 2 MiB L2 (Sapphire Rapids) the 1 MiB weight still splits: a quarter of the L2
    assert lk._dot_parallel(1, 1024, 256, "float32", dataclasses.replace(two, l2=2 << 20))
    assert not lk._dot_parallel(1, 256, 256, "float32", dataclasses.replace(two, l2=1 << 20))
    assert lk._dot_parallel(1, 4096, 1024, "float32", two)
    one = dataclasses.replace(two, cores=1)
    assert not lk._dot_parallel(1, 4096, 1024, "float32", one)
    assert not lk._dot_parallel(1, 1024, 256, "float32", one)


def test_worth_parallel_stream_compares_the_weight_with_l2() -> None:
    two = dataclasses.replace(Target.host(), cores=2, l2=4 << 20)
    assert worth_parallel_stream(1 << 20, two)
    assert not worth_parallel_stream((1 << 20) - 1, two)
    # never below 512 KiB, however small the L2
    small = dataclasses.replace(two, l2=1 << 20)
    assert worth_parallel_stream(1 << 19, small)
    assert not worth_parallel_stream((1 << 19) - 1, small)
    assert not worth_parallel_stream(1 << 30, dataclasses.replace(two, cores=1))


def test_nests_go_parallel_only_with_several_cores() -> None:
    shape = (64, 1024)
    two = dataclasses.replace(Target.host(), cores=2)
    assert NestSchedule.default(shape, target=two).parallel_axis == 0
    assert NestSchedule.default(shape, target=dataclasses.replace(two, cores=1)
                                ).parallel_axis is None


@pytest.mark.parametrize("shape,axis", [
    ((3, 128, 8, 256), 1),  # 3 on 2 threads is 2 and 1: the next axis, after 3 forks
    ((1, 3, 64, 64), 2),
    ((4, 128), 0),  # a multiple of the threads
    ((7, 128), 0),  # four or more a thread
    ((3, 3, 3, 3, 512), 0),  # beyond 4 forks further in: the first one stays
    ((3, 5), 0),  # nothing evener
])
def test_the_parallel_axis_shares_out_evenly(shape: tuple, axis: int) -> None:
    two = dataclasses.replace(Target.host(), cores=2)
    assert NestSchedule.default(shape, work_per_element=1 << 15, target=two).parallel_axis \
        == axis


def test_an_inner_parallel_axis_agrees_with_one_thread() -> None:
    # a copy whose parallel loop is the second one (three forks), against numpy
    x = kiln.var("x", shape=(128, 8, 768), dtype="float32")
    body = op.transpose(op.reshape(x, newshape=(128, 8, 3, 256)), axes=(2, 0, 1, 3))
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], body)))
    a = np.random.default_rng(0).standard_normal((128, 8, 768)).astype(np.float32)
    want = a.reshape(128, 8, 3, 256).transpose(2, 0, 1, 3)
    for count in (1, 2):
        with threads(count):
            np.testing.assert_array_equal(exe(a), want)


def _conv1x1(c: int, o: int, size: int) -> kiln.IRModule:
    x = kiln.var("x", shape=(1, c, size, size), dtype="float32")
    w = kiln.var("w", shape=(o, c, 1, 1), dtype="float32")
    b = kiln.var("b", shape=(o,), dtype="float32")
    body = op.clip(nn.bias_add(nn.conv2d(x, w), b), a_min=0.0, a_max=6.0)
    return kiln.IRModule.from_expr(kiln.Function([x, w, b], body))


@pytest.mark.parametrize(("c", "o", "size"), [(16, 96, 28), (24, 40, 30)])
def test_split_conv_agrees_with_numpy_and_one_thread(c: int, o: int, size: int) -> None:
    # a MobileNet-style 1×1 expansion conv with packed weights, split over output pixels
    # (whose ``pixel // width`` index arithmetic the threaded copy must keep right)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((o, c, 1, 1)) * 0.3).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    exe = kiln.build(_conv1x1(c, o, size), params={"w": w, "b": b})
    expect = np.clip(np.einsum("oc,chw->ohw", w[:, :, 0, 0], x[0])[None]
                     + b[None, :, None, None], 0.0, 6.0)
    with threads(1):
        one = exe(x)
    with threads(2):
        two = exe(x)
    np.testing.assert_allclose(two, expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize(("m", "tile"), [
    (32, (8, 16)),     # the LSTM's input projection over 32 steps: 16 + 16, not 28 + 4
    (64, (11, 33)),    # batch 64: 33 + 31, not 39 + 25 in the fewest padded rows (13)
    (128, (13, 65)),   # 65 + 63: tiles of 13 already split it best
    (197, (11, 99)),   # ViT: 99 + 98, not 108 + 89 in tiles of 12
])
def test_dense_split_over_m_gives_threads_even_rows(m: int, tile: tuple[int, int]) -> None:
    # the register tile (14 rows on AVX-512, shortened by up to two to pad fewest rows)
    # cuts few rows badly; over M, the height that costs the most loaded thread least
    two = dataclasses.replace(Target.parse("llvm -mcpu=znver4"), cores=2)
    s = g.GemmSchedule.default(1, m, 1024, 256, b_prepacked=True, target=two)
    assert (s.mr, s.mc, s.parallel) == (*tile, "m")
    one = g.GemmSchedule.default(1, m, 1024, 256, b_prepacked=True,
                                 target=dataclasses.replace(two, cores=1))
    assert one.parallel is None and one.mr >= 12  # nothing to split: the fewest padded rows
    knobs = {**g.tile_knobs(s), "mr": 14, "mb": 1}
    assert s.key is not None
    with overrides_scope(ScheduleOverrides({s.key: knobs}, "a log")):
        logged = g.GemmSchedule.default(1, m, 1024, 256, b_prepacked=True, target=two)
    assert (logged.mr, logged.mc) == (14, 14)  # a tuning log's knobs stay as they are


def _dense_with_weight(m: int, units: int, k: int, seed: int) -> tuple[kiln.Executable,
                                                                       np.ndarray, np.ndarray]:
    """A built dense of x (m×k) by a constant weight (units×k), with its x and weight."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((units, k)) * 0.1).astype(np.float32)
    xv = kiln.var("x", shape=(m, k), dtype="float32")
    wv = kiln.var("w", shape=(units, k), dtype="float32")
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([xv, wv], nn.dense(xv, wv))),
                     params={"w": w})
    return exe, x, w


def _agrees_with_numpy_and_one_thread(exe: kiln.Executable, x: np.ndarray,
                                      w: np.ndarray) -> None:
    with threads(1):
        one = exe(x)
    with threads(2):
        two = exe(x)
    np.testing.assert_allclose(two, x.astype(np.float64) @ w.T.astype(np.float64),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(one, two)


def test_prepacked_dense_with_even_rows_agrees_with_numpy_and_one_thread() -> None:
    _agrees_with_numpy_and_one_thread(*_dense_with_weight(32, 1024, 256, 3))


def test_weights_that_fit_the_l2s_only_split_make_products_split_columns() -> None:
    # a program whose weights fit the cores' L2s together but not one: each core keeps its
    # columns of B (the batch-64 MLP's 2.6 MB on two 2 MiB L2s), instead of streaming all
    two = dataclasses.replace(Target.parse("llvm -mcpu=znver4"), cores=2, l2=2 << 20)
    mib = 1 << 20

    def parallel(total: int | None, target: Target = two) -> str | None:
        if total is None:
            return g.GemmSchedule.default(1, 64, 512, 784, b_prepacked=True,
                                          target=target).parallel
        with weights_scope(total):
            return g.GemmSchedule.default(1, 64, 512, 784, b_prepacked=True,
                                          target=target).parallel

    assert parallel(None) == "m"  # no program: the rows, as before
    assert parallel(5 * mib // 2) == "n"
    assert parallel(3 * mib) == "n"
    assert parallel(3 * mib + 1) == "m"  # streamed from L3 either way
    assert parallel(3 * mib // 2) == "m"  # one L2 holds them
    one = dataclasses.replace(two, cores=1)
    with weights_scope(5 * mib // 2):
        assert not weights_fit_split(one)
        assert g.GemmSchedule.default(1, 64, 512, 784, b_prepacked=True,
                                      target=one).parallel is None
        # B not constant: nothing stays in L2 from call to call
        assert g.GemmSchedule.default(1, 1024, 512, 784, target=two).parallel == "m"


def test_a_model_whose_weights_fit_the_l2s_split_splits_columns_and_agrees() -> None:
    host = Target.host()
    if host.cores < 2:
        pytest.skip("one core: nothing to split")
    k = 256
    units = -(-5 * host.l2 // 4 // (4 * k) // 32) * 32  # weights: 1.25 L2
    exe, x, w = _dense_with_weight(64, units, k, 5)
    gemms = [s for d in exe.program.kernels.values() if d.kernel is not None
             for _, s in d.kernel.attrs.get("schedules", ()) if s.get("kernel") == "gemm"]
    assert [s["parallel"] for s in gemms] == ["n"]
    _agrees_with_numpy_and_one_thread(exe, x, w)
