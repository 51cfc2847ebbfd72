"""The decompose-math pass: transcendental functions as core loop-IR arithmetic.

Lowerings write ``Unary("exp", x)`` and its kin (`TRANSCENDENTAL_OPS`); this pass rewrites
each into range reduction plus a polynomial, in the style of Cephes and SLEEF, using only
core operations that exist on vectors — `FMA`, `Select`, comparisons, `Bitcast` and integer
arithmetic on the bits, ``round``, ``abs``. Both consumers of the loop IR run the result: the
evaluator (evaluate.py, which rounds float32 at every step, like the machine) and the code
generator (codegen/emit_expr.py). So a lowering test on the evaluator exercises the very
approximation the machine code computes, and scalar code in a ``vectorized`` loop still
vectorizes: nothing becomes a call to libm.

Special values are handled by selects: NaN in gives NaN; ±inf, overflow (→ inf) and
underflow (into denormals, then 0) give what the exact result rounds to; denormal inputs
work. float16 computes in float32 and rounds; integer operands compute in float64 (and the
result converts back, as the evaluator always did).

Accuracy: the largest error in ulp of the correctly rounded result, measured by
tests/loops/test_decompose_math.py (dense sweeps, against numpy in float64 for float32 and
against numpy's long double or mpmath for float64; the tests assert the bound column).

    function  float32  float64  bound   range
    exp       0.98     0.99     1       all inputs (inf above 88.72 / 709.78)
    log       0.78     0.82     1       all positive inputs (denormals included)
    tanh      1.20     1.21     1.5     all inputs
    sigmoid   2.10     1.93     2.5     all inputs (the exact 1/(1 + e^-x))
    erf       0.94     0.91     1       all inputs
    sin       1.46     1.44     2       |x| ≤ 2^20; beyond, the reduction loses accuracy (the
    cos       1.47     1.44     2       result stays in [-1, 1]); ±inf gives NaN

float32 constants are Cephes' (exp, log, tanh, sin, cos) or least-squares fits made with
numpy (erf: x·P(x²) on [0, 1]; on [1, 4], log(erfc(x)) + x² as a polynomial in
(x − 2.5)/1.5, so erfc(x) = exp(that − x²); beyond 3.92, erf rounds to 1). float64 uses
Taylor coefficients (exp, sin, cos, and log's atanh series in s = f/(2 + f)) or polynomials
interpolated at Chebyshev nodes in 60-digit arithmetic (mpmath) and rounded: tanh as
x + x³·P(x²) on |x| < 0.625; erf as x·P(x²) on [0, 1] and, on [1, 6], log(erfc(x)) + x² in
(x − 3.5)/2.5, degree 24, fitted for the error it makes in erf (beyond 5.9, erf rounds to 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.errors import InternalError
from kiln.loops.ir import (
    FMA,
    TRANSCENDENTAL_OPS,
    Allocate,
    Binary,
    Bitcast,
    Broadcast,
    Cast,
    Check,
    Const,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Prefetch,
    Select,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Unary,
)

TRANSCENDENTAL = TRANSCENDENTAL_OPS
"""The unary operations this pass rewrites: a kernel with none of them needs no pass."""


# --- constants ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Consts:
    """What the algorithms need to know about one float format."""

    int_dtype: str
    mantissa_bits: int
    bias: int
    exp_lo: float  # exp's input clamp: below, the result is 0; above, inf
    exp_hi: float
    ln2_hi: float  # ln 2 = hi + lo (exp: hi with few bits, or the rounding of ln 2 with FMA)
    ln2_lo: float
    exp_p: tuple[float, ...]  # e^r = 1 + r + r²·P(r)
    tanh_p: tuple[float, ...]  # tanh x = x + x³·P(x²) for |x| < 0.625
    erf_small: tuple[float, ...]  # erf x = x + x·P(x²) for |x| < 1
    erf_large: tuple[float, ...]  # log erfc(x) + x² = P((x − center)/half) on [1, end]
    erf_center: float
    erf_half: float
    erf_end: float
    sin_p: tuple[float, ...]  # sin r = r + r³·P(r²)
    cos_p: tuple[float, ...]  # cos r = 1 − r²/2 + r⁴·P(r²)
    pio2: tuple[float, float, float]  # π/2 as a sum of three floats (x − q·part exact by FMA)


def _taylor(lo: int, hi: int, step: int, first_sign: float) -> tuple[float, ...]:
    """±1/n! for n = lo, lo + step, ..., hi, highest n first; the sign alternates when
    ``step`` is 2 (sin's and cos's series) and starts as ``first_sign``."""
    out = []
    sign = first_sign
    for n in range(lo, hi + 1, step):
        f = 1.0
        for k in range(2, n + 1):
            f *= k
        out.append(sign / f)
        if step == 2:
            sign = -sign
    return tuple(reversed(out))


F32 = _Consts(
    int_dtype="int32", mantissa_bits=23, bias=127, exp_lo=-104.0, exp_hi=89.0,
    ln2_hi=0.693359375, ln2_lo=-2.12194440e-4,
    exp_p=(1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
           1.6666665459e-1, 5.0000001201e-1),
    tanh_p=(-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
            -3.33332819422e-1),
    erf_small=(7.853861107308402e-05, -0.0008010193681327743, 0.005188327710359514,
               -0.02685381196113562, 0.11283585149711245, -0.37612625824417084,
               0.1283791657267948),
    erf_large=(-2.1355597255023895e-06, 4.138954682275653e-05, -0.0002225980133516714,
               0.0008815250475890934, -0.0031940771732479334, 0.010961152613162994,
               -0.03664649277925491, 0.12623929977416992, -0.5290210843086243,
               -1.556815266609192),
    erf_center=2.5, erf_half=1.5, erf_end=4.0,
    sin_p=(-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1),
    cos_p=(2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2),
    pio2=(1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15),
)

F64 = _Consts(
    int_dtype="int64", mantissa_bits=52, bias=1023, exp_lo=-746.0, exp_hi=710.0,
    ln2_hi=0.6931471805599453, ln2_lo=2.3190468138462996e-17,
    exp_p=_taylor(2, 13, 1, 1.0),
    tanh_p=(6.485163482793113e-06, -3.12011014257974e-05, 9.257116129556769e-05,
            -0.0002375906496055562, 0.0005896606577757043, -0.0014557754120478055,
            0.0035921217511549622, -0.008863235103240878, 0.021869488519008305,
            -0.05396825396789699, 0.13333333333333042, -0.3333333333333333),
    erf_small=(-4.230945824295338e-12, 8.709045129053106e-11, -1.216456005728345e-09,
               1.4792401209404813e-08, -1.6364642158167616e-07, 1.6462045441468418e-06,
               -1.4925647567519332e-05, 0.00012055332902888736, -0.000854832702193483,
               0.0052239776254232985, -0.02686617064512984, 0.1128379167095512,
               -0.37612638903183754, 0.1283791670955126),
    erf_large=(2.247276352107439e-09, -7.240824974515327e-09, 4.521416204583651e-09,
               4.710840527099266e-09, -2.1580142736303587e-09, 1.8848830089033838e-08,
               -1.2999681259733388e-07, 3.918923288527924e-07, -9.165507592535276e-07,
               1.91269798607734e-06, -3.4204246659666945e-06, 4.56839762190763e-06,
               -1.4780737118311842e-06, -1.847528986000811e-05, 9.090101551597176e-05,
               -0.00030781940159072446, 0.0008935765716880319, -0.0023739973006794987,
               0.005953704477141584, -0.014384548328888422, 0.03412841107971968,
               -0.0816509097178572, 0.20779340786106157, -0.6652489709129766,
               -1.8624374021481738),
    erf_center=3.5, erf_half=2.5, erf_end=6.0,
    sin_p=_taylor(3, 17, 2, -1.0),
    cos_p=_taylor(4, 16, 2, 1.0),
    pio2=(1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33),
)

LOG2E = 1.44269504088896341
TWO_OVER_PI = 0.636619772367581343
# float32 log (Cephes logf): ln m as m − m²/2 + m³·P(m) around 1.
LOG32_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
           1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
           3.3333331174e-1)
# float64 log: ln 2 = HI + LO with HI of 42 bits, so that e·HI is exact for any exponent e.
LN2_HI42, LN2_LO42 = 0.6931471805598903, 5.497923018708371e-14


# --- arithmetic on one float format, as loop-IR expressions -----------------------------------


class _F:
    """Builds loop-IR arithmetic on float scalars or vectors of one dtype and width."""

    def __init__(self, dtype: str, lanes: int) -> None:
        self.dtype, self.lanes = dtype, lanes
        self.k = F32 if dtype == "float32" else F64
        self.it = self.k.int_dtype

    def c(self, v: float) -> Expr:
        return Const(float(v), self.dtype, self.lanes)

    def ci(self, v: int) -> Expr:
        return Const(int(v), self.it, self.lanes)

    def add(self, x: Expr, y: Expr) -> Expr:
        return Binary("add", x, y)

    def sub(self, x: Expr, y: Expr) -> Expr:
        return Binary("sub", x, y)

    def mul(self, x: Expr, y: Expr) -> Expr:
        return Binary("mul", x, y)

    def div(self, x: Expr, y: Expr) -> Expr:
        return Binary("div", x, y)

    def fma(self, x: Expr, y: Expr, z: Expr) -> Expr:
        return FMA(x, y, z)

    def poly(self, x: Expr, coeffs: tuple[float, ...]) -> Expr:
        """Horner's rule, highest coefficient first, with FMAs."""
        acc = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc

    def lt(self, x: Expr, y: Expr) -> Expr:
        return Binary("lt", x, y)

    def eq(self, x: Expr, y: Expr) -> Expr:
        return Binary("eq", x, y)

    def isnan(self, x: Expr) -> Expr:
        return Binary("ne", x, x)

    def select(self, cond: Expr, x: Expr, y: Expr) -> Expr:
        return Select(cond, x, y)

    def abs(self, x: Expr) -> Expr:
        return Unary("abs", x)

    def round(self, x: Expr) -> Expr:
        return Unary("round", x)

    def clamp(self, x: Expr, lo: float, hi: float) -> Expr:
        """``x`` limited to [lo, hi]; NaN comes out as ``lo`` (so that a conversion of it to
        an integer is defined: callers mask NaN lanes at the end)."""
        above = self.select(Binary("gt", x, self.c(lo)), x, self.c(lo))
        return self.select(self.lt(above, self.c(hi)), above, self.c(hi))

    def bits(self, x: Expr) -> Expr:
        return Bitcast(self.it, x)

    def from_bits(self, i: Expr) -> Expr:
        return Bitcast(self.dtype, i)

    def copysign(self, mag: Expr, sign: Expr) -> Expr:
        top = 1 << (_width(self.it) - 1)
        magnitude = Binary("and", self.bits(mag), self.ci(top - 1))
        return self.from_bits(Binary("or", magnitude, Binary("and", self.bits(sign),
                                                               self.ci(-top))))

    def to_int(self, x: Expr) -> Expr:
        return Cast(self.it, x)

    def to_float(self, i: Expr) -> Expr:
        return Cast(self.dtype, i)

    def pow2(self, k: Expr) -> Expr:
        """2^k for an integer k within the normal exponents, built from its bits."""
        return self.from_bits(Binary("mul", Binary("add", k, self.ci(self.k.bias)),
                                     self.ci(1 << self.k.mantissa_bits)))


def _width(dtype: str) -> int:
    return 64 if dtype.endswith("64") else 32


# --- the functions -----------------------------------------------------------------------------


def _exp(f: _F, x: Expr, tiny_results: bool = True, bounded: bool = False) -> Expr:
    """e^x: x = n·ln2 + r, e^r = p by a polynomial on [-ln2/2, ln2/2], then p·2^n by adding
    n to p's exponent bits, exact where the result is a normal float.

    Above the largest float the sum of the bits passes inf's and gives inf. Below the
    smallest normal float, where ``tiny_results`` says that can happen, the result is p·2^n
    rounded to a multiple of the smallest denormal, read from the bits of a sum, not a
    product: a multiplication whose result is denormal (or underflows to 0) takes a
    microcode assist on x86 without flush-to-zero, about 150 cycles, and had made a causal
    softmax, half its inputs masked, 4× slower. The results are bit for bit the rounding
    of p·2^n that two scaling products gave before.

    n is x·log₂e rounded to even by adding 1.5·2^(mantissa bits), whose sum holds n in its
    low bits: one addition for both n and its integer (a conversion to an integer, with its
    saturation rules, was scalarized lane by lane: an exp went 10× slower). A ``bounded`` x
    is known to be a number whose e^x is a normal float (erf's tail): no clamp, no inf, no
    NaN to pass on."""
    k = f.k
    xc = x if bounded else f.clamp(x, k.exp_lo, k.exp_hi)
    magic = f.c(1.5 * 2.0 ** k.mantissa_bits)
    held = f.add(f.mul(xc, f.c(LOG2E)), magic)
    n = f.sub(held, magic)
    r = f.fma(n, f.c(-k.ln2_hi), xc)
    r = f.fma(n, f.c(-k.ln2_lo), r)
    p = f.add(f.fma(f.poly(r, k.exp_p), f.mul(r, r), r), f.c(1.0))  # in [0.70, 1.42]
    ni = Binary("sub", f.bits(held), f.bits(magic))  # |n| ≤ 150 for float32, 1100 for 64
    one_exponent = 1 << k.mantissa_bits  # 1 in the exponent field
    y_bits = Binary("add", f.bits(p), Binary("mul", ni, f.ci(one_exponent)))
    if bounded:
        return f.from_bits(y_bits)
    inf_bits = ((1 << (_width(f.it) - 1)) - 1) & ~(one_exponent - 1)
    y = f.select(Binary("lt", y_bits, f.ci(inf_bits)), f.from_bits(y_bits),
                 f.c(float("inf")))
    if tiny_results:
        # A tiny p·2^n is a multiple of the smallest denormal, 2^-s, below 2^(mantissa
        # bits): its bits are the integer p·2^(n + s) rounds to (to even), the low mantissa
        # bits of p·2^(n + s) + 2^(mantissa bits).
        s = k.bias - 1 + k.mantissa_bits
        lowest = 1 - k.bias  # the smallest normal float is 2^lowest
        scale = f.pow2(Binary("add", Binary("min", ni, f.ci(lowest)), f.ci(s)))  # ≥ 2^-2
        v = f.add(f.mul(p, scale), f.c(float(one_exponent)))
        denormal = f.from_bits(Binary("sub", f.bits(v), f.bits(f.c(float(one_exponent)))))
        y = f.select(Binary("lt", y_bits, f.ci(one_exponent)), denormal, y)
    return f.select(f.isnan(x), x, y)


def _exponent_and_mantissa(f: _F, x: Expr, low: float) -> tuple[Expr, Expr]:
    """x = 2^e·m with m in [√½, √2), for positive x (denormals scaled up first)."""
    k = f.k
    mbits = k.mantissa_bits
    denormal = f.lt(x, f.c(2.0 ** (1 - k.bias)))
    xs = f.select(denormal, f.mul(x, f.c(2.0 ** mbits)), x)
    xi = f.bits(xs)
    exp_mask = ((1 << (_width(f.it) - 1)) - 1) & ~((1 << mbits) - 1)
    e = Binary("floordiv", Binary("and", xi, f.ci(exp_mask)), f.ci(1 << mbits))
    e = Binary("sub", e, f.ci(k.bias - 1))
    e = Binary("sub", e, f.select(denormal, f.ci(mbits), f.ci(0)))
    half_bits = (k.bias - 1) << mbits  # the bits of 0.5
    m = f.from_bits(Binary("or", Binary("and", xi, f.ci((1 << mbits) - 1)), f.ci(half_bits)))
    small = f.lt(m, f.c(low))
    e = Binary("sub", e, f.select(small, f.ci(1), f.ci(0)))
    return f.to_float(e), f.select(small, f.add(m, m), m)


def _log_special(f: _F, x: Expr, r: Expr) -> Expr:
    r = f.select(f.eq(x, f.c(float("inf"))), x, r)
    r = f.select(f.eq(x, f.c(0.0)), f.c(float("-inf")), r)
    return f.select(Binary("ge", x, f.c(0.0)), r, f.c(float("nan")))  # x < 0 or NaN


def _log32(f: _F, x: Expr) -> Expr:
    """ln x = e·ln2 + ln m: a polynomial in m − 1 (Cephes logf)."""
    fe, m = _exponent_and_mantissa(f, x, 0.707106781186547524)
    m = f.sub(m, f.c(1.0))
    z = f.mul(m, m)
    y = f.mul(f.mul(f.poly(m, LOG32_P), m), z)
    y = f.fma(fe, f.c(F32.ln2_lo), y)
    y = f.fma(z, f.c(-0.5), y)
    r = f.fma(fe, f.c(F32.ln2_hi), f.add(m, y))
    return _log_special(f, x, r)


def _log64(f: _F, x: Expr) -> Expr:
    """ln x = e·ln2 + ln(1 + g), ln(1 + g) = g − (g²/2 − s·(g²/2 + R(s²))) with
    s = g/(2 + g), R the atanh series 2s²/3 + 2s⁴/5 + ... (|s| ≤ 0.172)."""
    fe, m = _exponent_and_mantissa(f, x, 0.707106781186547524)
    g = f.sub(m, f.c(1.0))
    s = f.div(g, f.add(f.c(2.0), g))
    z = f.mul(s, s)
    series = tuple(2.0 / (2 * n + 1) for n in range(10, 0, -1))
    big_r = f.mul(f.poly(z, series), z)
    hfsq = f.mul(f.mul(g, g), f.c(0.5))
    inner = f.fma(s, f.add(hfsq, big_r), f.mul(fe, f.c(LN2_LO42)))
    r = f.fma(fe, f.c(LN2_HI42), f.sub(g, f.sub(hfsq, inner)))
    return _log_special(f, x, r)


def _tanh(f: _F, x: Expr) -> Expr:
    """A polynomial for |x| < 0.625, else 1 − 2/(e^{2|x|} + 1), with x's sign."""
    ax = f.abs(x)
    z = f.mul(x, x)
    small = f.fma(f.mul(f.poly(z, f.k.tanh_p), z), x, x)
    e = _exp(f, f.add(ax, ax), tiny_results=False)  # e ≥ 1
    large = f.sub(f.c(1.0), f.div(f.c(2.0), f.add(e, f.c(1.0))))
    y = f.select(f.lt(ax, f.c(0.625)), small, f.copysign(large, x))
    return f.select(f.eq(x, f.c(0.0)), x, y)  # tanh(±0) = ±0


def _sigmoid(f: _F, x: Expr) -> Expr:
    """1/(1 + e^-x) as e/(1+e) or 1/(1+e) with e = e^-|x| (accurate at both tails)."""
    e = _exp(f, Unary("neg", f.abs(x)))
    d = f.add(f.c(1.0), e)
    return f.select(f.lt(x, f.c(0.0)), f.div(e, d), f.div(f.c(1.0), d))


def _erf(f: _F, x: Expr) -> Expr:
    """x·P(x²) for |x| < 1; else 1 − exp(g(|x|) − x²) with g ≈ log erfc + x², signed."""
    k = f.k
    ax = f.abs(x)
    small = f.fma(x, f.poly(f.mul(x, x), k.erf_small), x)
    t = f.clamp(ax, 1.0, k.erf_end)
    u = f.mul(f.sub(t, f.c(k.erf_center)), f.c(1.0 / k.erf_half))
    # log erfc(t) in [-39, -1.8]: e^ of it is a normal float
    tail = _exp(f, f.fma(Unary("neg", t), t, f.poly(u, k.erf_large)), bounded=True)
    large = f.copysign(f.sub(f.c(1.0), tail), x)
    return f.select(Binary("ge", ax, f.c(1.0)), large, small)  # NaN: small's, NaN


def _sincos(f: _F, x: Expr, quadrant_shift: int) -> Expr:
    """sin (shift 0) or cos (shift 1): x = q·π/2 + r, then ±sin r or ±cos r by quadrant."""
    k = f.k
    q = f.round(f.mul(x, f.c(TWO_OVER_PI)))
    r = x
    for part in k.pio2:
        r = f.fma(q, f.c(-part), r)
    z = f.mul(r, r)
    s = f.fma(f.mul(f.poly(z, k.sin_p), z), r, r)
    c = f.add(f.fma(f.mul(z, z), f.poly(z, k.cos_p), f.mul(z, f.c(-0.5))), f.c(1.0))
    # Only q's two low bits matter; clamping keeps the conversion defined for huge |x|.
    qi = Binary("add", f.to_int(f.clamp(q, -2.0**30, 2.0**30)), f.ci(quadrant_shift))
    use_cos = Binary("ne", Binary("and", qi, f.ci(1)), f.ci(0))
    negate = Binary("ne", Binary("and", qi, f.ci(2)), f.ci(0))
    y = f.select(use_cos, c, s)
    y = f.select(negate, Unary("neg", y), y)
    y = f.clamp(y, -1.0, 1.0)
    if quadrant_shift == 0:  # sin(±0) = ±0 (the reduction loses the sign of zero)
        y = f.select(f.eq(x, f.c(0.0)), x, y)
    finite = f.lt(f.abs(x), f.c(float("inf")))  # false for ±inf and NaN
    return f.select(finite, y, f.c(float("nan")))


_RULES: dict[str, Callable[[_F, Expr], Expr]] = {
    "exp": _exp,
    "log": lambda f, x: _log32(f, x) if f.dtype == "float32" else _log64(f, x),
    "tanh": _tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
    "sin": lambda f, x: _sincos(f, x, 0),
    "cos": lambda f, x: _sincos(f, x, 1),
}


def expand(op: str, x: Expr) -> Expr:
    """``op(x)`` for a transcendental ``op``, as core arithmetic on ``x`` (which it shares)."""
    if op not in _RULES:
        raise InternalError(f"decompose-math: {op} is not a transcendental function")
    dtype = x.dtype
    if dtype in ("float32", "float64"):
        return _RULES[op](_F(dtype, x.lanes), x)
    if dtype == "float16":
        return Cast(dtype, _RULES[op](_F("float32", x.lanes), Cast("float32", x)))
    if dtype == "bool":
        raise InternalError(f"decompose-math: {op} is not defined on bool")
    # A float function of an integer: computed in float64, converted back.
    return Cast(dtype, _RULES[op](_F("float64", x.lanes), Cast("float64", x)))


# --- the pass ----------------------------------------------------------------------------------

_EXPR_FIELDS: dict[type, tuple[str, ...]] = {
    Binary: ("a", "b"), Unary: ("a",), Cast: ("a",), Bitcast: ("a",),
    Select: ("cond", "a", "b"), Broadcast: ("value",), FMA: ("a", "b", "c"),
}


_COMPOUND_EXPRS = (Binary, Unary, Cast, Bitcast, Select, Broadcast, FMA)


def _expr_children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.indices
    return tuple(getattr(e, name) for name in _EXPR_FIELDS.get(type(e), ()))


def _rebuild_expr(e: Expr, kids: list[Expr]) -> Expr:
    if isinstance(e, Load):
        return dataclasses.replace(e, indices=tuple(kids))
    if not isinstance(e, _COMPOUND_EXPRS):
        raise InternalError(f"decompose-math: {type(e).__name__} has no operands to replace")
    fields: dict[str, Any] = dict(zip(_EXPR_FIELDS[type(e)], kids))
    return dataclasses.replace(e, **fields)


def decompose_expr(root: Expr, memo: dict[int, Expr] | None = None) -> Expr:
    """``root`` with every transcendental call rewritten into core arithmetic (a post-order
    over the expression DAG; ``memo`` maps rewritten nodes, by identity, to their result)."""
    memo = {} if memo is None else memo
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in memo:
            continue
        kids = _expr_children(e)
        if not ready:
            stack.append((e, True))
            stack.extend((c, False) for c in kids if id(c) not in memo)
            continue
        new = [memo[id(c)] for c in kids]
        out = e if all(a is b for a, b in zip(new, kids)) else _rebuild_expr(e, new)
        if isinstance(out, Unary) and out.op in TRANSCENDENTAL:
            out = expand(out.op, out.a)
        memo[id(e)] = out
    return memo[id(root)]


# For each statement type: its expression fields, and its statement fields (a tuple field
# holds several; None is allowed for IfThenElse's else_case).
_STMT_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    For: (("start", "extent"), ("body",)),
    Store: (("indices", "value"), ()),
    LetStmt: (("value",), ("body",)),
    Allocate: ((), ("body",)),
    Seq: ((), ("stmts",)),
    IfThenElse: (("cond",), ("then_case", "else_case")),
    Check: (("cond",), ()),
    TileProduct: (("steps", "a", "b", "c"), ()),
    Prefetch: (("ref",), ()),
}


_STMT_TYPES = (For, Store, LetStmt, Allocate, Seq, IfThenElse, Check, TileProduct, Prefetch)


def _stmt_children(s: Stmt) -> list[Stmt]:
    out: list[Stmt] = []
    for name in _STMT_FIELDS[type(s)][1]:
        v = getattr(s, name)
        if isinstance(v, tuple):
            out.extend(v)
        elif v is not None:
            out.append(v)
    return out


def _rewrite_stmt(root: Stmt, memo: dict[int, Expr]) -> Stmt:
    done: dict[int, Stmt] = {}
    stack: list[tuple[Stmt, bool]] = [(root, False)]
    while stack:
        s, ready = stack.pop()
        if id(s) in done:
            continue
        if not isinstance(s, _STMT_TYPES):
            raise InternalError(f"decompose-math: unknown statement {type(s).__name__}")
        if not ready:
            stack.append((s, True))
            stack.extend((c, False) for c in _stmt_children(s))
            continue
        expr_fields, stmt_fields = _STMT_FIELDS[type(s)]
        changes: dict[str, Any] = {}  # field name -> its rewritten value
        for name in expr_fields:
            v = getattr(s, name)
            if isinstance(v, tuple):
                nt = tuple(decompose_expr(i, memo) for i in v)
                if any(a is not b for a, b in zip(nt, v)):
                    changes[name] = nt
            else:
                ne = decompose_expr(v, memo)
                if ne is not v:
                    changes[name] = ne
        for name in stmt_fields:
            v = getattr(s, name)
            if isinstance(v, tuple):
                ns = tuple(done[id(c)] for c in v)
                if any(a is not b for a, b in zip(ns, v)):
                    changes[name] = ns
            elif v is not None and done[id(v)] is not v:
                changes[name] = done[id(v)]
        done[id(s)] = dataclasses.replace(s, **changes) if changes else s
    return done[id(root)]


def has_transcendentals(kernel: Kernel) -> bool:
    """Whether ``kernel`` still calls a transcendental function (so needs `decompose_math`)."""
    stack: list[Stmt | Expr] = [kernel.body]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Stmt):
            stack.extend(_stmt_children(n))
            for name in _STMT_FIELDS[type(n)][0]:
                v = getattr(n, name)
                stack.extend(v if isinstance(v, tuple) else (v,))
        else:
            if isinstance(n, Unary) and n.op in TRANSCENDENTAL:
                return True
            stack.extend(_expr_children(n))
    return False


def decompose_math(kernel: Kernel) -> Kernel:
    """``kernel`` with every transcendental call rewritten into core loop-IR arithmetic
    (the kernel itself when it has none, so the pass is idempotent)."""
    if not has_transcendentals(kernel):
        return kernel
    body = _rewrite_stmt(kernel.body, {})
    return dataclasses.replace(kernel, body=body)
