"""Vector loops split where their reads divide the index: the quotient a loop of its own, the
remainder the vector loop.

A copy that gathers heads or splits Q, K and V (a transformer's `reshape`, `transpose` and
`strided_slice`, and their gradients) reads ``x[(j + 256·b) // 64, t, (j + 256·b) % 64]``
along a vectorized ``j`` in [0, 256): one division and one remainder per lane, and a gather,
though every run of 64 lanes reads consecutive floats. With ``j = 64·j1 + j0`` and ``j0`` in
[0, 64) the vector loop, `simplify` finds the quotient ``j1 + 4·b`` and the remainder ``j0``
from the variables' ranges: a plain vector load. The encoder's QKV split gradient (a
(128, 8, 3, 256) output from three (32, 128, 64) adjoints): 425 -> 202 µs a call in its
training step's profile (`benchmarks/training.py --models encoder4 --profile`, 2 threads of
a Sapphire Rapids-class VM). Where the vector loop is shorter than the divisor (a head of 64
columns out of 256-wide rows) the ranges alone remove the division, without a split.

`simplify` rewrites ``e // c`` and ``e % c`` for a linear ``e`` (a sum of constant multiples
of variables and a constant): for the largest divisor ``g`` of ``c`` such that the terms
whose multiple ``g`` does not divide lie in [0, g) whatever the variables' values (their
ranges), ``e // c = (big / g) // (c / g)`` and ``e % c = ((big / g) % (c / g))·g + small``
(floor division, exact for negative ``big`` too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.loops.ir import (
    INDEX,
    Binary,
    Const,
    Expr,
    For,
    Stmt,
    Store,
    Var,
    binary,
    operands,
    subexpressions,
    with_operands,
)
from kiln.loops.schedule import VECTORIZE_MIN_EXTENT, NestSchedule, lowering_target

Ranges = dict[int, tuple[int, int]]  # id of a variable -> its lowest and highest value
Linear = tuple[dict[int, int], dict[int, Var], int]  # multiples, variables, constant


def _linear(e: Expr) -> Linear | None:
    """``e`` as Σ k·v + constant (by variable id), or None where it is not linear."""
    terms: dict[int, int] = {}
    names: dict[int, Var] = {}
    const = 0
    stack: list[tuple[Expr, int]] = [(e, 1)]
    while stack:
        x, k = stack.pop()
        if isinstance(x, Const) and isinstance(x.value, int) and not isinstance(x.value, bool):
            const += k * x.value
        elif isinstance(x, Var) and x.lanes == 1:
            terms[id(x)] = terms.get(id(x), 0) + k
            names[id(x)] = x
        elif isinstance(x, Binary) and x.op in ("add", "sub"):
            stack += [(x.a, k), (x.b, -k if x.op == "sub" else k)]
        elif isinstance(x, Binary) and x.op == "mul" and isinstance(x.b, Const) \
                and isinstance(x.b.value, int):
            stack.append((x.a, k * x.b.value))
        elif isinstance(x, Binary) and x.op == "mul" and isinstance(x.a, Const) \
                and isinstance(x.a.value, int):
            stack.append((x.b, k * x.a.value))
        else:
            return None
    return terms, names, const


def _build(terms: dict[int, int], names: dict[int, Var], const: int, scale: int) -> Expr:
    """Σ (k / scale)·v + const / scale (every k and const a multiple of scale)."""
    out: Expr = Const(const // scale, INDEX)
    for key, k in terms.items():
        if k:
            out = binary("add", out, binary("mul", names[key], Const(k // scale, INDEX)))
    return out


def _divisors(c: int) -> list[int]:
    """The divisors of ``c`` > 0, largest first (in √c steps: a tensor's divisor can be
    millions)."""
    small = [d for d in range(1, int(c ** 0.5) + 1) if c % d == 0]
    return sorted(set(small + [c // d for d in small]), reverse=True)


def _divided(op: str, dividend: Expr, c: int, ranges: Ranges) -> Expr | None:
    """``dividend // c`` or ``% c`` without the division where the ranges allow it."""
    lin = _linear(dividend)
    if lin is None or c <= 0:
        return None
    terms, names, const = lin
    for g in _divisors(c):
        small = {v: k for v, k in terms.items() if k % g}
        if any(v not in ranges for v in small):
            continue
        lo = hi = const % g
        for v, k in small.items():
            a, b = k * ranges[v][0], k * ranges[v][1]
            lo, hi = lo + min(a, b), hi + max(a, b)
        if lo < 0 or hi >= g:
            continue
        big = {v: k for v, k in terms.items() if k % g == 0}
        quotient = _build(big, names, const - const % g, g)
        rest = _build(small, names, const % g, 1)
        if op == "floordiv":
            return quotient if g == c else binary("floordiv", quotient, Const(c // g, INDEX))
        if g == c:
            return rest
        return binary("add", binary("mul", binary("floormod", quotient, Const(c // g, INDEX)),
                                    Const(g, INDEX)), rest)
    return None


def simplify(e: Expr, ranges: Ranges) -> Expr:
    """``e`` with each division and remainder of a linear index by a constant rewritten where
    the variables' ranges allow (see the module docstring); children first, each shared
    node once."""
    done: dict[int, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if id(x) in done:
            continue
        kids = operands(x)
        if not ready:
            stack.append((x, True))
            stack += [(k, False) for k in kids if id(k) not in done]
            continue
        new = with_operands(x, tuple(done[id(k)] for k in kids)) if kids else x
        if isinstance(new, Binary) and new.op in ("floordiv", "floormod") \
                and isinstance(new.b, Const) and isinstance(new.b.value, int):
            new = _divided(new.op, new.a, new.b.value, ranges) or new
        done[id(x)] = new
    return done[id(e)]


def _divisions_of(e: Expr, v: Var) -> list[int]:
    """The constant divisors of the divisions and remainders in ``e`` whose dividend moves
    with ``v`` one for one."""
    out = []
    for x in subexpressions(e):
        if isinstance(x, Binary) and x.op in ("floordiv", "floormod") \
                and isinstance(x.b, Const) and isinstance(x.b.value, int):
            lin = _linear(x.a)
            if lin is not None and lin[0].get(id(v)) == 1:
                out.append(x.b.value)
    return out


def split_divisor(shape: Sequence[int], element: Callable[[tuple[Expr, ...]], Stmt]
                  ) -> int | None | bool:
    """How to split a nest's vectorized last axis: the smallest divisor of a division its
    reads make of that axis that divides its length and holds a vector or more (a run of
    consecutive lanes); None where such a division does not divide it (the ranges alone may
    remove it); False where its reads divide no index by a constant (nothing to do)."""
    if len(shape) < 2 or shape[-1] < VECTORIZE_MIN_EXTENT:
        return False
    probe = tuple(Var(f"q{k}") for k in range(len(shape)))
    stmt = element(probe)
    if not isinstance(stmt, Store):
        return False
    lanes = lowering_target().lanes(stmt.buffer.dtype)
    n = shape[-1]
    divisors = [c for e in (*stmt.indices, stmt.value) for c in _divisions_of(e, probe[-1])]
    found = [c for c in divisors if n % c == 0 and lanes <= c < n]
    if found:
        return min(found)
    return None if divisors else False


def split_nest(shape: Sequence[int], element: Callable[[tuple[Expr, ...]], Stmt],
               c: int | None) -> Stmt | None:
    """The nest over ``shape`` with its last axis (the vector loop) split into ``n / c`` runs
    of ``c`` (not split when None), its reads' divisions simplified by the loops' ranges;
    None where no division of the vector index went away, or one is left."""
    if len(shape) < 2 or shape[-1] < VECTORIZE_MIN_EXTENT:
        return None
    outer = tuple(Var(f"i{k}") for k in range(len(shape) - 1))
    n = shape[-1]
    hi, lo = Var("i_run"), Var("i_lane")
    run = c or n
    last = binary("add", binary("mul", hi, Const(run, INDEX)), lo) if c else lo
    stmt = element((*outer, last))
    if not isinstance(stmt, Store):
        return None
    before = [d for e in (*stmt.indices, stmt.value) for d in _divisions_of(e, lo)]
    ranges: Ranges = {id(v): (0, d - 1) for v, d in zip(outer, shape)}
    ranges[id(hi)], ranges[id(lo)] = (0, n // run - 1), (0, run - 1)
    stmt = Store(stmt.buffer, tuple(simplify(i, ranges) for i in stmt.indices),
                 simplify(stmt.value, ranges))
    if not (before or c) or any(_divisions_of(e, lo) for e in (*stmt.indices, stmt.value)):
        return None
    schedule = NestSchedule.default(shape[:-1], work_per_element=n)
    body: Stmt = For(lo, Const(0), Const(run), stmt, "vectorized")
    if c:
        body = For(hi, Const(0), Const(n // run), body)
    for k in reversed(range(len(outer))):
        kind = "parallel" if k == schedule.parallel_axis else "serial"
        body = For(outer[k], Const(0), Const(shape[k]), body, kind)
    return body
