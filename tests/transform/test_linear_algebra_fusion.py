"""linear-algebra-fusion: matrix products absorb their elementwise epilogues, nothing else."""

import time

import numpy as np

import kiln
from kiln.transform import PassContext, Sequential, get_pass
from kiln.transform.fuse_ops import FuseOps, FusionStats, fusion_stats
from kiln.transform.linear_algebra_fusion import LinearAlgebraFusion

X, W, B, Y = ("Tensor[(2, 8), float32]", "Tensor[(16, 8), float32]", "Tensor[(16), float32]",
              "Tensor[(2, 16), float32]")


def run(mod: kiln.IRModule, *passes) -> kiln.IRModule:
    with PassContext(debug=True):
        return Sequential(list(passes))(mod)


def assert_same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.checked_type.shape).astype("float32")
            for p in kiln.infer_types(before)["main"].params]
    want, got = kiln.interpret(before, *args), kiln.interpret(after, *args)
    for w, g in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def check(before_text: str, expected_text: str, *passes) -> kiln.IRModule:
    before = kiln.parse(before_text)
    after = run(before, *(passes or (LinearAlgebraFusion(),)))
    assert kiln.structural_equal(after, kiln.parse(expected_text)), kiln.astext(after)
    assert kiln.structural_equal(before, kiln.parse(before_text))
    assert_same_results(before, after)
    return after


MLP = f"""
def @main(%x: {X}, %w: {W}, %b: {B}) {{
  %0 = exp(%x);
  %1 = nn.dense(%0, %w);
  %2 = nn.bias_add(%1, %b);
  %3 = nn.relu(%2);
  nn.softmax(%3)
}}"""


def test_dense_bias_relu_become_one_kernel_and_other_ops_are_left_alone():
    check(MLP, f"""
def @main(%x: {X}, %w: {W}, %b: {B}) {{
  %0 = exp(%x);
  %1 = fn (%p0: {X}, %p1: {W}, %p2: {B}, Primitive=1) -> {Y} {{
    %2 = nn.dense(%p0, %p1);
    %3 = nn.bias_add(%2, %p2);
    nn.relu(%3)
  }};
  nn.softmax(%1(%0, %w, %b))
}}""")


def test_a_diamond_epilogue_is_absorbed():
    check(f"""
def @main(%x: {X}, %w: {W}) {{
  %0 = nn.dense(%x, %w);
  %1 = sigmoid(%0);
  multiply(%0, %1)
}}""", f"""
def @main(%x: {X}, %w: {W}) {{
  %0 = fn (%p0: {X}, %p1: {W}, Primitive=1) -> {Y} {{
    %1 = nn.dense(%p0, %p1);
    %2 = sigmoid(%1);
    multiply(%1, %2)
  }};
  %0(%x, %w)
}}""")


def test_batch_matmul_with_scale_and_residual():
    a, b = "Tensor[(3, 4, 5), float32]", "Tensor[(3, 6, 5), float32]"
    out = "Tensor[(3, 4, 6), float32]"
    check(f"""
def @main(%a: {a}, %b: {b}, %r: {out}) {{
  %0 = nn.batch_matmul(%a, %b);
  %1 = multiply(%0, 0.5f);
  add(%1, %r)
}}""", f"""
def @main(%a: {a}, %b: {b}, %r: {out}) {{
  %0 = fn (%p0: {a}, %p1: {b}, %p2: {out}, Primitive=1) -> {out} {{
    %1 = nn.batch_matmul(%p0, %p1);
    %2 = multiply(%1, 0.5f);
    add(%2, %p2)
  }};
  %0(%a, %b, %r)
}}""")


def test_convolutions_reductions_and_reshapes_are_not_its_business():
    text = """
def @main(%x: Tensor[(1, 4, 8, 8), float32], %w: Tensor[(4, 4, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.relu(%0);
  %2 = sum(%1, axis=[1]);
  reshape(%2, newshape=[-1])
}"""
    check(text, text)


def test_the_epilogue_stops_where_the_products_value_is_broadcast_or_shared():
    check(f"""
def @main(%x: Tensor[(1, 8), float32], %w: {W}, %y: {Y}) {{
  %0 = nn.dense(%x, %w);
  %1 = tanh(%0);
  %2 = add(%1, %y);
  (%2, %1)
}}""", f"""
def @main(%x: Tensor[(1, 8), float32], %w: {W}, %y: {Y}) {{
  %0 = fn (%p0: Tensor[(1, 8), float32], %p1: {W}, Primitive=1) -> Tensor[(1, 16), float32] {{
    %1 = nn.dense(%p0, %p1);
    tanh(%1)
  }};
  %2 = %0(%x, %w);
  (add(%2, %y), %2)
}}""")


def test_followed_by_fuse_ops_it_settles_matrix_kernels_first():
    # FuseOps alone pulls exp(%y), which joins the epilogue's add, into the dense kernel;
    # after linear-algebra-fusion the dense kernel is closed and exp gets its own.
    text = f"""
def @main(%x: {X}, %w: {W}, %y: {Y}) {{
  %0 = nn.dense(%x, %w);
  %1 = exp(%y);
  add(%0, %1)
}}"""
    check(text, f"""
def @main(%x: {X}, %w: {W}, %y: {Y}) {{
  %0 = fn (%p0: {X}, %p1: {W}, %p2: {Y}, Primitive=1) -> {Y} {{
    %1 = nn.dense(%p0, %p1);
    %2 = exp(%p2);
    add(%1, %2)
  }};
  %0(%x, %w, %y)
}}""", FuseOps())
    check(text, f"""
def @main(%x: {X}, %w: {W}, %y: {Y}) {{
  %0 = fn (%q0: {Y}, Primitive=1) -> {Y} {{ exp(%q0) }};
  %1 = fn (%p0: {X}, %p1: {W}, %p2: {Y}, Primitive=1) -> {Y} {{
    %2 = nn.dense(%p0, %p1);
    add(%2, %p2)
  }};
  %1(%x, %w, %0(%y))
}}""", LinearAlgebraFusion(), FuseOps())


def test_on_a_plain_mlp_it_agrees_with_fuse_ops():
    before = kiln.parse(MLP)
    both = run(before, LinearAlgebraFusion(), FuseOps())
    alone = run(before, FuseOps())
    assert kiln.structural_equal(both, alone)
    assert fusion_stats(both) == FusionStats(3, 5, 0)


def test_registered_by_name():
    p = get_pass("linear-algebra-fusion")
    assert p.info.opt_level == 1


def test_20000_node_graph():
    x = kiln.var("x", shape=(1, 4))
    w = kiln.var("w", shape=(4, 4))
    h: kiln.Expr = x
    for _ in range(5000):
        h = kiln.op.tanh(kiln.op.add(kiln.op.nn.dense(h, w), kiln.op.exp(h)))
    before = kiln.infer_types(kiln.IRModule.from_expr(kiln.Function([x, w], h)))
    start = time.perf_counter()
    after = LinearAlgebraFusion()(before)
    elapsed = time.perf_counter() - start
    # dense + add + tanh per layer; each exp (which feeds the add) stays outside.
    assert fusion_stats(after) == FusionStats(5000, 15000, 5000)
    assert elapsed < 5.0
    x0, w0 = np.full((1, 4), 0.1, "float32"), np.eye(4, dtype="float32") * 0.5
    want = x0
    for _ in range(5000):
        want = np.tanh(want @ w0.T + np.exp(want))
    np.testing.assert_allclose(kiln.interpret(after, x0, w0), want, rtol=1e-5)
