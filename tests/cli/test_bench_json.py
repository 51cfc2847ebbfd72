"""kiln bench --json and --time-budget: the figures as one JSON object, calls for a time."""

import json

import pytest

from kiln.cli import main

RELAY = "def @main(%x: Tensor[(4, 8), float32]) { nn.relu(%x) * %x }"


def test_json_holds_the_figures_and_the_profile(tmp_path, capsys):
    (tmp_path / "m.rly").write_text(RELAY)
    assert main(["bench", str(tmp_path / "m.rly"), "--repeat", "7", "--json", "--profile"]) == 0
    record = json.loads(capsys.readouterr().out)
    s = record["seconds"]
    assert record["calls"] == 7 and record["kernels"] == 1
    assert 0 < s["min"] <= s["p10"] <= s["median"] <= s["p90"] <= s["max"]
    assert record["calls_per_second"] > 0
    (row,) = record["profile"]
    assert row["calls"] >= 7 and row["operators"] == ["nn.relu", "multiply"]


def test_a_time_budget_times_calls_for_that_long(tmp_path, capsys):
    (tmp_path / "m.rly").write_text(RELAY)
    assert main(["bench", str(tmp_path / "m.rly"), "--time-budget", "0.05", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["calls"] >= 3
    assert sum([record["seconds"]["min"]] * record["calls"]) <= 0.05 + 0.05
    for bad in (["--time-budget", "0"], ["--time-budget", "1", "--repeat", "3"]):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", str(tmp_path / "m.rly"), *bad])
        assert exit_.value.code == 2
    assert "must be a number above 0" in capsys.readouterr().err
