"""simplify-inference: batch_norm to scale and shift, dropout removed, layer_norm expanded."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.transform.pass_manager import PassContext, typed
from kiln.transform.simplify_inference import SimplifyInference

EXPAND = {"simplify-inference.expand_layer_norm": True}


def run(mod: kiln.IRModule, **config) -> kiln.IRModule:
    with PassContext(debug=True, config=config):
        return SimplifyInference()(mod)


def sample(mod: kiln.IRModule, seed: int = 0) -> list[np.ndarray]:
    """Random arguments for @main (positive, for the variances among them)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.2, 2.0, p.checked_type.shape).astype(p.checked_type.dtype)
            * rng.choice([-1, 1], p.checked_type.shape).astype(p.checked_type.dtype)
            if p.name_hint != "v" else
            rng.uniform(0.2, 2.0, p.checked_type.shape).astype(p.checked_type.dtype)
            for p in typed(mod)["main"].params]


def leaves(value) -> list[np.ndarray]:
    """The arrays of a (nested) tuple value, in order."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(np.asarray(v))
    return out


def same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    args = sample(before)
    want, got = leaves(kiln.interpret(before, *args)), leaves(kiln.interpret(after, *args))
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


BN = ("def @main(%x: Tensor[(2, 3, 4, 5), float32], %g: Tensor[(3), float32], "
      "%b: Tensor[(3), float32], %m: Tensor[(3), float32], %v: Tensor[(3), float32]) {")


def test_batch_norm_becomes_a_scale_and_a_shift_per_channel():
    mod = kiln.parse(f"{BN} %0 = nn.batch_norm(%x, %g, %b, %m, %v); %0.0 }}")
    expected = kiln.parse(f"""{BN}
        %0 = multiply(rsqrt(add(%v, 1e-05f)), %g);
        %1 = add(multiply(negative(%m), %0), %b);
        add(multiply(%x, expand_dims(%0, axis=1, num_newaxis=2)),
            expand_dims(%1, axis=1, num_newaxis=2))
    }}""")
    out = run(mod)
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_batch_norm_without_scale_or_center_and_on_the_last_axis():
    mod = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 3), float32], %g: Tensor[(3), float32],
                  %b: Tensor[(3), float32], %m: Tensor[(3), float32], %v: Tensor[(3), float32]) {
          %0 = nn.batch_norm(%x, %g, %b, %m, %v, axis=-1, epsilon=0.25f, scale=False);
          %1 = nn.batch_norm(%x, %g, %b, %m, %v, axis=2, center=False);
          (%0.0, %1.0)
        }""")
    expected = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 3), float32], %g: Tensor[(3), float32],
                  %b: Tensor[(3), float32], %m: Tensor[(3), float32], %v: Tensor[(3), float32]) {
          %0 = rsqrt(add(%v, 0.25f));
          %1 = multiply(rsqrt(add(%v, 1e-05f)), %g);
          (add(multiply(%x, %0), add(multiply(negative(%m), %0), %b)),
           add(multiply(%x, %1), multiply(negative(%m), %1)))
        }""")
    out = run(mod)
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_the_moving_statistics_pass_through_and_a_whole_tuple_keeps_the_call():
    mod = kiln.parse(f"{BN} %0 = nn.batch_norm(%x, %g, %b, %m, %v); (%0.1, %0.2, %0) }}")
    out = run(mod)
    assert kiln.structural_equal(out, kiln.parse(
        f"{BN} %0 = nn.batch_norm(%x, %g, %b, %m, %v); (%m, %v, %0) }}")), kiln.astext(out)
    same_results(mod, out)


def test_dropout_is_the_identity_and_its_mask_is_ones():
    mod = kiln.parse("""
        def @main(%x: Tensor[(2, 3), float32]) {
          %0 = nn.dropout(%x, rate=0.3f);
          (nn.relu(%0.0), %0.1)
        }""")
    out = run(mod)
    assert kiln.structural_equal(out, kiln.parse("""
        def @main(%x: Tensor[(2, 3), float32]) { (nn.relu(%x), ones_like(%x)) }"""))
    same_results(mod, out)


LN = "def @main(%x: Tensor[(2, 5), float32], %g: Tensor[(5), float32], %b: Tensor[(5), float32]) {"


def test_layer_norm_is_expanded_only_when_asked():
    mod = kiln.parse(f"{LN} nn.layer_norm(%x, %g, %b) }}")
    assert kiln.structural_equal(run(mod), mod)
    out = run(mod, **EXPAND)
    expected = kiln.parse(f"""{LN}
        %0 = subtract(%x, mean(%x, axis=[1], keepdims=True));
        %1 = mean(multiply(%0, %0), axis=[1], keepdims=True);
        add(multiply(multiply(%0, rsqrt(add(%1, 1e-05f))), %g), %b)
    }}""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_layer_norm_on_a_middle_axis_without_scale():
    mod = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 3), float32], %g: Tensor[(4), float32],
                  %b: Tensor[(4), float32]) {
          nn.layer_norm(%x, %g, %b, axis=1, scale=False, epsilon=0.001f)
        }""")
    out = run(mod, **EXPAND)
    expected = kiln.parse("""
        def @main(%x: Tensor[(2, 4, 3), float32], %g: Tensor[(4), float32],
                  %b: Tensor[(4), float32]) {
          %0 = subtract(%x, mean(%x, axis=[1], keepdims=True));
          %1 = mean(multiply(%0, %0), axis=[1], keepdims=True);
          add(multiply(%0, rsqrt(add(%1, 0.001f))), expand_dims(%b, axis=1))
        }""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_a_let_bound_batch_norm_is_seen_through():
    mod = kiln.parse(f"""{BN}
        let %bn = nn.batch_norm(%x, %g, %b, %m, %v, center=False, scale=False);
        let %y = %bn.0;
        let %z = nn.dropout(%y);
        %z.0
    }}""")
    out = run(mod)
    expected = kiln.parse(f"""{BN}
        let %bn = nn.batch_norm(%x, %g, %b, %m, %v, center=False, scale=False);
        let %y = add(multiply(%x, expand_dims(rsqrt(add(%v, 1e-05f)), axis=1, num_newaxis=2)),
                     expand_dims(multiply(negative(%m), rsqrt(add(%v, 1e-05f))),
                                 axis=1, num_newaxis=2));
        let %z = nn.dropout(%y);
        %y
    }}""")
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)


def test_batch_norm_in_a_closure_and_a_branch_of_an_if():
    mod = kiln.parse(f"""{BN}
        let %f = fn (%a: Tensor[(2, 3, 4, 5), float32]) {{
          %0 = nn.batch_norm(%a, %g, %b, %m, %v);
          nn.relu(%0.0)
        }};
        %1 = nn.dropout(%x);
        if (True) {{ %f(%1.0) }} else {{ %x }}
    }}""")
    out = run(mod)
    assert not any(isinstance(n, kiln.Call) and isinstance(n.op, kiln.Op)
                   and n.op.name in ("nn.batch_norm", "nn.dropout")
                   for n in post_order(out["main"]))
    same_results(mod, out)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_dtypes(dtype):
    mod = kiln.parse(BN.replace("float32", dtype)
                     + " %0 = nn.batch_norm(%x, %g, %b, %m, %v, epsilon=0.5f); %0.0 }")
    out = run(mod)
    eps = [n for n in post_order(out["main"]) if isinstance(n, kiln.Constant)]
    assert [c.dtype for c in eps] == [dtype]
    args = sample(mod)
    np.testing.assert_allclose(kiln.interpret(out, *args).astype("float64"),
                               kiln.interpret(mod, *args).astype("float64"),
                               rtol=1e-2 if dtype == "float16" else 1e-10, atol=1e-2)


def test_a_20000_node_graph():
    x = kiln.var("x", shape=(1, 2, 2, 2))
    g, b, m, v = (kiln.var(n, shape=(2,)) for n in "gbmv")
    e = x
    for _ in range(3500):  # batch_norm, .0, dropout, .0 and two ops: 6 nodes each
        e = kiln.op.nn.dropout(kiln.op.nn.batch_norm(e, g, b, m, v)[0])[0]
    mod = kiln.IRModule.from_expr(kiln.Function([x, g, b, m, v], e))
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = SimplifyInference()(tmod)
    elapsed = time.perf_counter() - start
    ops = {n.op.name for n in post_order(out["main"])
           if isinstance(n, kiln.Call) and isinstance(n.op, kiln.Op)}
    assert ops == {"add", "multiply", "negative", "rsqrt", "expand_dims"}
    assert elapsed < 8, f"{elapsed:.1f} s"
