"""The loop-IR verifier: well-formed kernels, and every memory access proven in bounds.

Native code must never read or write outside a buffer, so the verifier does not trust the
lowering: it bounds every index expression by interval arithmetic over the loop ranges and
let-bound values, and rejects an access it cannot prove in range. Lowerings make data-
dependent indices safe by clamping them (``min``/``max``), which the analysis understands.
Other checks: variables are used in scope, operands agree in dtype and lanes, inputs are
never written, local buffers are used only inside their allocation, parallel loops do not nest.

A symbolic kernel (`Kernel.dims`: sizes passed at run time) is proven in bounds for every
value of its dims: a dim ranges over [0, `DIM_MAX`], and an index of an axis of symbolic
size ``d`` must be at least 0 by the interval analysis and, lanes included, at most
``d - 1`` by the symbolic bounds of kiln/loops/symbolic_bounds.py (linear in the dims and
their floor quotients by constants: a loop ``for v in [0, d)``, or a vector loop over
``[0, d // L)`` at ``v * L`` with its tail over ``[d // L * L, d)``). Local buffers have
static shapes. The caller checks
that the dims it passes are the arrays' sizes (kiln/runtime/symbolic.py).

A failure is an `InternalError`: a bug in kiln's lowering, never the user's.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from kiln.errors import InternalError
from kiln.ir.dtype import dtype_of
from kiln.loops.ir import (
    COMPARISONS,
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
    operands,
)
from kiln.loops.printer import expr_text
from kiln.loops.symbolic_bounds import Bounds, Dim, Form, at_most

MAX_UNROLL = 256
DIM_MAX = 2**40  # what a symbolic kernel's dim may be, as far as the interval analysis knows


@dataclass(frozen=True)
class Interval:
    """Integer bounds, inclusive; None means unbounded on that side."""

    lo: int | None
    hi: int | None

    def __add__(self, o: Interval) -> Interval:
        return Interval(_op(self.lo, o.lo, int.__add__), _op(self.hi, o.hi, int.__add__))

    def __sub__(self, o: Interval) -> Interval:
        return Interval(_op(self.lo, o.hi, int.__sub__), _op(self.hi, o.lo, int.__sub__))

    def __mul__(self, o: Interval) -> Interval:
        lo, hi, olo, ohi = self.lo, self.hi, o.lo, o.hi
        if lo is None or hi is None or olo is None or ohi is None:
            return UNBOUNDED
        products = [a * b for a in (lo, hi) for b in (olo, ohi)]
        return Interval(min(products), max(products))


UNBOUNDED = Interval(None, None)


def _op(a: int | None, b: int | None, f) -> int | None:  # noqa: ANN001
    return None if a is None or b is None else f(a, b)


class _Verifier:
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.inputs = {id(b) for b in kernel.inputs}
        self.buffers: set[int] = {id(b) for b in kernel.params}
        self.ranges: dict[int, Interval] = {}  # id(var) -> its interval
        self.memo: dict[int, Interval] = {}
        # id(integer expression) -> bounds that an enclosing IfThenElse's condition proves
        self.facts: dict[int, Interval] = {}
        # a symbolic kernel's dims: id(var) -> var, each ranging over [0, DIM_MAX]
        self.dims = {id(d): d for d in kernel.dims}
        for d in kernel.dims:
            if d.dtype != "int64" or d.lanes != 1:
                raise self.fail(f"the dim {d.name} is not a scalar index")
            self.ranges[id(d)] = Interval(0, DIM_MAX)
        # id(loop var) -> id(dim) d: the loop runs over [0, d), so the variable is ≤ d - 1
        self.below: dict[int, int] = {}
        # loops that never run (extent ≤ 0: a tail of a size that has none): their accesses
        # are not checked against bounds, which their variables' empty ranges cannot give
        self.dead: set[int] = set()
        # symbolic upper bounds of indices, for the other accesses to symbolic axes
        self.symbolic = Bounds(self.dims, self._interval)

    def _interval(self, e: Expr) -> tuple[int | None, int | None]:
        iv = self.bound(e)
        return iv.lo, iv.hi

    def _below_dim(self, idx: Expr, extra: int, dim: Var) -> bool:
        """Whether ``idx + extra <= dim - 1`` wherever the access runs, by symbolic bounds."""
        d = Form.of({Dim(id(dim), dim.name): Fraction(1)})
        return any(at_most(u + Form.number(extra + 1) - d, DIM_MAX)
                   for u in self.symbolic.upper(idx))

    def fail(self, message: str) -> InternalError:
        return InternalError(f"loop IR of kernel {self.kernel.name}: {message}")

    # --- expressions -------------------------------------------------------------------------

    def check_expr(self, root: Expr) -> None:
        stack = [root]
        seen: set[int] = set()
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            match e:
                case Var():
                    if id(e) not in self.ranges:
                        raise self.fail(f"variable {e.name} is used outside its scope")
                case Const():
                    pass
                case Load():
                    self.check_access(e.buffer, e.indices, e.lanes, "read")
                    stack.extend(e.indices)
                case Binary(a=a, b=b):
                    if a.dtype != b.dtype or a.lanes != b.lanes:
                        raise self.fail(f"operands of {e.op} differ: {expr_text(e)} "
                                        f"({a.dtype}x{a.lanes} vs {b.dtype}x{b.lanes})")
                    stack.extend((a, b))
                case Unary(a=a) | Cast(a=a):
                    stack.append(a)
                case Bitcast(a=a):
                    if a.lanes != e.lanes:
                        raise self.fail(f"bitcast changes the lanes: {expr_text(e)}")
                    stack.append(a)
                case Select(cond=c, a=a, b=b):
                    if (c.dtype != "bool" or a.dtype != b.dtype or a.lanes != b.lanes
                            or c.lanes not in (1, a.lanes)):
                        raise self.fail(f"ill-typed select {expr_text(e)}")
                    stack.extend((c, a, b))
                case Broadcast(value=v):
                    if v.lanes != 1:
                        raise self.fail("broadcast of a vector")
                    stack.append(v)
                case FMA(a=a, b=b, c=c):
                    if not (a.dtype == b.dtype == c.dtype and a.lanes == b.lanes == c.lanes):
                        raise self.fail(f"operands of fma differ: {expr_text(e)}")
                    stack.extend((a, b, c))
                case DotProduct(a=a, b=b, c=c):
                    if not (a.dtype == b.dtype == c.dtype == "int32"
                            and a.lanes == b.lanes == c.lanes):
                        raise self.fail(f"operands of a dot product are not int32 vectors of "
                                        f"equal lanes: {expr_text(e)}")
                    stack.extend((a, b, c))
                case _:
                    raise self.fail(f"unknown expression {type(e).__name__}")

    def bound(self, e: Expr) -> Interval:
        """Bounds of an integer expression (iterative, memoized per node)."""
        order: list[Expr] = []
        stack = [e]
        while stack:
            x = stack.pop()
            if id(x) in self.memo:
                continue
            order.append(x)
            if isinstance(x, Binary):
                stack.extend((x.a, x.b))
            elif isinstance(x, (Cast, Unary)):
                stack.append(x.a)
            elif isinstance(x, Select):
                stack.extend((x.a, x.b))
        for x in reversed(order):
            if id(x) not in self.memo:
                iv = self._bound1(x)
                fact = self.facts.get(id(x))
                self.memo[id(x)] = iv if fact is None else _meet(iv, fact)
        return self.memo[id(e)]

    def _bound1(self, x: Expr) -> Interval:
        m = self.memo
        match x:
            case Const(value=v) if isinstance(v, int) and not isinstance(v, bool):
                return Interval(v, v)
            case Var():
                return self.ranges.get(id(x), UNBOUNDED)
            case Cast(a=a) if dtype_of(x.dtype).is_integer and dtype_of(a.dtype).is_integer:
                return m[id(a)]
            case Select(a=a, b=b):
                ia, ib = m[id(a)], m[id(b)]
                return Interval(_op(ia.lo, ib.lo, min), _op(ia.hi, ib.hi, max))
            case Binary(op=op, a=a, b=b) if dtype_of(x.dtype).is_integer:
                ia, ib = m[id(a)], m[id(b)]
                if op == "add":
                    return ia + ib
                if op == "sub":
                    return ia - ib
                if op == "mul":
                    return ia * ib
                if op == "min":  # None is -inf for lo, +inf for hi
                    lo = None if ia.lo is None or ib.lo is None else min(ia.lo, ib.lo)
                    hi = ib.hi if ia.hi is None else ia.hi if ib.hi is None else min(ia.hi, ib.hi)
                    return Interval(lo, hi)
                if op == "max":
                    lo = ib.lo if ia.lo is None else ia.lo if ib.lo is None else max(ia.lo, ib.lo)
                    hi = None if ia.hi is None or ib.hi is None else max(ia.hi, ib.hi)
                    return Interval(lo, hi)
                if (op in ("floordiv", "floormod") and ia.lo is not None and ia.lo == ia.hi
                        and ib.lo is not None and ib.lo == ib.hi and ib.lo > 0):
                    # constants (a lowering's n // L, n % L left unfolded): exact
                    v = ia.lo // ib.lo if op == "floordiv" else ia.lo % ib.lo
                    return Interval(v, v)
                if op in ("floordiv", "truncdiv") and ib.lo == ib.hi and ib.lo and ib.lo > 0:
                    c = ib.lo
                    if op == "truncdiv" and (ia.lo is None or ia.lo < 0):
                        return UNBOUNDED
                    div = int.__floordiv__
                    return Interval(_op(ia.lo, c, div), _op(ia.hi, c, div))
                if op in ("floormod", "truncmod") and ib.lo == ib.hi and ib.lo and ib.lo > 0:
                    c = ib.lo
                    if ia.lo is not None and ia.hi is not None and ia.lo >= 0 and ia.hi < c:
                        return ia
                    if op == "floormod" or (ia.lo is not None and ia.lo >= 0):
                        return Interval(0, c - 1)
                    return Interval(-(c - 1), c - 1)
        return UNBOUNDED

    def check_access(self, buf: Buffer, indices: tuple[Expr, ...], lanes: int, what: str) -> None:
        if id(buf) not in self.buffers:
            raise self.fail(f"buffer {buf.name} is not a parameter or a live local allocation")
        if len(indices) != buf.ndim:
            raise self.fail(f"{buf.name} has {buf.ndim} dimensions but is indexed with "
                            f"{len(indices)}")
        if lanes > 1 and buf.ndim == 0:
            raise self.fail(f"vector access to the scalar buffer {buf.name}")
        for axis, idx in enumerate(indices):
            if not dtype_of(idx.dtype).is_integer or idx.lanes != 1:
                raise self.fail(f"index {expr_text(idx)} of {buf.name} is not a scalar integer")
            if self.dead:
                continue
            iv = self.bound(idx)
            extra = lanes - 1 if axis == buf.ndim - 1 else 0
            dim = buf.shape[axis]
            if isinstance(dim, Var):
                loop_var = (not extra and isinstance(idx, Var)
                            and self.below.get(id(idx)) == id(dim))
                if (iv.lo is None or iv.lo < 0
                        or not (loop_var or self._below_dim(idx, extra, dim))):
                    raise self.fail(
                        f"cannot prove the {what} of {buf.name}{list(buf.shape)} in bounds: "
                        f"index {expr_text(idx)} of axis {axis}, of symbolic size {dim.name}, "
                        f"is not provably in [0, {dim.name} - 1]"
                        + (f" (+{extra} lanes)" if extra else ""))
                continue
            if iv.lo is None or iv.hi is None or iv.lo < 0 or iv.hi + extra >= buf.shape[axis]:
                raise self.fail(
                    f"cannot prove the {what} of {buf.name}{list(buf.shape)} in bounds: index "
                    f"{expr_text(idx)} of axis {axis} ranges over [{iv.lo}, {iv.hi}]"
                    + (f" (+{extra} lanes)" if extra else ""))

    # --- statements --------------------------------------------------------------------------

    def check(self) -> None:
        seen_names = set()
        for b in self.kernel.params:
            if b.scope != "global":
                raise self.fail(f"kernel parameter {b.name} must have global scope")
            if b.name in seen_names:
                raise self.fail(f"two parameters are named {b.name}")
            seen_names.add(b.name)
        # Walk with an explicit stack of (statement, inside a parallel loop); a variable or a
        # buffer on the stack closes its scope.
        stack: list[tuple[Stmt, bool] | Var | Buffer | _Facts] = [(self.kernel.body, False)]
        while stack:
            item = stack.pop()
            if isinstance(item, _Facts):  # entering or leaving a guarded branch
                self.facts = item.facts
                self.memo.clear()
                continue
            if isinstance(item, Var):
                self.ranges.pop(id(item), None)
                self.below.pop(id(item), None)
                self.dead.discard(id(item))
                self.symbolic.unbind(item)
                continue
            if isinstance(item, Buffer):
                self.buffers.discard(id(item))
                continue
            s, in_parallel = item
            match s:
                case For(var=v, start=start, extent=ext, body=body, kind=loop_kind):
                    self.check_expr(start)
                    self.check_expr(ext)
                    if not all(dtype_of(x.dtype).is_integer and x.lanes == 1
                               for x in (v, start, ext)):
                        raise self.fail(f"loop {v.name} needs a scalar integer variable, start "
                                        "and extent")
                    if loop_kind == "parallel" and in_parallel:
                        raise self.fail("parallel loops must not nest")
                    if loop_kind == "unrolled" and not (isinstance(ext, Const)
                                                        and 0 <= ext.value <= MAX_UNROLL):
                        raise self.fail(f"unrolled loop {v.name} needs a constant extent "
                                        f"≤ {MAX_UNROLL}")
                    if id(v) in self.ranges:
                        raise self.fail(f"loop variable {v.name} is bound twice")
                    lo, n = self.bound(start), self.bound(ext)
                    hi = _op(lo.hi, n.hi, lambda a, b: a + b - 1)
                    self.ranges[id(v)] = Interval(lo.lo, hi)
                    if n.hi is not None and n.hi <= 0:
                        self.dead.add(id(v))
                    if id(ext) in self.dims and lo.hi is not None and lo.hi <= 0:
                        self.below[id(v)] = id(ext)
                    if self.dims:  # the last iteration, start + extent - 1
                        one = Form.number(1)
                        if isinstance(ext, Binary) and ext.op == "sub" and ext.b is start:
                            # for v in [s, e) written as [s, s + (e - s)): at most e - 1
                            last = [u - one for u in self.symbolic.upper(ext.a)]
                        else:
                            last = [s + x - one for s in self.symbolic.upper(start)
                                    for x in self.symbolic.upper(ext)]
                        self.symbolic.bind(v, last)
                    self.memo.clear()
                    stack.append(v)
                    stack.append((body, in_parallel or loop_kind == "parallel"))
                case Store(buffer=buf, indices=idx, value=val):
                    if id(buf) in self.inputs:
                        raise self.fail(f"the input {buf.name} is written")
                    if val.dtype != buf.dtype:
                        raise self.fail(f"a {val.dtype} value is stored into {buf.name} "
                                        f"({buf.dtype})")
                    self.check_expr(val)
                    for i in idx:
                        self.check_expr(i)
                    self.check_access(buf, idx, val.lanes, "write")
                case LetStmt(var=v, value=val, body=body):
                    self.check_expr(val)
                    if v.dtype != val.dtype or v.lanes != val.lanes:
                        raise self.fail(f"let {v.name}: {v.dtype} bound to a {val.dtype} value")
                    self.ranges[id(v)] = (self.bound(val) if dtype_of(v.dtype).is_integer
                                          else UNBOUNDED)
                    if self.dims and dtype_of(v.dtype).is_integer and v.lanes == 1:
                        self.symbolic.bind(v, self.symbolic.upper(val))
                    stack.append(v)
                    stack.append((body, in_parallel))
                case Allocate(buffer=buf, body=body):
                    if buf.scope != "local":
                        raise self.fail(f"allocated buffer {buf.name} must have local scope")
                    if buf.is_symbolic:
                        raise self.fail(f"local buffer {buf.name} has a symbolic shape")
                    self.buffers.add(id(buf))
                    stack.append(buf)
                    stack.append((body, in_parallel))
                case Seq(stmts=stmts):
                    stack.extend((x, in_parallel) for x in reversed(stmts))
                case IfThenElse(cond=c, then_case=t, else_case=f):
                    self.check_expr(c)
                    if c.dtype != "bool" or c.lanes != 1:
                        raise self.fail(f"the condition {expr_text(c)} is not a scalar bool")
                    if f is not None:
                        stack.append((f, in_parallel))
                    known = _guard_facts(c)
                    if known:
                        # the then-branch runs only where the condition holds
                        stack.append(_Facts(self.facts))
                        stack.append((t, in_parallel))
                        stack.append(_Facts({**self.facts, **{
                            k: _meet(self.facts.get(k, UNBOUNDED), v) for k, v in known.items()}}))
                    else:
                        stack.append((t, in_parallel))
                case Check(cond=c):
                    self.check_expr(c)
                    if c.dtype != "bool" or c.lanes != 1:
                        raise self.fail(f"the check {expr_text(c)} is not a scalar bool")
                case TileProduct():
                    self.check_tiles(s)
                case Prefetch(ref=r):
                    self.check_expr(r)
                case _:
                    raise self.fail(f"unknown statement {type(s).__name__}")


    def check_tiles(self, s: TileProduct) -> None:
        """A `TileProduct`: a constant number of steps, and every tile — 16 rows of 16
        int32 from its first element, ``stride`` apart — inside its buffer for every step;
        the C tiles written after the last step (``var`` out of scope there)."""
        if not (isinstance(s.steps, Const) and isinstance(s.steps.value, int)
                and s.steps.value >= 1):
            raise self.fail(f"tile product over {s.var.name} needs a constant number of steps "
                            f"≥ 1, not {expr_text(s.steps)}")
        if s.c_stride < TILE_WORDS or min(s.a_stride, s.b_stride) < 0:
            raise self.fail("tile product: a C tile's rows must not overlap, and strides are "
                            "not negative")
        for ref in s.c:
            if id(ref.buffer) in self.inputs:
                raise self.fail(f"the input {ref.buffer.name} is written")
            self.check_tile(ref, s.c_stride, "write")
        if id(s.var) in self.ranges:
            raise self.fail(f"loop variable {s.var.name} is bound twice")
        self.ranges[id(s.var)] = Interval(0, int(s.steps.value) - 1)
        self.memo.clear()
        for ref in s.a:
            self.check_tile(ref, s.a_stride, "read")
        for ref in s.b:
            self.check_tile(ref, s.b_stride, "read")
        self.ranges.pop(id(s.var))
        self.memo.clear()

    def check_tile(self, ref: Load, stride: int, what: str) -> None:
        buf = ref.buffer
        if id(buf) not in self.buffers:
            raise self.fail(f"buffer {buf.name} is not a parameter or a live local allocation")
        if buf.is_symbolic or len(ref.indices) != buf.ndim:
            raise self.fail(f"tile of {buf.name}: a static buffer indexed on every axis")
        for idx in ref.indices:
            self.check_expr(idx)
            if not dtype_of(idx.dtype).is_integer or idx.lanes != 1:
                raise self.fail(f"index {expr_text(idx)} of {buf.name} is not a scalar integer")
        if self.dead:
            return
        flat = Interval(0, 0)
        for idx, step in zip(ref.indices, buf.strides):
            flat = flat + self.bound(idx) * Interval(step, step)
        reach = (TILE_ROWS - 1) * stride + TILE_WORDS - 1
        if flat.lo is None or flat.hi is None or flat.lo < 0 or flat.hi + reach >= buf.size:
            raise self.fail(
                f"cannot prove the tile {what} of {buf.name}{list(buf.shape)} in bounds: its "
                f"first element ranges over [{flat.lo}, {flat.hi}] and the tile reaches "
                f"{reach} elements past it")


@dataclass(frozen=True)
class _Facts:
    """A marker on the walk's stack: the facts in force from here on."""

    facts: dict[int, Interval]


def _meet(a: Interval, b: Interval) -> Interval:
    lo = b.lo if a.lo is None else a.lo if b.lo is None else max(a.lo, b.lo)
    hi = b.hi if a.hi is None else a.hi if b.hi is None else min(a.hi, b.hi)
    return Interval(lo, hi)


def _guard_facts(cond: Expr) -> dict[int, Interval]:
    """Bounds that ``cond`` proves where it holds: for each conjunct ``e < c``, ``e <= c``,
    ``e > c`` or ``e >= c`` (c an integer constant), the bound of the expression ``e``
    itself (by identity: an access indexed by that same node is bounded by it)."""
    out: dict[int, Interval] = {}
    stack = [cond]
    while stack:
        e = stack.pop()
        if not isinstance(e, Binary):
            continue
        if e.op == "and":
            stack.extend((e.a, e.b))
            continue
        c = e.b
        if not (isinstance(c, Const) and isinstance(c.value, int)
                and not isinstance(c.value, bool)):
            continue
        bound = {"lt": Interval(None, c.value - 1), "le": Interval(None, c.value),
                 "gt": Interval(c.value + 1, None), "ge": Interval(c.value, None)}.get(e.op)
        if bound is not None and _pure_index(e.a):
            out[id(e.a)] = _meet(out.get(id(e.a), UNBOUNDED), bound)
    return out


def _pure_index(e: Expr) -> bool:
    """Whether ``e`` reads no buffer (a store in the branch cannot change its value)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            return False
        stack.extend(operands(x))
    return True


def verify(kernel: Kernel) -> Kernel:
    """Check a kernel (raises `InternalError`); returns it for chaining."""
    _Verifier(kernel).check()
    return kernel


_ = COMPARISONS  # comparisons give bool (see ir.Binary.dtype)
