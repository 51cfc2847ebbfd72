"""Emit loop-IR expressions as LLVM instructions (part of the emit stage).

`ExprEmitter.emit` walks an expression iteratively (loop-IR expressions can be hundreds
deep) and emits every node once per statement: values are memoized by node identity, since
lowerings share subexpressions freely. The semantics of each operation are in arith.py.

Transcendental functions are core arithmetic by the time they get here: the decompose-math
pass (kiln/loops/decompose_math.py) rewrites them in the loop IR, so the machine computes
exactly what the loop evaluator does. A kernel emitted without that pass still works: a
transcendental call met here is expanded by the same rewrite, node by node.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen import arith
from kiln.codegen.dot_product import emit_dot
from kiln.codegen.llvmtypes import (
    I64,
    ModuleContext,
    constant,
    itemsize,
    kind,
    memory_type,
    splat,
    value_type,
)
from kiln.errors import InternalError
from kiln.loops.decompose_math import TRANSCENDENTAL, expand
from kiln.loops.ir import (
    FMA,
    Binary,
    Bitcast,
    Broadcast,
    Buffer,
    Cast,
    Const,
    DotProduct,
    Expr,
    Load,
    Select,
    Unary,
    Var,
    operands,
)

Memo = dict[int, ir.Value]


class ExprEmitter:
    """Emits expressions at the builder's position, with variables and buffers bound."""

    def __init__(self, mc: ModuleContext, builder: ir.IRBuilder, env: dict[int, ir.Value],
                 buffers: dict[int, ir.Value]) -> None:
        self.mc = mc
        self.b = builder
        self.env = env
        self.buffers = buffers
        # Transcendental calls met in expressions, by identity: the call and its expansion.
        self.expanded: dict[int, tuple[Unary, Expr]] = {}
        self.strides: dict[int, tuple[Expr, ...]] = {}  # symbolic buffers' (see _strides)

    def emit(self, root: Expr, memo: Memo) -> ir.Value:
        """The value of ``root``; ``memo`` maps emitted nodes (by identity) to values."""
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if id(e) in memo:
                continue
            if ready:
                memo[id(e)] = self._node(e, memo)
                continue
            stack.append((e, True))
            stack.extend((c, False) for c in self._children(e) if id(c) not in memo)
        return memo[id(root)]

    def _children(self, e: Expr) -> tuple[Expr, ...]:
        if isinstance(e, Unary) and e.op in TRANSCENDENTAL:
            if id(e) not in self.expanded:
                self.expanded[id(e)] = (e, expand(e.op, e.a))
            return (self.expanded[id(e)][1],)
        return operands(e)

    def address(self, buf: Buffer, indices: tuple[Expr, ...], memo: Memo) -> ir.Value:
        """The address of ``buf[indices]`` (row-major; the verifier proved it in bounds,
        so the index arithmetic cannot overflow: ``nsw``)."""
        b = self.b
        flat: ir.Value | None = None
        if buf.is_symbolic:  # strides from the dims passed at run time
            for idx, sx in zip(indices, self._strides(buf)):
                if isinstance(idx, Const) and idx.value == 0:
                    continue
                i = self.as_index(self.emit(idx, memo), idx.dtype)
                if not (isinstance(sx, Const) and sx.value == 1):
                    i = b.mul(i, self.emit(sx, memo), flags=["nsw"])
                flat = i if flat is None else b.add(flat, i, flags=["nsw"])
        for idx, stride in () if buf.is_symbolic else _rejoin(indices, buf.strides):
            if isinstance(idx, Const) and idx.value == 0:
                continue
            i = self.as_index(self.emit(idx, memo), idx.dtype)
            if stride != 1:
                i = b.mul(i, ir.Constant(I64, stride), flags=["nsw"])
            flat = i if flat is None else b.add(flat, i, flags=["nsw"])
        base = self.buffers.get(id(buf))
        if base is None:
            raise InternalError(f"codegen: buffer {buf.name} is not bound")
        if flat is None:
            return base
        return b.gep(base, [flat], inbounds=True, source_etype=memory_type(buf.dtype))

    def _strides(self, buf: Buffer) -> tuple[Expr, ...]:
        """A symbolic buffer's stride expressions, made once per buffer (so that the memo
        emits each product once per statement)."""
        got = self.strides.get(id(buf))
        if got is None:
            got = self.strides[id(buf)] = buf.stride_exprs()
        return got

    def as_index(self, v: ir.Value, dtype: str) -> ir.Value:
        """An integer value widened to i64."""
        if v.type.width == 64:
            return v
        return self.b.zext(v, I64) if kind(dtype) in ("uint", "bool") else self.b.sext(v, I64)

    # --- rules -------------------------------------------------------------------------------

    def _node(self, e: Expr, memo: Memo) -> ir.Value:
        """``e``'s value, its operands already in ``memo``."""
        match e:
            case Const():
                return self._const(e, memo)
            case Var():
                return self._var(e, memo)
            case Load():
                return self._load(e, memo)
            case Binary():
                return self._binary(e, memo)
            case Unary():
                return self._unary(e, memo)
            case Cast():
                return self._cast(e, memo)
            case Bitcast():
                return self._bitcast(e, memo)
            case Select():
                return self._select(e, memo)
            case Broadcast():
                return self._broadcast(e, memo)
            case FMA():
                return self._fma(e, memo)
            case DotProduct():
                return emit_dot(self.mc, self.b, memo[id(e.a)], memo[id(e.b)], memo[id(e.c)],
                                e.a_dtype, e.b_dtype)
        raise InternalError(f"codegen: unknown expression {type(e).__name__}")

    def _const(self, e: Const, memo: Memo) -> ir.Value:
        return constant(e.dtype, e.value, e.lanes)

    def _var(self, e: Var, memo: Memo) -> ir.Value:
        v = self.env.get(id(e))
        if v is None:
            raise InternalError(f"codegen: variable {e.name} is not bound")
        return v

    def _load(self, e: Load, memo: Memo) -> ir.Value:
        ptr = self.address(e.buffer, e.indices, memo)
        mt = memory_type(e.dtype, e.lanes)
        v = self.b.load(ptr, typ=mt, align=itemsize(e.dtype))
        if e.dtype == "bool":
            v = self.b.icmp_unsigned("!=", v, ir.Constant(mt, None))
        return v

    def _select(self, e: Select, memo: Memo) -> ir.Value:
        return self.b.select(memo[id(e.cond)], memo[id(e.a)], memo[id(e.b)])

    def _broadcast(self, e: Broadcast, memo: Memo) -> ir.Value:
        return splat(self.b, memo[id(e.value)], e.lanes)

    def _fma(self, e: FMA, memo: Memo) -> ir.Value:
        return arith.fma(self.mc, self.b, e.dtype, memo[id(e.a)], memo[id(e.b)], memo[id(e.c)])

    def _binary(self, e: Binary, memo: Memo) -> ir.Value:
        return arith.binary(self.mc, self.b, e.op, e.a.dtype, memo[id(e.a)], memo[id(e.b)],
                            e.b)

    def _unary(self, e: Unary, memo: Memo) -> ir.Value:
        if e.op in TRANSCENDENTAL:
            return memo[id(self.expanded[id(e)][1])]
        return arith.unary(self.mc, self.b, e.op, e.dtype, memo[id(e.a)])

    def _cast(self, e: Cast, memo: Memo) -> ir.Value:
        return arith.cast(self.mc, self.b, e.a.dtype, e.dtype, memo[id(e.a)])

    def _bitcast(self, e: Bitcast, memo: Memo) -> ir.Value:
        return self.b.bitcast(memo[id(e.a)], value_type(e.dtype, e.lanes))


def _rejoin(indices: tuple[Expr, ...], strides: tuple[int, ...]) -> list[tuple[Expr, int]]:
    """(index, stride) pairs of an access, with ``e // (b·c)`` and ``(e // c) % b`` on two
    neighbouring axes whose strides differ by ``b`` joined back into ``e // c`` (``e`` and
    ``e % b`` for c = 1: floor division and modulo always recombine exactly). A flat position
    split into coordinates (a conv's pixel into row and column, a reshape's element into the
    source's axes) then addresses memory as the flat position again, so that consecutive
    positions are visibly consecutive addresses: a vectorized loop over them loads and
    stores vectors instead of gathering and scattering lanes."""
    pairs = list(zip(indices, strides))
    while True:  # joined pairs join again: e // (a·b·c), (e // (b·c)) % a, (e // c) % b, ...
        out: list[tuple[Expr, int]] = []
        k = 0
        while k < len(pairs):
            (hi, s_hi) = pairs[k]
            if k + 1 < len(pairs):
                joined = _join(hi, s_hi, *pairs[k + 1])
                if joined is not None:
                    out.append(joined)
                    k += 2
                    continue
            out.append((hi, s_hi))
            k += 1
        if len(out) == len(pairs):
            return out
        pairs = out


def _join(hi: Expr, s_hi: int, lo: Expr, s_lo: int) -> tuple[Expr, int] | None:
    """``(e // c, s_lo)`` where ``hi`` is ``e // (b·c)``, ``lo`` is ``(e // c) % b`` (or
    ``e % b``, c = 1) and ``s_hi = b · s_lo``; else None."""
    if not (isinstance(hi, Binary) and hi.op == "floordiv" and isinstance(hi.b, Const)
            and isinstance(lo, Binary) and lo.op == "floormod" and isinstance(lo.b, Const)):
        return None
    e, b = hi.a, lo.b.value
    inner = lo.a
    c: int | float | bool
    if inner is e:
        c = 1
    elif (isinstance(inner, Binary) and inner.op == "floordiv" and inner.a is e
          and isinstance(inner.b, Const)):
        c = inner.b.value
    else:
        return None
    if not (isinstance(b, int) and isinstance(c, int) and b > 0 and c > 0
            and hi.b.value == b * c and s_hi == s_lo * b):
        return None
    return (e if c == 1 else inner), s_lo
