"""inline-partitions: Relay's BYOC form (Compiler= functions holding Composite= functions, as
TVM's PartitionGraph prints them) builds and runs through kiln; numpy is the oracle."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import kiln
from kiln.ir.expr import Function
from kiln.ir.traverse import post_order
from kiln.transform import get_pass

# A partitioned function as a literal, called in place (TVM's printer, graph form).
LITERAL = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 4), float32], %y: Tensor[(1, 4), float32]) -> Tensor[(1, 4), float32] {
  %2 = fn (%a: Tensor[(1, 4), float32], %b: Tensor[(1, 4), float32], Primitive=1,
           Compiler="dnnl", global_symbol="tvmgen_default_dnnl_main_0", Inline=1)
           -> Tensor[(1, 4), float32] {
    %0 = fn (%p0: Tensor[(1, 4), float32], %p1: Tensor[(1, 4), float32],
             Composite="dnnl.add_relu", PartitionedFromPattern="add_nn.relu_")
             -> Tensor[(1, 4), float32] {
      %1 = add(%p0, %p1);
      nn.relu(%1)
    };
    %0(%a, %b)
  };
  %2(%x, %y)
}
"""

# A partitioned global, its composite function called twice (TVM 0.12's PartitionGraph).
GLOBAL = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 3, 6, 6), float32], %w: Tensor[(4, 3, 3, 3), float32],
          %b: Tensor[(1, 4, 4, 4), float32]) -> Tensor[(1, 4, 4, 4), float32] {
  %0 = @tvmgen_default_ccompiler_main_0(%x, %w, %b);
  multiply(%0, 2f)
}

def @tvmgen_default_ccompiler_main_0(%c_x: Tensor[(1, 3, 6, 6), float32],
    %c_w: Tensor[(4, 3, 3, 3), float32], %c_b: Tensor[(1, 4, 4, 4), float32],
    Inline=1, Compiler="ccompiler", global_symbol="tvmgen_default_ccompiler_main_0",
    Primitive=1) -> Tensor[(1, 4, 4, 4), float32] {
  %3 = fn (%FunctionVar_0: Tensor[(1, 3, 6, 6), float32],
           %FunctionVar_1: Tensor[(4, 3, 3, 3), float32],
           PartitionedFromPattern="nn.conv2d_", Composite="ccompiler.conv2d")
           -> Tensor[(1, 4, 4, 4), float32] {
    nn.conv2d(%FunctionVar_0, %FunctionVar_1, padding=[0, 0, 0, 0])
  };
  %4 = fn (%FunctionVar_2: Tensor[(1, 4, 4, 4), float32],
           %FunctionVar_3: Tensor[(1, 4, 4, 4), float32],
           PartitionedFromPattern="add_", Composite="ccompiler.add")
           -> Tensor[(1, 4, 4, 4), float32] {
    add(%FunctionVar_2, %FunctionVar_3)
  };
  %5 = %3(%c_x, %c_w);
  %6 = %4(%5, %c_b);
  %4(%6, %c_b)
}
"""


def _conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i : i + out.shape[2], j : j + out.shape[3]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def test_a_partitioned_literal_builds_and_runs(caplog: pytest.LogCaptureFixture) -> None:
    mod = kiln.parse(LITERAL)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((1, 4)).astype("float32") for _ in range(2))
    with caplog.at_level(logging.INFO, logger="kiln.transform.inline_partitions"):
        out = kiln.build(mod)(x, y)
    np.testing.assert_allclose(out, np.maximum(x + y, 0), rtol=1e-6)
    assert "'dnnl'" in caplog.text and "runs through kiln" in caplog.text


def test_a_partitioned_global_builds_and_runs() -> None:
    mod = kiln.parse(GLOBAL)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 6, 6)).astype("float32")
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    b = rng.standard_normal((1, 4, 4, 4)).astype("float32")
    expected = (_conv2d(x.astype(np.float64), w.astype(np.float64)) + 2 * b) * 2
    np.testing.assert_allclose(kiln.build(mod)(x, w, b), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kiln.interpret(mod, x, w, b), expected, rtol=1e-4, atol=1e-4)


def test_the_pass_leaves_no_markers_and_no_nested_calls_of_literals() -> None:
    mod = get_pass("inline-partitions")(kiln.parse(GLOBAL))
    for fn in mod.functions.values():
        for node in post_order(fn):
            if isinstance(node, Function):
                assert not {"Compiler", "Composite", "Primitive"} & set(node.attrs)
            if isinstance(node, kiln.Call):
                assert not isinstance(node.op, Function)
    assert mod["tvmgen_default_ccompiler_main_0"].attrs.get("Inline") == 1


def test_a_module_without_partitions_is_returned_as_is() -> None:
    mod = kiln.parse("def @main(%x: Tensor[(2), float32]) { negative(%x) }")
    assert get_pass("inline-partitions")(mod) is mod


def test_it_runs_at_opt_level_0() -> None:
    mod = kiln.parse(LITERAL)
    x = np.ones((1, 4), "float32")
    np.testing.assert_array_equal(kiln.build(mod, opt_level=0)(x, x), 2 * x)
