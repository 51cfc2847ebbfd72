"""Upper bounds of index expressions in terms of a symbolic kernel's dims.

The loop verifier proves an access to an axis of symbolic size ``d`` in bounds by showing
that its last index (lanes included) is at most ``d - 1`` for *every* value of the dims.
Interval arithmetic cannot: ``d`` ranges over [0, DIM_MAX], and ``p * 64 + 63`` for a loop
``for p in [0, d // 64)`` is below ``d`` only through the relation between ``p`` and ``d``.
This module bounds such expressions by `Form`s: linear combinations, with rational
coefficients, of *atoms* — a dim, or the floor quotient ``E // c`` of an exactly known form
``E`` by a positive constant — plus a constant. An index is bounded above by the forms of
its loop variables' last iterations (``start + extent - 1``: an access inside a loop runs
only where the loop does), and ``E % c`` is exactly ``E - c * (E // c)``.

`at_most` then decides ``form <= 0`` for every value of the dims by replacing each quotient
atom, deepest first, by its bound on the side that can only raise the form (``E // c`` is
at most ``E / c`` and at least ``(E - c + 1) / c``), and reading the linear form in the dims
that is left (each dim in [0, DIM_MAX]). Every step over-approximates, so a form it says
is at most 0 is; it may fail to prove a true bound, never prove a false one. This is what
lets a vector main loop over ``[0, d // L)`` and its tail ``[d // L * L, d)`` verify.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction

from kiln.ir.dtype import dtype_of
from kiln.loops.ir import Binary, Cast, Const, Expr, Var

MAX_FORMS = 4  # bounds kept per expression (a min gives one per operand)


@dataclass(frozen=True)
class Dim:
    """An atom: a kernel's dim (compared by the variable's identity)."""

    key: int
    name: str


@dataclass(frozen=True)
class Quot:
    """An atom: ``floor(form / c)``, c > 0."""

    form: Form
    c: int


Atom = Dim | Quot


@dataclass(frozen=True)
class Form:
    """``const + sum(coef * atom)``; terms with coefficient 0 are left out."""

    terms: frozenset[tuple[Atom, Fraction]]
    const: Fraction

    @staticmethod
    def of(terms: dict[Atom, Fraction], const: Fraction | int = 0) -> Form:
        return Form(frozenset((a, k) for a, k in terms.items() if k != 0), Fraction(const))

    @staticmethod
    def number(value: int | Fraction) -> Form:
        return Form(frozenset(), Fraction(value))

    def coefs(self) -> dict[Atom, Fraction]:
        return dict(self.terms)

    def __add__(self, o: Form) -> Form:
        t = self.coefs()
        for a, k in o.terms:
            t[a] = t.get(a, Fraction(0)) + k
        return Form.of(t, self.const + o.const)

    def scale(self, k: Fraction | int) -> Form:
        return Form.of({a: c * k for a, c in self.terms}, self.const * k)

    def __sub__(self, o: Form) -> Form:
        return self + o.scale(-1)


def _depth(a: Atom) -> int:
    if isinstance(a, Dim):
        return 0
    return 1 + max((_depth(b) for b, _ in a.form.terms), default=0)


def at_most(form: Form, dim_max: int, limit: int = 0) -> bool:
    """Whether ``form <= limit`` for every value in [0, dim_max] of the dims it names."""
    f = form
    while True:
        quots = [a for a, _ in f.terms if isinstance(a, Quot)]
        if not quots:
            break
        q = max(quots, key=_depth)
        k = f.coefs()[q]
        rest = Form.of({a: c for a, c in f.terms if a != q}, f.const)
        # k > 0: q <= E / c raises the form; k < 0: q >= (E - c + 1) / c does
        bound = q.form.scale(Fraction(1, q.c)) if k > 0 else \
            (q.form - Form.number(q.c - 1)).scale(Fraction(1, q.c))
        f = rest + bound.scale(k)
    top = f.const + sum((k * dim_max for _, k in f.terms if k > 0), Fraction(0))
    return top <= limit


class Bounds:
    """Symbolic bounds of a kernel's integer expressions, as the verifier walks it.

    ``dims``: id(dim var) -> the var; ``interval``: the verifier's numeric bounds of an
    expression (lo, hi; None unbounded), for what has no exact form; ``upper`` of a loop or
    let variable is what the verifier recorded with `bind`.
    """

    def __init__(self, dims: dict[int, Var],
                 interval: Callable[[Expr], tuple[int | None, int | None]]) -> None:
        self.dims = dims
        self.interval = interval
        self.vars: dict[int, list[Form]] = {}  # id(loop/let var) -> upper bounds

    def bind(self, v: Var, forms: list[Form]) -> None:
        if forms:
            self.vars[id(v)] = forms[:MAX_FORMS]

    def unbind(self, v: Var) -> None:
        self.vars.pop(id(v), None)

    def exact(self, e: Expr) -> Form | None:
        """``e`` as a form, where it is one exactly (dims, constants, +, -, * and // and %
        by positive constants); None otherwise."""
        post: list[Expr] = []
        stack = [e]
        while stack:
            x = stack.pop()
            post.append(x)
            if isinstance(x, Binary):
                stack.extend((x.a, x.b))
            elif isinstance(x, Cast):
                stack.append(x.a)
        got: dict[int, Form | None] = {}
        for x in reversed(post):
            if id(x) not in got:
                got[id(x)] = self._exact1(x, got)
        return got[id(e)]

    def _exact1(self, x: Expr, got: dict[int, Form | None]) -> Form | None:
        if not dtype_of(x.dtype).is_integer or x.lanes != 1:
            return None
        match x:
            case Const(value=v) if isinstance(v, int) and not isinstance(v, bool):
                return Form.number(v)
            case Var() if id(x) in self.dims:
                return Form.of({Dim(id(x), x.name): Fraction(1)})
            case Cast(a=a) if x.dtype == "int64" and dtype_of(a.dtype).is_integer:
                return got[id(a)]  # a widening (a narrowing could wrap)
            case Binary(op=op, a=a, b=b):
                fa, fb = got[id(a)], got[id(b)]
                if fa is None or fb is None:
                    return None
                if op == "add":
                    return fa + fb
                if op == "sub":
                    return fa - fb
                c = _constant(fb)
                if op == "mul":
                    ca = _constant(fa)
                    if c is not None:
                        return fa.scale(c)
                    return fb.scale(ca) if ca is not None else None
                if c is None or c <= 0 or c.denominator != 1:
                    return None
                n = int(c)
                if op == "floordiv":
                    return _quot(fa, n)
                if op == "floormod":
                    return fa - _quot(fa, n).scale(n)
        return None

    def upper(self, root: Expr) -> list[Form]:
        """Forms that ``root`` is at most (where it is evaluated); [] when none is known."""
        return self._bounds(root, upper=True)

    def lower(self, root: Expr) -> list[Form]:
        """Forms that ``root`` is at least; [] when none is known."""
        return self._bounds(root, upper=False)

    def _bounds(self, e: Expr, upper: bool) -> list[Form]:
        exact = self.exact(e)
        if exact is not None:
            return [exact]
        if not dtype_of(e.dtype).is_integer or e.lanes != 1:
            return []
        out: list[Form] = []
        match e:
            case Var() if upper and id(e) in self.vars:
                out = list(self.vars[id(e)])
            case Cast(a=a) if e.dtype == "int64" and dtype_of(a.dtype).is_integer:
                out = self._bounds(a, upper)
            case Binary(op="add", a=a, b=b):
                out = _sums(self._bounds(a, upper), self._bounds(b, upper))
            case Binary(op="sub", a=a, b=b):
                out = _sums(self._bounds(a, upper),
                            [f.scale(-1) for f in self._bounds(b, not upper)])
            case Binary(op="mul", a=a, b=b):
                for x, y in ((a, b), (b, a)):
                    c = self.exact(y)
                    k = _constant(c) if c is not None else None
                    if k is not None:
                        out = [f.scale(k) for f in self._bounds(x, upper if k >= 0 else not upper)]
                        break
            case Binary(op="floordiv", a=a, b=Const(value=c)) if isinstance(c, int) and c > 0:
                shift = Form.number(0 if upper else c - 1)
                out = [(f - shift).scale(Fraction(1, c)) for f in self._bounds(a, upper)]
            case Binary(op="min", a=a, b=b) if upper:
                out = self._bounds(a, True) + self._bounds(b, True)
            case Binary(op="max", a=a, b=b) if not upper:
                out = self._bounds(a, False) + self._bounds(b, False)
        lo, hi = self.interval(e)
        number = hi if upper else lo
        if number is not None:
            out.append(Form.number(number))
        return out[:MAX_FORMS]


def _constant(f: Form) -> Fraction | None:
    return f.const if not f.terms else None


def _quot(f: Form, c: int) -> Form:
    k = _constant(f)
    if k is not None:
        return Form.number(k // c)
    return Form.of({Quot(f, c): Fraction(1)})


def _sums(xs: Iterable[Form], ys: Iterable[Form]) -> list[Form]:
    ys = list(ys)
    return [x + y for x in xs for y in ys][:MAX_FORMS]
