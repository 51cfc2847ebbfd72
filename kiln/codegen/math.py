"""Transcendental functions as inline, branch-free polynomial code (part of the emit stage).

LLVM's ``llvm.exp.*``/``llvm.log.*`` intrinsics become calls to libm, one lane at a time,
which stops the loop vectorizer and costs several times more than straight-line arithmetic.
So float32 ``exp``, ``log``, ``tanh``, ``sigmoid``, ``erf``, ``sin`` and ``cos`` are emitted
as range reduction plus a polynomial, in the style of Cephes and SLEEF, using only
instructions that exist on vectors (FMA, selects, bit casts): scalar code inside a
``vectorized`` loop vectorizes, and vector code (``lanes > 1``) stays in registers. Special
values are handled by selects: NaN in gives NaN; ±inf, overflow (→ inf) and underflow
(into denormals, then 0) give what the float64 reference rounds to; denormal inputs work.

Accuracy, float32: the largest error in ulp of the correctly rounded result, as measured
by tests/codegen/test_math.py over dense sweeps (evenly spaced values and evenly spaced bit
patterns, 2^18 each) against numpy in float64; the test asserts the bound column.

    function  measured  bound   range
    exp       0.99      1       all inputs (denormal results included; inf above 88.72)
    log       0.80      1       all positive inputs (denormals included)
    tanh      1.30      1.5     all inputs
    sigmoid   2.26      2.5     all inputs (the exact 1/(1 + e^-x))
    erf       0.98      1       all inputs
    sin       1.92      2       |x| ≤ 2^20; beyond, the reduction loses accuracy (the result
    cos       1.54      2       stays in [-1, 1]); ±inf gives NaN

The constants are Cephes' (exp, log, tanh, sin, cos) or least-squares fits made with numpy
(erf: x·P(x²) on [0, 1]; on [1, 4] log(erfc(x)) + x² as a polynomial in (x − 2.5)/1.5,
so erfc(x) = exp(that − x²); beyond 3.92, erf rounds to 1).

float16 computes in float32 and rounds; float64 calls libm (see arith.py).
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.llvmtypes import I32, ModuleContext, like, with_element

LOG2E = 1.44269504088896341
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = HI + LO, HI with few bits (Cephes)
EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
         5.0000001201e-1)
LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
         1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
          -3.33332819422e-1)
ERF_SMALL = (7.853861107308402e-05, -0.0008010193681327743, 0.005188327710359514,
             -0.02685381196113562, 0.11283585149711245, -0.37612625824417084,
             0.1283791657267948)  # P(x²) − 1: erf x = x + x·that, one rounding at the end
ERF_LARGE = (-2.1355597255023895e-06, 4.138954682275653e-05, -0.0002225980133516714,
             0.0008815250475890934, -0.0031940771732479334, 0.010961152613162994,
             -0.03664649277925491, 0.12623929977416992, -0.5290210843086243,
             -1.556815266609192)
SIN_P = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
COS_P = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
# π/2 as a sum of three float32s (each the rounding of what remains); with FMA, x − q·A is
# exact, so the reduction keeps about 72 bits of π/2.
PIO2 = (1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15)
TWO_OVER_PI = 0.636619772367581343


class F32:
    """Arithmetic on float32 scalars or vectors of one shape, for writing the polynomials."""

    def __init__(self, mc: ModuleContext, b: ir.IRBuilder, t: ir.Type) -> None:
        self.mc, self.b, self.t = mc, b, t
        self.it = with_element(t, I32)

    def c(self, v: float) -> ir.Constant:
        return like(self.t, v)

    def ci(self, v: int) -> ir.Constant:
        return like(self.it, v)

    def add(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fadd(x, y)

    def sub(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fsub(x, y)

    def mul(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fmul(x, y)

    def div(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fdiv(x, y)

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        return self.mc.call(self.b, "fma", x, y, z)

    def poly(self, x: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
        """Horner's rule, highest coefficient first, with FMAs."""
        acc: ir.Value = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc

    def lt(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered("<", x, y)

    def isnan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def select(self, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.select(cond, x, y)

    def abs(self, x: ir.Value) -> ir.Value:
        return self.mc.call(self.b, "fabs", x)

    def rint(self, x: ir.Value) -> ir.Value:
        return self.mc.call(self.b, "rint", x)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """``x`` limited to [lo, hi] (NaN may come out as either bound: callers mask it)."""
        return self.mc.call(self.b, "minnum", self.mc.call(self.b, "maxnum", x, self.c(lo)),
                            self.c(hi))

    def copysign(self, mag: ir.Value, sign: ir.Value) -> ir.Value:
        return self.mc.call(self.b, "copysign", mag, sign)

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.it)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.t)

    def to_int(self, x: ir.Value) -> ir.Value:
        return self.b.fptosi(x, self.it)

    def to_float(self, i: ir.Value) -> ir.Value:
        return self.b.sitofp(i, self.t)


def exp(f: F32, x: ir.Value) -> ir.Value:
    """e^x: x = k·ln2 + r, e^r by a polynomial on [-ln2/2, ln2/2], scaled by 2^k in two
    steps so that denormal results round once and overflow gives inf."""
    b = f.b
    xc = f.clamp(x, -104.0, 89.0)
    k = f.rint(f.mul(xc, f.c(LOG2E)))
    r = f.fma(k, f.c(-LN2_HI), xc)
    r = f.fma(k, f.c(-LN2_LO), r)
    p = f.add(f.fma(f.poly(r, EXP_P), f.mul(r, r), r), f.c(1.0))
    ki = f.to_int(k)
    k1 = b.ashr(ki, f.ci(1))
    k2 = b.sub(ki, k1)
    s1 = f.from_bits(b.shl(b.add(k1, f.ci(127)), f.ci(23)))
    s2 = f.from_bits(b.shl(b.add(k2, f.ci(127)), f.ci(23)))
    y = f.mul(f.mul(p, s1), s2)
    return f.select(f.isnan(x), x, y)


def log(f: F32, x: ir.Value) -> ir.Value:
    """ln x = e·ln2 + ln m with m in [√½, √2): a polynomial in m − 1 (Cephes logf)."""
    b = f.b
    denormal = f.lt(x, f.c(1.1754943508222875e-38))
    xs = f.select(denormal, f.mul(x, f.c(8388608.0)), x)  # 2^23: denormals become normal
    xi = f.bits(xs)
    e = b.sub(b.and_(b.lshr(xi, f.ci(23)), f.ci(0xFF)), f.ci(126))
    e = b.sub(e, b.select(denormal, f.ci(23), f.ci(0)))
    m = f.from_bits(b.or_(b.and_(xi, f.ci(0x007FFFFF)), f.ci(0x3F000000)))  # in [0.5, 1)
    small = f.lt(m, f.c(0.707106781186547524))
    e = b.sub(e, b.select(small, f.ci(1), f.ci(0)))
    m = f.sub(f.select(small, f.add(m, m), m), f.c(1.0))
    z = f.mul(m, m)
    fe = f.to_float(e)
    y = f.mul(f.mul(f.poly(m, LOG_P), m), z)
    y = f.fma(fe, f.c(LN2_LO), y)
    y = f.fma(z, f.c(-0.5), y)
    r = f.fma(fe, f.c(LN2_HI), f.add(m, y))
    r = f.select(b.fcmp_ordered("==", x, f.c(float("inf"))), x, r)
    r = f.select(b.fcmp_ordered("==", x, f.c(0.0)), f.c(float("-inf")), r)
    return f.select(b.fcmp_unordered("<", x, f.c(0.0)), f.c(float("nan")), r)


def tanh(f: F32, x: ir.Value) -> ir.Value:
    """A polynomial for |x| < 0.625, else 1 − 2/(e^{2|x|} + 1), with x's sign."""
    ax = f.abs(x)
    z = f.mul(x, x)
    small = f.fma(f.mul(f.poly(z, TANH_P), z), x, x)
    e = exp(f, f.add(ax, ax))
    large = f.sub(f.c(1.0), f.div(f.c(2.0), f.add(e, f.c(1.0))))
    large = f.copysign(large, x)
    y = f.select(f.lt(ax, f.c(0.625)), small, large)
    return f.select(f.b.fcmp_ordered("==", x, f.c(0.0)), x, y)  # tanh(±0) = ±0


def sigmoid(f: F32, x: ir.Value) -> ir.Value:
    """1/(1 + e^-x) as e/(1+e) or 1/(1+e) with e = e^-|x| (accurate at both tails)."""
    e = exp(f, f.b.fneg(f.abs(x)))
    d = f.add(f.c(1.0), e)
    return f.select(f.lt(x, f.c(0.0)), f.div(e, d), f.div(f.c(1.0), d))


def erf(f: F32, x: ir.Value) -> ir.Value:
    """x·P(x²) for |x| < 1; else 1 − exp(g(|x|) − x²) with g ≈ log erfc + x², signed."""
    ax = f.abs(x)
    small = f.fma(x, f.poly(f.mul(x, x), ERF_SMALL), x)
    t = f.clamp(ax, 1.0, 4.0)
    g = f.poly(f.mul(f.sub(t, f.c(2.5)), f.c(1.0 / 1.5)), ERF_LARGE)
    tail = exp(f, f.fma(f.b.fneg(t), t, g))
    large = f.copysign(f.sub(f.c(1.0), tail), x)
    y = f.select(f.lt(ax, f.c(1.0)), small, large)
    return f.select(f.isnan(x), x, y)


def _sincos(f: F32, x: ir.Value, quadrant_shift: int) -> ir.Value:
    """sin (shift 0) or cos (shift 1): x = q·π/2 + r, then ±sin r or ±cos r by quadrant."""
    b = f.b
    q = f.rint(f.mul(x, f.c(TWO_OVER_PI)))
    r = x
    for part in PIO2:
        r = f.fma(q, f.c(-part), r)
    z = f.mul(r, r)
    s = f.fma(f.mul(f.poly(z, SIN_P), z), r, r)
    c = f.add(f.fma(f.mul(z, z), f.poly(z, COS_P), f.mul(z, f.c(-0.5))), f.c(1.0))
    # Only q's two low bits matter; clamping keeps the conversion defined for huge |x|.
    qi = b.add(f.to_int(f.clamp(q, -2.0**30, 2.0**30)), f.ci(quadrant_shift))
    use_cos = b.icmp_unsigned("!=", b.and_(qi, f.ci(1)), f.ci(0))
    negate = b.icmp_unsigned("!=", b.and_(qi, f.ci(2)), f.ci(0))
    y = f.select(use_cos, c, s)
    y = f.select(negate, b.fneg(y), y)
    y = f.clamp(y, -1.0, 1.0)
    if quadrant_shift == 0:  # sin(±0) = ±0 (the reduction loses the sign of zero)
        y = f.select(b.fcmp_ordered("==", x, f.c(0.0)), x, y)
    bad = b.fcmp_unordered("==", f.abs(x), f.c(float("inf")))  # ±inf or NaN
    return f.select(bad, f.c(float("nan")), y)


def sin(f: F32, x: ir.Value) -> ir.Value:
    return _sincos(f, x, 0)


def cos(f: F32, x: ir.Value) -> ir.Value:
    return _sincos(f, x, 1)


FLOAT32 = {"exp": exp, "log": log, "tanh": tanh, "sigmoid": sigmoid, "erf": erf, "sin": sin,
           "cos": cos}


def emit_float32(mc: ModuleContext, b: ir.IRBuilder, op: str, x: ir.Value) -> ir.Value:
    """``op(x)`` for a float32 scalar or vector ``x``."""
    return FLOAT32[op](F32(mc, b, x.type), x)
