"""First-order mode: straight-line adjoint programs, agreement with higher-order mode."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ad import grad
from kiln.ir.traverse import post_order
from kiln.testing.gradcheck import check_grad

DATAFLOW = """
#[version = "0.0.5"]
def @main(%x: Tensor[(4, 6), float64], %w: Tensor[(6, 6), float64], %b: Tensor[(6), float64],
          %gamma: Tensor[(6), float64], %beta: Tensor[(6), float64]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b, axis=-1);
  %2 = split(%1, indices_or_sections=2, axis=1);
  %3 = sigmoid(%2.0) * tanh(%2.1);
  %4 = concatenate((%3, %2.1, %3), axis=1);
  %5 = nn.layer_norm(%4, %gamma, %beta) ;
  %6 = mean(%5, axis=[0]);
  %7 = max(%x, axis=[1], keepdims=True);
  (sum(%6 * %6), %5, %7)
}
"""


def _args(rng: np.random.Generator) -> list[np.ndarray]:
    gamma = rng.uniform(0.5, 1.5, 6)
    return [rng.standard_normal((4, 6)), rng.standard_normal((6, 6)) * 0.5,
            rng.standard_normal(6), gamma, rng.standard_normal(6)]


def test_dataflow_program_against_finite_differences() -> None:
    mod = kiln.infer_types(kiln.parse(DATAFLOW.replace("(%3, %2.1, %3)", "(%3, %2.1, %2.0)")
                                      .replace("Tensor[(6), float64], %beta", "Tensor[(9), "
                                               "float64], %beta").replace("%beta: Tensor[(6)",
                                                                          "%beta: Tensor[(9)")))
    rng = np.random.default_rng(0)
    args = _args(rng)
    args[3], args[4] = rng.uniform(0.5, 1.5, 9), rng.standard_normal(9)
    check_grad(mod, args, mode="first_order", of=0)
    check_grad(mod, args, mode="first_order")  # every output seeded


def test_both_modes_give_the_same_numbers_on_dataflow_programs() -> None:
    mod = kiln.infer_types(kiln.parse(DATAFLOW.replace("Tensor[(6), float64], %beta",
                                                       "Tensor[(9), float64], %beta")
                                      .replace("%beta: Tensor[(6)", "%beta: Tensor[(9)")))
    rng = np.random.default_rng(1)
    args = _args(rng)
    args[3], args[4] = rng.uniform(0.5, 1.5, 9), rng.standard_normal(9)
    for options in [{}, {"of": 1}, {"wrt": (0, 2), "keeping": ()}]:
        out = {}
        for mode in ("first_order", "higher_order"):
            g = grad(mod["main"], mod=mod, mode=mode, **options)
            out[mode] = kiln.interpret(kiln.IRModule.from_expr(g, mod), *args)
        first, higher = out["first_order"], out["higher_order"]
        for a, b in zip(_flatten(first), _flatten(higher), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _flatten(v: object) -> list[np.ndarray]:
    if isinstance(v, tuple):
        return [leaf for x in v for leaf in _flatten(x)]
    return [np.asarray(v)]


def test_the_adjoint_program_is_straight_line_and_shares_forward_values() -> None:
    mod = kiln.infer_types(kiln.parse(DATAFLOW.replace("Tensor[(6), float64], %beta",
                                                       "Tensor[(9), float64], %beta")
                                      .replace("%beta: Tensor[(6)", "%beta: Tensor[(9)")))
    g = grad(mod["main"], mod=mod, mode="first_order")
    nodes = post_order(g.body)
    kinds = {type(n) for n in nodes}
    assert not kinds & {kiln.Function, kiln.RefCreate, kiln.RefRead, kiln.RefWrite, kiln.If,
                        kiln.Match}
    # every forward operator runs once: the adjoint code reads the forward values
    for name in ("sigmoid", "tanh", "nn.layer_norm", "split"):
        calls = [n for n in nodes if isinstance(n, kiln.Call) and n.op == kiln.Op(name)]
        assert len(calls) == 1, name
    # a flat chain of lets: the body is let after let down to the result tuple
    depth, e = 0, g.body
    while isinstance(e, kiln.Let):
        depth, e = depth + 1, e.body
    assert isinstance(e, kiln.Tuple) and depth > 30


def test_only_values_on_a_path_from_wrt_to_the_output_get_adjoints() -> None:
    x = kiln.var("x", shape=(3,), dtype="float64")
    y = kiln.var("y", shape=(3,), dtype="float64")
    unrelated = kiln.op.exp(y)  # depends on y only: no adjoint for d/dx
    fn = kiln.infer_types(kiln.Function([x, y], kiln.op.sum(x * unrelated) + kiln.op.sum(
        kiln.op.sin(y))))
    g = grad(fn, mode="first_order", wrt=0, keeping=())
    names = [n.op.name for n in post_order(g.body) if isinstance(n, kiln.Call)
             and isinstance(n.op, kiln.Op)]
    assert names.count("cos") == 0  # sin(y) is not differentiated: y is not in wrt
    (dx,) = kiln.interpret(g, np.ones(3), np.zeros(3))
    np.testing.assert_allclose(dx, np.ones(3))


@pytest.mark.parametrize(
    ("body", "construct"),
    [
        ("if (sum(%x) > 0f) { %x } else { %x * 2f }", "an if expression"),
        ("let %f = fn (%y: Tensor[(3), float32]) { %y }; %f(%x)", "a function"),
        ("let %r = ref(%x); ref_read(%r)", "a reference"),
        ("@g(%x)", "a call of the global function @g"),
        ("match ((%x, %x)) { (%a, _) => %a }", "a match expression"),
    ],
)
def test_rejects_what_it_cannot_handle_and_suggests_higher_order(body, construct) -> None:
    text = f"""
        def @g(%x: Tensor[(3), float32]) -> Tensor[(3), float32] {{ %x }}
        def @main(%x: Tensor[(3), float32]) {{ {body} }}
    """
    mod = kiln.infer_types(kiln.parse(text, source_name="prog.rly"))
    with pytest.raises(kiln.Error, match=f"this one has {construct}.*higher_order") as info:
        grad(mod["main"], mod=mod, mode="first_order")
    assert info.value.line == 3
    grad(mod["main"], mod=mod)  # higher_order takes it


def test_second_derivatives_by_differentiating_a_gradient() -> None:
    # d/dx of the first-order gradient program: a Hessian-vector product.
    x = kiln.var("x", shape=(3,), dtype="float64")
    w = kiln.var("w", shape=(3,), dtype="float64")
    f = kiln.infer_types(kiln.Function(
        [x, w], kiln.op.sum(kiln.op.tanh(x * w) * kiln.op.exp(x) + kiln.op.abs(x) * x * x)))
    g = grad(f, mode="first_order", wrt=0, keeping=())  # x, w -> (df/dx,)
    v = kiln.var("v", shape=(3,), dtype="float64")
    xg = kiln.var("x2", shape=(3,), dtype="float64")
    wg = kiln.var("w2", shape=(3,), dtype="float64")
    # h(x, w, v) = <df/dx (x, w), v>
    h = kiln.infer_types(kiln.Function(
        [xg, wg, v], kiln.op.sum(kiln.TupleGetItem(kiln.Call(g, (xg, wg)), 0) * v)))
    with pytest.raises(kiln.Error, match="a function"):
        grad(h, mode="first_order")
    hv = grad(h, wrt=0, keeping=())  # the higher-order mode handles the call of g
    rng = np.random.default_rng(2)
    xv, wv, vv = rng.uniform(0.2, 1, 3), rng.standard_normal(3), rng.standard_normal(3)
    (actual,) = kiln.interpret(hv, xv, wv, vv)

    def dfdx(xx: np.ndarray) -> np.ndarray:
        (d,) = kiln.interpret(g, xx, wv)
        return d

    eps = 1e-6
    expected = np.array([
        np.dot(dfdx(xv + eps * e) - dfdx(xv - eps * e), vv) / (2 * eps) for e in np.eye(3)
    ])
    np.testing.assert_allclose(actual, expected, rtol=1e-6)
