"""matrix-chain-reordering: the dynamic program, rebuilt chains, and when chains are left alone."""

import time
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.traverse import post_order
from kiln.op import nn
from kiln.transform.matrix_chain_reordering import (
    MatrixChainReordering,
    chain_flops,
    matrix_chain_order,
)
from kiln.transform.pass_manager import PassContext, typed


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return MatrixChainReordering()(mod)


def brute_force(dims: tuple[int, ...]) -> int:
    """The cheapest association by trying every one (Catalan many)."""

    @cache
    def best(i: int, j: int) -> int:
        if i == j:
            return 0
        return min(best(i, k) + best(k + 1, j) + dims[i] * dims[k + 1] * dims[j + 1]
                   for k in range(i, j))

    return best(0, len(dims) - 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=2, max_size=8))
def test_the_dynamic_program_finds_the_cheapest_association(dims):
    cost, split = matrix_chain_order(dims)
    assert cost == brute_force(tuple(dims))

    def cost_of(i: int, j: int) -> int:  # the cost of the association the split table gives
        if i == j:
            return 0
        k = split[i][j]
        return cost_of(i, k) + cost_of(k + 1, j) + dims[i] * dims[k + 1] * dims[j + 1]

    assert cost_of(0, len(dims) - 2) == cost


def test_the_textbook_example():
    assert matrix_chain_order([10, 30, 5, 60])[0] == 4500  # (AB)C: 1500 + 3000
    assert matrix_chain_order([40, 20, 30, 10, 30])[0] == 26000


def benchmark_chain() -> kiln.IRModule:
    sizes = [(40, 400), (400, 10), (10, 300), (300, 5), (5, 200)]
    a = kiln.var("a", shape=sizes[0])
    h: kiln.Expr = a
    params = [a]
    for i, (k, n) in enumerate(sizes[1:]):
        w = kiln.var(f"m{i}", shape=(n, k))  # dense(h, w) = h @ w.T
        params.append(w)
        h = nn.dense(h, w)
    return kiln.IRModule.from_expr(kiln.Function(params, h))


def random_args(mod: kiln.IRModule, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, p.checked_type.shape).astype(p.checked_type.dtype)
            for p in typed(mod)["main"].params]


def same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    args = random_args(before)
    want = kiln.interpret(before, *args)
    got = kiln.interpret(after, *args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_benchmark_chain_of_five():
    mod = benchmark_chain()
    out = run(mod)
    # ((((A B) C) D) E): 40*400*10 + 40*10*300 + 40*300*5 + 40*5*200 multiply-adds
    assert chain_flops(mod) == 2 * (160000 + 120000 + 60000 + 40000)
    # (A ((B C) D)) E: 10*300*5 + 400*10*5 + 40*400*5 + 40*5*200
    assert chain_flops(out) == 2 * (15000 + 20000 + 80000 + 40000)
    same_results(mod, out)


HEAD = ("def @main(%a: Tensor[(100, 10), float32], %b: Tensor[(100, 10), float32], "
        "%c: Tensor[(5, 100), float32]")


def test_a_chain_of_three_is_reassociated():
    # A B^T C^T costs 100*10*100 + 100*100*5; A (C B)^T costs 5*100*10 + 100*10*5.
    mod = kiln.parse(f"{HEAD}) {{ nn.dense(nn.dense(%a, %b), %c) }}")
    out = run(mod)
    expected = kiln.parse(f"{HEAD}) {{ nn.dense(%a, nn.dense(%c, transpose(%b))) }}")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_a_weight_that_is_itself_a_product():
    # dense(A, dense(P, Q)) = A (P Q^T)^T = A Q P^T: three factors.
    mod = kiln.parse("""
        def @main(%a: Tensor[(2, 50), float32], %p: Tensor[(60, 40), float32],
                  %q: Tensor[(50, 40), float32]) {
          nn.dense(%a, nn.dense(%p, %q))
        }""")
    out = run(mod)
    expected = kiln.parse("""
        def @main(%a: Tensor[(2, 50), float32], %p: Tensor[(60, 40), float32],
                  %q: Tensor[(50, 40), float32]) {
          nn.dense(nn.dense(%a, transpose(%q)), %p)
        }""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_leading_batch_dimensions_of_the_first_factor():
    mod = kiln.parse("""
        def @main(%a: Tensor[(4, 25, 10), float32], %b: Tensor[(100, 10), float32],
                  %c: Tensor[(5, 100), float32]) {
          nn.dense(nn.dense(%a, %b), %c)
        }""")
    out = run(mod)
    expected = kiln.parse("""
        def @main(%a: Tensor[(4, 25, 10), float32], %b: Tensor[(100, 10), float32],
                  %c: Tensor[(5, 100), float32]) {
          nn.dense(%a, nn.dense(%c, transpose(%b)))
        }""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_batch_matmul_chains_use_the_transpose_flags():
    mod = kiln.parse("""
        def @main(%a: Tensor[(3, 40, 4), float32], %b: Tensor[(3, 40, 4), float32],
                  %c: Tensor[(3, 2, 40), float32]) {
          nn.batch_matmul(nn.batch_matmul(%a, %b), %c)
        }""")
    out = run(mod)
    expected = kiln.parse("""
        def @main(%a: Tensor[(3, 40, 4), float32], %b: Tensor[(3, 40, 4), float32],
                  %c: Tensor[(3, 2, 40), float32]) {
          nn.batch_matmul(%a, nn.batch_matmul(%b, %c, transpose_a=True, transpose_b=True),
                          transpose_b=False)
        }""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


@pytest.mark.parametrize("body, extra", [
    # the inner product is used twice: it must be computed anyway
    ("%0 = nn.dense(%a, %b); (nn.dense(%0, %c), %0)", ""),
    # already the cheapest association
    ("nn.dense(%a, nn.dense(%c, transpose(%b)))", ""),
    # a product computed in a wider dtype than its operands
    ('nn.dense(nn.dense(%h, %i, out_dtype="float32"), %c)',
     ", %h: Tensor[(100, 10), float16], %i: Tensor[(100, 10), float16]"),
])
def test_chains_left_alone(body, extra):
    mod = kiln.parse(f"{HEAD}{extra}) {{ {body} }}")
    assert kiln.structural_equal(run(mod), mod)


def test_unknown_sizes_and_mixed_products_are_left_alone():
    mod = kiln.parse("""
        def @main(%a: Tensor[(?, 10), float32], %b: Tensor[(100, 10), float32],
                  %c: Tensor[(5, 100), float32]) {
          nn.dense(nn.dense(%a, %b), %c)
        }""")
    assert kiln.structural_equal(run(mod), mod)
    mod = kiln.parse("""
        def @main(%a: Tensor[(1, 100, 10), float32], %b: Tensor[(1, 100, 10), float32],
                  %c: Tensor[(5, 100), float32]) {
          nn.dense(nn.batch_matmul(%a, %b), %c)
        }""")
    assert kiln.structural_equal(run(mod), mod)


def test_a_normal_form_lets_closures_and_branches():
    mod = kiln.parse(f"""{HEAD}, %f: bool) {{
        let %t = nn.dense(%a, %b);
        let %g = fn (%x: Tensor[(100, 10), float32]) {{
          let %s = nn.dense(%x, %b);
          nn.dense(%s, %c)
        }};
        if (%f) {{ nn.dense(%t, %c) }} else {{ %g(%a) }}
    }}""")
    out = run(mod)
    # %t is bound outside the if: moving its product into a branch is not done. The chain in
    # the closure is rebuilt there; %s stays bound (dead) for dead-code elimination.
    expected = kiln.parse(f"""{HEAD}, %f: bool) {{
        let %t = nn.dense(%a, %b);
        let %g = fn (%x: Tensor[(100, 10), float32]) {{
          let %s = nn.dense(%x, %b);
          nn.dense(%x, nn.dense(%c, transpose(%b)))
        }};
        if (%f) {{ nn.dense(%t, %c) }} else {{ %g(%a) }}
    }}""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    args = random_args(mod)[:3]
    for flag in (True, False):
        want = kiln.interpret(mod, *args, np.array(flag))
        np.testing.assert_allclose(kiln.interpret(out, *args, np.array(flag)), want,
                                   rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_factors_with_effects_keep_their_order():
    # Two factors read references: the dense rebuild would evaluate them in another order.
    text = f"""{HEAD}) {{
        let %r = ref(%a);
        let %s = ref(%c);
        nn.dense(nn.dense(ref_read(%r), %b), {{C}})
    }}"""
    two = kiln.parse(text.replace("{C}", "ref_read(%s)"))
    assert kiln.structural_equal(run(two), two)
    one = kiln.parse(text.replace("{C}", "%c"))
    out = run(one)
    assert not kiln.structural_equal(out, one)
    same_results(one, out)


def test_a_20000_node_graph():
    x = kiln.var("x", shape=(64, 4))
    rng = np.random.default_rng(0)
    tall = rng.uniform(-1, 1, (64, 4)).astype("float32")
    wide = rng.uniform(-1, 1, (4, 64)).astype("float32")
    h: kiln.Expr = x
    for i in range(7000):  # dense, its op and a constant: 3 nodes each
        h = nn.dense(h, kiln.const(tall if i % 2 == 0 else wide))
    mod = kiln.IRModule.from_expr(kiln.Function([x], h))
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = MatrixChainReordering()(tmod)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"{elapsed:.1f} s"
    before, after = chain_flops(tmod), chain_flops(out)
    assert after < before / 4, (before, after)
    denses = sum(1 for n in post_order(out["main"]) if isinstance(n, kiln.Call)
                 and n.op == kiln.Op("nn.dense"))
    assert denses == 7000


def test_flops_of_products():
    mod = kiln.parse("""
        def @main(%a: Tensor[(2, 3, 4), float32], %b: Tensor[(2, 5, 4), float32],
                  %c: Tensor[(6, 4), float32], %d: Tensor[(2, 3, 7), float32]) {
          (nn.batch_matmul(%a, %b), nn.dense(%a, %c),
           nn.batch_matmul(%a, %d, transpose_a=True, transpose_b=False))
        }""")
    # 2 flops (a multiply and an add) per term of each sum
    assert chain_flops(mod) == 2 * (2 * 3 * 5 * 4) + 2 * (2 * 3 * 6 * 4) + 2 * (2 * 4 * 7 * 3)
