"""kiln.train.Step: donation (results written into the inputs they replace, read before they
are overwritten), no allocation per step, the state dict, batch checks."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import kiln
from kiln.ssa.memory import donation_hazards, result_sources
from kiln.train import SGD, Adam
from tests.train.helpers import batches, mlp_loss, mlp_params


def test_results_overwrite_the_weights_arrays() -> None:
    step = kiln.train.Step(mlp_loss(), mlp_params(), Adam(lr=0.01))
    before = {k: v for k, v in step.params.items()}
    addresses = {k: v.ctypes.data for k, v in before.items()}
    xs, ys = batches(3)
    for s in range(3):
        step(xs[s], ys[s])
    for k, v in step.params.items():
        assert v is before[k] and v.ctypes.data == addresses[k]
    assert step.executables[0].executor.name == "native"


@pytest.mark.parametrize("split", [False, True])
def test_a_step_allocates_nothing_after_the_first(split) -> None:
    # weights of 64 KiB and more: a step that allocated its results again would show
    from kiln.ir.expr import Function, var
    from kiln.op import nn

    x = var("x", shape=(16, 128))
    w1, w2 = var("w1", shape=(128, 128)), var("w2", shape=(10, 128))
    f = Function((x, w1, w2), nn.dense(nn.relu(nn.dense(x, w1)), w2))
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((128, 128)).astype("float32") * 0.1,
              "w2": rng.standard_normal((10, 128)).astype("float32") * 0.1}
    step = kiln.train.Step(kiln.train.with_loss(f, "cross_entropy"), params,
                           Adam(lr=1e-3), split=split)
    xb = rng.standard_normal((16, 128)).astype("float32")
    yb = rng.integers(0, 10, 16).astype("int64")
    step(xb, yb)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(20):
            step(xb, yb)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 8192, f"a step allocated {peak - base} bytes"
    assert current - base < 4096
    assert step.results_allocated == 0


def hand_program(text: str) -> kiln.Executable:
    return kiln.build(kiln.parse(text))


def test_result_sources_see_through_tuples() -> None:
    exe = hand_program("""
def @main(%a: Tensor[(4), float32], %b: (Tensor[(4), float32], Tensor[(4), float32])) {
  (%b.1, %a + 1f, %b)
}""")
    assert result_sources(exe.program) == [
        frozenset([2]), frozenset(), frozenset([1]), frozenset([2])]


def test_donating_inputs_that_results_copy_is_safe() -> None:
    # new a = old b (a copy of an input), new b = old a + old b (computed): both donated.
    # Written straight into the inputs, the copy of b would read a's result or the other way
    # round; donation_hazards sends both to scratch memory.
    exe = hand_program("""
def @main(%a: Tensor[(4), float32], %b: Tensor[(4), float32]) {
  (%b, %a + %b)
}""")
    assert donation_hazards(exe.program, {0: 0, 1: 1}) == {0, 1}
    assert donation_hazards(exe.program, {1: 0}) == set()  # a's memory: nothing copies a


def test_an_update_reading_the_weight_it_overwrites() -> None:
    # loss = sum(w * w[::-1]): each element's gradient reads another element of w, so an
    # update written into w before every read was done would give other numbers
    from kiln.ir.expr import Function, const, var
    from kiln.op import sum_, take

    w = var("w", shape=(64,))
    f = Function((w,), sum_(w * take(w, const(np.arange(63, -1, -1, dtype="int32")), axis=0)))
    w0 = np.linspace(-1, 1, 64).astype("float32")
    step = kiln.train.Step(f, {"w": w0}, SGD(lr=0.1))
    expected = w0.copy()
    for _ in range(5):
        loss = step()
        assert loss == pytest.approx(float(np.sum(expected * expected[::-1])), rel=1e-5)
        expected = expected - np.float32(0.1) * (2 * expected[::-1])
        np.testing.assert_allclose(step.params["w"], expected, rtol=1e-6, atol=1e-6)


def test_state_dict_round_trip_continues_the_same_run() -> None:
    xs, ys = batches(6)
    a = kiln.train.Step(mlp_loss(), mlp_params(), Adam(lr=0.01))
    for s in range(3):
        a(xs[s], ys[s])
    saved = a.state_dict()
    b = kiln.train.Step(mlp_loss(), mlp_params(seed=5), Adam(lr=0.01))
    b.load_state_dict(saved)
    assert b.steps_taken == 3
    for s in range(3, 6):
        assert a(xs[s], ys[s]) == b(xs[s], ys[s])
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert set(saved["state"]["w1"]) == {"exp_avg", "exp_avg_sq"}


def test_frozen_weights_stay_and_get_no_state() -> None:
    params = mlp_params()
    step = kiln.train.Step(mlp_loss(), params, SGD(lr=0.1, momentum=0.9),
                           trainable=["w2", "b2"])
    xs, ys = batches(2)
    step(xs[0], ys[0])
    assert set(step.params) == {"w2", "b2"}
    assert set(step.state_dict()["state"]) == {"w2", "b2"}
    assert not np.array_equal(step.params["w2"], params["w2"])


def test_grad_hook_sees_and_changes_the_gradients() -> None:
    seen = []

    def hook(grads):
        seen.append([g.copy() for g in grads])
        for g in grads:
            g *= 0  # as an all-reduce would, in place: here, nothing to apply

    params = mlp_params()
    step = kiln.train.Step(mlp_loss(), params, SGD(lr=0.1), split=True, grad_hook=hook)
    xs, ys = batches(1)
    step(xs[0], ys[0])
    assert len(seen) == 1 and len(seen[0]) == 4 and np.abs(seen[0][0]).sum() > 0
    for k, v in params.items():
        np.testing.assert_array_equal(step.params[k], v)


def test_outputs_kept_beside_the_loss() -> None:
    from kiln.ir.expr import Function, var
    from kiln.op import nn

    x, w = var("x", shape=(4, 3)), var("w", shape=(2, 3))
    mod = kiln.train.with_loss(Function((x, w), nn.dense(x, w)), "mse", keep_output=True)
    wv = np.ones((2, 3), "float32")
    xv = np.arange(12, dtype="float32").reshape(4, 3)
    for split in (False, True):
        step = kiln.train.Step(mod, {"w": wv}, SGD(lr=0.0), split=split)
        loss = step(xv, np.zeros((4, 2), "float32"))
        np.testing.assert_allclose(step.outputs, xv @ wv.T, rtol=1e-6)
        assert loss == pytest.approx(float(np.mean((xv @ wv.T) ** 2)), rel=1e-6)


def test_bad_batches_and_names_are_errors() -> None:
    step = kiln.train.Step(mlp_loss(), mlp_params(), SGD(lr=0.1))
    xs, ys = batches(1)
    with pytest.raises(kiln.Error, match="batch input"):
        step(xs[0][:3], ys[0])
    with pytest.raises(kiln.Error, match="takes 2 batch input"):
        step(xs[0])
    with pytest.raises(kiln.Error, match="does not take"):
        kiln.train.Step(mlp_loss(), {"nope": np.zeros(3, "float32")}, SGD())
    with pytest.raises(kiln.Error, match="not a trained weight"):
        step.load_state_dict({"params": {"w9": np.zeros(1)}})
    with pytest.raises(kiln.Error, match="nothing to train"):
        kiln.train.Step(mlp_loss(), {}, SGD())
    with pytest.raises(kiln.Error, match="float32 scalar"):
        from kiln.ir.expr import Function, var

        v = var("v", shape=(3,))
        kiln.train.Step(Function((v,), v * v), {"v": np.ones(3, "float32")}, SGD())


@pytest.mark.parametrize("executor", ["native", "vm"])
def test_a_result_copying_a_donated_input_reads_it_first(executor) -> None:
    # (new a, new b) = (old a + old b, old a), each written into its own input: the second
    # result is a copy of a, whose memory the first takes (native: scratch memory; VM: the
    # copy taken first). Written straight in, b would get the new a.
    from kiln.train.step import _Program

    exe = kiln.build(kiln.parse("""
def @main(%a: Tensor[(4), float32], %b: Tensor[(4), float32]) {
  (%a + %b, %a)
}"""), executor=executor)
    a, b = np.arange(4, dtype="float32"), np.full(4, 10, "float32")
    program = _Program(exe, [a, b], {0: 0, 1: 1})
    program()
    np.testing.assert_array_equal(a, [10, 11, 12, 13])
    np.testing.assert_array_equal(b, [0, 1, 2, 3])
    program()
    np.testing.assert_array_equal(a, [10, 12, 14, 16])
    np.testing.assert_array_equal(b, [10, 11, 12, 13])


def test_the_momentum_update_fuses_with_the_gradients_last_kernel() -> None:
    """The step's results read the gradients as the gradient program computes them (not
    through its result tuple, which fusion does not see through), so each convolution's
    momentum update (0.9 * buffer + gradient) is the epilogue of the kernel computing that
    gradient (conv2d_backward_weight): the gradient is never stored."""
    from tests.train.ddp_models import cnn_loss, cnn_params

    step = kiln.train.Step(cnn_loss(4), cnn_params(), SGD(lr=0.1, momentum=0.9), threads=1)
    kernels = step.executables[0].program.kernels.values()
    products = [k.ops for k in kernels if "nn.conv2d_backward_weight" in k.ops]
    assert len(products) == 2, products  # c1 and c2
    assert all("add" in ops and "multiply" in ops for ops in products), products


@pytest.mark.parametrize("split", [False, True])
def test_subnormal_gradients_are_flushed_unless_asked_not_to(split) -> None:
    # loss = sum(w * x) with x = 1e-20 and the loss scaled by 1e-20: every gradient is
    # 1e-40, a subnormal float32. Flushed (the default, as TensorFlow and oneDNN do), the
    # momentum buffer stays 0; kept, it holds the subnormal gradient exactly as numpy has it.
    from kiln.ir.expr import Function, const, var
    from kiln.op import sum_

    x = var("x", shape=(64,))
    w = var("w", shape=(64,))
    f = Function((x, w), sum_(w * x) * const(np.float32(1e-20)))
    params = {"w": np.ones(64, np.float32)}
    batch = np.full(64, 1e-20, np.float32)
    want = np.float32(1e-20) * np.float32(1e-20)
    assert want != 0 and abs(want) < np.finfo(np.float32).tiny  # a subnormal
    flushed = kiln.train.Step(f, params, SGD(lr=0.1, momentum=0.9), split=split)
    kept = kiln.train.Step(f, params, SGD(lr=0.1, momentum=0.9), split=split,
                           flush_denormals=False)
    flushed(batch)
    kept(batch)
    np.testing.assert_array_equal(flushed.optimizer_state["w"][0], np.zeros(64, np.float32))
    np.testing.assert_array_equal(kept.optimizer_state["w"][0], np.full(64, want, np.float32))
    # the calling thread's own mode is back: numpy still computes the subnormal
    assert np.float32(1e-20) * np.float32(1e-20) == want
