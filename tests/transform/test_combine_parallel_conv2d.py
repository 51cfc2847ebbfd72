"""combine-parallel-conv2d: which parallel convolutions combine, how, and where they may not."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.transform.combine_parallel_conv2d import CombineParallelConv2D
from kiln.transform.pass_manager import PassContext, typed

MIN2 = {"combine-parallel-conv2d.min_num_branches": 2}
HEAD = ("def @main(%x: Tensor[(1, 3, 8, 8), float32], %w1: Tensor[(4, 3, 3, 3), float32], "
        "%w2: Tensor[(2, 3, 3, 3), float32], %w3: Tensor[(5, 3, 3, 3), float32]")


def run(mod: kiln.IRModule, **config) -> kiln.IRModule:
    with PassContext(debug=True, config=config):
        return CombineParallelConv2D()(mod)


def program(body: str, extra: str = "") -> kiln.IRModule:
    return kiln.parse(f"{HEAD}{extra}) {{ {body} }}")


def leaves(value) -> list[np.ndarray]:
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(np.asarray(v))
    return out


def same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.checked_type.shape).astype("float32")
            for p in typed(before)["main"].params]
    want, got = leaves(kiln.interpret(before, *args)), leaves(kiln.interpret(after, *args))
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_three_branches_become_one_convolution_and_a_split():
    mod = program("""
        %0 = nn.conv2d(%x, %w1, padding=[1, 1]);
        %1 = nn.conv2d(%x, %w2, padding=[1, 1]);
        %2 = nn.conv2d(%x, %w3, padding=[1, 1]);
        (nn.relu(%0), %1, %2)""")
    out = run(mod)
    expected = program("""
        %0 = nn.conv2d(%x, concatenate((%w1, %w2, %w3)), padding=[1, 1]);
        %1 = split(%0, indices_or_sections=[4, 6], axis=1);
        (nn.relu(%1.0), %1.1, %1.2)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_two_branches_need_the_option():
    mod = program("(nn.conv2d(%x, %w1), nn.conv2d(%x, %w2))")
    assert kiln.structural_equal(run(mod), mod)
    out = run(mod, **MIN2)
    expected = program("""
        %0 = split(nn.conv2d(%x, concatenate((%w1, %w2))), indices_or_sections=[4], axis=1);
        (%0.0, %0.1)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


@pytest.mark.parametrize("value", ["3", 1, 2.5, True])
def test_a_malformed_option_is_an_error(value):
    mod = program("(nn.conv2d(%x, %w1), nn.conv2d(%x, %w2))")
    with pytest.raises(kiln.Error, match="combine-parallel-conv2d.min_num_branches must be an"):
        run(mod, **{"combine-parallel-conv2d.min_num_branches": value})


def test_the_channels_attribute_becomes_the_sum():
    mod = program("""(nn.conv2d(%x, %w1, channels=4), nn.conv2d(%x, %w2, channels=2),
                      nn.conv2d(%x, %w3, channels=5))""")
    out = run(mod)
    expected = program("""
        %0 = nn.conv2d(%x, concatenate((%w1, %w2, %w3)), channels=11);
        %1 = split(%0, indices_or_sections=[4, 6], axis=1);
        (%1.0, %1.1, %1.2)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)


@pytest.mark.parametrize("third", [
    "nn.conv2d(%x, %w3, strides=[2, 2])",              # another stride
    "nn.conv2d(%x, %w3, padding=[1, 1])",              # another padding
    "nn.conv2d(%x, %w3, dilation=[2, 2])",             # another dilation
    "nn.conv2d(%x, %k)",                               # another kernel size
    "nn.conv2d(nn.relu(%x), %w3)",                     # another input
    'nn.conv2d(%x, %w3, out_dtype="float64")',         # another result dtype
])
def test_convolutions_that_differ_do_not_combine(third):
    mod = program(f"(nn.conv2d(%x, %w1), nn.conv2d(%x, %w2), {third})",
                  ", %k: Tensor[(5, 3, 1, 1), float32]")
    assert kiln.structural_equal(run(mod), mod)


def test_grouped_convolutions_do_not_combine():
    mod = kiln.parse("""
        def @main(%x: Tensor[(1, 4, 8, 8), float32], %w: Tensor[(4, 2, 3, 3), float32]) {
          (nn.conv2d(%x, %w, groups=2), nn.conv2d(%x, %w, groups=2), nn.conv2d(%x, %w, groups=2))
        }""")
    assert kiln.structural_equal(run(mod), mod)


def test_branches_of_an_if_do_not_combine():
    # Two in each branch: three would be needed in one region.
    mod = program("""
        if (%c) { (nn.conv2d(%x, %w1), nn.conv2d(%x, %w2)) }
        else { (nn.conv2d(%x, %w1), nn.conv2d(%x, %w2)) }""", ", %c: bool")
    assert kiln.structural_equal(run(mod), mod)


def test_a_weight_bound_inside_the_region_blocks_combining():
    # The combined call runs where the first branch runs, before %v is bound.
    mod = program("""
        let %a = nn.conv2d(%x, %w1);
        let %v = multiply(%w2, 2f);
        let %b = nn.conv2d(%x, %v);
        let %c = nn.conv2d(%x, %w3);
        (%a, %b, %c)""")
    assert kiln.structural_equal(run(mod), mod)
    assert not kiln.structural_equal(run(mod, **MIN2), mod)  # %a and %c still combine


def test_a_normal_form_and_closures():
    mod = program("""
        let %f = fn (%y: Tensor[(1, 3, 8, 8), float32]) {
          let %a = nn.conv2d(%y, %w1);
          let %b = nn.conv2d(%y, %w2);
          let %c = nn.conv2d(%y, %w3);
          (%a, %b, %c)
        };
        %f(%x)""")
    out = run(mod)
    expected = program("""
        let %f = fn (%y: Tensor[(1, 3, 8, 8), float32]) {
          %0 = split(nn.conv2d(%y, concatenate((%w1, %w2, %w3))),
                     indices_or_sections=[4, 6], axis=1);
          let %a = %0.0;
          let %b = %0.1;
          let %c = %0.2;
          (%a, %b, %c)
        };
        %f(%x)""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_constant_weights_and_effects_around_the_branches():
    # A ref_write between the branches is not moved: only the convolutions are combined.
    x = kiln.var("x", shape=(1, 2, 4, 4))
    r, u = kiln.var("r"), kiln.var("u")
    rng = np.random.default_rng(3)
    ws = [kiln.const(rng.standard_normal((n, 2, 1, 1)).astype("float32")) for n in (1, 2, 3)]
    convs = [kiln.op.nn.conv2d(x, w) for w in ws]
    body = kiln.Let(r, kiln.RefCreate(kiln.op.zeros((1, 1, 4, 4))), kiln.Let(
        u, kiln.RefWrite(r, convs[0]),
        kiln.tuple_(kiln.RefRead(r), convs[1], convs[2])))
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    out = run(mod)
    splits = [n for n in post_order(out["main"]) if isinstance(n, kiln.Call)
              and n.op == kiln.Op("split")]
    assert len(splits) == 1
    arg = rng.standard_normal((1, 2, 4, 4)).astype("float32")
    for w, g in zip(leaves(kiln.interpret(mod, arg)), leaves(kiln.interpret(out, arg))):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_a_20000_node_graph():
    x = kiln.var("x", shape=(1, 2, 2, 2))
    ws = [kiln.var(f"w{i}", shape=(2, 2, 1, 1)) for i in range(3)]
    h: kiln.Expr = x
    for _ in range(2000):  # 3 convolutions, 2 adds and their 5 ops: 10 nodes each
        c = [kiln.op.nn.conv2d(h, w) for w in ws]
        h = c[0] + c[1] + c[2]
    mod = kiln.IRModule.from_expr(kiln.Function([x, *ws], h))
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = CombineParallelConv2D()(tmod)
    elapsed = time.perf_counter() - start
    convs = [n for n in post_order(out["main"]) if isinstance(n, kiln.Call)
             and n.op == kiln.Op("nn.conv2d")]
    assert len(convs) == 2000
    assert elapsed < 10, f"{elapsed:.1f} s"
