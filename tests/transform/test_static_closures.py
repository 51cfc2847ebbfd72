"""specialize-closures: higher-order programs whose closures and references are static are
partially evaluated to first order (and run natively); the others are left for the VM."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.expr import Function, RefCreate
from kiln.ir.traverse import post_order
from kiln.transform import PassContext, get_pass

MLP = """
def @main(%x: Tensor[(8, 12), float32], %w: Tensor[(16, 12), float32],
          %w2: Tensor[(3, 16), float32]) -> Tensor[(), float32] {
  sum(tanh(nn.dense(nn.relu(nn.dense(%x, %w)), %w2)))
}"""


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((8, 12), (16, 12), (3, 16))]


def _flat(out):
    loss, grads = out
    return [np.asarray(loss), *(np.asarray(g) for g in grads)]


def test_a_higher_order_gradient_runs_natively_and_equals_the_first_order_one():
    mod = kiln.parse(MLP)
    ho = kiln.IRModule.from_expr(kiln.grad(mod["main"], mod=mod), mod)
    fo = kiln.IRModule.from_expr(kiln.grad(mod["main"], mod=mod, mode="first_order"), mod)
    exe = kiln.build(ho)
    assert exe.stats().executor == "native"
    args = _args()
    want = _flat(kiln.interpret(ho, *args))
    for got in (_flat(exe(*args)), _flat(kiln.build(fo)(*args))):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)  # fast tanh, FMA


def test_the_pass_removes_every_closure_and_reference():
    mod = kiln.parse(MLP)
    ho = kiln.IRModule.from_expr(kiln.grad(mod["main"], mod=mod), mod)
    with PassContext(opt_level=3):
        out = get_pass("specialize-closures")(get_pass("infer-type")(ho))
    nodes = list(post_order(out["main"].body))
    assert not any(isinstance(n, (Function, RefCreate)) for n in nodes)
    assert list(out.functions) == [out.get_global_var("main")]


def test_a_loop_over_data_is_left_for_the_vm():
    text = """
    def @loop(%i: int32, %acc: float32) -> float32 {
      if (%i == 0) { %acc } else { @loop(%i - 1, %acc * 2f) }
    }
    def @main(%n: int32, %x: float32) {
      let %r = ref(%x);
      let %f = fn () { ref_write(%r, @loop(%n, ref_read(%r))) };
      let %u = %f();
      ref_read(%r)
    }"""
    mod = kiln.parse(text)
    exe = kiln.build(mod)
    assert exe.stats().executor == "vm"
    assert float(exe(np.int32(5), np.float32(1.5))) == pytest.approx(48.0)


def test_it_runs_only_from_opt_level_2():
    mod = kiln.parse(MLP)
    ho = kiln.IRModule.from_expr(kiln.grad(mod["main"], mod=mod), mod)
    assert kiln.build(ho, opt_level=1).stats().executor == "vm"
