"""kiln.train.Step with batch norm in training mode and dropout: the running statistics kept
and updated in place each step, the dropout key advanced from the seed; a small CNN trained
as torch trains it (losses, weights and running statistics per step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.expr import Function, var
from kiln.op import nn
from kiln.train import SGD
from kiln.train.program import step_function
from tests.train.helpers import relative_error

N, C, H, W, F_, K = 8, 3, 6, 6, 4, 5


def cnn(rate: float) -> kiln.IRModule:
    """conv -> batch norm (training) -> relu -> dropout -> dense, with cross entropy."""
    x = var("x", shape=(N, C, H, W))
    w = var("conv_w", shape=(F_, C, 3, 3))
    gamma, beta = var("bn_gamma", shape=(F_,)), var("bn_beta", shape=(F_,))
    mean, variance = var("bn_mean", shape=(F_,)), var("bn_var", shape=(F_,))
    key = var("key", shape=(2,), dtype="int64")
    fc_w, fc_b = var("fc_w", shape=(K, F_ * H * W)), var("fc_b", shape=(K,))
    y = nn.conv2d(x, w, padding=(1, 1))
    y = nn.batch_norm(y, gamma, beta, mean, variance, training=True, momentum=0.1)[0]
    y = nn.dropout_train(nn.relu(y), key, rate=rate)
    logits = nn.bias_add(nn.dense(nn.batch_flatten(y), fc_w), fc_b)
    f = Function((x, w, gamma, beta, mean, variance, key, fc_w, fc_b), logits)
    return kiln.train.with_loss(f, "cross_entropy")


def torch_cnn(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(C, F_, 3, padding=1, bias=False), torch.nn.BatchNorm2d(F_, momentum=0.1),
        torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Flatten(),
        torch.nn.Linear(F_ * H * W, K))


def params_of(model: torch.nn.Sequential) -> dict[str, np.ndarray]:
    conv, bn, fc = model[0], model[1], model[5]
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)  # not the default ones and zeros: gamma and beta matter
        bn.bias.uniform_(-0.5, 0.5)
    return {"conv_w": conv.weight, "bn_gamma": bn.weight, "bn_beta": bn.bias,
            "bn_mean": bn.running_mean, "bn_var": bn.running_var, "fc_w": fc.weight,
            "fc_b": fc.bias}


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((steps, N, C, H, W)) * 2 + 0.5).astype("float32")
    return xs, rng.integers(0, K, (steps, N)).astype("int64")


@pytest.mark.parametrize("split", [False, True])
def test_cnn_with_batch_norm_trains_as_in_torch(split: bool) -> None:
    steps = 10
    model = torch_cnn()
    tensors = params_of(model)
    params = {n: t.detach().numpy().copy() for n, t in tensors.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = kiln.train.Step(cnn(0.0), params, SGD(lr=0.05, momentum=0.9), split=split)
    assert sorted(step.params) == ["bn_beta", "bn_gamma", "conv_w", "fc_b", "fc_w"]
    assert sorted(step.buffers) == ["bn_mean", "bn_var"]
    mean_array = step.buffers["bn_mean"]
    xs, ys = data(steps)
    model.train()
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xs[s])),
                                                 torch.from_numpy(ys[s]))
        loss.backward()
        opt.step()
        got = step(xs[s], ys[s])
        assert abs(got - loss.item()) <= 1e-4 * abs(loss.item()), s
        for n in ("bn_mean", "bn_var"):
            assert relative_error(step.buffers[n], tensors[n].numpy()) < 1e-4, (s, n)
    for n, w in step.params.items():
        assert relative_error(w, tensors[n].detach().numpy()) < 1e-4, n
    assert step.buffers["bn_mean"] is mean_array  # updated in place
    state = step.state_dict()
    np.testing.assert_array_equal(state["buffers"]["bn_var"], step.buffers["bn_var"])
    state["buffers"]["bn_var"][...] = 1.0
    step.load_state_dict(state)
    np.testing.assert_array_equal(step.buffers["bn_var"], np.ones(F_, "float32"))


def test_running_statistics_are_updated_without_allocating() -> None:
    model = torch_cnn()
    params = {n: t.detach().numpy().copy() for n, t in params_of(model).items()}
    step = kiln.train.Step(cnn(0.2), params, SGD(lr=0.05))
    xs, ys = data(3)
    step(xs[0], ys[0])
    before = step.results_allocated
    var_before = step.buffers["bn_var"].copy()
    step(xs[1], ys[1])
    step(xs[2], ys[2])
    assert step.results_allocated == before == 0
    assert not np.array_equal(var_before, step.buffers["bn_var"])


def test_checkpoint_keeps_the_running_statistics(tmp_path) -> None:
    model = torch_cnn()
    params = {n: t.detach().numpy().copy() for n, t in params_of(model).items()}
    xs, ys = data(4)
    step = kiln.train.Step(cnn(0.3), params, SGD(lr=0.05), seed=5)
    for s in range(2):
        step(xs[s], ys[s])
    kiln.train.save_checkpoint(step, tmp_path / "run.npz")
    rest = [step(xs[s], ys[s]) for s in (2, 3)]
    resumed = kiln.train.Step(cnn(0.3), params, SGD(lr=0.05), seed=5)
    kiln.train.load_checkpoint(resumed, tmp_path / "run.npz")
    assert [resumed(xs[s], ys[s]) for s in (2, 3)] == rest
    for n, b in step.buffers.items():
        np.testing.assert_array_equal(resumed.buffers[n], b)


def test_dropout_training_is_reproducible_from_the_seed() -> None:
    model = torch_cnn()
    params = {n: t.detach().numpy().copy() for n, t in params_of(model).items()}
    xs, ys = data(5)

    def run(seed: int, rate: float = 0.5) -> list[float]:
        step = kiln.train.Step(cnn(rate), params, SGD(lr=0.05), seed=seed)
        return [step(xs[s], ys[s]) for s in range(5)]

    first, again, other = run(11), run(11), run(12)
    assert first == again
    assert first != other
    assert first != run(11, rate=0.0)


def test_the_key_advances_every_step() -> None:
    """The same batch and no learning (lr 0): the loss changes from step to step only through
    the dropout mask, and matches the interpreter given the key the Step promises."""
    model = torch_cnn()
    params = {n: t.detach().numpy().copy() for n, t in params_of(model).items()}
    xs, ys = data(1)
    step = kiln.train.Step(cnn(0.5), params, SGD(lr=0.0), seed=7)
    losses = [step(xs[0], ys[0]) for _ in range(3)]
    assert len(set(losses)) == 3
    mod = cnn(0.5)
    names = [p.name_hint for p in mod["main"].params]
    for s, loss in enumerate(losses):
        given = dict(params, x=xs[0], target=ys[0], key=np.array([7, s], np.int64))
        expected = kiln.interpret(mod, *(given[n] for n in names))
        assert abs(loss - float(expected)) <= 1e-5 * abs(loss), s


def test_step_errors_name_the_buffers() -> None:
    model = torch_cnn()
    params = {n: t.detach().numpy().copy() for n, t in params_of(model).items()}
    missing = {n: v for n, v in params.items() if n != "bn_var"}
    with pytest.raises(kiln.Error, match="must give %bn_var, a running statistic"):
        kiln.train.Step(cnn(0.0), missing, SGD(lr=0.1))
    with pytest.raises(kiln.Error, match="%key is a dropout key"):
        kiln.train.Step(cnn(0.0), dict(params, key=np.zeros(2, np.int64)), SGD(lr=0.1))
    with pytest.raises(kiln.Error, match="'bn_mean', a running statistic"):
        kiln.train.Step(cnn(0.0), params, SGD(lr=0.1), trainable=["conv_w", "bn_mean"])


def test_a_torch_module_in_train_mode_imports_and_trains_as_in_torch() -> None:
    """from_torch of a module in train mode: its batch norm normalizes with the batch's
    statistics (torch's _native_batch_norm_legit_functional), and a Step trains it with its
    running statistics kept, as torch does (dropout of rate 0 imports as the identity)."""
    model = torch_cnn(seed=2).train()
    params_of(model)
    x0 = torch.zeros(N, C, H, W)
    mod, weights = kiln.frontend.from_torch(model, (x0,))
    assert model.training
    xs, ys = data(4)
    with torch.no_grad():  # the import's forward: the batch's statistics
        expected = model(torch.from_numpy(xs[0])).numpy()
        model[1].running_mean.zero_()
        model[1].running_var.fill_(1.0)
    got = kiln.interpret(mod, xs[0], params=weights)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # by default the float32 weights but the running statistics are trained
    step = kiln.train.Step(kiln.train.with_loss(mod, "cross_entropy"), weights, SGD(lr=0.05))
    assert len(step.params) == len(list(model.parameters()))
    assert sorted(step.buffers) == ["p_1_running_mean", "p_1_running_var"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xs[s])),
                                                 torch.from_numpy(ys[s]))
        loss.backward()
        opt.step()
        assert abs(step(xs[s], ys[s]) - loss.item()) <= 1e-4 * loss.item(), s
    for n in ("running_mean", "running_var"):
        assert relative_error(step.buffers[f"p_1_{n}"], getattr(model[1], n).numpy()) < 1e-4


def test_a_let_bound_batch_norm_updates_its_statistics_once() -> None:
    """A loss function in let form: the statistics are read through the let's variable."""
    mod = kiln.parse("""
def @main(%x: Tensor[(6, 3), float32], %g: Tensor[(3), float32], %b: Tensor[(3), float32],
          %m: Tensor[(3), float32], %v: Tensor[(3), float32]) {
  let %y = nn.batch_norm(%x, %g, %b, %m, %v, axis=1, training=True, momentum=0.25f);
  let %z = %y.0;
  sum(%z * %z)
}""")
    rng = np.random.default_rng(0)
    m0, v0 = rng.standard_normal(3).astype("float32"), np.full(3, 2.0, "float32")
    params = {"g": np.ones(3, "float32"), "b": np.zeros(3, "float32"), "m": m0, "v": v0}
    step = kiln.train.Step(mod, params, SGD(lr=0.0))
    x = rng.standard_normal((6, 3)).astype("float32")
    step(x)
    np.testing.assert_allclose(step.buffers["m"], 0.75 * m0 + 0.25 * x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(step.buffers["v"], 0.75 * v0 + 0.25 * x.var(0, ddof=1),
                               rtol=1e-6)
    # the step program computes the batch norm once (its statistics through %y)
    sf, layout = step_function(mod["main"], [1, 2], SGD(lr=0.0), mod=mod)
    assert layout.stats == (3, 4)
    assert kiln.astext(sf).count("nn.batch_norm") == 1


def test_batch_norm_in_another_function_is_an_error() -> None:
    mod = kiln.parse("""
def @f(%x: Tensor[(4, 3), float32], %g: Tensor[(3), float32]) {
  nn.batch_norm(%x, %g, %g, %g, %g, axis=1, training=True).0
}
def @main(%x: Tensor[(4, 3), float32], %g: Tensor[(3), float32]) { sum(@f(%x, %g)) }""")
    with pytest.raises(kiln.Error, match="@f calls a batch norm in training mode"):
        kiln.train.Step(mod, {"g": np.ones(3, "float32")}, SGD(lr=0.1))
