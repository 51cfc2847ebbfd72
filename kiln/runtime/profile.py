"""Where an executable's time goes: per kernel, calls, time, share, FLOPs and GFLOP/s.

    p = exe.profile(x, repeat=20)      # a `Profile`
    print(p)                           # a table, the costliest kernel first
    p.rows[0].kernel, p.rows[0].gflops # the same, machine-readable

**Measurement.** The program runs in a VM of its own whose kernels are the executable's,
each wrapped in a timer (`time.perf_counter`, a monotonic clock, read just before and just
after the kernel call), so the executable's own call path is untouched. A kernel of
symbolic shape is timed per specialization: one row for each concrete shape it met. After a
warm-up run (which also compiles those specializations), ``repeat`` profiled runs alternate
with ``repeat`` runs of the executable's own executor (the whole-program native executor for
a static program): their median is the whole-run time a caller sees. Each kernel's share is
its time over the profiled runs' time, both measured in the same runs by the same clock, so
the shares add up to at most 1; the rest is the VM's own work between kernels (allocating,
moving values), which the native executor does not have.

**FLOPs** are counted statically from each kernel's loop IR as compiled (after
decompose-math, so an ``exp`` counts the FMAs, multiplies and rounds of its polynomial):

- per lane, an FMA counts 2; a float add, sub, mul, div, min, max or pow 1; a float neg,
  abs, sqrt, rsqrt, floor, ceil, round or sign 1; a `DotProduct` (the int8 kernels' 4
  multiply-adds) 8, so an int8 product's "GFLOP/s" are its integer operations per second;
  a `TileProduct` 2 · 16 · 16 · 64 per step and pair of A and B tiles (AMX's multiply-adds);
  Comparisons, selects, casts, bitcasts, loads, stores and other integer arithmetic
  (indices, packing) count 0;
- an expression is a DAG: a node shared within one statement counts once, as the code
  generator evaluates it once;
- a loop multiplies its body by its trip count. Trip counts and branches that depend on
  enclosing loop indices (edge tiles of a GEMM) are evaluated for each index value that
  matters; a branch on data (argmax, pooling gradients, integer powers) counts both sides.

So the count is the arithmetic the kernel executes, padding of partial tiles included: a
GEMM whose tiles fit its shape exactly counts 2·M·N·K plus its epilogue.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.ir.dtype import dtype_of
from kiln.loops.ir import (
    FMA,
    TILE_ROWS,
    TILE_WORDS,
    TRANSCENDENTAL_OPS,
    Allocate,
    Binary,
    Cast,
    Check,
    Const,
    DotProduct,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Select,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Unary,
    Var,
    operands,
)
from kiln.runtime.kernel import KernelFunction
from kiln.runtime.vm import VM
from kiln.ssa.ir import KernelDecl

if TYPE_CHECKING:
    from kiln.runtime.build import Executable


# --- FLOPs from the loop IR ------------------------------------------------------------------

_BINARY_FLOPS = frozenset(["add", "sub", "mul", "div", "min", "max", "pow"])
_UNARY_FLOPS = frozenset(["neg", "abs", "sqrt", "rsqrt", "floor", "ceil", "round", "nearbyint",
                          "sign", *TRANSCENDENTAL_OPS])  # transcendentals only if not decomposed


def _node_flops(e: Expr) -> int:
    match e:
        case DotProduct():  # 4 integer multiply-adds per lane (int8 kernels: int8_gemm.py)
            return 8 * e.lanes
        case FMA():
            cost = 2
        case Binary(op=op) if op in _BINARY_FLOPS:
            cost = 1
        case Unary(op=op) if op in _UNARY_FLOPS:
            cost = 1
        case _:
            return 0
    return cost * e.lanes if dtype_of(e.dtype).is_float else 0


def expr_flops(root: Expr) -> int:
    """The float operations evaluating ``root`` once takes (each shared node once)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        total += _node_flops(e)
        stack.extend(operands(e))
    return total


def _expr_vars(root: Expr) -> set[Var]:
    seen: set[int] = set()
    found: set[Var] = set()
    stack = [root]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Var):
            found.add(e)
        stack.extend(operands(e))
    return found


_INT_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b if b else None, "floormod": lambda a, b: a % b if b else None,
    "truncdiv": lambda a, b: int(a / b) if b else None,
    "truncmod": lambda a, b: a - b * int(a / b) if b else None,
    "min": min, "max": max, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "and": lambda a, b: bool(a) and bool(b),
    "or": lambda a, b: bool(a) or bool(b),
}


def _static_value(root: Expr, env: dict[Var, int]) -> int | bool | None:
    """The value of an index or condition expression given the loop indices in ``env``, or
    None when it depends on anything else (data, an unknown index, a float)."""
    values: dict[int, Any] = {}
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in values:
            continue
        if not ready:
            stack.append((e, True))
            stack.extend((o, False) for o in operands(e) if id(o) not in values)
            continue
        v: Any = None
        args = [values[id(o)] for o in operands(e)]
        if any(a is None for a in args):
            v = None
        elif isinstance(e, Const) and not dtype_of(e.dtype).is_float:
            v = e.value
        elif isinstance(e, Var):
            v = env.get(e)
        elif isinstance(e, Binary) and e.op in _INT_OPS and not dtype_of(e.a.dtype).is_float:
            v = _INT_OPS[e.op](args[0], args[1])
        elif isinstance(e, Select):
            v = args[1] if args[0] else args[2]
        elif isinstance(e, Cast) and not dtype_of(e.dtype).is_float:
            v = bool(args[0]) if e.dtype == "bool" else int(args[0])
        values[id(e)] = v
    return values[id(root)]


class _Uncountable(Exception):
    """A trip count that depends on data: the kernel's FLOPs are unknown."""


def _children(s: Stmt) -> tuple[Stmt, ...]:
    match s:
        case For(body=b) | LetStmt(body=b) | Allocate(body=b):
            return (b,)
        case Seq(stmts=ss):
            return ss
        case IfThenElse(then_case=t, else_case=f):
            return (t,) if f is None else (t, f)
    return ()


def _control_vars(body: Stmt) -> dict[int, tuple[Var, ...]]:
    """For each statement, the variables bound outside it that its FLOP count depends on:
    those its trip counts and branch conditions are computed from."""
    free: dict[int, set[Var]] = {}
    stack: list[tuple[Stmt, bool]] = [(body, False)]
    while stack:
        s, ready = stack.pop()
        if not ready:
            stack.append((s, True))
            stack.extend((c, False) for c in _children(s))
            continue
        inner: set[Var] = set()
        for child in _children(s):
            inner |= free[id(child)]
        match s:
            case For(var=v, start=start, extent=extent):
                inner = (inner - {v}) | _expr_vars(start) | _expr_vars(extent)
            case LetStmt(var=v, value=value):
                if v in inner:
                    inner = (inner - {v}) | _expr_vars(value)
            case IfThenElse(cond=c):
                inner |= _expr_vars(c)
        free[id(s)] = inner
    return {k: tuple(sorted(vs, key=lambda v: v.uid)) for k, vs in free.items()}


_Task = Generator[tuple[Stmt, dict[Var, int]], int, int]


def _count_flops(kernel: Kernel) -> int:
    control = _control_vars(kernel.body)
    root_flops: dict[int, int] = {}

    def flops(e: Expr) -> int:
        n = root_flops.get(id(e))
        if n is None:
            n = root_flops[id(e)] = expr_flops(e)
        return n

    def task(s: Stmt, env: dict[Var, int]) -> _Task:
        # One statement's count; it yields (statement, indices) to have a child counted.
        match s:
            case Store(value=value, indices=idx):
                return flops(value) + sum(flops(i) for i in idx)
            case Check(cond=c):
                return flops(c)
            case LetStmt(var=v, value=value, body=body):
                known = _static_value(value, env)  # an index (a tile's row), else None
                inner = env if known is None else {**env, v: int(known)}
                return flops(value) + (yield body, inner)
            case For(var=v, start=start, extent=extent, body=body):
                first, count = _static_value(start, env), _static_value(extent, env)
                if count is None or first is None:
                    raise _Uncountable
                if v not in control[id(body)]:
                    return max(int(count), 0) * (yield body, env)
                total = 0
                for i in range(int(first), int(first) + int(count)):
                    total += yield body, {**env, v: i}
                return total
            case IfThenElse(cond=c, then_case=then, else_case=other):
                taken = _static_value(c, env)
                sides = ([then, other] if taken is None else
                         [then] if taken else [other])
                total = flops(c)
                for side in sides:
                    if side is not None:
                        total += yield side, env
                return total
            case Seq(stmts=ss):
                total = 0
                for child in ss:
                    total += yield child, env
                return total
            case Allocate(body=body):
                return (yield body, env)
            case TileProduct(steps=steps, a=a, b=b):
                # 16 × 16 × 64 integer multiply-adds per A tile, B tile and step
                count = _static_value(steps, env)
                if count is None:
                    raise _Uncountable
                return 2 * TILE_ROWS * TILE_WORDS * 4 * TILE_ROWS * len(a) * len(b) * int(count)
        return 0

    def key(s: Stmt, env: dict[Var, int]) -> tuple[Any, ...]:
        return (id(s), *(env.get(v) for v in control[id(s)]))

    # An explicit stack of counting tasks: loop nests are deep, Python's stack is not.
    memo: dict[tuple[Any, ...], int] = {}
    stack: list[tuple[_Task, tuple[Any, ...]]] = [(task(kernel.body, {}), key(kernel.body, {}))]
    value: Any = None
    while stack:
        gen, k = stack[-1]
        try:
            child, env = gen.send(value)
        except StopIteration as done:
            stack.pop()
            value = memo[k] = done.value
            continue
        ck = key(child, env)
        if ck in memo:
            value = memo[ck]
        else:
            stack.append((task(child, env), ck))
            value = None
    return int(value)


_FLOPS: weakref.WeakKeyDictionary[Kernel, int | None] = weakref.WeakKeyDictionary()


def kernel_flops(kernel: Kernel) -> int | None:
    """The float operations one call of ``kernel`` executes (the rule in this module's
    docstring), or None when a trip count depends on data."""
    if kernel in _FLOPS:
        return _FLOPS[kernel]
    try:
        n: int | None = _count_flops(kernel)
    except _Uncountable:
        n = None
    _FLOPS[kernel] = n
    return n


# --- the profile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRow:
    """One kernel (or one specialization of a kernel of symbolic shape)."""

    kernel: str
    calls: int  # over all profiled runs
    total: float  # seconds, over all profiled runs
    share: float  # of the profiled runs' time
    flops: int | None  # per call; None when the loop IR's trip counts depend on data
    ops: tuple[str, ...]  # the fused operators, in order
    location: str  # file:line:col of its first operator call at Level 1, or "?"

    @property
    def mean(self) -> float:
        """Seconds per call (0 when never called)."""
        return self.total / self.calls if self.calls else 0.0

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s: FLOPs × calls / total time."""
        if self.flops is None or not self.calls or self.total <= 0:
            return None
        return self.flops * self.calls / self.total / 1e9


@dataclass(frozen=True)
class Profile:
    """Per-kernel times of an executable, the costliest first, and its whole-run time."""

    rows: tuple[ProfileRow, ...]
    repeat: int  # profiled runs (and as many runs of the executor)
    whole: float  # seconds per run with the executable's own executor (median)
    executor: str  # which executor that is
    vm_total: float  # seconds of the profiled runs, all together (what shares divide)

    @property
    def kernel_total(self) -> float:
        """Seconds in kernels over all profiled runs."""
        return sum(r.total for r in self.rows)

    @property
    def flops(self) -> int | None:
        """FLOPs of one run (None when some kernel's are unknown)."""
        if any(r.flops is None and r.calls for r in self.rows):
            return None
        return sum((r.flops or 0) * r.calls for r in self.rows) // max(self.repeat, 1)

    def __str__(self) -> str:
        head = ("kernel", "calls", "total ms", "mean us", "share", "MFLOP", "GFLOP/s",
                "source", "operators")
        body = [_row_cells(r) for r in self.rows]
        k_total, per_run = self.kernel_total, self.flops
        gflops = (f"{per_run * self.repeat / k_total / 1e9:.1f}"
                  if per_run and k_total > 0 else "-")
        foot = ("total (kernels)", str(sum(r.calls for r in self.rows)), f"{k_total * 1e3:.3f}",
                "", f"{k_total / self.vm_total:.1%}" if self.vm_total > 0 else "-",
                f"{per_run / 1e6:.2f}" if per_run is not None else "?", gflops, "", "")
        cells = [head, *body, foot]
        widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
        left = {0, 7, 8}  # names, sources and operators read left-aligned; numbers right

        def line(c: tuple[str, ...]) -> str:
            return "  ".join(x.ljust(w) if i in left else x.rjust(w)
                             for i, (x, w) in enumerate(zip(c, widths))).rstrip()

        rule = "-" * len(line(head))
        runs = f"{self.repeat} run{'s' if self.repeat != 1 else ''}"
        vm_run = self.vm_total / max(self.repeat, 1)
        return "\n".join([
            line(head), rule, *map(line, body), rule, line(foot),
            f"per run: {self.whole * 1e3:.3f} ms with the {self.executor} executor (median of "
            f"{runs}), {vm_run * 1e3:.3f} ms in the profiling VM (the shares are of this)",
            "MFLOP per call (the total: per run); a kernel's time includes its call from "
            "Python, a few us",
        ])


def _row_cells(r: ProfileRow) -> tuple[str, ...]:
    g = r.gflops
    return (r.kernel, str(r.calls), f"{r.total * 1e3:.3f}",
            f"{r.mean * 1e6:.1f}" if r.calls else "-", f"{r.share:.1%}",
            "?" if r.flops is None else f"{r.flops / 1e6:.3f}",
            "-" if g is None or not r.flops else f"{g:.1f}", r.location,
            ", ".join(dict.fromkeys(r.ops)))


# --- measuring -------------------------------------------------------------------------------


class _Timed:
    """A kernel function that adds up its calls and the time they take."""

    __slots__ = ("f", "kernel", "decl", "calls", "seconds")

    def __init__(self, f: KernelFunction, decl: KernelDecl) -> None:
        self.f = f
        self.kernel = f.kernel
        self.decl = decl
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, *arrays: np.ndarray) -> None:
        start = time.perf_counter()
        self.f(*arrays)
        self.seconds += time.perf_counter() - start
        self.calls += 1


def _default_repeat(one_run: float) -> int:
    """Enough runs for about half a second of profiling, from 3 to 200."""
    return min(200, max(3, math.ceil(0.5 / max(one_run, 1e-6))))


def profile_executable(exe: Executable, args: list[Any], repeat: int | None = None
                       ) -> Profile:
    """The `Profile` of ``exe`` on checked arguments ``args`` (@main's, in order)."""
    from kiln.runtime.build import make_specializer

    program = exe.program
    timed: dict[str, _Timed] = {}
    for name, f in exe.kernels.functions.items():
        decl = program.kernels.get(name)
        if decl is not None:
            timed[name] = _Timed(f, decl)
    compile_shape = make_specializer(exe.target, exe.opt_level)

    def specialize(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...]) -> KernelFunction:
        t = _Timed(compile_shape(decl, shapes), decl)
        timed[t.kernel.name] = t
        return t

    machine = VM(program, dict[str, KernelFunction](timed), specialize)
    start = time.perf_counter()
    machine.run(program.entry, args)  # warm-up: compiles kernels of symbolic shape
    first = time.perf_counter() - start
    exe.executor.run(args)
    if repeat is None:
        repeat = _default_repeat(first)
    for t in timed.values():
        t.calls, t.seconds = 0, 0.0
    vm_total = 0.0
    wholes = []
    for _ in range(repeat):
        start = time.perf_counter()
        exe.executor.run(args)
        middle = time.perf_counter()
        machine.run(program.entry, args)
        vm_total += time.perf_counter() - middle
        wholes.append(middle - start)
    rows = []
    for name, t in timed.items():
        rows.append(ProfileRow(name, t.calls, t.seconds,
                               t.seconds / vm_total if vm_total > 0 else 0.0,
                               kernel_flops(t.kernel), t.decl.ops, t.decl.location or "?"))
    specialized = {t.decl.name for t in timed.values() if t.decl.name != t.kernel.name}
    for decl in program.kernels.values():
        if decl.kernel is None and decl.name not in specialized:
            # of symbolic shape and never met: a row with no calls, so every kernel is listed
            rows.append(ProfileRow(decl.name, 0, 0.0, 0.0, None, decl.ops, decl.location or "?"))
    rows.sort(key=lambda r: (-r.total, r.kernel))
    return Profile(tuple(rows), repeat, float(np.median(wholes)),
                   getattr(exe.executor, "name", type(exe.executor).__name__), vm_total)
