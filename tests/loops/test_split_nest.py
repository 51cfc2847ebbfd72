"""Divisions of a vector loop's index (kiln/loops/split_nest.py): `simplify` against brute
force over every value of small ranges, and copies that split heads, compiled, against numpy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.loops.ir import INDEX, Binary, Const, Expr, For, Var, binary, subexpressions
from kiln.loops.split_nest import simplify
from kiln.runtime.backend import lower
from kiln.runtime.compiler import native_available


def value(e: Expr, env: dict[int, int]) -> int:
    """An index expression's value (floor division and remainder, as the loop IR's)."""
    stack: list[tuple[Expr, bool]] = [(e, False)]
    done: dict[int, int] = {}
    while stack:
        x, ready = stack.pop()
        if isinstance(x, Const):
            done[id(x)] = int(x.value)
        elif isinstance(x, Var):
            done[id(x)] = env[id(x)]
        elif not ready:
            assert isinstance(x, Binary)
            stack += [(x, True), (x.a, False), (x.b, False)]
        else:
            done[id(x)] = arithmetic(x.op, done[id(x.a)], done[id(x.b)])
    return done[id(e)]


def arithmetic(op: str, a: int, b: int) -> int:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    return a // b if op == "floordiv" else a % b


def divisions(e: Expr, v: Var) -> int:
    """Divisions and remainders in ``e`` whose dividend mentions ``v``."""
    return sum(1 for x in subexpressions(e) if isinstance(x, Binary)
               and x.op in ("floordiv", "floormod") and any(y is v for y in subexpressions(x.a)))


def c(k: int) -> Const:
    return Const(k, INDEX)


J, I, B = Var("j"), Var("i"), Var("b")
CASES = [
    # (dividend, divisor, ranges, divisions of j left): a head's columns, 64 of 256
    (binary("add", J, binary("mul", I, c(64))), 256, {J: (0, 63), I: (0, 31)}, 0),
    # a run of 64 within 256-wide rows of 8 heads
    (binary("add", binary("add", J, binary("mul", I, c(64))), binary("mul", B, c(256))), 64,
     {J: (0, 63), I: (0, 3), B: (0, 7)}, 0),
    # a negative multiple of the divisor beside the lanes
    (binary("add", binary("sub", binary("mul", I, c(64)), c(128)), J), 64,
     {J: (0, 63), I: (0, 5)}, 0),
    # lanes past the divisor: nothing to do
    (binary("add", J, binary("mul", B, c(256))), 64, {J: (0, 255), B: (0, 3)}, 2),
    # an offset that crosses a run: nothing to do
    (binary("add", binary("add", J, c(5)), binary("mul", I, c(64))), 64,
     {J: (0, 63), I: (0, 3)}, 2),
]


@pytest.mark.parametrize("dividend,divisor,ranges,left", CASES)
def test_simplify_agrees_with_brute_force(dividend: Expr, divisor: int, ranges: dict,
                                          left: int) -> None:
    both = binary("add", Binary("floordiv", dividend, c(divisor)),
                  binary("mul", Binary("floormod", dividend, c(divisor)), c(1 << 20)))
    got = simplify(both, {id(v): r for v, r in ranges.items()})
    assert divisions(got, J) == left
    names = list(ranges)
    for values in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges.values())):
        env = {id(v): x for v, x in zip(names, values)}
        assert value(got, env) == value(both, env), values


pytestmark_native = pytest.mark.skipif(not native_available(), reason="needs llvmlite")


def vector_divisions(kernel) -> int:
    """Divisions of a vectorized loop's variable in a kernel's reads and writes."""
    stack, n = [kernel.body], 0
    lanes: list[Var] = []
    while stack:
        s = stack.pop()
        if isinstance(s, For):
            if s.kind == "vectorized":
                lanes.append(s.var)
            stack.append(s.body)
        elif hasattr(s, "stmts"):
            stack.extend(s.stmts)
        elif hasattr(s, "body"):
            stack.append(s.body)
        if hasattr(s, "indices"):
            for e in (*s.indices, s.value):
                n += sum(divisions(e, v) for v in lanes)
    return n


@pytestmark_native
@pytest.mark.parametrize("heads,dim", [(4, 64), (12, 64), (2, 32)])
def test_head_copies_read_plain_vectors(heads: int, dim: int) -> None:
    # the encoder's shapes: Q, K, V as (t, b, 3, d) split into heads (b·h, t, dim), and the
    # heads' adjoints added back into a (t, b, 3, d) gradient; no division of a vector
    # index left, numpy's result on one and two threads
    t, b = 16, 2
    d = heads * dim
    x = kiln.var("x", shape=(t, b, 3, d), dtype="float32")
    ys = [kiln.var(f"y{k}", shape=(b * heads, t, dim), dtype="float32") for k in range(3)]
    q = kiln.op.reshape(kiln.op.strided_slice(x, begin=[0, 0, 1, 0], end=[t, b, 2, d]),
                        newshape=(t, b * heads, dim))
    split = kiln.op.transpose(q, axes=(1, 0, 2))
    parts = [kiln.op.reshape(kiln.op.transpose(y, axes=(1, 0, 2)), newshape=(t, b, 1, d))
             for y in ys]
    merged = kiln.op.concatenate(parts, axis=2)
    mod = kiln.IRModule.from_expr(kiln.Function([x, *ys], kiln.Tuple([split, merged])))
    low = lower(mod, "llvm", 3, upto="lower-kernels")
    kernels = [decl.kernel for decl in low.program.kernels.values()]
    assert kernels and all(k is not None and vector_divisions(k) == 0 for k in kernels)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((t, b, 3, d)).astype(np.float32)
    bs = [rng.standard_normal((b * heads, t, dim)).astype(np.float32) for _ in range(3)]
    exe = kiln.build(mod)
    for count in (1, 2):
        with threads(count):
            got_split, got_merged = exe(a, *bs)
        np.testing.assert_array_equal(
            got_split, a[:, :, 1, :].reshape(t, b * heads, dim).transpose(1, 0, 2))
        np.testing.assert_array_equal(got_merged, np.stack(
            [y.transpose(1, 0, 2).reshape(t, b, d) for y in bs], axis=2))


def test_a_large_divisor_is_quick_and_exact() -> None:
    # a flat index of a large tensor divided by a large row length: the divisors are found
    # in √c steps, and the result still agrees with brute force at the range's ends
    row = 30_000_000
    e = binary("add", J, binary("mul", I, c(row)))
    both = binary("add", Binary("floordiv", e, c(row)), Binary("floormod", e, c(row)))
    ranges = {J: (0, row - 1), I: (0, 3)}
    got = simplify(both, {id(v): r for v, r in ranges.items()})
    assert divisions(got, J) == 0
    for j, i in itertools.product((0, 1, row - 1), (0, 3)):
        env = {id(J): j, id(I): i}
        assert value(got, env) == value(both, env)
