"""Python numbers and lists passed for tensors convert exactly or are refused (eval/convert.py).

The same rules hold for the reference interpreter and for executables; the expected values come
from Python's own arithmetic (ints are exact, ``float`` is float64), not from kiln.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln

SCALARS = """
def @main(%f32: float32, %f64: float64, %f16: float16, %i32: int32, %u8: uint8, %i64: int64,
          %b: bool) {
  (%f32, %f64, %f16, %i32, %u8, %i64, %b)
}
"""
NAMES = ["f32", "f64", "f16", "i32", "u8", "i64", "b"]
GOOD = {"f32": 0.5, "f64": 0.5, "f16": 0.5, "i32": 1, "u8": 1, "i64": 1, "b": True}


def interpreter(mod):
    return lambda *a: kiln.interpret(mod, *a)


def executable(mod):
    return kiln.build(mod, target="evaluator")


@pytest.fixture(scope="module", params=[interpreter, executable], ids=["interpret", "build"])
def run(request):
    return request.param(kiln.parse(SCALARS))


def call(run, **given):
    return run(*[given.get(n, GOOD[n]) for n in NAMES])


@pytest.mark.parametrize("name, value, want", [
    ("f32", 0.1, np.float32(0.1)),  # a float rounds, as floats do
    ("f32", 1e-50, np.float32(0.0)),
    ("f32", math.inf, np.float32(math.inf)),
    ("f16", -math.inf, np.float16(-math.inf)),
    ("f32", 2**24, np.float32(2**24)),
    ("f32", 2**100, np.float32(2**100)),  # a large int a float32 holds exactly
    ("f32", -(2**63), np.float32(-(2**63))),
    ("f64", 2**53, np.float64(2**53)),
    ("f32", True, np.float32(1)),
    ("i32", 2.0, np.int32(2)),
    ("i32", -(2**31), np.int32(-(2**31))),
    ("u8", 255, np.uint8(255)),
    ("i64", 2**63 - 1, np.int64(2**63 - 1)),
    ("b", 1, np.bool_(True)),
    ("b", 0.0, np.bool_(False)),
])
def test_values_that_convert_exactly(run, name, value, want):
    got = call(run, **{name: value})[NAMES.index(name)]
    assert got.dtype == want.dtype and got.shape == ()
    assert got == want or (math.isnan(want) and math.isnan(got))


def test_nan_stays_nan(run):
    got = call(run, f32=math.nan)[0]
    assert got.dtype == np.float32 and math.isnan(got)


@pytest.mark.parametrize("name, value, why", [
    ("f32", 2**60 + 1, "float32 cannot hold it exactly (the nearest float32 is "
                       f"{2**60})"),
    ("f32", 2**24 + 1, "float32 cannot hold it exactly"),
    ("f64", 2**53 + 1, "float64 cannot hold it exactly"),
    ("f32", 2**200, "beyond the range of float32"),
    ("f64", 2**2000, "beyond the range of float64"),
    ("f32", 1e300, "beyond the range of float32"),
    ("f16", 70000.0, "beyond the range of float16"),
    ("i32", 2**31, "out of the range of int32"),
    ("i32", 2.5, "fractional part"),
    ("i32", math.nan, "int32 has no nan"),
    ("i32", 1e10, "out of the range of int32"),
    ("u8", -1, "out of the range of uint8"),
    ("i64", 2**63, "out of the range of int64"),
    ("i64", float(2**63), "out of the range of int64"),
    ("b", 2, "a bool holds only 0 and 1"),
])
def test_values_that_do_not_convert_exactly_are_refused(run, name, value, why):
    i = NAMES.index(name)
    with pytest.raises(kiln.Error) as info:
        call(run, **{name: value})
    text = str(info.value)
    assert f"argument {i + 1} (%{name}) of @main" in text
    assert f"{value!r} does not convert to " in text
    assert why in text


LISTS = "def @main(%x: Tensor[(2, 2), float32], %n: Tensor[(3), int32]) { (%x, %n) }"


@pytest.fixture(scope="module", params=[interpreter, executable], ids=["interpret", "build"])
def run_lists(request):
    return request.param(kiln.parse(LISTS))


def test_lists_convert_element_by_element(run_lists):
    x, n = run_lists([[0.1, 2], [2**24, True]], [1, 2.0, -(2**31)])
    np.testing.assert_array_equal(x, np.array([[0.1, 2], [2**24, 1]], np.float32))
    np.testing.assert_array_equal(n, np.array([1, 2, -(2**31)], np.int32))


@pytest.mark.parametrize("x, n, where", [
    ([[0.1, 2**60 + 1], [0.0, 0.0]], [1, 2, 3], f"element [0, 1] of [[0.1, {2**60 + 1}]"),
    ([[1.0, 2.0], [3.0, 1e39]], [1, 2, 3], "element [1, 1]"),
    ([[1.0, 2.0], [3.0, 4.0]], [1, 2.5, 3], "element [1] of [1, 2.5, 3], 2.5, does not convert"),
    ([[1.0, 2.0], [3.0, 4.0]], [1, 2, 2**40], "element [2]"),
    ([[1.0, 2.0], [3.0, 4.0]], [1, None, 3], "it is a NoneType, not a number"),
])
def test_a_list_names_the_element_that_does_not_convert(run_lists, x, n, where):
    with pytest.raises(kiln.Error, match="does not convert to") as info:
        run_lists(x, n)
    assert where in str(info.value)


def test_a_list_of_strings_or_a_ragged_list_is_refused(run_lists):
    with pytest.raises(kiln.Error, match="not made of numbers"):
        run_lists([["a", "b"], ["c", "d"]], [1, 2, 3])
    with pytest.raises(kiln.Error, match="inhomogeneous"):
        run_lists([[1.0, 2.0], [3.0]], [1, 2, 3])


def test_numpy_arrays_of_another_dtype_are_refused_not_converted(run_lists):
    with pytest.raises(kiln.Error, match="dtype float64"):
        run_lists(np.zeros((2, 2)), np.zeros(3, np.int32))
