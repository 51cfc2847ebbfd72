"""The qnn operators against numpy references written here, bit for bit, through the reference
interpreter (their numpy computes) and kiln.build (their canonical forms compiled: nn.dense /
nn.conv2d of 8-bit integers accumulating in int32), on awkward shapes: odd sizes, reduction
lengths that are not multiples of 4, 16 or 64, per-channel kernel scales and zero points.

The requantize oracle is TVM's definition in Python integers: the ratio of the float32 scales
in double is m * 2**(e - 31) with m = round(frac * 2**31) (frexp), and the product
(x - zp) * m * 2**e / 2**31 is rounded halves up (UPWARD) or halves away from zero (TONEAREST).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.errors import Error, TypeCheckError
from kiln.ir.expr import Function, Var, const
from kiln.ir.ty import TensorType

from .helpers import covers

RNG = np.random.default_rng(7)


def _ints(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _run_both(params, body, *values):
    """(interpreted, compiled) results of Function(params, body) on values."""
    f = Function(list(params), body)
    interpreted = np.asarray(kiln.interpret(f, *values))
    compiled = np.asarray(kiln.build(f)(*values))
    return interpreted, compiled


def _tvm_multiplier(ratio: float) -> tuple[int, int]:
    frac, exp = math.frexp(ratio)
    m = int(Fraction(frac) * 2**31 + Fraction(1, 2)) if frac >= 0 else 0  # std::round, > 0
    if m == 2**31:
        m, exp = m // 2, exp + 1
    return m, exp


def _rescale(v: int, ratio: float, rounding: str) -> int:
    m, exp = _tvm_multiplier(ratio)
    exact = Fraction(v * m) * Fraction(2) ** exp / 2**31
    floor = math.floor(exact)
    if exact - floor == Fraction(1, 2):
        return floor + 1 if (rounding == "UPWARD" or exact > 0) else floor
    return round(exact)  # not a half: nearest


def requantize_ref(x, in_scale, in_zp, out_scale, out_zp, dtype, rounding="UPWARD", axis=-1):
    x = np.asarray(x).astype(np.int64)
    ins = np.broadcast_to(np.float32(in_scale), (x.shape[axis],))
    outs = np.broadcast_to(np.float32(out_scale), (x.shape[axis],))
    zin = np.broadcast_to(np.int64(in_zp), (x.shape[axis],))
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape, np.int64)
    for idx in np.ndindex(moved.shape):
        c = idx[-1]
        ratio = float(np.float64(ins[c]) / np.float64(outs[c]))
        out[idx] = _rescale(int(moved[idx]) - int(zin[c]), ratio, rounding) + int(out_zp)
    info = np.iinfo(dtype)
    return np.moveaxis(np.clip(out, info.min, info.max), -1, axis).astype(dtype)


# --- quantize / dequantize -----------------------------------------------------------------


@covers("qnn.quantize", "qnn.dequantize")
@pytest.mark.parametrize("out_dtype", ["int8", "uint8"])
def test_quantize_and_dequantize_per_tensor_and_per_channel(out_dtype) -> None:
    x = (RNG.standard_normal((3, 5, 7)) * 3).astype("float32")
    x[0, 0, :4] = [0.25, 0.75, -0.25, -1.25]  # exact halves at scale 0.5
    zp = 3 if out_dtype == "int8" else 128
    scales = np.array([0.5, 0.02, 0.031, 0.1, 0.5], "float32")  # per channel on axis 1
    xv = Var("x", TensorType(x.shape, "float32"))
    for scale, axis in ((np.float32(0.5), -1), (scales, 1)):
        for rounding, rnd in (("HALF_AWAY", lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5)),
                              ("HALF_TO_EVEN", np.rint)):
            s = scale.reshape(-1, 1) if np.ndim(scale) else scale
            expected = np.clip(rnd(x / s) + zp, *_range(out_dtype)).astype(out_dtype)
            q = op.qnn.quantize(xv, const(scale), const(zp, "int32"), axis=axis,
                                out_dtype=out_dtype, rounding=rounding)
            for got in _run_both([xv], q, x):
                np.testing.assert_array_equal(got, expected)
            # dequantize of those integers: (q - zp) * scale in float32
            qv = Var("q", TensorType(x.shape, out_dtype))
            dq = op.qnn.dequantize(qv, const(scale), const(zp, "int32"), axis=axis)
            want = ((expected.astype(np.int32) - zp).astype(np.float32) * s).astype("float32")
            for got in _run_both([qv], dq, expected):
                np.testing.assert_array_equal(got, want)


def _range(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def test_quantize_gradient_is_straight_through() -> None:
    # The rule itself (kiln's AD stops at integer values, as at cast): d q / d x = 1 / scale.
    x = RNG.standard_normal((4, 3)).astype("float32")
    xv = Var("x", TensorType(x.shape, "float32"))
    gv = Var("g", TensorType(x.shape, "int8"))
    scale = np.array([0.25, 0.5, 2.0], "float32")
    q = op.qnn.quantize(xv, const(scale), const(0, "int32"), axis=1)
    typed = kiln.infer_types(Function([xv], q)).body
    (dx, _, _) = kiln.op.get("qnn.quantize").gradient(typed, gv)
    g = RNG.integers(-5, 6, x.shape).astype("int8")
    got = np.asarray(kiln.interpret(Function([xv, gv], dx), x, g))
    np.testing.assert_array_equal(got, g.astype("float32") / scale)


# --- requantize ----------------------------------------------------------------------------


@covers("qnn.requantize")
@pytest.mark.parametrize("rounding", ["UPWARD", "TONEAREST", "None"])
def test_requantize_matches_tvms_fixed_point(rounding) -> None:
    x = RNG.integers(-20000, 20000, (3, 7)).astype("int32")
    x[0, :6] = [-3, -1, 1, 3, 5, -5]  # halves at ratio 0.5
    xv = Var("x", TensorType(x.shape, "int32"))
    mode = "UPWARD" if rounding == "None" else rounding
    cases = [(np.float32(0.5), 0, np.float32(1.0), 0, "int32", -1),
             (np.float32(0.0123), 7, np.float32(0.5), -3, "int8", -1),
             (np.float32(3.7e-4), -2, np.float32(0.08), 128, "uint8", -1),
             (np.linspace(0.001, 0.3, 7).astype("float32"), 0, np.float32(0.3), 5, "int8", 1)]
    for in_s, in_z, out_s, out_z, dtype, axis in cases:
        expected = requantize_ref(x, in_s, in_z, out_s, out_z, dtype, mode, axis)
        r = op.qnn.requantize(xv, const(in_s), const(in_z, "int32"), const(out_s),
                              const(out_z, "int32"), axis=axis, rounding=rounding,
                              out_dtype=dtype)
        for got in _run_both([xv], r, x):
            np.testing.assert_array_equal(got, expected)


# --- dense / batch_matmul / conv2d ---------------------------------------------------------


def _dense_ref(x, w, zx, zw):
    zw = np.asarray(zw, np.int64).reshape(-1, 1) if np.ndim(zw) else np.int64(zw)
    return ((x.astype(np.int64) - zx) @ (w.astype(np.int64) - zw).T).astype(np.int32)


@covers("qnn.dense")
@pytest.mark.parametrize(("batch", "k", "units"), [(1, 3, 1), (5, 37, 9), (3, 67, 17)])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_dense_exact(batch, k, units, dtype) -> None:
    x = _ints((batch, k), dtype)
    w = _ints((units, k), "int8")
    xv = Var("x", TensorType(x.shape, dtype))
    for zx, zw in ((0, 0), (131 if dtype == "uint8" else -5, 0),
                   (17, RNG.integers(-4, 5, units).astype("int32"))):
        y = op.qnn.dense(xv, const(w), const(zx, "int32"), const(np.asarray(zw, "int32")),
                         const(np.float32(0.1)), const(np.float32(0.2)))
        for got in _run_both([xv], y, x):
            np.testing.assert_array_equal(got, _dense_ref(x, w, zx, zw))


@covers("qnn.batch_matmul")
@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(False, True), (True, False)])
def test_batch_matmul_exact(transpose_a, transpose_b) -> None:
    b, m, k, n = 2, 5, 19, 3
    x = _ints((b, k, m) if transpose_a else (b, m, k), "uint8")
    y = _ints((b, n, k) if transpose_b else (b, k, n), "int8")
    xv, yv = Var("x", TensorType(x.shape, "uint8")), Var("y", TensorType(y.shape, "int8"))
    zx, zy = 100, -3
    out = op.qnn.batch_matmul(xv, yv, const(zx, "int32"), const(zy, "int32"),
                              const(np.float32(1.0)), const(np.float32(1.0)),
                              transpose_a=transpose_a, transpose_b=transpose_b)
    a = x.astype(np.int64) - zx
    c = y.astype(np.int64) - zy
    a = a.transpose(0, 2, 1) if transpose_a else a
    c = c.transpose(0, 2, 1) if transpose_b else c
    expected = np.einsum("bmk,bkn->bmn", a, c).astype(np.int32)
    for got in _run_both([xv, yv], out, x, y):
        np.testing.assert_array_equal(got, expected)


def _conv_ref(x, w, zx, zw, stride, pad, dilation, groups):
    """Direct loops in int64: the padding is the zero point (the real value 0)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)),
                constant_values=zx) - zx
    zw = np.broadcast_to(np.asarray(zw, np.int64), (o,))
    wc = w.astype(np.int64) - zw.reshape(-1, 1, 1, 1)
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    per = o // groups
    for oc in range(o):
        g = oc // per
        for i in range(oh):
            for j in range(ow):
                win = xp[:, g * cg:(g + 1) * cg, i * stride: i * stride + dilation * (kh - 1) + 1:
                         dilation, j * stride: j * stride + dilation * (kw - 1) + 1: dilation]
                out[:, oc, i, j] = np.sum(win * wc[oc], axis=(1, 2, 3))
    return out.astype(np.int32)


@covers("qnn.conv2d")
@pytest.mark.parametrize(("shape", "wshape", "stride", "pad", "dilation", "groups"), [
    ((1, 3, 7, 9), (5, 3, 3, 3), 1, 1, 1, 1),
    ((2, 6, 9, 8), (4, 3, 3, 2), 2, 2, 1, 2),
    ((1, 5, 11, 11), (5, 1, 3, 3), 1, 1, 2, 5),  # depthwise, dilated
])
def test_conv2d_exact(shape, wshape, stride, pad, dilation, groups) -> None:
    x = _ints(shape, "uint8")
    w = _ints(wshape, "int8")
    xv = Var("x", TensorType(x.shape, "uint8"))
    o = wshape[0]
    for zx, zw in ((0, 0), (121, 0), (121, RNG.integers(-3, 4, o).astype("int32"))):
        y = op.qnn.conv2d(xv, const(w), const(zx, "int32"), const(np.asarray(zw, "int32")),
                          const(np.float32(0.1)), const(np.full(o, 0.2, "float32")),
                          strides=stride, padding=pad, dilation=dilation, groups=groups,
                          kernel_size=wshape[2:], channels=o)
        for got in _run_both([xv], y, x):
            np.testing.assert_array_equal(
                got, _conv_ref(x, w, zx, zw, stride, pad, dilation, groups))


# --- add / mul / concatenate ---------------------------------------------------------------


@covers("qnn.add", "qnn.mul")
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_add_and_mul(dtype) -> None:
    a, b = _ints((3, 1, 5), dtype), _ints((4, 5), dtype)  # broadcasting
    av, bv = Var("a", TensorType(a.shape, dtype)), Var("b", TensorType(b.shape, dtype))
    ls, lz, rs, rz, os_, oz = (np.float32(0.05), 3, np.float32(0.013), -2, np.float32(0.07), 9)
    if dtype == "uint8":
        lz, rz, oz = 128, 120, 131
    args = [const(ls), const(lz, "int32"), const(rs), const(rz, "int32"), const(os_),
            const(oz, "int32")]
    a64, b64 = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
    # add: each side requantized to the output scale (zero point 0, int32), then summed.
    ra = requantize_ref(a64, ls, lz, os_, 0, "int32")
    rb = requantize_ref(b64, rs, rz, os_, 0, "int32")
    lo, hi = _range(dtype)
    add_expected = np.clip(ra.astype(np.int64) + rb + oz, lo, hi).astype(dtype)
    for got in _run_both([av, bv], op.qnn.add(av, bv, *args), a, b):
        np.testing.assert_array_equal(got, add_expected)
    # mul: (a - za)(b - zb) in the scale ls * rs (float32), requantized to the output.
    product = (a64 - lz) * (b64 - rz)
    mul_expected = requantize_ref(product, np.float32(ls * rs), 0, os_, oz, dtype)
    for got in _run_both([av, bv], op.qnn.mul(av, bv, *args), a, b):
        np.testing.assert_array_equal(got, mul_expected)


@covers("qnn.concatenate")
def test_concatenate_requantizes_each_input() -> None:
    from kiln.ir.expr import Tuple

    a, b = _ints((2, 3, 5), "uint8"), _ints((2, 4, 5), "uint8")
    av, bv = Var("a", TensorType(a.shape, "uint8")), Var("b", TensorType(b.shape, "uint8"))
    scales = Tuple((const(np.float32(0.1)), const(np.float32(0.037))))
    zps = Tuple((const(128, "int32"), const(100, "int32")))
    out = op.qnn.concatenate(Tuple((av, bv)), scales, zps, const(np.float32(0.1)),
                             const(128, "int32"), axis=1)
    expected = np.concatenate([a, requantize_ref(b, 0.037, 100, 0.1, 128, "uint8")], axis=1)
    for got in _run_both([av, bv], out, a, b):
        np.testing.assert_array_equal(got, expected)


# --- relations, text -------------------------------------------------------------------------


def test_relations_reject_wrong_dtypes_and_shapes() -> None:
    f32 = Var("x", TensorType((2, 4), "float32"))
    w = const(np.zeros((3, 4), "int8"))
    z, s = const(0, "int32"), const(np.float32(1.0))
    with pytest.raises(TypeCheckError, match="data must have dtype int8 or uint8"):
        kiln.infer_types(Function([f32], op.qnn.dense(f32, w, z, z, s, s)))
    u8 = Var("x", TensorType((2, 5), "uint8"))
    with pytest.raises(TypeCheckError, match="reduction dimension"):
        kiln.infer_types(Function([u8], op.qnn.dense(u8, w, z, z, s, s)))
    with pytest.raises(TypeCheckError, match="kernel scale has 2 entries"):
        bad = const(np.ones(2, "float32"))
        kiln.infer_types(Function([u8], op.qnn.dense(
            Var("y", TensorType((2, 4), "uint8")), w, z, z, s, bad)))
    with pytest.raises(TypeCheckError, match="output zero point must have dtype int32"):
        kiln.infer_types(Function([f32], op.qnn.quantize(f32, s, const(0, "int8"))))
    with pytest.raises(TypeCheckError, match="compute_dtype"):
        i32 = Var("x", TensorType((2,), "int32"))
        kiln.infer_types(Function([i32], op.qnn.requantize(i32, s, z, s, z,
                                                          compute_dtype="float32")))


def test_requantize_needs_constant_scales_to_compile() -> None:
    x = Var("x", TensorType((4,), "int32"))
    s = Var("s", TensorType((), "float32"))
    f = Function([x, s], op.qnn.requantize(x, s, const(0, "int32"), const(np.float32(1.0)),
                                           const(0, "int32")))
    with pytest.raises(Error, match="input scale must be a constant"):
        kiln.build(f)


def test_relay_text_round_trip() -> None:
    src = """
    def @main(%x: Tensor[(2, 3), float32]) {
      %0 = qnn.quantize(%x, 0.5f, 1, out_dtype="uint8");
      qnn.dequantize(%0, 0.5f, 1)
    }
    """
    mod = kiln.parse(src)
    assert "qnn.quantize(%x, 0.5f, 1, out_dtype=\"uint8\")" in kiln.astext(mod)
    x = np.array([[0.2, -0.25, 3.0], [100.0, 0.75, -1.0]], "float32")
    got = np.asarray(kiln.interpret(mod, x))
    # -1.0 / 0.5 + 1 = -1 clips to 0 (uint8), which dequantizes to -0.5
    np.testing.assert_array_equal(got, np.array([[0.0, -0.5, 3.0], [100.0, 1.0, -0.5]]))


def test_canonical_form_is_integer_dense_at_every_opt_level() -> None:
    x = Var("x", TensorType((3, 21), "uint8"))
    w = _ints((4, 21), "int8")
    y = op.qnn.dense(x, const(w), const(7, "int32"), const(0, "int32"),
                     const(np.float32(1.0)), const(np.float32(1.0)))
    f = Function([x], y)
    text = kiln.astext(kiln.optimize(kiln.IRModule.from_expr(f), opt_level=0))
    assert "qnn." not in text
    assert any("dense" in line and line.rsplit("ty=", 1)[-1].endswith("int32] */;")
               for line in text.splitlines())
    xs = _ints((3, 21), "uint8")
    got = np.asarray(kiln.build(f, opt_level=0)(xs))
    np.testing.assert_array_equal(got, _dense_ref(xs, w, 7, 0))
