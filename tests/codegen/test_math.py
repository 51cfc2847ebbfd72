"""The accuracy of compiled float32 transcendentals, in ulp: kernels that still call them,
emitted directly (the emitter expands each call with kiln/loops/decompose_math.py, whose
approximations these are; tests/loops/test_decompose_math.py covers float64 and the
evaluator).

Each function is compiled alone (a vectorized loop, and explicit 8-lane vectors) and run
over a dense sweep — evenly spaced values, and values evenly spaced in their bit patterns so
that every binade from denormals up is covered — and compared with numpy in float64 (for
erf, Python's math.erf). The error is measured in units in the last place of the correctly
rounded float32 result; the bounds asserted are the ones decompose_math.py documents.
Special values (±inf, NaN, ±0, overflow and underflow edges) must come out exactly as
float64 rounds them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln.codegen import compile_kernels
from kiln.loops.ir import Buffer, Const, For, Kernel, Load, Store, Unary, Var

from ..loops.test_decompose_math import BOUND as DECOMPOSED_BOUND
from ..loops.test_decompose_math import SWEEPS as DECOMPOSED_SWEEPS

N = 1 << 18

erf64 = np.vectorize(math.erf, otypes=[np.float64])
REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": erf64, "sin": np.sin,
             "cos": np.cos, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}

# The float32 bounds documented in kiln/loops/decompose_math.py and the sweeps over which
# they are checked: the same as for the pipeline's decompose-math (one table for both paths).
BOUND = DECOMPOSED_BOUND["float32"]
SWEEPS = DECOMPOSED_SWEEPS["float32"]


def _kernel(op: str, lanes: int) -> Kernel:
    x, y, i = Buffer("x", (N,), "float32"), Buffer("y", (N,), "float32"), Var("i")
    if lanes == 1:
        body = For(i, Const(0), Const(N), Store(y, (i,), Unary(op, Load(x, (i,)))), "vectorized")
    else:
        body = For(i, Const(0), Const(N // lanes),
                   Store(y, (i * lanes,), Unary(op, Load(x, (i * lanes,), lanes))))
    return Kernel(f"{op}_x{lanes}", (x,), (y,), body)


def _inputs(mode: str, lo: float, hi: float) -> np.ndarray:
    if mode == "lin":
        return np.linspace(lo, hi, N).astype(np.float32)
    a, b = np.float32(lo).view(np.int32), np.float32(hi).view(np.int32)
    return np.linspace(a, b, N).astype(np.int32).view(np.float32)


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got − exact| in ulp of the correctly rounded float32 result (finite results only)."""
    with np.errstate(over="ignore"):
        rounded = exact.astype(np.float32)
    ulp = np.spacing(np.abs(rounded)).astype(np.float64)
    ulp[ulp == 0] = 2.0 ** -149
    finite = np.isfinite(rounded)
    with np.errstate(invalid="ignore"):
        return np.where(finite, np.abs(got.astype(np.float64) - exact) / ulp, 0.0)


@pytest.mark.parametrize("op", sorted(SWEEPS))
def test_accuracy_within_the_documented_ulp_bound(op: str) -> None:
    lib = compile_kernels([_kernel(op, 1), _kernel(op, 8)])
    for mode, lo, hi in SWEEPS[op]:
        x = _inputs(mode, lo, hi)
        with np.errstate(all="ignore"):
            exact = REFERENCE[op](x.astype(np.float64))
        for lanes in (1, 8):
            y = np.empty_like(x)
            lib[f"{op}_x{lanes}"](x, y)
            err = ulp_error(y, exact)
            worst = int(np.argmax(err))
            assert err[worst] <= BOUND[op], (
                f"{op}({x[worst]!r}) = {y[worst]!r}, exact {exact[worst]!r}: {err[worst]:.2f} ulp "
                f"({mode} sweep over [{lo}, {hi}], {lanes} lanes)")
            with np.errstate(over="ignore"):
                rounded = exact.astype(np.float32)
            infinite = ~np.isfinite(rounded)
            np.testing.assert_array_equal(y[infinite], rounded[infinite])


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 88.72283, 88.7229, 89.5,
                    -87.3, -103.0, -103.98, -104.5, 1e-45, -1e-45, 1.17549435e-38, 3.4e38,
                    -3.4e38, 9.0, -9.0, 3.92, -3.92, 1e-20], dtype=np.float32)


@pytest.mark.parametrize("op", sorted(SWEEPS))
def test_special_values(op: str) -> None:
    n = len(SPECIAL)
    x, y, i = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32"), Var("i")
    k = Kernel("special", (x,), (y,), For(i, Const(0), Const(n),
                                          Store(y, (i,), Unary(op, Load(x, (i,)))), "vectorized"))
    out = np.empty(n, dtype=np.float32)
    compile_kernels([k])["special"](SPECIAL, out)
    with np.errstate(all="ignore"):
        exact = REFERENCE[op](SPECIAL.astype(np.float64))
        rounded = exact.astype(np.float32)
    nan = np.isnan(rounded)
    assert np.array_equal(np.isnan(out), nan), f"{op}: NaN where {SPECIAL[np.isnan(out) != nan]}"
    big = np.abs(SPECIAL) > 2.0**20
    if op in ("sin", "cos"):  # beyond the accurate range: only bounded
        assert np.all(np.abs(out[big & ~nan]) <= 1.0)
    keep = ~nan & ~(big if op in ("sin", "cos") else False)
    assert np.all(ulp_error(out[keep], exact[keep]) <= BOUND[op])
    inf = np.isinf(rounded) & keep
    np.testing.assert_array_equal(out[inf], rounded[inf])
    if op in ("tanh", "erf", "sin"):  # odd functions keep the sign of zero
        assert np.signbit(out[4]) and not np.signbit(out[3])
