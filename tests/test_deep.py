"""Deep programs: nothing in kiln recurses in Python over the IR.

A 20,000-deep let chain and a 20,000-node dataflow graph must infer, print, parse and
interpret without a RecursionError (sys.getrecursionlimit() is 1000 here).
"""

import numpy as np

import kiln

N = 20000


def let_chain(n: int) -> kiln.IRModule:
    x = kiln.var("x", shape=(2,))
    body: kiln.Expr
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body = vs[-1]
    for i in reversed(range(n)):
        prev = x if i == 0 else vs[i - 1]
        body = kiln.Let(vs[i], kiln.op.add(prev, kiln.const(1.0)), body)
    return kiln.IRModule.from_expr(kiln.Function([x], body))


def dataflow_graph(n: int) -> kiln.IRModule:
    """A chain of n calls where each node is used twice (a diamond at every step)."""
    x = kiln.var("x", shape=(2,))
    h: kiln.Expr = x
    for i in range(n // 2):
        h = kiln.op.multiply(h, h) if i % 2 else kiln.op.subtract(h, kiln.op.nn.relu(h))
    return kiln.IRModule.from_expr(kiln.Function([x], h))


def test_let_chain_infers_prints_parses_and_runs():
    mod = let_chain(N)
    typed = kiln.infer_types(mod)
    assert typed["main"].checked_type.ret_type == kiln.TensorType((2,), "float32")
    text = kiln.astext(mod)
    again = kiln.parse(text)
    assert kiln.structural_equal(again, mod)
    out = kiln.interpret(typed, np.array([1.0, -1.0], "float32"))
    np.testing.assert_array_equal(out, np.array([1.0 + N, -1.0 + N], "float32"))


def test_dataflow_graph_infers_prints_parses_and_runs():
    mod = dataflow_graph(N)
    typed = kiln.infer_types(mod)
    text = kiln.astext(typed)
    again = kiln.parse(text)
    assert kiln.structural_equal(again, mod)
    x = np.array([0.5, -3.0], "float32")
    expected = x.copy()
    for i in range(N // 2):
        expected = expected * expected if i % 2 else expected - np.maximum(expected, 0)
    np.testing.assert_array_equal(kiln.interpret(typed, x), expected)


def test_deep_non_tail_recursion_runs():
    # @count(n) = if n == 0 { 0 } else { 1 + @count(n - 1) }: 20,000 nested calls.
    text = """
    def @count(%n: int32) -> int32 {
      if (%n == 0) { 0 } else { 1 + @count(%n - 1) }
    }
    def @main(%n: int32) { @count(%n) }
    """
    assert int(kiln.interpret(kiln.parse(text), np.int32(N))) == N


def test_dataflow_graph_goes_through_optimize():
    mod = dataflow_graph(N)
    out = kiln.optimize(mod)
    stats = kiln.transform.fusion_stats(out)
    assert stats.calls_outside == 0 and stats.primitive_functions < N // 50
    x = np.array([0.5, -3.0], "float32")
    np.testing.assert_array_equal(kiln.interpret(out, x), kiln.interpret(mod, x))
