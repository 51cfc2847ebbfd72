"""A direct interpreter of the loop IR, in Python: the oracle for code generation.

It runs a kernel statement by statement on numpy arrays, element by element, so it is only
for small shapes in tests: to check a lowering before it is compiled, and to check that the
compiled kernel computes exactly what its loop IR says. Outputs start filled with a sentinel
(NaN, or the dtype's maximum) so that an element the kernel forgets to write shows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.errors import EvalError, InternalError
from kiln.loops.ir import (
    FMA,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    # Not floor(|x| + 0.5): that addition rounds (0.49999997 + 0.5 is 1 in float32).
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), 0).astype(x.dtype)


_UNARY = {
    "neg": np.negative,
    "not": lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x),
    "abs": np.abs,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": _erf,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round_half_away,
    "sign": np.sign,
}


def _truncdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, b)
    return q + ((q < 0) & (q * b != a))


_BINARY = {
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
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


class _Machine:
    def __init__(self) -> None:
        self.env: dict[int, np.ndarray] = {}  # id(var) -> value (1-D array of its lanes)
        self.mem: dict[int, np.ndarray] = {}  # id(buffer) -> storage

    def expr(self, e: Expr) -> np.ndarray:
        """The value of ``e`` as a 1-D array of ``e.lanes`` elements of ``e.dtype``."""
        match e:
            case Const(value=v, dtype=dt, lanes=n):
                return np.full(n, v, dtype=dt)
            case Var():
                return self.env[id(e)]
            case Load(buffer=b, indices=idx, lanes=n):
                where = tuple(int(self.expr(i)[0]) for i in idx)
                data = self.mem[id(b)]
                if n == 1:
                    return np.array([data[where]], dtype=b.dtype)
                return np.array(data[where[:-1]][where[-1]: where[-1] + n], dtype=b.dtype)
            case Binary(op=op, a=a, b=b):
                out = _BINARY[op](self.expr(a), self.expr(b))
                return np.asarray(out, dtype=e.dtype)
            case Unary(op=op, a=a):
                x = self.expr(a)
                return np.asarray(_UNARY[op](x), dtype=e.dtype)
            case Cast(dtype=dt, a=a):
                return self.expr(a).astype(dt)
            case Select(cond=c, a=a, b=b):
                return np.where(self.expr(c), self.expr(a), self.expr(b)).astype(e.dtype)
            case Broadcast(value=v, lanes=n):
                return np.repeat(self.expr(v), n)
            case FMA(a=a, b=b, c=c):
                wide = (self.expr(a).astype(np.float64) * self.expr(b).astype(np.float64)
                        + self.expr(c).astype(np.float64))
                return wide.astype(e.dtype)
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
            case _:
                raise InternalError(f"loop evaluator: unknown statement {type(s).__name__}")


def _sentinel(b: Buffer) -> np.ndarray:
    if b.dtype.startswith("float"):
        return np.full(b.shape, np.nan, dtype=b.dtype)
    if b.dtype == "bool":
        return np.ones(b.shape, dtype=bool)
    return np.full(b.shape, np.iinfo(b.dtype).max, dtype=b.dtype)


def evaluate(kernel: Kernel, *inputs: np.ndarray) -> list[np.ndarray]:
    """Run ``kernel`` on input arrays; the output arrays, in the kernel's order."""
    if len(inputs) != len(kernel.inputs):
        raise InternalError(f"{kernel.name} takes {len(kernel.inputs)} inputs, got {len(inputs)}")
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


_ = Any
