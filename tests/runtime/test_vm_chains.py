"""Kernel chains (kiln/runtime/chains.py): the kernels of a straight stretch of a VM block run
by one native call. Results are checked against numpy oracles written here, failures inside
a chain against the error each kernel raises on its own, and concurrent calls against one
another."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kiln
from kiln.eval.values import ConstructorValue
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

# each Cons cell: three kernels (reshape+add, dense+add of a folded constant, softmax) with
# two buffers in the frame's arena that only they use, and a result that leaves the chain
WALK = """
type List { Cons(Tensor[(8), float32], List), Nil, }
def @walk(%l: List, %w: Tensor[(8, 8), float32]) -> Tensor[(1, 8), float32] {
  match (%l) {
    Cons(%x, %rest) => {
      let %y = @walk(%rest, %w);
      let %h = nn.dense(add(reshape(%x, newshape=[1, 8]), %y), %w);
      nn.softmax(add(%h, ones(shape=[1, 8], dtype="float32")))
    },
    Nil => zeros(shape=[1, 8], dtype="float32"),
  }
}
def @main(%l: List, %w: Tensor[(8, 8), float32]) -> Tensor[(1, 8), float32] { @walk(%l, %w) }
"""


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _walk_oracle(xs: list[np.ndarray], w: np.ndarray) -> np.ndarray:
    y = np.zeros((1, 8), np.float64)
    for x in reversed(xs):  # the innermost cell runs first
        y = _softmax((x.reshape(1, 8) + y) @ w.T.astype(np.float64) + 1.0)
    return y


def _as_list(mod: kiln.IRModule, xs: list[np.ndarray]) -> ConstructorValue:
    cons, nil = mod.get_constructor("Cons"), mod.get_constructor("Nil")
    value = ConstructorValue(nil, ())
    for x in reversed(xs):
        value = ConstructorValue(cons, (x, value))
    return value


def test_a_recursive_program_runs_its_cells_as_chains() -> None:
    mod = kiln.parse(WALK)
    exe = kiln.build(mod)
    assert exe.stats().executor == "vm"
    assert exe.executor.vm.chained == 3  # the Cons arm's three kernels, in one chain
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype("float32")
    for n in (0, 1, 2, 7):
        xs = [rng.standard_normal(8).astype("float32") for _ in range(n)]
        got = exe(_as_list(mod, xs), w)
        np.testing.assert_allclose(got, _walk_oracle(xs, w), rtol=1e-5, atol=1e-6)


def test_the_tree_lstm_matches_a_numpy_recursion() -> None:
    from kiln.testing import models

    mod, params = models.tree_lstm(embed=12, hidden=8)
    exe = kiln.build(mod, params=params)
    assert exe.executor.vm.chained == 7  # a leaf's three kernels, a node's four
    tree = models.random_tree(mod, 9, embed=12)

    def sig(z: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-z))

    def cell(t: ConstructorValue) -> tuple[np.ndarray, np.ndarray]:
        # an explicit stack, children first
        done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        work = [(t, False)]
        while work:
            v, expanded = work.pop()
            if v.name == "Leaf":
                g = v.fields[0] @ params["leaf_weight"].T + params["leaf_bias"]
                i, o, u = np.split(g, 3, axis=1)
                c = sig(i) * np.tanh(u)
                done[id(v)] = (sig(o) * np.tanh(c), c)
            elif not expanded:
                work += [(v, True), (v.fields[1], False), (v.fields[0], False)]
            else:
                (hl, cl), (hr, cr) = done[id(v.fields[0])], done[id(v.fields[1])]
                g = np.concatenate([hl, hr], axis=1) @ params["node_weight"].T
                i, fl, fr, o, u = np.split(g + params["node_bias"], 5, axis=1)
                c = sig(i) * np.tanh(u) + sig(fl) * cl + sig(fr) * cr
                done[id(v)] = (sig(o) * np.tanh(c), c)
        return done[id(t)]

    np.testing.assert_allclose(exe(tree), cell(tree)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("divide_first", [True, False])
def test_a_kernel_failing_inside_a_chain_raises_its_own_error(divide_first: bool) -> None:
    ops = ["let %q = divide(%x, %d);", "let %h = nn.dense(%f, %w);"]
    if not divide_first:
        ops.reverse()
    mod = kiln.parse(f"""
    type Box {{ B(Tensor[(4), int32]), }}
    def @main(%b: Box, %d: Tensor[(4), int32], %f: Tensor[(1, 8), float32],
              %w: Tensor[(8, 8), float32]) -> (Tensor[(4), int32], Tensor[(1, 8), float32]) {{
      match (%b) {{
        B(%x) => {{
          {ops[0]}
          {ops[1]}
          (%q, %h)
        }},
      }}
    }}
    """)
    exe = kiln.build(mod)
    assert exe.executor.vm.chained == 2
    box = ConstructorValue(mod.get_constructor("B"), (np.array([6, 7, 8, 9], "int32"),))
    f = np.ones((1, 8), "float32")
    w = np.eye(8, dtype="float32")
    q, h = exe(box, np.array([3, 7, 2, 4], "int32"), f, w)
    np.testing.assert_array_equal(q, [2, 1, 4, 2])
    np.testing.assert_array_equal(h, f)
    with pytest.raises(kiln.Error, match="integer division by zero"):
        exe(box, np.array([3, 0, 2, 4], "int32"), f, w)
    q, _ = exe(box, np.array([1, 1, 1, 1], "int32"), f, w)  # and it runs on afterwards
    np.testing.assert_array_equal(q, [6, 7, 8, 9])


def test_concurrent_calls_do_not_share_a_chains_pointers() -> None:
    mod = kiln.parse(WALK)
    exe = kiln.build(mod)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 8)).astype("float32")
    lists = [[rng.standard_normal(8).astype("float32") for _ in range(n)] for n in (3, 5, 6, 9)]
    want = [_walk_oracle(xs, w) for xs in lists]
    errors: list[str] = []

    def worker(k: int) -> None:
        for _ in range(50):
            got = exe(_as_list(mod, lists[k]), w)
            if not np.allclose(got, want[k], rtol=1e-5, atol=1e-6):
                errors.append(f"list {k}: {got} != {want[k]}")
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(lists))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_profiler_still_times_each_kernel_of_a_chain() -> None:
    mod = kiln.parse(WALK)
    exe = kiln.build(mod)
    w = np.eye(8, dtype="float32")
    xs = [np.ones(8, "float32")] * 4
    rows = {r.kernel: r for r in exe.profile(_as_list(mod, xs), w, repeat=3).rows}
    for name in ("fused_reshape_add", "fused_nn_dense_add", "fused_nn_softmax"):
        assert rows[name].calls == 4 * 3
