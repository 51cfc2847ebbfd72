"""The loader against files an attacker made: field edits and machine-code edits with a
correct checksum (artifact_fuzz.py). Every case loads and runs, or is a kiln.Error; no
other exception escapes and the process never dies."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime import build

from .helpers import needs_native
from .test_artifact_trust import LIST_MODEL, MODEL, params, x_input

pytestmark = needs_native

SCRIPT = Path(__file__).with_name("artifact_fuzz.py")


def fuzz(tmp_path, exe, args, count, seed):
    exe.save(tmp_path / "seed.kiln")
    np.savez(tmp_path / "in.npz", *args)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "seed.kiln"),
                           str(tmp_path / "in.npz"), str(count), str(seed)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    last = done.stderr.strip().splitlines()[-3:]
    assert done.returncode == 0, f"the loader crashed after {last}: {done.stderr[-2000:]}"
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["escapes"] == 0, counts["examples"]
    assert counts["cases"] >= count * 0.9
    assert counts["load_errors"] > 0 and counts["ran"] > 0  # both kinds of case were met
    return counts


@pytest.mark.parametrize("count", [300, pytest.param(2000, marks=pytest.mark.slow)])
def test_fuzzed_native_programs_load_and_run_or_are_errors(tmp_path, count):
    exe = build(kiln.parse(MODEL), params=params())
    fuzz(tmp_path, exe, [x_input()], count, seed=1)


@pytest.mark.parametrize("count", [200, pytest.param(1000, marks=pytest.mark.slow)])
def test_fuzzed_vm_programs_load_and_run_or_are_errors(tmp_path, count):
    exe = build(kiln.parse(LIST_MODEL))
    fuzz(tmp_path, exe, [np.linspace(-1, 1, 4, dtype="float32")], count, seed=2)
