"""Every operator's lowering against the reference interpreter, alone and fused.

For each operator of the registry, the small programs of tests/loops/op_cases.py are lowered
to loop-IR kernels (the verifier proves every access in bounds as they are made), run by the
loop-IR evaluator, and compared with `kiln.interpret`: exactly for integer and bool results,
to rtol 1e-5 for float32 (the evaluator computes transcendentals with numpy, so this checks
the lowering, not the code generator's approximations). Each program runs twice: as one
kernel holding the whole function, and through `kiln.optimize` with every fused primitive
function replaced by its kernel.
"""

from __future__ import annotations

import warnings

import pytest

import kiln

from .helpers import check_alone, check_fused
from .op_cases import CASES

_PARAMS = [pytest.param(name, k, id=f"{name}-{k}") for name, cases in CASES.items()
           for k in range(len(cases))]


def test_every_operator_has_a_lowering_and_cases() -> None:
    # Operators the host runs (kiln/op/dyn.py: their results' shapes are data) have no loops.
    # The qnn operators compile through their canonical forms of core operators (the
    # qnn-canonicalize pass), checked against numpy by kiln.build in tests/op/test_qnn*.py.
    looped = [o for o in kiln.op.all_ops() if not o.host and o.name not in kiln.op.qnn.CANONICAL]
    missing_rule = sorted(o.name for o in looped if o.lower is None)
    missing_case = sorted(o.name for o in looped if o.name not in CASES)
    assert not missing_rule, f"operators without a lowering: {missing_rule}"
    assert not missing_case, f"operators without a lowering case: {missing_case}"
    unknown = sorted(set(CASES) - {o.name for o in kiln.op.all_ops()})
    assert not unknown, f"cases for unknown operators: {unknown}"


@pytest.mark.parametrize(("name", "k"), _PARAMS)
def test_lowering_agrees_with_the_interpreter(name: str, k: int) -> None:
    case = CASES[name][k]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference's nan, inf and 0/0
        kernel = check_alone(case)
        assert name in kernel.attrs["ops"]
        assert str(kernel)  # the printer handles every construct
        check_fused(case)
