"""Floating-point math on integer tensors, as TVM's IdentityRel types it: the result keeps the
integer dtype; kiln computes in float64 and truncates toward zero. The oracle is Python's math
module, element by element, truncated with int()."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType

from .helpers import check, infer


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# name -> (scalar oracle, integers to try)
FLOAT_MATH = {
    "exp": (math.exp, range(-3, 8)),
    "log": (math.log, range(1, 40)),
    "sqrt": (math.sqrt, range(0, 50)),
    "rsqrt": (lambda v: 1.0 / math.sqrt(v), range(1, 10)),
    "tanh": (math.tanh, range(-4, 5)),
    "sigmoid": (_sigmoid, range(-6, 7)),
    "erf": (math.erf, range(-3, 4)),
    "sin": (math.sin, range(-7, 8)),
    "cos": (math.cos, range(-7, 8)),
}


@pytest.mark.parametrize("name", FLOAT_MATH)
@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_float_math_on_integers_truncates(name: str, dtype: str) -> None:
    fn, values = FLOAT_MATH[name]
    info = np.iinfo(dtype)
    # results that fit the dtype (a float out of an integer's range converts to nothing defined)
    kept = [v for v in values if info.min <= int(fn(float(v))) <= info.max]
    x = np.array(kept, dtype)
    expected = np.array([int(fn(float(v))) for v in kept], dtype)
    check(name, [x], expected)


@pytest.mark.parametrize("name", FLOAT_MATH)
def test_relation_keeps_the_integer_dtype(name: str) -> None:
    assert infer(name, [TensorType((2, 3), "uint8")]) == TensorType((2, 3), "uint8")
    with pytest.raises(kiln.TypeCheckError, match="numeric"):
        infer(name, [TensorType((2,), "bool")])


def test_tvm_text_with_integer_math_runs() -> None:
    mod = kiln.parse(
        '#[version = "0.0.5"]\n'
        "def @main(%x: Tensor[(4), int32]) -> Tensor[(4), int32] {\n"
        "  %0 = sqrt(%x);\n"
        "  exp(%0)\n"
        "}\n"
    )
    x = np.array([0, 4, 9, 5], "int32")
    expected = np.array([int(math.exp(int(math.sqrt(v)))) for v in x], "int32")
    out = kiln.interpret(mod, x)
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(kiln.build(mod, target="evaluator")(x), expected)
