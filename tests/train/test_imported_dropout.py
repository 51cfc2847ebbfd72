"""Dropout of rate p > 0 in a torch model imported in train mode: nn.dropout_train with a key
parameter that kiln.train.Step fills each step. The masks are kiln's (its counter hash), not
torch's, so the checks are statistical and against kiln's own seed: the rate and the scale,
training that lowers the loss, runs that repeat from the seed; in eval mode, the identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.train import SGD

P = 0.4


def _mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(P),
                               torch.nn.Linear(32, 3))


def _task(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Three separable classes: the label is the largest of three fixed projections."""
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((steps, 16, 8)).astype("float32")
    proj = rng.standard_normal((8, 3)).astype("float32")
    return xs, np.argmax(xs @ proj, axis=-1).astype("int64")


def _step(seed: int) -> kiln.train.Step:
    mod, params = kiln.frontend.from_torch(_mlp().train(), (torch.zeros(16, 8),))
    return kiln.train.Step(kiln.train.with_loss(mod, "cross_entropy"), params, SGD(lr=0.2),
                           seed=seed)


def test_train_mode_dropout_imports_with_a_key_the_step_fills() -> None:
    mod, params = kiln.frontend.from_torch(_mlp().train(), (torch.zeros(16, 8),))
    names = [p.name_hint for p in mod["main"].params]
    assert names[-1] == "dropout_key" and "dropout_key" not in params
    assert "nn.dropout_train" in str(mod)
    step = kiln.train.Step(kiln.train.with_loss(mod, "cross_entropy"), params, SGD(lr=0.2))
    xs, ys = _task(40)
    losses = [step(xs[s], ys[s]) for s in range(40)]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-8:]) < 0.7 * np.mean(losses[:8])


def test_the_mask_drops_a_fraction_p_and_scales_the_rest() -> None:
    model = torch.nn.Sequential(torch.nn.Dropout(P)).train()
    mod, params = kiln.frontend.from_torch(model, (torch.zeros(64, 256),))
    ones = np.ones((64, 256), "float32")
    for key in ([0, 0], [7, 3]):
        out = np.asarray(kiln.build(mod)(ones, np.asarray(key, np.int64)))
        dropped = float(np.mean(out == 0))
        assert abs(dropped - P) < 0.02, dropped  # 16384 draws: the std is 0.004
        np.testing.assert_allclose(out[out != 0], 1 / (1 - P), rtol=1e-6)


def test_a_run_repeats_from_the_seed() -> None:
    xs, ys = _task(3)
    runs = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        step = _step(seed)
        runs[name] = [step(xs[s], ys[s]) for s in range(3)]
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


@pytest.mark.parametrize("module", [torch.nn.Dropout(P), torch.nn.Dropout2d(P)])
def test_eval_mode_dropout_imports_as_the_identity(module) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), module).eval()
    x = torch.randn(2, 2, 4, 4)
    mod, params = kiln.frontend.from_torch(model, (x,))
    assert "dropout" not in str(mod)
    got = kiln.build(mod, params=params)(x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_train_mode_channel_dropout_says_to_call_eval() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.Dropout2d(P)).train()
    with pytest.raises(kiln.Error, match=r"Dropout2d.*whole channels.*model\.eval\(\)"):
        kiln.frontend.from_torch(model, (torch.randn(2, 2, 4, 4),))
