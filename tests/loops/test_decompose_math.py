"""The decompose-math pass (kiln/loops/decompose_math.py): accuracy, special values, and the
agreement of its two consumers.

Each function is decomposed and run two ways — compiled to machine code (a vectorized scalar
loop, and explicit 8-lane vectors) over dense sweeps, and by the loop evaluator over a
sample of them — and compared with an independent oracle: numpy in float64 for float32
results (Python's math.erf for erf), numpy's long double for float64 results (mpmath for
erf). Errors are in ulp of the correctly rounded result; the bounds asserted are the ones
decompose_math.py documents. The evaluator and the machine code must agree bit for bit:
they run the same arithmetic, each operation rounded once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln.codegen import compile_kernels
from kiln.loops.decompose_math import TRANSCENDENTAL, decompose_math, has_transcendentals
from kiln.loops.evaluate import evaluate
from kiln.loops.ir import (
    Binary,
    Buffer,
    Const,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Seq,
    Store,
    Unary,
    Var,
)
from kiln.loops.printer import kernel_text
from kiln.loops.verify import verify

OPS = sorted(TRANSCENDENTAL)
N = 1 << 16  # points per sweep, compiled
SAMPLE = 256  # points per sweep, evaluated

BOUND = {
    "float32": {"exp": 1.0, "log": 1.0, "tanh": 1.5, "sigmoid": 2.5, "erf": 1.0, "sin": 2.0,
                "cos": 2.0},
    "float64": {"exp": 1.0, "log": 1.0, "tanh": 1.5, "sigmoid": 2.5, "erf": 1.0, "sin": 2.0,
                "cos": 2.0},
}

SWEEPS = {
    "float32": {
        "exp": [("lin", -110, 90), ("bits", 1e-30, 90), ("bits", -1e-30, -110)],
        "log": [("bits", 1e-45, 3.4e38), ("lin", 0.5, 2.0)],
        "tanh": [("lin", -12, 12), ("bits", 1e-30, 20)],
        "sigmoid": [("lin", -110, 110), ("bits", 1e-30, 110), ("bits", -1e-30, -110)],
        "erf": [("lin", -5, 5), ("bits", 1e-30, 5)],
        "sin": [("lin", -10, 10), ("bits", 1e-30, 2.0**20), ("lin", -2.0**20, 2.0**20)],
        "cos": [("lin", -10, 10), ("bits", 1e-30, 2.0**20), ("lin", -2.0**20, 2.0**20)],
    },
    "float64": {
        "exp": [("lin", -750, 712), ("bits", 1e-300, 712), ("bits", -1e-300, -750)],
        "log": [("bits", 5e-324, 1.7e308), ("lin", 0.5, 2.0)],
        "tanh": [("lin", -25, 25), ("bits", 1e-300, 25)],
        "sigmoid": [("lin", -750, 750), ("bits", 1e-300, 750), ("bits", -1e-300, -750)],
        "erf": [("lin", -7, 7), ("bits", 1e-300, 7)],
        "sin": [("lin", -10, 10), ("bits", 1e-300, 2.0**20), ("lin", -2.0**20, 2.0**20)],
        "cos": [("lin", -10, 10), ("bits", 1e-300, 2.0**20), ("lin", -2.0**20, 2.0**20)],
    },
}

MEASURED: dict[tuple[str, str, str], float] = {}  # the worst errors seen, for -s runs

_ITYPE = {"float32": np.int32, "float64": np.int64}


def _inputs(dtype: str, mode: str, lo: float, hi: float, n: int) -> np.ndarray:
    if mode == "lin":
        return np.linspace(lo, hi, n).astype(dtype)
    it = _ITYPE[dtype]
    a, b = np.array(lo, dtype).view(it), np.array(hi, dtype).view(it)
    return np.linspace(a, b, n).astype(it).view(dtype)


# --- the oracle --------------------------------------------------------------------------------


def _erf_exact(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        # Through text: an mpf converts to long double by way of float64.
        return np.array([np.longdouble(mpmath.nstr(mpmath.erf(mpmath.mpf(float(v))), 30))
                         for v in x], dtype=np.longdouble)


def exact(op: str, x: np.ndarray) -> np.ndarray:
    """``op(x)`` in a wider type than ``x``'s: float64 for float32, long double for float64."""
    dtype = x.dtype.name
    if op == "erf":
        return _erf_exact(x, dtype)
    w = x.astype(np.float64 if dtype == "float32" else np.longdouble)
    with np.errstate(all="ignore"):
        if op == "sigmoid":
            return 1 / (1 + np.exp(-w))
        return getattr(np, op)(w)


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got − ref| in ulp of the correctly rounded result (finite results only)."""
    dtype = got.dtype
    with np.errstate(over="ignore"):
        rounded = ref.astype(dtype)
    ulp = np.spacing(np.abs(rounded)).astype(ref.dtype)
    ulp[ulp == 0] = np.finfo(dtype).smallest_subnormal
    finite = np.isfinite(rounded)
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(ref.dtype) - ref) / ulp
    return np.where(finite, err, 0.0).astype(np.float64)


# --- kernels -----------------------------------------------------------------------------------


def _kernel(op: str, dtype: str, n: int, lanes: int) -> Kernel:
    x, y, i = Buffer("x", (n,), dtype), Buffer("y", (n,), dtype), Var("i")
    if lanes == 1:
        body = For(i, Const(0), Const(n), Store(y, (i,), Unary(op, Load(x, (i,)))), "vectorized")
    else:
        body = For(i, Const(0), Const(n // lanes),
                   Store(y, (i * lanes,), Unary(op, Load(x, (i * lanes,), lanes))))
    return Kernel(f"{op}_{dtype}_x{lanes}", (x,), (y,), body)


def _native(kernel: Kernel, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    compile_kernels([kernel])[kernel.name](x, y)
    return y


def _check_accuracy(op: str, x: np.ndarray, got: np.ndarray, what: str) -> float:
    ref = exact(op, x)
    err = ulp_error(got, ref)
    worst = int(np.argmax(err))
    bound = BOUND[x.dtype.name][op]
    assert err[worst] <= bound, (f"{what}: {op}({x[worst]!r}) = {got[worst]!r}, exact "
                                 f"{ref[worst]!r}: {err[worst]:.2f} ulp")
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = ref.astype(x.dtype)
    infinite = ~np.isfinite(rounded)
    np.testing.assert_array_equal(got[infinite], rounded[infinite], err_msg=what)
    return float(err[worst])


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_native_accuracy_within_the_documented_bound(op: str, dtype: str) -> None:
    n = 4096 if (op, dtype) == ("erf", "float64") else N  # mpmath, the oracle, is slow
    kernels = [decompose_math(_kernel(op, dtype, n, lanes)) for lanes in (1, 8)]
    for k in kernels:
        verify(k)
    lib = compile_kernels(kernels)
    for mode, lo, hi in SWEEPS[dtype][op]:
        x = _inputs(dtype, mode, lo, hi, n)
        for k in kernels:
            y = np.empty_like(x)
            lib[k.name](x, y)
            worst = _check_accuracy(op, x, y, f"{k.name}, {mode} sweep over [{lo}, {hi}]")
            MEASURED[(op, dtype, "native")] = max(MEASURED.get((op, dtype, "native"), 0), worst)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_evaluator_agrees_with_machine_code_and_oracle(op: str, dtype: str) -> None:
    x = np.concatenate([_inputs(dtype, mode, lo, hi, SAMPLE)
                        for mode, lo, hi in SWEEPS[dtype][op]])
    for lanes in (1, 8):
        k = _kernel(op, dtype, len(x), lanes)
        got = evaluate(k, x)[0]
        np.testing.assert_array_equal(got, _native(k, x), err_msg=f"{k.name}: evaluator")
        worst = _check_accuracy(op, x, got, f"{k.name} on the evaluator")
        MEASURED[(op, dtype, "evaluator")] = max(MEASURED.get((op, dtype, "evaluator"), 0),
                                                 worst)


SPECIAL = {
    "float32": [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 88.72283, 88.7229, 89.5, -87.3,
                -103.0, -103.98, -104.5, 1e-45, -1e-45, 1.17549435e-38, 3.4e38, -3.4e38, 9.0,
                -9.0, 3.92, -3.92, 1e-20, 0.625, -0.625],
    "float64": [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 709.78, 709.79, 710.5, -708.4,
                -744.4, -745.1, -745.2, -746.0, 5e-324, -5e-324, 2.2250738585072014e-308,
                1.7e308, -1.7e308, 19.0, -19.0, 5.92, -5.92, 6.5, 1e-200, 0.625, -0.625],
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_special_values(op: str, dtype: str) -> None:
    x = np.array(SPECIAL[dtype], dtype=dtype)
    k = _kernel(op, dtype, len(x), 1)
    out = _native(k, x)
    np.testing.assert_array_equal(evaluate(k, x)[0], out)
    ref = exact(op, x)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = ref.astype(dtype)
    nan = np.isnan(rounded)
    assert np.array_equal(np.isnan(out), nan), f"{op}: NaN where {x[np.isnan(out) != nan]}"
    big = np.abs(x) > 2.0**20
    if op in ("sin", "cos"):  # beyond the accurate range: only bounded
        assert np.all(np.abs(out[big & ~nan]) <= 1.0)
    keep = ~nan & ~(big if op in ("sin", "cos") else False)
    assert np.all(ulp_error(out[keep], ref[keep]) <= BOUND[dtype][op])
    inf = np.isinf(rounded) & keep
    np.testing.assert_array_equal(out[inf], rounded[inf])
    if op in ("tanh", "erf", "sin"):  # odd functions keep the sign of zero
        assert np.signbit(out[4]) and not np.signbit(out[3])


def test_the_pass_is_idempotent_and_leaves_valid_core_ir() -> None:
    x, y, i = Buffer("x", (16,), "float32"), Buffer("y", (16,), "float32"), Var("i")
    t = Var("t", "float32")
    value = Load(x, (i,))
    body = For(i, Const(0), Const(16), LetStmt(t, Unary("exp", value), Seq((
        IfThenElse(Binary("lt", value, Const(0.0, "float32")),
                   Store(y, (i,), Unary("tanh", Unary("sin", t))),
                   Store(y, (i,), Binary("add", Unary("log", t), Unary("erf", value)))),))))
    k = Kernel("mixed", (x,), (y,), body)
    assert has_transcendentals(k)
    d = decompose_math(k)
    verify(d)
    assert not has_transcendentals(d)
    assert decompose_math(d) is d
    assert "bitcast<int32>" in kernel_text(d)
    xs = np.linspace(-2, 2, 16).astype(np.float32)
    got = evaluate(k, xs)[0]
    np.testing.assert_array_equal(got, _native(d, xs))
    np.testing.assert_array_equal(got, _native(k, xs))  # the emitter decomposes by itself too
    e = np.exp(xs.astype(np.float64)).astype(np.float32).astype(np.float64)
    want = np.where(xs < 0, np.tanh(np.sin(e)),
                    np.log(e) + np.vectorize(math.erf)(xs.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "int32", "int64", "uint8"])
def test_other_dtypes_compute_in_a_float_and_convert(dtype: str) -> None:
    xs = (np.linspace(0, 4, 32) if dtype.startswith("float") else np.arange(32)).astype(dtype)
    wide = "float32" if dtype == "float16" else "float64"
    for op in ("exp", "log", "sin", "cos"):  # none lands on an integer but where exact
        k = _kernel(op, dtype, 32, 1)
        d = decompose_math(k)
        verify(d)
        got, native = evaluate(d, xs)[0], _native(d, xs)
        with np.errstate(all="ignore"):
            want = getattr(np, op)(xs.astype(wide))
        if dtype == "float16":
            np.testing.assert_array_equal(got, native, err_msg=f"{op} on {dtype}")
            np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-3)
            continue
        # Where the float result fits the integer type (beyond, the machine saturates and
        # numpy wraps, as for any conversion: see codegen/arith.py).
        fits = np.isfinite(want) & (np.abs(want) < np.iinfo(dtype).max)
        np.testing.assert_array_equal(got[fits], native[fits], err_msg=f"{op} on {dtype}")
        np.testing.assert_array_equal(got[fits], want[fits].astype(dtype))


def teardown_module() -> None:
    for key in sorted(MEASURED):
        print(f"\n{' '.join(key)}: {MEASURED[key]:.2f} ulp", end="")
