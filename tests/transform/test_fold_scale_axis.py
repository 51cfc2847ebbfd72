"""fold-scale-axis: per-channel scales folded into conv2d and dense weights, and when not."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.op import nn
from kiln.transform.fold_scale_axis import FoldScaleAxis
from kiln.transform.pass_manager import PassContext, typed

rng = np.random.default_rng(0)


def scale(*shape: int, low: float = 0.5) -> np.ndarray:
    return rng.uniform(low, 2.0, shape).astype("float32")


def const(a: np.ndarray) -> kiln.Constant:
    return kiln.const(a)


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return FoldScaleAxis()(mod)


def module(params: list[kiln.Var], body: kiln.Expr) -> kiln.IRModule:
    return kiln.IRModule.from_expr(kiln.Function(params, body))


def same_results(before: kiln.IRModule, after: kiln.IRModule) -> None:
    r = np.random.default_rng(1)
    args = [r.standard_normal(p.checked_type.shape).astype("float32")
            for p in typed(before)["main"].params]
    want, got = kiln.interpret(before, *args), kiln.interpret(after, *args)
    for w, g in zip(want if isinstance(want, tuple) else [want],
                    got if isinstance(got, tuple) else [got]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def check(params: list[kiln.Var], before: kiln.Expr, expected: kiln.Expr) -> None:
    mod = module(params, before)
    out = run(mod)
    assert kiln.structural_equal(out, module(params, expected)), kiln.astext(out)
    same_results(mod, out)


def unchanged(params: list[kiln.Var], before: kiln.Expr) -> None:
    mod = module(params, before)
    assert kiln.structural_equal(run(mod), mod)


x = kiln.var("x", shape=(2, 3, 6, 6))
w = kiln.var("w", shape=(4, 3, 3, 3))
b = kiln.var("b", shape=(4,))
d = kiln.var("d", shape=(5, 8))
dw = kiln.var("dw", shape=(6, 8))
db = kiln.var("db", shape=(6,))


def conv(data: kiln.Expr, weight: kiln.Expr) -> kiln.Expr:
    return nn.conv2d(data, weight, padding=(1, 1))


# --- after the operator -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (), (1, 1, 1)])
def test_a_scale_after_conv2d_goes_into_its_weights(shape):
    s = scale(*shape)
    per_channel = np.broadcast_to(s.reshape(-1), (4,)).reshape(4, 1, 1, 1)
    check([x, w], conv(x, w) * const(s), conv(x, w * const(per_channel)))
    check([x, w], const(s) * conv(x, w), conv(x, w * const(per_channel)))


def test_through_bias_add_add_and_relu():
    s = scale(4, 1, 1)
    s4, s1 = s.reshape(4, 1, 1, 1), s.reshape(4)
    check([x, w, b], nn.bias_add(conv(x, w), b) * const(s),
          nn.bias_add(conv(x, w * const(s4)), b * const(s1)))
    b3 = kiln.var("b3", shape=(4, 1, 1))
    check([x, w, b3], nn.relu(conv(x, w) + b3) * const(s),
          nn.relu(conv(x, w * const(s4)) + b3 * const(s)))
    # an addend that varies over space is scaled as a whole
    bs = kiln.var("bs", shape=(1, 6, 6))
    check([x, w, bs], (conv(x, w) + bs) * const(s), conv(x, w * const(s4)) + bs * const(s))


def test_dense_with_a_bias():
    s = scale(6)
    check([d, dw, db], nn.bias_add(nn.dense(d, dw), db, axis=-1) * const(s),
          nn.bias_add(nn.dense(d, dw * const(s.reshape(6, 1))), db * const(s), axis=-1))
    d3 = kiln.var("d3", shape=(2, 5, 8))
    s2 = scale(1, 6)
    check([d3, dw], nn.dense(d3, dw) * const(s2), nn.dense(d3, dw * const(s2.reshape(6, 1))))


def test_scales_that_cannot_be_folded():
    s = scale(4, 1, 1)
    # relu(y) * s == relu(y * s) needs s >= 0
    negative = s.copy()
    negative[2] = -1.0
    unchanged([x, w], nn.relu(conv(x, w)) * const(negative))
    # varies over space, or broadcasts the result to a larger shape
    unchanged([x, w], conv(x, w) * const(scale(1, 1, 6, 6)))
    unchanged([x, w], conv(x, w) * const(scale(3, 1, 4, 1, 1)))
    # a scale that is not a constant
    sv = kiln.var("sv", shape=(4, 1, 1))
    unchanged([x, w, sv], conv(x, w) * sv)
    # the convolution's result is used elsewhere too: folding would compute it twice
    c = conv(x, w)
    unchanged([x, w], kiln.tuple_(c * const(s), c))
    c = nn.bias_add(conv(x, w), b)
    unchanged([x, w, b], kiln.tuple_(c * const(s), c))
    # bias_add along another axis than the channels
    bh = kiln.var("bh", shape=(6,))
    unchanged([x, w, bh], nn.bias_add(conv(x, w), bh, axis=2) * const(s))
    # a convolution or dense layer with a wider result dtype than its weights
    wide = nn.conv2d(x, w, out_dtype="float64")
    unchanged([x, w], wide * kiln.const(scale(4, 1, 1).astype("float64")))
    unchanged([d, dw], nn.dense(d, dw, out_dtype="float64") * kiln.const(
        scale(6).astype("float64")))


# --- before the operator ------------------------------------------------------------------


def test_a_scale_on_the_input_channels_of_conv2d():
    s = scale(3, 1, 1)
    check([x, w], conv(x * const(s), w), conv(x, w * const(s.reshape(1, 3, 1, 1))))
    check([x, w], conv(const(s) * x, w), conv(x, w * const(s.reshape(1, 3, 1, 1))))


def test_grouped_and_depthwise_convolutions():
    xg = kiln.var("xg", shape=(1, 4, 5, 5))
    wg = kiln.var("wg", shape=(6, 2, 3, 3))  # 2 groups: 2 input and 3 output channels each
    s = scale(4, 1, 1)
    v = s.reshape(4)
    expected = np.array([[v[0], v[1]]] * 3 + [[v[2], v[3]]] * 3, "float32")[:, :, None, None]
    check([xg, wg], nn.conv2d(xg * const(s), wg, groups=2),
          nn.conv2d(xg, wg * const(expected), groups=2))
    wd = kiln.var("wd", shape=(4, 1, 3, 3))  # depthwise
    check([xg, wd], nn.conv2d(xg * const(s), wd, groups=4, padding=1),
          nn.conv2d(xg, wd * const(s.reshape(4, 1, 1, 1)), groups=4, padding=1))


def test_a_scale_on_the_input_of_dense():
    s = scale(8)
    check([d, dw], nn.dense(d * const(s), dw), nn.dense(d, dw * const(s.reshape(1, 8))))
    unchanged([d, dw], nn.dense(d * const(scale(5, 1)), dw))  # scales rows, not features


def test_both_directions_and_a_chain_of_layers():
    s_in, s_out, s2 = scale(3, 1, 1), scale(4, 1, 1), scale(5)
    w2 = kiln.var("w2", shape=(5, 4, 1, 1))
    before = nn.conv2d(nn.relu(conv(x * const(s_in), w) * const(s_out)), w2) * const(
        s2.reshape(5, 1, 1))
    expected = nn.conv2d(
        nn.relu(conv(x, w * const(s_in.reshape(1, 3, 1, 1)) * const(s_out.reshape(4, 1, 1, 1)))),
        w2 * const(s2.reshape(5, 1, 1, 1)))
    check([x, w, w2], before, expected)


def test_let_bound_layers_are_seen_through():
    mod = kiln.parse("""
        def @main(%x: Tensor[(1, 3), float32], %w: Tensor[(2, 3), float32],
                  %b: Tensor[(2), float32]) {
          let %y = nn.dense(%x, %w);
          let %z = nn.bias_add(%y, %b, axis=1);
          multiply(%z, 2f)
        }""")
    out = run(mod)
    expected = kiln.parse("""
        def @main(%x: Tensor[(1, 3), float32], %w: Tensor[(2, 3), float32],
                  %b: Tensor[(2), float32]) {
          let %y = nn.dense(%x, %w);
          let %z = nn.bias_add(%y, %b, axis=1);
          nn.bias_add(nn.dense(%x, multiply(%w, meta[relay.Constant][0])),
                      multiply(%b, meta[relay.Constant][1]), axis=1)
        }
        #[metadata]
        {"kiln_metadata": 1, "relay.Constant": [
          {"dtype": "float32", "shape": [2, 1], "data": "AAAAQAAAAEA="},
          {"dtype": "float32", "shape": [2], "data": "AAAAQAAAAEA="}]}
        """)
    assert kiln.structural_equal(out, expected), kiln.astext(out)
    same_results(mod, out)
    # used twice through the variable: not folded
    twice = kiln.parse("""
        def @main(%x: Tensor[(1, 3), float32], %w: Tensor[(2, 3), float32]) {
          let %y = nn.dense(%x, %w);
          (multiply(%y, 2f), %y)
        }""")
    assert kiln.structural_equal(run(twice), twice)


def test_a_scale_inside_a_closure_and_a_branch():
    s = scale(4, 1, 1)
    p = kiln.var("p", shape=(2, 3, 6, 6))
    c = kiln.var("c", shape=(), dtype="bool")
    f = kiln.Function([p], conv(p, w) * const(s))
    f2 = kiln.Function([p], conv(p, w * const(s.reshape(4, 1, 1, 1))))
    fv = kiln.var("f")
    before = kiln.Let(fv, f, kiln.if_(c, kiln.Call(fv, [x]), conv(x, w) * const(s)))
    expected = kiln.Let(fv, f2, kiln.if_(c, kiln.Call(fv, [x]),
                                         conv(x, w * const(s.reshape(4, 1, 1, 1)))))
    mod = module([x, w, c], before)
    out = run(mod)
    assert kiln.structural_equal(out, module([x, w, c], expected)), kiln.astext(out)
    args = [np.random.default_rng(2).standard_normal(t).astype("float32")
            for t in [(2, 3, 6, 6), (4, 3, 3, 3)]]
    for flag in (True, False):
        np.testing.assert_allclose(kiln.interpret(out, *args, np.array(flag)),
                                   kiln.interpret(mod, *args, np.array(flag)), rtol=1e-4,
                                   atol=1e-4)


def test_a_20000_node_graph():
    h: kiln.Expr = d
    weight = kiln.var("w", shape=(8, 8))
    for _ in range(4000):  # dense, multiply, a constant and two ops: 5 nodes each
        h = nn.dense(h, weight) * const(scale(8))
    mod = module([d, weight], h)
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = FoldScaleAxis()(tmod)
    elapsed = time.perf_counter() - start
    ops = [n.op.name for n in post_order(out["main"].body)
           if isinstance(n, kiln.Call) and isinstance(n.op, kiln.Op)]
    assert ops.count("nn.dense") == 4000 and ops.count("multiply") == 4000
    # every multiply now scales the weight, none a layer's output
    assert all(n.args[0] is out["main"].params[1] for n in post_order(out["main"].body)
               if isinstance(n, kiln.Call) and n.op == kiln.Op("multiply"))
    assert elapsed < 15, f"{elapsed:.1f} s"
