"""`kiln tune` and `--tuning-log` on kiln build, run and bench."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.cli import main
from kiln.cli.tune import parse_budget
from kiln.tune import read_log

MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 9, 20), float32], %y: Tensor[(2, 20, 12), float32]) {
  nn.relu(nn.batch_matmul(%x, %y, transpose_b=False))
}
"""


def test_tune_then_build_run_bench_with_the_log(tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "mm.rly"
    model.write_text(MODEL)
    log = tmp_path / "mm.tunelog"
    assert main(["tune", str(model), "-o", str(log), "--budget", "1s", "--progress"]) == 0
    captured = capsys.readouterr()
    assert "tuning kernels 1/1, best speedup" in captured.err
    assert "gemm batch=2 m=9 n=12 k=20" in captured.out  # the result table
    (key,) = {e.key for e in read_log(log) if e.final}
    out = tmp_path / "mm.kiln"
    assert main(["build", str(model), "--tuning-log", str(log), "-o", str(out)]) == 0
    exe = kiln.load(out)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (2, 9, 20)), rng.uniform(-1, 1, (2, 20, 12))
    x, y = x.astype(np.float32), y.astype(np.float32)
    np.testing.assert_allclose(exe(x, y), np.maximum(x @ y, 0), rtol=1e-5, atol=1e-5)
    assert main(["bench", str(model), "--tuning-log", str(log), "--repeat", "3"]) == 0
    # a second run appends to the log
    assert main(["tune", str(model), "-o", str(log), "--budget", "0"]) == 0
    assert sum(e.final for e in read_log(log)) == 2


def test_tuning_log_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "mm.rly"
    model.write_text(MODEL)
    assert main(["build", str(model), "--tuning-log", str(tmp_path / "none.tunelog")]) == 1
    assert "no such tuning log" in capsys.readouterr().err
    bad = tmp_path / "bad.tunelog"
    bad.write_text("hello\n")
    assert main(["tune", str(model), "-o", str(bad), "--budget", "1"]) == 1
    assert "is not a kiln tuning log" in capsys.readouterr().err
    assert main(["tune", str(model), "--target", "evaluator", "--budget", "1"]) == 1


def test_budget_syntax() -> None:
    assert parse_budget("120") == parse_budget("120s") == parse_budget("2m") == 120.0
    assert parse_budget("1.5h") == 5400.0
    for bad in ("soon", "-3s", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_budget(bad)
