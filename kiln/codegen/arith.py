"""The meaning of loop-IR operations in LLVM instructions (part of the emit stage).

Semantics follow the loop evaluator (numpy), with these choices where numpy leaves the
result undefined, warns, or raises:

- integer division and modulo by zero give 0 (numpy's result; lowerings put a `Check`
  before a division that can see a zero) and ``INT_MIN // -1`` wraps to ``INT_MIN``: no
  instruction that can trap is ever executed;
- float → integer conversion saturates: NaN → 0, values beyond the range clamp to the
  integer type's minimum or maximum (``llvm.fptosi.sat``); numpy gives INT_MIN there;
- ``min``/``max`` on floats propagate NaN, like numpy's ``minimum``/``maximum``;
- ``pow`` on integers with a negative exponent gives 0 (numpy raises);
- float arithmetic is strict IEEE (no fast-math flags): results equal the evaluator's bit
  for bit, except ``FMA`` (one rounding) and ``round`` (``llvm.round``: exactly half away
  from zero; the evaluator's ``sign(x)·floor(|x| + 0.5)`` can round 0.49999997 up).

Transcendental functions never get here: decompose-math (kiln/loops/decompose_math.py)
rewrites them into the core operations below, and `ExprEmitter` expands any it still meets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import numpy as np
from llvmlite import ir

from kiln.codegen.llvmtypes import (
    I1,
    ModuleContext,
    bits,
    kind,
    like,
    mangle,
    value_type,
    with_element,
)
from kiln.errors import InternalError
from kiln.loops.ir import Broadcast, Const, Expr

# Short names for the two llvmlite types every rule takes.
B: TypeAlias = ir.IRBuilder
V: TypeAlias = ir.Value


def _const_value(e: Expr | None) -> object:
    """The constant value of ``e`` (a `Const`, or a `Broadcast` of one), else None."""
    if isinstance(e, Broadcast):
        e = e.value
    return e.value if isinstance(e, Const) else None


# --- binary ------------------------------------------------------------------------------------

_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def binary(mc: ModuleContext, b: B, op: str, dtype: str, x: V, y: V, y_expr: Expr) -> V:
    """``x op y`` for operands of ``dtype``."""
    k = kind(dtype)
    if op in _ICMP:
        if k == "float":
            if op == "ne":
                return b.fcmp_unordered("!=", x, y)
            return b.fcmp_ordered(_FCMP[op], x, y)
        if k == "sint":
            return b.icmp_signed(_ICMP[op], x, y)
        return b.icmp_unsigned(_ICMP[op], x, y)
    table = {"float": _FLOAT, "sint": _INT, "uint": _INT, "bool": _BOOL}[k]
    rule = table.get(op)
    if rule is None:
        raise InternalError(f"codegen: {op} is not defined on {dtype}")
    return rule(mc, b, x, y, k, _const_value(y_expr))


def _float_minmax(pick: str) -> Callable[..., V]:
    def rule(mc: ModuleContext, b: B, x: V, y: V, k: str, cy: object) -> V:
        # numpy: x if x beats y or x is NaN, else y (so NaN in either propagates).
        best = b.select(b.fcmp_ordered(pick, x, y), x, y)
        return b.select(b.fcmp_unordered("uno", x, x), x, best)
    return rule


def _float_floordivmod(mc: ModuleContext, b: B, x: V, y: V) -> tuple[V, V]:
    """numpy's ``divmod`` for floats (npy_divmod): floor quotient and the modulo."""
    zero = like(x.type, 0.0)
    mod = b.frem(x, y)
    div = b.fdiv(b.fsub(x, mod), y)
    fix = b.and_(b.fcmp_unordered("!=", mod, zero),
                 b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", mod, zero)))
    mod_nz = b.select(fix, b.fadd(mod, y), mod)
    div = b.select(fix, b.fsub(div, like(x.type, 1.0)), div)
    mod = b.select(b.fcmp_ordered("==", mod, zero), mc.call(b, "copysign", zero, y), mod_nz)
    floor = mc.call(b, "floor", div)
    floor = b.select(b.fcmp_ordered(">", b.fsub(div, floor), like(x.type, 0.5)),
                     b.fadd(floor, like(x.type, 1.0)), floor)
    q = b.select(b.fcmp_ordered("==", div, zero), mc.call(b, "copysign", zero, b.fdiv(x, y)),
                 floor)
    y_zero = b.fcmp_ordered("==", y, zero)
    return b.select(y_zero, b.fdiv(x, y), q), b.select(y_zero, b.frem(x, y), mod)


def _float_pow(mc: ModuleContext, b: B, x: V, y: V, k: str, cy: object) -> V:
    if cy == 1.0:
        return x
    if cy == 2.0:
        return b.fmul(x, x)  # correctly rounded, like pow
    return mc.call(b, "pow", x, y)


_FLOAT: dict[str, Callable[..., V]] = {
    "add": lambda mc, b, x, y, k, cy: b.fadd(x, y),
    "sub": lambda mc, b, x, y, k, cy: b.fsub(x, y),
    "mul": lambda mc, b, x, y, k, cy: b.fmul(x, y),
    "div": lambda mc, b, x, y, k, cy: b.fdiv(x, y),
    "truncdiv": lambda mc, b, x, y, k, cy: mc.call(b, "trunc", b.fdiv(x, y)),
    "truncmod": lambda mc, b, x, y, k, cy: b.frem(x, y),
    "floordiv": lambda mc, b, x, y, k, cy: _float_floordivmod(mc, b, x, y)[0],
    "floormod": lambda mc, b, x, y, k, cy: _float_floordivmod(mc, b, x, y)[1],
    "min": _float_minmax("<"),
    "max": _float_minmax(">"),
    "pow": _float_pow,
}


def _safe_divisor(b: B, x: V, y: V, k: str, cy: object) -> tuple[V, V | None]:
    """A divisor that cannot trap, and the mask of lanes whose true divisor is 0 (or None
    when ``y`` is a known-safe constant)."""
    if isinstance(cy, int) and cy != 0 and not (k == "sint" and cy == -1):
        return y, None
    zero = b.icmp_unsigned("==", y, like(y.type, 0))
    bad = zero
    if k == "sint":
        width = x.type.element.width if isinstance(x.type, ir.VectorType) else x.type.width
        overflow = b.and_(b.icmp_unsigned("==", x, like(x.type, 1 << (width - 1))),
                          b.icmp_signed("==", y, like(y.type, -1)))
        bad = b.or_(zero, overflow)
    return b.select(bad, like(y.type, 1), y), zero


def _int_div(op: str) -> Callable[..., V]:
    def rule(mc: ModuleContext, b: B, x: V, y: V, k: str, cy: object) -> V:
        sy, zero = _safe_divisor(b, x, y, k, cy)
        signed = k == "sint"
        if op in ("div", "truncdiv") or (op == "floordiv" and not signed):
            r = b.sdiv(x, sy) if signed else b.udiv(x, sy)
        elif op == "truncmod" or (op == "floormod" and not signed):
            r = b.srem(x, sy) if signed else b.urem(x, sy)
        else:
            q, m = b.sdiv(x, sy), b.srem(x, sy)
            zero_t = like(x.type, 0)
            # The quotient rounds toward -inf: adjust where the remainder's sign differs.
            off = b.and_(b.icmp_unsigned("!=", m, zero_t),
                         b.icmp_signed("<", b.xor(m, sy), zero_t))
            if op == "floordiv":
                r = b.sub(q, b.zext(off, x.type))
            else:
                r = b.add(m, b.select(off, sy, zero_t))
        return r if zero is None else b.select(zero, like(x.type, 0), r)
    return rule


def _shift(b: B, x: V, y: V, k: str, left: bool) -> V:
    """``x << y`` or ``x >> y`` (arithmetic when signed) as kiln defines them
    (kiln/loops/evaluate.py `shift_right`): the amount clamped to [0, width - 1], and a
    shift by the width or more giving 0 where the clamp would not (left, unsigned right)."""
    element = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    width = element.width
    zero, top = like(x.type, 0), like(x.type, width - 1)
    if k == "sint":
        amount = b.select(b.icmp_signed("<", y, zero), zero,
                          b.select(b.icmp_signed(">", y, top), top, y))
        past = b.icmp_signed(">", y, top)
    else:
        amount = b.select(b.icmp_unsigned(">", y, top), top, y)
        past = b.icmp_unsigned(">", y, top)
    if not left:
        r = b.ashr(x, amount) if k == "sint" else b.lshr(x, amount)
        return r if k == "sint" else b.select(past, zero, r)
    return b.select(past, zero, b.shl(x, amount))


def _int_pow(mc: ModuleContext, b: B, x: V, y: V, k: str, cy: object) -> V:
    if cy == 1:
        return x
    if cy == 2:
        return b.mul(x, x)
    fn = _ipow_function(mc, x.type.element if isinstance(x.type, ir.VectorType) else x.type)
    if not isinstance(x.type, ir.VectorType):
        return b.call(fn, [x, y])
    out: V = ir.Constant(x.type, ir.Undefined)
    for lane in range(x.type.count):
        i = ir.Constant(ir.IntType(32), lane)
        out = b.insert_element(out, b.call(fn, [b.extract_element(x, i),
                                               b.extract_element(y, i)]), i)
    return out


def _ipow_function(mc: ModuleContext, t: ir.IntType) -> ir.Function:
    """``kiln.ipow.iN(base, exp)``: exponentiation by squaring; a negative exponent gives 0."""
    name = f"kiln.ipow.i{t.width}"
    if name in mc.module.globals:
        return mc.module.globals[name]
    fn = ir.Function(mc.module, ir.FunctionType(t, [t, t]), name)
    fn.linkage = "internal"
    base, exp = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    trivial = b.select(b.icmp_signed("==", exp, zero), one, zero)  # x**0 = 1; x**-n = 0
    b.cbranch(b.icmp_signed(">", exp, zero), loop, done)
    b.position_at_end(loop)
    acc, bb, ee = b.phi(t), b.phi(t), b.phi(t)
    odd = b.icmp_unsigned("!=", b.and_(ee, one), zero)
    acc2 = b.select(odd, b.mul(acc, bb), acc)
    ee2 = b.lshr(ee, one)
    bb2 = b.mul(bb, bb)
    for phi, start, nxt in ((acc, one, acc2), (bb, base, bb2), (ee, exp, ee2)):
        phi.add_incoming(start, entry)
        phi.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("!=", ee2, zero), loop, done)
    b.position_at_end(done)
    result = b.phi(t)
    result.add_incoming(trivial, entry)
    result.add_incoming(acc2, loop)
    b.ret(result)
    return fn


def _int_minmax(name: str) -> Callable[..., V]:
    def rule(mc: ModuleContext, b: B, x: V, y: V, k: str, cy: object) -> V:
        return mc.call(b, ("s" if k == "sint" else "u") + name, x, y)
    return rule


_INT: dict[str, Callable[..., V]] = {
    "add": lambda mc, b, x, y, k, cy: b.add(x, y),
    "sub": lambda mc, b, x, y, k, cy: b.sub(x, y),
    "mul": lambda mc, b, x, y, k, cy: b.mul(x, y),
    "div": _int_div("div"),
    "truncdiv": _int_div("truncdiv"),
    "truncmod": _int_div("truncmod"),
    "floordiv": _int_div("floordiv"),
    "floormod": _int_div("floormod"),
    "min": _int_minmax("min"),
    "max": _int_minmax("max"),
    "pow": _int_pow,
    "and": lambda mc, b, x, y, k, cy: b.and_(x, y),
    "or": lambda mc, b, x, y, k, cy: b.or_(x, y),
    "xor": lambda mc, b, x, y, k, cy: b.xor(x, y),
    "shl": lambda mc, b, x, y, k, cy: _shift(b, x, y, k, left=True),
    "shr": lambda mc, b, x, y, k, cy: _shift(b, x, y, k, left=False),
}

_BOOL: dict[str, Callable[..., V]] = {  # numpy's bool arithmetic is logical
    "and": lambda mc, b, x, y, k, cy: b.and_(x, y),
    "or": lambda mc, b, x, y, k, cy: b.or_(x, y),
    "xor": lambda mc, b, x, y, k, cy: b.xor(x, y),
    "add": lambda mc, b, x, y, k, cy: b.or_(x, y),
    "max": lambda mc, b, x, y, k, cy: b.or_(x, y),
    "mul": lambda mc, b, x, y, k, cy: b.and_(x, y),
    "min": lambda mc, b, x, y, k, cy: b.and_(x, y),
}


# --- unary -------------------------------------------------------------------------------------


def unary(mc: ModuleContext, b: B, op: str, dtype: str, x: V) -> V:
    """``op(x)`` for an operand of ``dtype``."""
    k = kind(dtype)
    if k == "float":
        return _float_unary(mc, b, op, dtype, x)
    if op == "not":
        return b.xor(x, like(x.type, -1))
    if op in ("floor", "ceil", "round", "nearbyint") or (k != "sint" and op == "abs"):
        return x
    if k == "bool":
        if op == "sign":
            return x
        raise InternalError(f"codegen: {op} is not defined on bool")
    zero = like(x.type, 0)
    if op == "neg":
        return b.sub(zero, x)
    if op == "abs":
        return b.call(mc.declare(f"llvm.abs.{mangle(x.type)}", x.type, [x.type, I1]),
                      [x, ir.Constant(I1, 0)])
    if op == "sign":
        if k == "uint":
            return b.zext(b.icmp_unsigned("!=", x, zero), x.type)
        pos = b.zext(b.icmp_signed(">", x, zero), x.type)
        return b.sub(pos, b.zext(b.icmp_signed("<", x, zero), x.type))
    # A float function of an integer (the evaluator truncates the float result back).
    wide = cast(mc, b, dtype, "float64", x)
    return cast(mc, b, "float64", dtype, _float_unary(mc, b, op, "float64", wide))


def _float_unary(mc: ModuleContext, b: B, op: str, dtype: str, x: V) -> V:
    match op:
        case "neg":
            return b.fneg(x)
        case "abs":
            return mc.call(b, "fabs", x)
        case "sqrt":
            return mc.call(b, "sqrt", x)
        case "rsqrt":
            return b.fdiv(like(x.type, 1.0), mc.call(b, "sqrt", x))
        case "floor" | "ceil" | "round":
            return mc.call(b, op, x)
        case "nearbyint":  # the default rounding mode: halves to even, one vrndscale
            return mc.call(b, "nearbyint", x)
        case "sign":
            zero = like(x.type, 0.0)
            y = b.select(b.fcmp_ordered("<", x, zero), like(x.type, -1.0), zero)
            y = b.select(b.fcmp_ordered(">", x, zero), like(x.type, 1.0), y)
            return b.select(b.fcmp_unordered("uno", x, x), x, y)
    raise InternalError(f"codegen: {op} is not defined on {dtype}")


# --- fused multiply-add and casts --------------------------------------------------------------


def fma(mc: ModuleContext, b: B, dtype: str, x: V, y: V, z: V) -> V:
    """``x * y + z``, fused for floats."""
    k = kind(dtype)
    if k == "float":
        return mc.call(b, "fma", x, y, z)
    if k == "bool":
        return b.or_(b.and_(x, y), z)
    return b.add(b.mul(x, y), z)


def cast(mc: ModuleContext, b: B, src: str, dst: str, x: V) -> V:
    """``x`` converted from ``src`` to ``dst`` (float → int saturates; NaN → 0).

    Conversions to and from float16 go through float32 (exact for every half value), so
    they never need compiler-rt helpers (``__truncdfhf2``) that a Python process lacks;
    float64 → float16 rounds to odd on the way, so that it still rounds only once.
    """
    if src == dst:
        return x
    ks, kd = kind(src), kind(dst)
    f32 = with_element(x.type, value_type("float32"))
    if src == "float16" and kd != "bool":
        return cast(mc, b, "float32", dst, b.fpext(x, f32))
    if dst == "float16" and ks != "bool":
        if src == "float64":
            odd = _round_to_odd_float32(mc, b, x, f32)
            return b.fptrunc(odd, with_element(x.type, value_type(dst)))
        if src != "float32":
            return b.fptrunc(cast(mc, b, src, "float32", x), with_element(x.type,
                                                                         value_type(dst)))
    t = with_element(x.type, value_type(dst))
    if kd == "bool":
        if ks == "float":
            return b.fcmp_unordered("!=", x, like(x.type, 0.0))  # NaN is true
        return b.icmp_unsigned("!=", x, like(x.type, 0))
    if ks == "bool":
        return b.uitofp(x, t) if kd == "float" else b.zext(x, t)
    if ks == "float":
        if kd == "float":
            return b.fpext(x, t) if bits(dst) > bits(src) else b.fptrunc(x, t)
        if bits(dst) < 32 or dst == "int32":
            return _saturating_to_int(b, src, dst, x, t)
        name = "fptosi" if kd == "sint" else "fptoui"
        fn = mc.declare(f"llvm.{name}.sat.{mangle(t)}.{mangle(x.type)}", t, [x.type])
        return b.call(fn, [x])
    signed = ks == "sint"
    if kd == "float":
        return b.sitofp(x, t) if signed else b.uitofp(x, t)
    if bits(dst) == bits(src):
        return x
    if bits(dst) < bits(src):
        return b.trunc(x, t)
    return b.sext(x, t) if signed else b.zext(x, t)


def _saturating_to_int(b: B, src: str, dst: str, x: V, t: ir.Type) -> V:
    """float → int8/16/32 as ``llvm.fpto[su]i.sat`` defines it (saturated, NaN → 0), from
    compares, selects and a plain conversion, which vectorize: this LLVM expands the
    saturating intrinsics lane by lane."""
    info = np.iinfo(dst)
    real = np.dtype(src).type
    lo = like(x.type, float(info.min))  # a power of two (or 0): exact
    top = real(info.max)
    if int(top) > info.max:  # int32's maximum rounds up to 2**31 in float32
        top = np.nextafter(top, real(0))
    hi = like(x.type, float(top))
    y = b.select(b.fcmp_ordered("<", x, lo), lo, x)
    y = b.select(b.fcmp_ordered(">", y, hi), hi, y)
    y = b.select(b.fcmp_unordered("uno", x, x), like(x.type, 0.0), y)
    i32 = with_element(x.type, ir.IntType(32))
    v = b.fptosi(y, i32)
    if int(top) < info.max:  # at or past 2**31: the maximum
        v = b.select(b.fcmp_ordered(">=", x, like(x.type, float(info.max) + 1.0)),
                     like(i32, int(info.max)), v)
    return v if bits(dst) == 32 else b.trunc(v, t)


def _round_to_odd_float32(mc: ModuleContext, b: B, x: V, f32: ir.Type) -> V:
    """float64 → float32 rounding to odd: truncate toward zero, then set the last bit if
    anything was lost (a second rounding, to float16, then rounds correctly)."""
    i32 = with_element(x.type, ir.IntType(32))
    near = b.fptrunc(x, f32)
    back = b.fpext(near, x.type)
    bits_ = b.bitcast(near, i32)
    # Rounded away from zero? Step back toward zero (one unit in the last place).
    away = b.fcmp_ordered(">", mc.call(b, "fabs", back), mc.call(b, "fabs", x))
    bits_ = b.select(away, b.sub(bits_, like(i32, 1)), bits_)
    inexact = b.fcmp_unordered("!=", back, x)
    bits_ = b.select(inexact, b.or_(bits_, like(i32, 1)), bits_)
    return b.bitcast(bits_, f32)

