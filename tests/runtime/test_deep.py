"""Deep programs through kiln.build: nothing recurses in Python over programs or values."""

import numpy as np
import pytest

import kiln
from kiln.runtime import build

from .helpers import needs_native


def let_chain(n: int) -> kiln.IRModule:
    x = kiln.var("x", shape=(2,))
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body: kiln.Expr = vs[-1]
    for i in reversed(range(n)):
        prev = x if i == 0 else vs[i - 1]
        body = kiln.Let(vs[i], kiln.op.add(prev, kiln.const(1.0)), body)
    return kiln.IRModule.from_expr(kiln.Function([x], body))


@pytest.mark.parametrize("n", [3000, pytest.param(20000, marks=pytest.mark.slow)])
def test_a_long_let_chain_builds_and_runs(n):
    exe = build(let_chain(n), target="evaluator")
    np.testing.assert_array_equal(exe(np.array([1.0, -1.0], "float32")),
                                  np.array([1.0 + n, -1.0 + n], "float32"))


def test_long_adt_arguments_are_checked_without_recursion():
    text = """
    type List[A] { Cons(A, List[A]), Nil, }
    def @sum(%xs: List[Tensor[(), float32]], %acc: Tensor[(), float32]) -> Tensor[(), float32] {
      match (%xs) { Cons(%h, %t) => @sum(%t, %acc + %h), Nil => %acc }
    }
    def @main(%xs: List[Tensor[(), float32]]) { @sum(%xs, 0f) }
    """
    mod = kiln.infer_types(kiln.parse(text))
    cons, nil = mod.get_constructor("Cons"), mod.get_constructor("Nil")
    xs = kiln.ConstructorValue(nil)
    for i in range(3000):
        xs = kiln.ConstructorValue(cons, (np.float32(i % 7), xs))  # numpy scalars: converted
    exe = build(mod, target="evaluator")
    assert float(exe(xs)) == float(sum(i % 7 for i in range(3000)))
    bad = kiln.ConstructorValue(cons, (np.float64(1.0), xs))
    with pytest.raises(kiln.Error, match="field 0 of Cons expects float32"):
        exe(bad)


@needs_native
def test_deep_non_tail_recursion_runs_natively():
    text = """
    def @count(%n: int32) -> int32 {
      if (%n == 0) { 0 } else { 1 + @count(%n - 1) }
    }
    def @main(%n: int32) { @count(%n) }
    """
    exe = build(kiln.parse(text))
    assert int(exe(np.int32(20000))) == 20000
