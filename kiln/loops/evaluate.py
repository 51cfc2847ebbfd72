"""A direct interpreter of the loop IR, in Python: the oracle for code generation.

It runs a kernel statement by statement on numpy arrays, element by element, so it is only
for small shapes in tests: to check a lowering before it is compiled, and to check that the
compiled kernel computes exactly what its loop IR says. Outputs start filled with a sentinel
(NaN, or the dtype's maximum) so that an element the kernel forgets to write shows.

Transcendental functions are first decomposed into core arithmetic (decompose_math.py),
the same the code generator compiles, and every operation rounds to its dtype as the
machine does: float32 arithmetic is numpy's float32 arithmetic, and `FMA` rounds once
(computed exactly, then rounded).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from kiln.errors import EvalError, InternalError
from kiln.ir.dtype import dtype_of
from kiln.loops.decompose_math import decompose_math
from kiln.loops.ir import (
    FMA,
    TILE_ROWS,
    TILE_WORDS,
    Allocate,
    Binary,
    Bitcast,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    DotProduct,
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
    Var,
    dot_group,
    operands,
)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    # Not floor(|x| + 0.5): that addition rounds (0.49999997 + 0.5 is 1 in float32).
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), 0).astype(x.dtype)


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "not": lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x),
    "abs": np.abs,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round_half_away,
    "nearbyint": np.rint,  # halves to even
    "sign": np.sign,
}


def shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a << b`` of integers as kiln defines it: a shift by at least the width gives 0, a
    negative shift none (kiln/op/elementwise.py, left_shift)."""
    a, b = np.asarray(a), np.asarray(b)
    bits = a.dtype.itemsize * 8
    s = np.clip(b.astype(np.int64), 0, bits - 1).astype(a.dtype)
    with np.errstate(over="ignore"):
        return np.where(b.astype(np.int64) >= bits, np.zeros_like(a), np.left_shift(a, s))


def shift_right(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a >> b`` of integers (arithmetic for signed ones): ``floor(a / 2**b)``, a shift by
    at least the width leaving the sign (0 or -1), a negative shift none."""
    a, b = np.asarray(a), np.asarray(b)
    bits = a.dtype.itemsize * 8
    s = np.clip(b.astype(np.int64), 0, bits - 1).astype(a.dtype)
    out = np.right_shift(a, s)
    if a.dtype.kind == "u":
        out = np.where(b.astype(np.int64) >= bits, np.zeros_like(a), out)
    return out


def _truncdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, b)
    return q + ((q < 0) & (q * b != a))


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "floordiv": np.floor_divide,
    "floormod": np.mod,
    "truncdiv": _truncdiv,
    "truncmod": np.fmod,
    "min": np.minimum,
    "max": np.maximum,
    "pow": np.power,
    "and": lambda a, b: np.logical_and(a, b) if a.dtype == np.bool_ else np.bitwise_and(a, b),
    "or": lambda a, b: np.logical_or(a, b) if a.dtype == np.bool_ else np.bitwise_or(a, b),
    "xor": lambda a, b: np.logical_xor(a, b) if a.dtype == np.bool_ else np.bitwise_xor(a, b),
    "shl": lambda a, b: shift_left(a, b),
    "shr": lambda a, b: shift_right(a, b),
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: str) -> np.ndarray:
    """``a * b + c`` rounded once to ``dtype``, as the machine's fused multiply-add."""
    if not dtype_of(dtype).is_float:
        return np.asarray(a * b + c, dtype=dtype)
    if dtype == "float64":
        return np.array([_fma64(x, y, z) for x, y, z in zip(a.tolist(), b.tolist(),
                                                            c.tolist())])
    # float32 and float16: the product is exact in float64 and TwoSum gives the error of the
    # sum; rounding that sum to odd makes the rounding to the narrow type a single one.
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    v = s - p
    err = (p - (s - v)) + (c - v)
    even = (s.view(np.int64) & 1) == 0
    odd = np.nextafter(s, np.where(err > 0, np.inf, -np.inf))
    s = np.where(np.isfinite(s) & (err != 0) & even, odd, s)
    return s.astype(dtype)


def _fma64(x: float, y: float, z: float) -> float:
    plain = x * y + z
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(z)
            and math.isfinite(plain)):
        return plain  # inf and NaN come out as IEEE says
    return float(Fraction(x) * Fraction(y) + Fraction(z))  # exact, then rounded once


def _dot4(a: np.ndarray, b: np.ndarray, c: np.ndarray, a_dtype: str,
          b_dtype: str) -> np.ndarray:
    """`DotProduct`: each int32 lane of ``a`` and ``b`` read as the 4 bytes (2 int16) of
    their dtypes, their products summed per lane into ``c`` exactly, wrapping modulo 2³²
    like int32 (the lowest-addressed value first: this machine is little-endian, as every
    Target kiln generates code for)."""
    group = dot_group(a_dtype)
    qa = a.astype("<i4").view(np.dtype(a_dtype).newbyteorder("<")).astype(np.int64)
    qb = b.astype("<i4").view(np.dtype(b_dtype).newbyteorder("<")).astype(np.int64)
    qa, qb = qa.reshape(-1, group), qb.reshape(-1, group)
    total = c.astype(np.int64) + (qa * qb).sum(axis=1)
    return total.astype(np.int32)  # wraps: int64 -> int32 keeps the low 32 bits


class _Machine:
    def __init__(self) -> None:
        self.env: dict[int, np.ndarray] = {}  # id(var) -> value (1-D array of its lanes)
        self.mem: dict[int, np.ndarray] = {}  # id(buffer) -> storage

    def expr(self, root: Expr) -> np.ndarray:
        """The value of ``root`` as a 1-D array of ``root.lanes`` elements of its dtype
        (a post-order walk: each shared node is evaluated once)."""
        memo: dict[int, np.ndarray] = {}
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if id(e) in memo:
                continue
            if ready:
                memo[id(e)] = self._node(e, memo)
                continue
            stack.append((e, True))
            stack.extend((c, False) for c in operands(e) if id(c) not in memo)
        return memo[id(root)]

    def _node(self, e: Expr, m: dict[int, np.ndarray]) -> np.ndarray:
        match e:
            case Const(value=v, dtype=dt, lanes=n):
                return np.full(n, v, dtype=dt)
            case Var():
                return self.env[id(e)]
            case Load(buffer=b, indices=idx, lanes=n):
                where = tuple(int(m[id(i)][0]) for i in idx)
                data = self.mem[id(b)]
                if n == 1:
                    return np.array([data[where]], dtype=b.dtype)
                return np.array(data[where[:-1]][where[-1]: where[-1] + n], dtype=b.dtype)
            case Binary(op=op, a=a, b=b):
                return np.asarray(_BINARY[op](m[id(a)], m[id(b)]), dtype=e.dtype)
            case Unary(op=op, a=a):
                rule = _UNARY.get(op)
                if rule is None:
                    raise InternalError(f"loop evaluator: {op} was not decomposed")
                return np.asarray(rule(m[id(a)]), dtype=e.dtype)
            case Cast(dtype=dt, a=a):
                return m[id(a)].astype(dt)
            case Bitcast(dtype=dt, a=a):
                return m[id(a)].view(dt)
            case Select(cond=c, a=a, b=b):
                return np.where(m[id(c)], m[id(a)], m[id(b)]).astype(e.dtype)
            case Broadcast(value=v, lanes=n):
                return np.repeat(m[id(v)], n)
            case FMA(a=a, b=b, c=c):
                return _fma(m[id(a)], m[id(b)], m[id(c)], e.dtype)
            case DotProduct(a=a, b=b, c=c):
                return _dot4(m[id(a)], m[id(b)], m[id(c)], e.a_dtype, e.b_dtype)
        raise InternalError(f"loop evaluator: unknown expression {type(e).__name__}")

    def stmt(self, s: Stmt) -> None:
        match s:
            case For(var=v, start=start, extent=ext, body=body):
                lo = int(self.expr(start)[0])
                for i in range(lo, lo + int(self.expr(ext)[0])):
                    self.env[id(v)] = np.array([i], dtype=v.dtype)
                    self.stmt(body)
                self.env.pop(id(v), None)
            case Store(buffer=b, indices=idx, value=val):
                where = tuple(int(self.expr(i)[0]) for i in idx)
                value = self.expr(val)
                data = self.mem[id(b)]
                if val.lanes == 1:
                    data[where] = value[0]
                else:
                    data[where[:-1]][where[-1]: where[-1] + val.lanes] = value
            case LetStmt(var=v, value=val, body=body):
                self.env[id(v)] = self.expr(val)
                self.stmt(body)
                self.env.pop(id(v), None)
            case Allocate(buffer=b, body=body):
                self.mem[id(b)] = _sentinel(b)
                self.stmt(body)
                del self.mem[id(b)]
            case Seq(stmts=stmts):
                for x in stmts:
                    self.stmt(x)
            case IfThenElse(cond=c, then_case=t, else_case=f):
                if bool(self.expr(c)[0]):
                    self.stmt(t)
                elif f is not None:
                    self.stmt(f)
            case Check(cond=c, message=msg):
                if not bool(self.expr(c)[0]):
                    raise EvalError(msg)
            case TileProduct():
                self.tiles(s)
            case Prefetch():
                pass  # a hint: nothing to compute
            case _:
                raise InternalError(f"loop evaluator: unknown statement {type(s).__name__}")




    def tile(self, ref: Load, stride: int) -> np.ndarray:
        """The (16, 16) int32 tile whose first element ``ref`` names: a view of its buffer."""
        data = self.mem[id(ref.buffer)].reshape(-1)
        start = sum(int(self.expr(i)[0]) * step
                    for i, step in zip(ref.indices, ref.buffer.strides))
        return np.lib.stride_tricks.as_strided(
            data[start:], (TILE_ROWS, TILE_WORDS), (stride * 4, 4), writeable=True)

    def tiles(self, s: TileProduct) -> None:
        """`TileProduct`: A (16 × 64 bytes) times B (16 × 16 int32 of 4 bytes, K/4 × N) per
        step, summed exactly, stored wrapped to int32."""
        nb = len(s.b)
        acc = np.zeros((len(s.a), nb, TILE_ROWS, TILE_WORDS), np.int64)
        for k in range(int(self.expr(s.steps)[0])):
            self.env[id(s.var)] = np.array([k], dtype=s.var.dtype)
            a = [np.ascontiguousarray(self.tile(r, s.a_stride)).view(s.a_dtype)
                 .astype(np.int64) for r in s.a]  # (16 rows, 64 K values)
            b = [np.ascontiguousarray(self.tile(r, s.b_stride)).view(s.b_dtype)
                 .reshape(TILE_ROWS, TILE_WORDS, 4).transpose(0, 2, 1)
                 .reshape(4 * TILE_ROWS, TILE_WORDS).astype(np.int64) for r in s.b]  # K × N
            for i, x in enumerate(a):
                for j, y in enumerate(b):
                    acc[i, j] += x @ y
        self.env.pop(id(s.var), None)
        for n, ref in enumerate(s.c):
            self.tile(ref, s.c_stride)[...] = acc[n // nb, n % nb].astype(np.int32)


def _sentinel(b: Buffer) -> np.ndarray:
    if dtype_of(b.dtype).is_float:
        return np.full(b.shape, np.nan, dtype=b.dtype)
    if b.dtype == "bool":
        return np.ones(b.shape, dtype=bool)
    return np.full(b.shape, np.iinfo(b.dtype).max, dtype=b.dtype)


def evaluate(kernel: Kernel, *inputs: np.ndarray) -> list[np.ndarray]:
    """Run ``kernel`` on input arrays; the output arrays, in the kernel's order."""
    if len(inputs) != len(kernel.inputs):
        raise InternalError(f"{kernel.name} takes {len(kernel.inputs)} inputs, got {len(inputs)}")
    kernel = decompose_math(kernel)
    m = _Machine()
    for b, a in zip(kernel.inputs, inputs):
        a = np.asarray(a)
        if a.shape != b.shape or a.dtype.name != b.dtype:
            raise InternalError(f"{kernel.name}: input {b.name} must be {b.dtype}{list(b.shape)}, "
                                f"got {a.dtype.name}{list(a.shape)}")
        m.mem[id(b)] = np.array(a, copy=True)
    outs = [_sentinel(b) for b in kernel.outputs]
    for b, o in zip(kernel.outputs, outs):
        m.mem[id(b)] = o
    with np.errstate(all="ignore"):
        m.stmt(kernel.body)
    return outs
