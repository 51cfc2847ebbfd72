"""combine-parallel-dense: parallel dense layers of one input become one dense and a split."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.transform.combine_parallel_dense import CombineParallelDense
from kiln.transform.pass_manager import PassContext, typed

HEAD = ("def @main(%x: Tensor[(4, 8), float32], %q: Tensor[(6, 8), float32], "
        "%k: Tensor[(6, 8), float32], %v: Tensor[(3, 8), float32]")


def run(mod: kiln.IRModule, **config) -> kiln.IRModule:
    with PassContext(debug=True, config=config):
        return CombineParallelDense()(mod)


def program(body: str, extra: str = "") -> kiln.IRModule:
    return kiln.parse(f"{HEAD}{extra}) {{ {body} }}")


def same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.checked_type.shape).astype("float32")
            for p in typed(before)["main"].params]
    want, got = kiln.interpret(before, *args), kiln.interpret(after, *args)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_query_key_value_projections_in_a_normal_form():
    mod = program("""
        let %a = nn.dense(%x, %q);
        let %b = nn.dense(%x, %k);
        let %c = nn.dense(%x, %v);
        (%a, %b, %c)""")
    out = run(mod)
    expected = program("""
        %0 = split(nn.dense(%x, concatenate((%q, %k, %v))), indices_or_sections=[6, 12],
                   axis=1);
        let %a = %0.0;
        let %b = %0.1;
        let %c = %0.2;
        (%a, %b, %c)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_batched_input_units_and_graph_form():
    mod = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 8), float32], %q: Tensor[(6, 8), float32],
                  %k: Tensor[(6, 8), float32], %v: Tensor[(3, 8), float32]) {
          (nn.dense(%x, %q, units=6), nn.dense(%x, %k, units=6), nn.dense(%x, %v, units=3))
        }""")
    out = run(mod)
    expected = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 8), float32], %q: Tensor[(6, 8), float32],
                  %k: Tensor[(6, 8), float32], %v: Tensor[(3, 8), float32]) {
          %0 = nn.dense(%x, concatenate((%q, %k, %v)), units=15);
          %1 = split(%0, indices_or_sections=[6, 12], axis=2);
          (%1.0, %1.1, %1.2)
        }""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_two_branches_need_the_option():
    mod = program("(nn.dense(%x, %q), nn.dense(%x, %v))")
    assert kiln.structural_equal(run(mod), mod)
    out = run(mod, **{"combine-parallel-dense.min_num_branches": 2})
    expected = program("""
        %0 = split(nn.dense(%x, concatenate((%q, %v))), indices_or_sections=[6], axis=1);
        (%0.0, %0.1)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)


@pytest.mark.parametrize("third, extra", [
    ("nn.dense(%x2, %v)", ", %x2: Tensor[(4, 8), float32]"),      # another input
    ("nn.dense(%x, %v, out_dtype=\"float64\")", ""),                # another result dtype
    ("nn.dense(%x, %v)", ""),                                       # (a control: combines)
])
def test_dense_layers_that_differ_do_not_combine(third, extra):
    mod = program(f"(nn.dense(%x, %q), nn.dense(%x, %k), {third})", extra)
    combined = not kiln.structural_equal(run(mod), mod)
    assert combined is (third == "nn.dense(%x, %v)")


def test_other_input_widths_and_dtypes_form_other_groups():
    mod = kiln.parse("""
        def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(5, 8), float32],
                  %y: Tensor[(4, 8), float64], %u: Tensor[(5, 8), float64]) {
          (nn.dense(%x, %w), nn.dense(%x, %w), nn.dense(%x, %w),
           nn.dense(%y, %u), nn.dense(%y, %u), nn.dense(%y, %u))
        }""")
    out = run(mod)
    denses = [n for n in post_order(out["main"]) if isinstance(n, kiln.Call)
              and n.op == kiln.Op("nn.dense")]
    assert len(denses) == 2
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(t) for s, t in
            [((4, 8), "float32"), ((5, 8), "float32"), ((4, 8), "float64"), ((5, 8), "float64")]]
    for w, g in zip(kiln.interpret(mod, *args), kiln.interpret(out, *args)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_clauses_are_regions_of_their_own():
    text = """
        type Option[A] { Some(A), None }
        def @main(%x: Tensor[(4, 8), float32], %q: Tensor[(6, 8), float32],
                  %o: Option[Tensor[(6, 8), float32]]) {
          %0 = nn.dense(%x, %q);
          match (%o) {
            Some(%w) => { BODY },
            None => (%0, %0, %0),
          }
        }"""
    mod = kiln.parse(text.replace("BODY", "(%0, nn.dense(%x, %w), nn.dense(%x, %q))"))
    # %0 runs in both clauses (wherever the match takes it first): it joins neither. The two
    # in the Some clause combine there, where the pattern variable %w is bound.
    out = run(mod, **{"combine-parallel-dense.min_num_branches": 2})
    expected = kiln.parse(text.replace("BODY", """
        %1 = split(nn.dense(%x, concatenate((%w, %q))), indices_or_sections=[6], axis=1);
        (%0, %1.0, %1.1)"""))
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    assert kiln.structural_equal(run(mod), mod)  # three are not in one region


def test_a_20000_node_graph():
    x = kiln.var("x", shape=(2, 4))
    ws = [kiln.var(f"w{i}", shape=(4, 4)) for i in range(3)]
    h: kiln.Expr = x
    for _ in range(2000):  # 3 dense layers, 2 adds and their 5 ops: 10 nodes each
        d = [kiln.op.nn.dense(h, w) for w in ws]
        h = d[0] + d[1] + d[2]
    mod = kiln.IRModule.from_expr(kiln.Function([x, *ws], h))
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = CombineParallelDense()(tmod)
    elapsed = time.perf_counter() - start
    denses = [n for n in post_order(out["main"]) if isinstance(n, kiln.Call)
              and n.op == kiln.Op("nn.dense")]
    assert len(denses) == 2000
    assert elapsed < 10, f"{elapsed:.1f} s"
    arg = np.full((2, 4), 0.01, "float32")
    weights = [np.eye(4, dtype="float32") / 3 for _ in range(3)]  # each layer: h -> h
    np.testing.assert_allclose(kiln.interpret(out, arg, *weights),
                               kiln.interpret(tmod, arg, *weights), rtol=1e-5)
