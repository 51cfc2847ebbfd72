"""The training example: a short run of examples/train_mlp.py lowers the loss."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def train_mlp():
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_training_run_lowers_the_loss(train_mlp) -> None:
    result = train_mlp.train(steps=60, log=None)
    losses = result["losses"]
    assert len(losses) == 60 and all(np.isfinite(losses))
    assert np.mean(losses[-10:]) < 0.25 * np.mean(losses[:10])
    assert result["accuracy"] > 0.8


def test_both_modes_train_the_same_way(train_mlp) -> None:
    first = train_mlp.train(steps=5, mode="first_order", log=None)["losses"]
    higher = train_mlp.train(steps=5, mode="higher_order", log=None)["losses"]
    np.testing.assert_allclose(first, higher, rtol=1e-6)


@pytest.mark.slow
def test_the_full_run_reaches_95_percent(train_mlp) -> None:
    assert train_mlp.train(log=None)["accuracy"] >= 0.95
