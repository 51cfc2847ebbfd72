"""fuse-ops: Relay's operator fusion, checked on before/expected pairs and by the interpreter."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.testing.programs import random_program
from kiln.transform import PassContext, get_pass
from kiln.transform.fuse_ops import FuseOps, FusionStats, fusion_stats

T = "Tensor[(4, 8), float32]"


def fuse(mod: kiln.IRModule, **options) -> kiln.IRModule:
    with PassContext(debug=True):
        return FuseOps(**options)(mod)


def random_args(mod: kiln.IRModule, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    args = []
    for p in kiln.infer_types(mod)["main"].params:
        t = p.checked_type
        if t.dtype == "bool":
            args.append(np.asarray(rng.random(t.shape) < 0.5))
        elif t.dtype.startswith("int"):
            args.append(rng.integers(0, 5, t.shape).astype(t.dtype))
        else:
            args.append(rng.standard_normal(t.shape).astype(t.dtype))
    return args


def leaves(value) -> list:
    return [x for v in value for x in leaves(v)] if isinstance(value, tuple) else [value]


def assert_same_results(before: kiln.IRModule, after: kiln.IRModule, seed: int = 0) -> None:
    args = random_args(before, seed)
    want, got = leaves(kiln.interpret(before, *args)), leaves(kiln.interpret(after, *args))
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def check(before_text: str, expected_text: str, **options) -> kiln.IRModule:
    before = kiln.parse(before_text)
    after = fuse(before, **options)
    expected = kiln.parse(expected_text)
    assert kiln.structural_equal(after, expected), kiln.astext(after)
    assert kiln.structural_equal(before, kiln.parse(before_text))  # the input is untouched
    assert_same_results(before, after)
    return after


def test_elementwise_and_injective_chain_is_one_kernel():
    check(f"""
def @main(%x: {T}) {{
  %0 = add(%x, 1f);
  %1 = exp(%0);
  transpose(%1)
}}""", f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> Tensor[(8, 4), float32] {{
    %1 = add(%p0, 1f);
    %2 = exp(%1);
    transpose(%2)
  }};
  %0(%x)
}}""")


CONV = "Tensor[(1, 4, 8, 8), float32]"
W = "Tensor[(4, 4, 3, 3), float32]"


def test_conv2d_bias_relu_is_one_kernel_and_the_next_conv_starts_another():
    check(f"""
def @main(%x: {CONV}, %w1: {W}, %b1: Tensor[(4), float32], %w2: {W}) {{
  %0 = nn.conv2d(%x, %w1, padding=[1, 1, 1, 1]);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.conv2d(%2, %w2, padding=[1, 1, 1, 1]);
  add(%3, %x)
}}""", f"""
def @main(%x: {CONV}, %w1: {W}, %b1: Tensor[(4), float32], %w2: {W}) {{
  %0 = fn (%p0: {CONV}, %p1: {W}, %p2: Tensor[(4), float32], Primitive=1) -> {CONV} {{
    %1 = nn.conv2d(%p0, %p1, padding=[1, 1, 1, 1]);
    %2 = nn.bias_add(%1, %p2);
    nn.relu(%2)
  }};
  %3 = %0(%x, %w1, %b1);
  %4 = fn (%q0: {CONV}, %q1: {W}, %q2: {CONV}, Primitive=1) -> {CONV} {{
    %5 = nn.conv2d(%q0, %q1, padding=[1, 1, 1, 1]);
    add(%5, %q2)
  }};
  %4(%3, %w2, %x)
}}""")


def test_a_conv2d_weight_computed_by_injective_ops_joins_the_convolution():
    # a data adjoint's flipped, channel-swapped kernel (take, transpose) is read by the
    # convolution's packing; the same ops on the data, or on a weight another op also
    # reads, stay kernels of their own
    check(f"""
def @main(%x: {CONV}, %w: {W}) {{
  %0 = transpose(%w, axes=[0, 1, 3, 2]);
  %1 = transpose(%0, axes=[1, 0, 2, 3]);
  nn.conv2d(%x, %1, padding=[1, 1, 1, 1])
}}""", f"""
def @main(%x: {CONV}, %w: {W}) {{
  %0 = fn (%p0: {CONV}, %p1: {W}, Primitive=1) -> {CONV} {{
    %1 = transpose(%p1, axes=[0, 1, 3, 2]);
    %2 = transpose(%1, axes=[1, 0, 2, 3]);
    nn.conv2d(%p0, %2, padding=[1, 1, 1, 1])
  }};
  %0(%x, %w)
}}""")
    after = fuse(kiln.parse(f"""
def @main(%x: {CONV}, %w: {W}) {{
  %0 = transpose(%x, axes=[0, 1, 3, 2]);
  %1 = transpose(%w, axes=[1, 0, 2, 3]);
  %2 = nn.conv2d(%0, %1, padding=[1, 1, 1, 1]);
  (%2, %1)
}}"""))
    kernels = [e for e in post_order(after["main"])
               if isinstance(e, kiln.Function) and e.attrs.get("Primitive")]
    assert len(kernels) == 3  # the data's transpose, the shared weight's, the convolution


def test_diamond_of_elementwise_ops_is_one_kernel():
    check(f"""
def @main(%x: {T}, %y: {T}) {{
  %0 = add(%x, %y);
  %1 = exp(%0);
  %2 = tanh(%0);
  multiply(%1, %2)
}}""", f"""
def @main(%x: {T}, %y: {T}) {{
  %0 = fn (%p0: {T}, %p1: {T}, Primitive=1) -> {T} {{
    %1 = add(%p0, %p1);
    %2 = exp(%1);
    %3 = tanh(%1);
    multiply(%2, %3)
  }};
  %0(%x, %y)
}}""")


def test_an_opaque_op_on_one_branch_splits_the_diamond():
    check(f"""
def @main(%x: {T}, %y: {T}) {{
  %0 = add(%x, %y);
  %1 = exp(%0);
  %2 = nn.softmax(%0);
  multiply(%1, %2)
}}""", f"""
def @main(%x: {T}, %y: {T}) {{
  %0 = fn (%p0: {T}, %p1: {T}, Primitive=1) -> {T} {{ add(%p0, %p1) }};
  %1 = %0(%x, %y);
  %2 = fn (%q0: {T}, Primitive=1) -> {T} {{ nn.softmax(%q0) }};
  %3 = %2(%1);
  %4 = fn (%r0: {T}, %r1: {T}, Primitive=1) -> {T} {{
    %5 = exp(%r0);
    multiply(%5, %r1)
  }};
  %4(%1, %3)
}}""")


def test_a_reduction_ends_its_group():
    check(f"""
def @main(%x: {T}) {{
  %0 = exp(%x);
  %1 = multiply(%0, 2f);
  %2 = sum(%1, axis=[1]);
  sqrt(%2)
}}""", f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> Tensor[(4), float32] {{
    %1 = exp(%p0);
    %2 = multiply(%1, 2f);
    sum(%2, axis=[1])
  }};
  %3 = %0(%x);
  %4 = fn (%q0: Tensor[(4), float32], Primitive=1) -> Tensor[(4), float32] {{ sqrt(%q0) }};
  %4(%3)
}}""")


POOLED = "Tensor[(1, 4, 4, 4), float32]"


def test_tuple_fields_join_the_concatenate_that_consumes_them():
    # TVM's test_concatenate: the pool stays alone (its value reaches the tuple injectively).
    check(f"""
def @main(%x: {CONV}) {{
  %0 = nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 2]);
  %1 = transpose(%0, axes=[0, 1, 3, 2]);
  %2 = concatenate((%1, %0), axis=1);
  add(%2, 1f)
}}""", f"""
def @main(%x: {CONV}) {{
  %0 = fn (%p0: {CONV}, Primitive=1) -> {POOLED} {{
    nn.max_pool2d(%p0, pool_size=[2, 2], strides=[2, 2])
  }};
  %1 = %0(%x);
  %2 = fn (%q0: {POOLED}, Primitive=1) -> Tensor[(1, 8, 4, 4), float32] {{
    %3 = transpose(%q0, axes=[0, 1, 3, 2]);
    %4 = concatenate((%3, %q0), axis=1);
    add(%4, 1f)
  }};
  %2(%1)
}}""")


def test_an_intermediate_tuple_pulls_every_branch_into_one_kernel():
    # TVM's test_tuple_intermediate: squeeze -> three branches -> concatenate -> squeeze.
    before = kiln.parse("""
def @main(%x: Tensor[(1, 4, 6, 6), float32]) {
  %0 = squeeze(%x);
  %1 = add(%0, 1f);
  %2 = squeeze(%0);
  %3 = add(add(%2, 1f), 1f);
  %4 = add(%0, 1f);
  %5 = concatenate((%1, %3, %4), axis=1);
  add(squeeze(%5), 1f)
}""")
    after = fuse(before)
    assert fusion_stats(after) == FusionStats(1, 9, 0)
    assert_same_results(before, after)


def test_a_tuple_result_stays_outside_kernels_and_shared_values_are_computed_once():
    after = check(f"""
def @main(%x: {T}) {{
  %0 = exp(%x);
  %1 = add(%0, 1f);
  (%0, %1, nn.softmax(%0))
}}""", f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> {T} {{ exp(%p0) }};
  %1 = %0(%x);
  %2 = fn (%q0: {T}, Primitive=1) -> {T} {{ add(%q0, 1f) }};
  %3 = fn (%r0: {T}, Primitive=1) -> {T} {{ nn.softmax(%r0) }};
  (%1, %2(%1), %3(%1))
}}""")
    # Equality ignores sharing; the count shows exp is one kernel, not one per use.
    assert fusion_stats(after) == FusionStats(3, 3, 0)


def test_split_and_its_projections_fuse_with_their_consumer():
    half = "Tensor[(4, 4), float32]"
    check(f"""
def @main(%x: {T}) {{
  %0 = split(%x, indices_or_sections=2, axis=1);
  %1 = add(%0.0, %0.1);
  exp(%1)
}}""", f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> {half} {{
    %1 = split(%p0, indices_or_sections=2, axis=1);
    %2 = add(%1.0, %1.1);
    exp(%2)
  }};
  %0(%x)
}}""")


def test_projections_of_an_opaque_op_result():
    # A projection joins its elementwise consumer, whose kernel then takes the whole tuple;
    # a projection that only feeds the result tuple stays outside any kernel.
    bn = "Tensor[(4), float32]"
    out = f"({CONV}, {bn}, {bn})"
    check(f"""
def @main(%x: {CONV}, %g: {bn}, %b: {bn}, %m: {bn}, %v: {bn}) {{
  %0 = nn.batch_norm(%x, %g, %b, %m, %v);
  (nn.relu(%0.0), %0.1)
}}""", f"""
def @main(%x: {CONV}, %g: {bn}, %b: {bn}, %m: {bn}, %v: {bn}) {{
  %0 = fn (%p0: {CONV}, %p1: {bn}, %p2: {bn}, %p3: {bn}, %p4: {bn}, Primitive=1) -> {out} {{
    nn.batch_norm(%p0, %p1, %p2, %p3, %p4)
  }};
  %1 = %0(%x, %g, %b, %m, %v);
  %2 = fn (%q0: {out}, Primitive=1) -> {CONV} {{ nn.relu(%q0.0) }};
  (%2(%1), %1.1)
}}""")


def test_lets_ifs_and_references_are_boundaries_and_effects_stay_in_order():
    check(f"""
def @main(%x: {T}, %c: bool) {{
  let %r = ref(exp(%x));
  let %a = add(ref_read(%r), 1f);
  ref_write(%r, multiply(%a, 2f));
  if (%c) {{ nn.relu(ref_read(%r)) }} else {{ negative(%a) }}
}}""", f"""
def @main(%x: {T}, %c: bool) {{
  %0 = fn (%p0: {T}, Primitive=1) -> {T} {{ exp(%p0) }};
  let %r = ref(%0(%x));
  %1 = fn (%p1: {T}, Primitive=1) -> {T} {{ add(%p1, 1f) }};
  let %a = %1(ref_read(%r));
  %2 = fn (%p2: {T}, Primitive=1) -> {T} {{ multiply(%p2, 2f) }};
  ref_write(%r, %2(%a));
  if (%c) {{
    %3 = fn (%p3: {T}, Primitive=1) -> {T} {{ nn.relu(%p3) }};
    %3(ref_read(%r))
  }} else {{
    %4 = fn (%p4: {T}, Primitive=1) -> {T} {{ negative(%p4) }};
    %4(%a)
  }}
}}""")


def test_closures_recursion_and_matches_are_fused_inside():
    check(f"""
type List[A] {{ Cons(A, List[A]), Nil }}

def @total(%xs: List[{T}], %acc: {T}) -> {T} {{
  match (%xs) {{
    Cons(%h, %t) => @total(%t, add(%acc, exp(%h))),
    Nil => %acc,
  }}
}}

def @main(%x: {T}, %y: {T}) {{
  let %f = fn (%z: {T}) {{ tanh(multiply(%z, %y)) }};
  @total(Cons(%f(%x), Cons(%x, Nil)), zeros(shape=[4, 8]))
}}""", f"""
type List[A] {{ Cons(A, List[A]), Nil }}

def @total(%xs: List[{T}], %acc: {T}) -> {T} {{
  match (%xs) {{
    Cons(%h, %t) => {{
      %0 = fn (%p0: {T}, %p1: {T}, Primitive=1) -> {T} {{
        %1 = exp(%p1);
        add(%p0, %1)
      }};
      @total(%t, %0(%acc, %h))
    }},
    Nil => %acc,
  }}
}}

def @main(%x: {T}, %y: {T}) {{
  let %f = fn (%z: {T}) {{
    %2 = fn (%q0: {T}, %q1: {T}, Primitive=1) -> {T} {{
      %3 = multiply(%q0, %q1);
      tanh(%3)
    }};
    %2(%z, %y)
  }};
  %4 = fn (Primitive=1) -> {T} {{ zeros(shape=[4, 8]) }};
  @total(Cons(%f(%x), Cons(%x, Nil)), %4())
}}""")


def test_shadowed_names_and_free_variables():
    x = kiln.var("x", shape=(4, 8))
    y = kiln.var("x", shape=(4, 8))  # same names, other variables
    z = kiln.var("x", shape=(4, 8))
    free = kiln.var("free", shape=(4, 8))
    inner = kiln.Function([z], kiln.op.exp(kiln.op.add(z, free)))
    body = kiln.Let(y, kiln.op.negative(x), kiln.Call(inner, [kiln.op.nn.relu(y)]))
    before = kiln.IRModule.from_expr(kiln.Function([x, free], body))
    after = fuse(before)
    assert fusion_stats(after) == FusionStats(3, 4, 0)
    assert_same_results(before, after)


def test_max_depth_splits_long_groups():
    before = f"""
def @main(%x: {T}) {{
  %0 = exp(%x);
  %1 = tanh(%0);
  %2 = negative(%1);
  %3 = sigmoid(%2);
  abs(%3)
}}"""
    check(before, f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> {T} {{ %1 = exp(%p0); tanh(%1) }};
  %2 = fn (%q0: {T}, Primitive=1) -> {T} {{ %3 = negative(%q0); sigmoid(%3) }};
  %4 = fn (%r0: {T}, Primitive=1) -> {T} {{ abs(%r0) }};
  %4(%2(%0(%x)))
}}""", max_depth=2)
    three = f"""
def @main(%x: {T}) {{
  %0 = fn (%p0: {T}, Primitive=1) -> {T} {{ %1 = exp(%p0); %2 = tanh(%1); negative(%2) }};
  %3 = fn (%q0: {T}, Primitive=1) -> {T} {{ %4 = sigmoid(%q0); abs(%4) }};
  %3(%0(%x))
}}"""
    check(before, three, max_depth=3)
    with PassContext(debug=True, config={"fuse-ops.max_depth": 3}):
        assert kiln.structural_equal(FuseOps()(kiln.parse(before)), kiln.parse(three))


def chain(n: int, shape=(2,)) -> kiln.IRModule:
    x = kiln.var("x", shape=shape)
    h: kiln.Expr = x
    for i in range(n):
        h = kiln.op.tanh(h) if i % 2 else kiln.op.negative(h)
    return kiln.IRModule.from_expr(kiln.Function([x], h))


def test_default_max_depth_is_256_nodes():
    after = fuse(chain(300))
    assert fusion_stats(after) == FusionStats(2, 300, 0)
    kernels = [e for e in post_order(after["main"])
               if isinstance(e, kiln.Function) and e.attrs.get("Primitive")]
    sizes = sorted(fusion_stats(k).calls_inside for k in kernels)
    assert sizes == [44, 256]


def test_fuse_opt_level_zero_wraps_each_operator_alone():
    after = fuse(chain(5), fuse_opt_level=0)
    assert fusion_stats(after) == FusionStats(5, 5, 0)


def test_running_twice_changes_nothing_more():
    once = fuse(chain(10))
    twice = fuse(once)
    assert kiln.structural_equal(once, twice)
    assert fusion_stats(twice) == FusionStats(1, 10, 0)


def test_bad_options_are_errors():
    with pytest.raises(kiln.Error, match="max_depth must be a positive integer"):
        FuseOps(max_depth=0)
    with PassContext(config={"fuse-ops.max_depth": "deep"}):
        with pytest.raises(kiln.Error, match="max_depth must be a positive integer, got 'deep'"):
            FuseOps()(chain(3))


def test_registered_by_name():
    p = get_pass("fuse-ops")
    assert p.info.name == "fuse-ops" and p.info.opt_level == 1


def test_resnet_like_block():
    text = f"""
def @main(%x: {CONV}, %w1: {W}, %b1: Tensor[(4), float32], %w2: {W}, %b2: Tensor[(4), float32],
          %wd: Tensor[(10, 4), float32], %bd: Tensor[(10), float32]) {{
  %0 = nn.conv2d(%x, %w1, padding=[1, 1, 1, 1]);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.conv2d(%2, %w2, padding=[1, 1, 1, 1]);
  %4 = nn.bias_add(%3, %b2);
  %5 = add(%4, %x);
  %6 = nn.relu(%5);
  %7 = nn.global_avg_pool2d(%6);
  %8 = nn.batch_flatten(%7);
  %9 = nn.dense(%8, %wd);
  %10 = nn.bias_add(%9, %bd);
  nn.softmax(%10)
}}"""
    before = kiln.parse(text)
    after = fuse(before)
    # conv+bias+relu | conv+bias+add+relu | pool | flatten | dense+bias | softmax
    assert fusion_stats(before) == FusionStats(0, 0, 12)
    assert fusion_stats(after) == FusionStats(6, 12, 0)
    assert_same_results(before, after)
    assert kiln.structural_equal(kiln.parse(kiln.astext(after)), after)  # prints and reads back


@pytest.mark.parametrize("seed", range(3))
def test_random_graphs_keep_their_meaning(seed):
    rng = np.random.default_rng(seed)
    x = kiln.var("x", shape=(3, 4))
    values: list[kiln.Expr] = [x]
    unary = [kiln.op.exp, kiln.op.tanh, kiln.op.negative, kiln.op.nn.relu, kiln.op.nn.softmax]
    for _ in range(60):
        a = values[rng.integers(len(values))]
        b = values[rng.integers(len(values))]
        kind = rng.integers(4)
        if kind == 0:
            values.append(unary[rng.integers(len(unary))](kiln.op.tanh(a)))
        elif kind == 1:
            values.append(kiln.op.add(a, b))
        elif kind == 2:
            values.append(kiln.op.sum(a, axis=[1], keepdims=True) * b)
        else:
            pair = kiln.op.concatenate(kiln.tuple_(a, b), axis=0)
            values.append(kiln.op.strided_slice(pair, begin=[1, 0], end=[4, 4]))
    out = kiln.tuple_(values[-1], values[-7], values[len(values) // 2])
    before = kiln.IRModule.from_expr(kiln.Function([x], out))
    after = fuse(before)
    stats = fusion_stats(after)
    assert stats.calls_outside == 0 and stats.calls_inside == fusion_stats(before).calls_outside
    assert stats.primitive_functions < stats.calls_inside
    assert_same_results(before, after, seed)


@pytest.mark.parametrize("seed", range(10))
def test_random_programs_keep_their_meaning(seed):
    # Lets, ifs, closures, globals and references from kiln.testing's program generator.
    mod, inputs = random_program(seed, steps=16)
    after = fuse(mod)
    assert fusion_stats(after).calls_outside == 0
    want, got = leaves(kiln.interpret(mod, *inputs)), leaves(kiln.interpret(after, *inputs))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_20000_node_graph_is_fused_quickly():
    before = chain(20000)
    typed = kiln.infer_types(before)
    start = time.perf_counter()
    after = FuseOps()(typed)
    elapsed = time.perf_counter() - start
    assert fusion_stats(after) == FusionStats(79, 20000, 0)  # ceil(20000 / 256) kernels
    assert elapsed < 5.0, f"fuse-ops took {elapsed:.2f} s on 20,000 nodes"
    want = x = np.array([0.5, -2.0], "float32")
    for i in range(20000):
        want = np.tanh(want) if i % 2 else -want
    np.testing.assert_allclose(kiln.interpret(after, x), want, rtol=1e-6)


def let_chain(n: int, kernel) -> kiln.IRModule:
    """let %v0 = e(%x); let %v1 = e(%v0); ... %v{n-1}, where e(a) = kernel(a)."""
    x = kiln.var("x", shape=(2,))
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body: kiln.Expr = vs[-1]
    for i in reversed(range(n)):
        body = kiln.Let(vs[i], kernel(x if i == 0 else vs[i - 1]), body)
    return kiln.IRModule.from_expr(kiln.Function([x], body))


def test_20000_deep_let_chain():
    def add_one(a):
        return kiln.op.add(a, kiln.const(1.0))

    def fused_add_one(a):
        p = kiln.var("p0", shape=(2,))
        f = kiln.Function([p], add_one(p), kiln.TensorType((2,), "float32"),
                          attrs={"Primitive": 1})
        return kiln.Call(f, [a])

    before = kiln.infer_types(let_chain(20000, add_one))
    start = time.perf_counter()
    after = FuseOps()(before)
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0, f"fuse-ops took {elapsed:.2f} s on a 20,000-deep let chain"
    assert kiln.structural_equal(after, let_chain(20000, fused_add_one))  # lets are boundaries


XW = "Tensor[(5, 1, 16), float32]"
H = "Tensor[(1, 8), float32]"
WH = "Tensor[(16, 8), float32]"


def test_a_take_at_one_index_joins_the_dense_whose_epilogue_adds_it():
    # a recurrent step: gates = xw[i] + dense(h, w); the row is read in the dense's epilogue
    after = check(f"""
def @main(%xw: {XW}, %i: int32, %h: {H}, %w: {WH}) {{
  %0 = take(%xw, %i, axis=0);
  %1 = nn.dense(%h, %w);
  add(%0, %1)
}}""", f"""
def @main(%xw: {XW}, %i: int32, %h: {H}, %w: {WH}) {{
  %0 = fn (%p0: {XW}, %p1: int32, %p2: {H}, %p3: {WH}, Primitive=1) -> Tensor[(1, 16), float32] {{
    %1 = take(%p0, %p1, axis=0);
    %2 = nn.dense(%p2, %p3);
    add(%1, %2)
  }};
  %0(%xw, %i, %h, %w)
}}""")
    assert_same_results(kiln.parse(f"""
def @main(%xw: {XW}, %i: int32, %h: {H}, %w: {WH}) {{
  add(take(%xw, %i, axis=0), nn.dense(%h, %w))
}}"""), after, seed=3)


def test_a_gather_or_a_take_after_a_convolution_keeps_its_kernel():
    for text in (
        # indices with a dimension of their own: a gather, not one contiguous row
        f"""def @main(%xw: Tensor[(5, 16), float32], %i: Tensor[(1), int32], %h: {H},
                      %w: {WH}) {{
              add(take(%xw, %i, axis=0), nn.dense(%h, %w)) }}""",
        # the product is a convolution
        f"""def @main(%x: {CONV}, %w: {W}, %t: Tensor[(3, 1, 4, 8, 8), float32], %i: int32) {{
              add(take(%t, %i, axis=0), nn.conv2d(%x, %w, padding=[1, 1, 1, 1])) }}""",
    ):
        after = fuse(kiln.parse(text))
        kernels = [e for e in post_order(after["main"])
                   if isinstance(e, kiln.Function) and e.attrs.get("Primitive")]
        assert len(kernels) == 2, kiln.astext(after)
        assert_same_results(kiln.parse(text), after)
