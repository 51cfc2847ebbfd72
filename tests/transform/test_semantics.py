"""Every pass, and the whole optimize pipeline, preserves meaning on random programs.

Random well-typed programs (kiln/testing/programs.py: many operators, lets and sharing,
tuples, ifs, closures, globals, references) are run by the reference interpreter before and
after each pass; results must agree, and the pass's output must type-check.
"""

import numpy as np
import pytest

import kiln
from kiln.testing.programs import random_program
from kiln.transform import PassContext, get_pass, list_passes

SEEDS = range(12)
# Level 1 only: the back end's passes give the lowered program (tests/runtime/test_backend.py).
PASSES = [info.name for info in list_passes()
          if info.level == 1 and not info.name.startswith("test-")]


def _flatten(value):
    if isinstance(value, tuple):
        out = []
        for v in value:
            out.extend(_flatten(v))
        return out
    return [value]


def assert_same_results(before: kiln.IRModule, after: kiln.IRModule, inputs, what: str):
    expected = _flatten(kiln.interpret(before, *inputs))
    got = _flatten(kiln.interpret(after, *inputs))
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, what
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("name", PASSES)
def test_pass_preserves_meaning(name):
    for seed in SEEDS:
        mod, inputs = random_program(seed)
        with PassContext(opt_level=3, debug=True):
            out = get_pass(name)(mod)
        assert_same_results(mod, out, inputs, f"pass {name}, program seed {seed}")


def test_optimize_pipeline_preserves_meaning():
    for seed in range(30):
        mod, inputs = random_program(seed, steps=16)
        with PassContext(debug=True):
            out = kiln.optimize(mod, opt_level=3)
        assert_same_results(mod, out, inputs, f"optimize, program seed {seed}")
