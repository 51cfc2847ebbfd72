"""Unary and binary elementwise operators, where, clip and cast, against PyTorch and by hand."""

from __future__ import annotations

import decimal

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import kiln
from kiln.ir.ty import TensorType

from .helpers import check, covers, infer, rand, run

SEEDS = [0, 1, 2]


def _round_half_away(x: np.ndarray) -> np.ndarray:
    # An oracle apart from numpy: Python's decimal rounding, one element at a time.
    out = [
        float(decimal.Decimal(float(v)).quantize(0, rounding=decimal.ROUND_HALF_UP))
        for v in x.ravel()
    ]
    return np.array(out, dtype=x.dtype).reshape(x.shape)


def _t(fn):  # a torch function as a numpy oracle
    return lambda x: fn(torch.from_numpy(np.asarray(x))).numpy()


# name -> (oracle, input low, input high, dtypes)
UNARY = {
    "exp": (_t(torch.exp), -5, 5, ["float32", "float64"]),
    "log": (_t(torch.log), 0.01, 10, ["float32", "float64"]),
    "sqrt": (_t(torch.sqrt), 0, 10, ["float32", "float64"]),
    "rsqrt": (_t(torch.rsqrt), 0.01, 10, ["float32", "float64"]),
    "tanh": (_t(torch.tanh), -5, 5, ["float32", "float64"]),
    "sigmoid": (_t(torch.sigmoid), -20, 20, ["float32", "float64"]),
    "erf": (_t(torch.erf), -5, 5, ["float32", "float64"]),
    "sin": (_t(torch.sin), -7, 7, ["float32", "float64"]),
    "cos": (_t(torch.cos), -7, 7, ["float32", "float64"]),
    "negative": (_t(torch.neg), -50, 50, ["float32", "int32", "int64"]),
    "abs": (_t(torch.abs), -50, 50, ["float32", "float64", "int32"]),
    "floor": (_t(torch.floor), -5, 5, ["float32", "float64", "int32"]),
    "ceil": (_t(torch.ceil), -5, 5, ["float32", "float64", "int32"]),
    "round": (_round_half_away, -5, 5, ["float32", "float64", "int32"]),
    "sign": (_t(torch.sign), -5, 5, ["float32", "int32"]),
    "logical_not": (_t(torch.logical_not), 0, 1, ["bool"]),
}


@covers(*UNARY)
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("seed", SEEDS)
def test_unary_against_oracle(name: str, seed: int) -> None:
    oracle, low, high, dtypes = UNARY[name]
    rng = np.random.default_rng(seed)
    for dtype in dtypes:
        shape = tuple(rng.integers(0, 5, size=rng.integers(0, 4)))
        x = rand(rng, shape, dtype, low, high)
        if name == "round" and dtype != "int32":
            x[..., :1] = np.round(x[..., :1] * 2) / 2  # exact halves, where the rules differ
        expected = np.asarray(oracle(x)).astype(dtype)
        rtol = 1e-5 if dtype == "float32" else 1e-12
        check(name, [x], expected, rtol=rtol, atol=1e-7 if name == "erf" else 0.0)


def test_round_halves_go_away_from_zero() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.0], dtype="float32")
    expected = np.array([1, 2, 3, -1, -2, -3, 0, 3], dtype="float32")
    check("round", [x], expected)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf"])
def test_float_math_keeps_integer_dtypes_and_rejects_bool(name: str) -> None:
    # TVM's IdentityRel types exp(int32) as int32 (values: tests/op/test_int_math.py)
    assert infer(name, [TensorType((3,), "int32")]) == TensorType((3,), "int32")
    with pytest.raises(kiln.TypeCheckError, match="numeric"):
        infer(name, [TensorType((3,), "bool")])


def test_unary_warnings_stay_quiet() -> None:
    x = np.array([-1.0, 0.0, 1e30], dtype="float32")
    with np.errstate(all="raise"):  # any unsilenced numpy warning would raise here
        out = run("log", x)
        run("exp", x)
        run("sqrt", x)
        run("rsqrt", x)
    assert np.isnan(out[0]) and out[1] == -np.inf


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _int_oracle(fn):
    def oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.broadcast_arrays(a, b)
        out = [fn(int(x), int(y)) for x, y in zip(a.ravel(), b.ravel(), strict=True)]
        return np.array(out, dtype=np.int64).reshape(a.shape)

    return oracle


def _t2(fn):
    return lambda a, b: fn(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b))).numpy()


# name -> (oracle for floats, oracle for ints or None, result dtype or None for the input's)
BINARY = {
    "add": (_t2(torch.add), _int_oracle(lambda a, b: a + b), None),
    "subtract": (_t2(torch.sub), _int_oracle(lambda a, b: a - b), None),
    "multiply": (_t2(torch.mul), _int_oracle(lambda a, b: a * b), None),
    "divide": (_t2(torch.div), _int_oracle(_trunc_div), None),
    "power": (_t2(torch.pow), _int_oracle(lambda a, b: a**b), None),
    "maximum": (_t2(torch.maximum), _int_oracle(max), None),
    "minimum": (_t2(torch.minimum), _int_oracle(min), None),
    "mod": (_t2(torch.fmod), _int_oracle(lambda a, b: a - _trunc_div(a, b) * b), None),
    "floor_divide": (_t2(lambda a, b: torch.floor(a / b)), _int_oracle(lambda a, b: a // b), None),
    "floor_mod": (
        _t2(lambda a, b: a - torch.floor(a / b) * b),
        _int_oracle(lambda a, b: a % b),
        None,
    ),
    "equal": (_t2(torch.eq), _int_oracle(lambda a, b: a == b), "bool"),
    "not_equal": (_t2(torch.ne), _int_oracle(lambda a, b: a != b), "bool"),
    "less": (_t2(torch.lt), _int_oracle(lambda a, b: a < b), "bool"),
    "less_equal": (_t2(torch.le), _int_oracle(lambda a, b: a <= b), "bool"),
    "greater": (_t2(torch.gt), _int_oracle(lambda a, b: a > b), "bool"),
    "greater_equal": (_t2(torch.ge), _int_oracle(lambda a, b: a >= b), "bool"),
    "logical_and": (_t2(torch.logical_and), None, None),
    "logical_or": (_t2(torch.logical_or), None, None),
}
NONZERO_RHS = {"divide", "mod", "floor_divide", "floor_mod"}


@covers(*BINARY)
@pytest.mark.parametrize("name", BINARY)
@settings(max_examples=12, deadline=None)
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
    seed=st.integers(0, 2**16),
    use_int=st.booleans(),
)
def test_binary_broadcasting_against_oracle(name: str, shapes, seed: int, use_int: bool) -> None:
    float_oracle, int_oracle, result = BINARY[name]
    rng = np.random.default_rng(seed)
    lhs_shape, rhs_shape = shapes.input_shapes
    logical = name.startswith("logical")
    dtype = "bool" if logical else ("int32" if use_int and int_oracle else "float32")
    lhs = rand(rng, lhs_shape, dtype, -20, 20)
    low = 0 if name == "power" else -20
    high = 4 if name == "power" and dtype == "int32" else 20
    rhs = rand(rng, rhs_shape, dtype, low, high)
    if name in NONZERO_RHS:
        rhs = np.where(rhs == 0, np.ones((), dtype), rhs).astype(dtype)
    if name == "power" and dtype == "float32":
        lhs = np.abs(lhs)
    oracle = int_oracle if dtype == "int32" else float_oracle
    expected = np.asarray(oracle(lhs, rhs)).astype(result or dtype)
    check(name, [lhs, rhs], expected, rtol=2e-5, atol=1e-5)


def test_integer_division_rounding_rules() -> None:
    a = np.array([7, -7, 7, -7, 6], dtype="int32")
    b = np.array([2, 2, -2, -2, 3], dtype="int32")
    check("divide", [a, b], np.array([3, -3, -3, 3, 2], dtype="int32"))
    check("mod", [a, b], np.array([1, -1, 1, -1, 0], dtype="int32"))
    check("floor_divide", [a, b], np.array([3, -4, -4, 3, 2], dtype="int32"))
    check("floor_mod", [a, b], np.array([1, 1, -1, -1, 0], dtype="int32"))


@pytest.mark.parametrize("name", ["divide", "mod", "floor_divide", "floor_mod"])
def test_integer_division_by_zero_is_an_eval_error(name: str) -> None:
    a = np.array([1, 2], dtype="int64")
    b = np.array([1, 0], dtype="int64")
    with pytest.raises(kiln.EvalError, match="division by zero"):
        run(name, a, b)


def test_float_division_by_zero_is_quiet() -> None:
    with np.errstate(all="raise"):
        out = run("divide", np.array([1.0, 0.0], "float32"), np.array([0.0, 0.0], "float32"))
    assert out[0] == np.inf and np.isnan(out[1])


def test_results_keep_narrow_dtypes() -> None:
    # int8 wraps around instead of promoting; 0-d inputs give 0-d arrays, not numpy scalars.
    check("add", [np.array([100], "int8"), np.array([100], "int8")], np.array([-56], "int8"))
    check("multiply", [np.array(3, "int16"), np.array(4, "int16")], np.array(12, "int16"))
    check("add", [np.array(1.5, "float16"), np.array(2.0, "float16")], np.array(3.5, "float16"))


def test_binary_needs_identical_dtypes() -> None:
    with pytest.raises(kiln.TypeCheckError, match="float32.*int32"):
        infer("add", [TensorType((2,), "float32"), TensorType((2,), "int32")])
    with pytest.raises(kiln.TypeCheckError, match="bool"):
        infer("logical_and", [TensorType((2,), "int32"), TensorType((2,), "int32")])
    with pytest.raises(kiln.TypeCheckError, match="numeric"):
        infer("add", [TensorType((2,), "bool"), TensorType((2,), "bool")])


def test_broadcast_mismatch_names_both_shapes() -> None:
    with pytest.raises(kiln.TypeCheckError, match=r"\(2, 3\).*\(4,\)"):
        infer("add", [TensorType((2, 3)), TensorType((4,))])


@covers("where")
@settings(max_examples=25, deadline=None)
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3),
    seed=st.integers(0, 2**16),
)
def test_where_against_torch(shapes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    c_shape, x_shape, y_shape = shapes.input_shapes
    cond = rand(rng, c_shape, "bool")
    x, y = rand(rng, x_shape, "int64"), rand(rng, y_shape, "int64")
    expected = torch.where(torch.from_numpy(cond), torch.from_numpy(x), torch.from_numpy(y))
    check("where", [cond, x, y], expected.numpy())


def test_where_checks_condition_and_branches() -> None:
    with pytest.raises(kiln.TypeCheckError, match="condition must have dtype bool"):
        infer("where", [TensorType((2,), "int32"), TensorType((2,)), TensorType((2,))])
    with pytest.raises(kiln.TypeCheckError, match="x has dtype float32 but y has dtype int32"):
        infer("where", [TensorType((2,), "bool"), TensorType((2,)), TensorType((2,), "int32")])


@covers("clip")
@pytest.mark.parametrize("seed", SEEDS)
def test_clip_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, (3, 4), "float32", -5, 5)
    expected = torch.clamp(torch.from_numpy(x), -1.5, 2.25).numpy()
    check("clip", [x], expected, a_min=-1.5, a_max=2.25)
    xi = rand(rng, (5,), "int32", -5, 5)
    expected_i = torch.clamp(torch.from_numpy(xi), -2, 3).numpy()
    check("clip", [xi], expected_i, a_min=-2, a_max=3)
    # Infinite bounds on integers keep every value.
    check("clip", [xi], xi.copy(), a_min=-np.inf, a_max=np.inf)


@covers("cast")
@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("float32", "int32"),
        ("float64", "float16"),
        ("int32", "float32"),
        ("float32", "bool"),
        ("int64", "int8"),
    ],
)
def test_cast_against_torch(src: str, dst: str) -> None:
    rng = np.random.default_rng(7)
    x = rand(rng, (4, 3), src, -100, 100)
    expected = torch.from_numpy(x).to(getattr(torch, dst)).numpy()
    check("cast", [x], expected, dtype=dst)


def test_cast_needs_a_dtype() -> None:
    with pytest.raises(kiln.Error, match="dtype"):
        kiln.op.cast(kiln.var("x", shape=(2,)), dtype="")


def _shift_oracle(value: int, amount: int, bits: int, signed: bool, left: bool) -> int:
    """A shift in Python's unbounded integers, wrapped back to ``bits`` (the oracle)."""
    amount = max(amount, 0)
    if left:
        out = (value << amount) % (1 << bits) if amount < bits else 0
    else:
        out = value >> amount if signed or amount < bits else 0
    if signed and out >= 1 << (bits - 1):
        out -= 1 << bits
    return out


@covers("left_shift", "right_shift")
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "uint32", "int64"])
def test_shifts_against_python_integers(dtype: str) -> None:
    # every amount from negative (no shift) past the width (0, or the sign for >> of signed)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(info.bits)
    a = rng.integers(info.min, int(info.max) + 1, (4, 19)).astype(dtype)
    lo = -2 if info.min < 0 else 0
    b = rng.integers(lo, info.bits + 3, (4, 19)).astype(dtype)
    a[0, :3] = (info.min, info.max // 2 + 1, info.max)
    b[0, :3] = (info.bits - 1, info.bits, info.bits + 1)
    for name, left in (("left_shift", True), ("right_shift", False)):
        want = np.array([_shift_oracle(int(v), int(s), info.bits, info.min < 0, left)
                         for v, s in zip(a.ravel(), b.ravel())]).reshape(a.shape)
        check(name, [a, b], want.astype(dtype))


def test_shifts_reject_floats() -> None:
    with pytest.raises(kiln.TypeCheckError, match="integer"):
        infer("right_shift", [TensorType((2,), "float32"), TensorType((2,), "float32")])


@covers("nearbyint")
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nearbyint_rounds_halves_to_even(dtype: str) -> None:
    # Python's round() (halves to even) on every value: the oracle
    x = np.concatenate([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, -0.51, 1000.5, -999.5, 0.0, -0.0],
                        np.random.default_rng(7).standard_normal(40) * 50]).astype(dtype)
    want = np.array([round(float(v)) for v in x], dtype=dtype)
    check("nearbyint", [x], want)
    check("nearbyint", [np.array([np.nan, np.inf, -np.inf], dtype)],
          np.array([np.nan, np.inf, -np.inf], dtype))
    check("nearbyint", [np.array([-3, 4], "int32")], np.array([-3, 4], "int32"))
