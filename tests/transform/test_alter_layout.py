"""alter-layout: constant dense weights become prepacked panels (nn.dense_packed), and when not.

Oracles: the packed constant equals `pack_dense_weight` of the original weight (whose unpacking
is checked against the weight in tests/op/test_nn_packed.py), and the rewritten program agrees
with numpy, interpreted and compiled.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.loops.gemm import k_blocking, register_tile
from kiln.loops.linear_kernels import uses_dot
from kiln.op import nn
from kiln.op.nn.packed import pack_dense_weight
from kiln.runtime.compiler import native_available
from kiln.target import Target
from kiln.transform.alter_layout import AlterLayout
from kiln.transform.pass_manager import PassContext

RNG = np.random.default_rng(3)


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return AlterLayout()(mod)


def calls(mod: kiln.IRModule) -> list[kiln.Call]:
    return [n for n in post_order(mod["main"]) if isinstance(n, kiln.Call)]


def mlp(rows: int, dtype: str = "float32") -> tuple[kiln.IRModule, list[np.ndarray]]:
    """dense(relu(dense(x, W1) + b), W2) with constant weights, x of ``rows`` rows."""
    w1 = RNG.standard_normal((40, 30)).astype(dtype)
    b1 = RNG.standard_normal(40).astype(dtype)
    w2 = RNG.standard_normal((9, 40)).astype(dtype)
    x = kiln.var("x", shape=(rows, 30), dtype=dtype)
    hidden = nn.relu(nn.bias_add(nn.dense(x, kiln.const(w1)), kiln.const(b1)))
    body = nn.dense(hidden, kiln.const(w2))
    return kiln.IRModule.from_expr(kiln.Function([x], body)), [w1, b1, w2]


def numpy_mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1.T + b1, 0) @ w2.T


def test_constant_weights_are_packed() -> None:
    # the 40-unit layer in GEMM panels; the 9-unit one (at most one vector of units) stays
    # a dense, whose dot-product kernel reads the weight rows in place (`uses_dot`)
    mod, (w1, b1, w2) = mlp(rows=8)
    out = run(mod)
    packed = [c for c in calls(out) if c.op.name == "nn.dense_packed"]
    plain = [c for c in calls(out) if c.op.name == "nn.dense"]
    assert [c.attrs.units for c in packed] == [40]
    assert len(plain) == 1
    assert uses_dot(8, 9, 40, Target.host().lanes("float32"))
    # Panels as wide as the micro-kernel on this machine
    lanes = Target.host().lanes("float32")
    wp = packed[0].args[1].data
    nr = wp.shape[2]
    assert nr in (lanes, register_tile(Target.host())[1])
    np.testing.assert_array_equal(wp, pack_dense_weight(w1, nr, wp.shape[1]))
    np.testing.assert_array_equal(wp.shape[1], k_blocking(30)[0])
    x = RNG.standard_normal((8, 30)).astype("float32")
    np.testing.assert_allclose(kiln.interpret(out, x), numpy_mlp(x, w1, b1, w2), rtol=1e-5,
                               atol=1e-5)
    # and compiled: the GEMM and the dot products give numpy's result
    exe = kiln.build(mod)
    kinds = sorted(str(sched.get("kernel")) for d in exe.program.kernels.values()
                   if d.kernel is not None for _, sched in d.kernel.attrs.get("schedules", ()))
    assert kinds == ["dot", "gemm"], kinds
    np.testing.assert_allclose(exe(x), numpy_mlp(x, w1, b1, w2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,dtype", [(2, "float32"), (8, "float64")])
def test_left_alone(rows: int, dtype: str) -> None:
    # few rows: the dot-product kernel reads the weight in place; float64: no packed GEMM
    mod, _ = mlp(rows, dtype)
    assert run(mod) is mod or not [c for c in calls(run(mod)) if c.op.name == "nn.dense_packed"]


def test_weight_parameter_left_alone() -> None:
    x = kiln.var("x", shape=(8, 5), dtype="float32")
    w = kiln.var("w", shape=(3, 5), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.dense(x, w)))
    assert [c.op.name for c in calls(run(mod))] == ["nn.dense"]


@pytest.mark.skipif(not native_available(), reason="needs llvmlite")
def test_build_with_params_uses_packed_weights(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    x = kiln.var("x", shape=(2, 7, 30), dtype="float32")  # 14 rows, rank 3
    w = kiln.var("w", shape=(35, 30), dtype="float32")
    b = kiln.var("b", shape=(35,), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w, b], nn.relu(nn.bias_add(
        nn.dense(x, w), b, axis=-1))))
    wv = RNG.standard_normal((35, 30)).astype("float32")
    bv = RNG.standard_normal(35).astype("float32")
    assert "nn.dense_packed" in kiln.astext(kiln.optimize(mod, params={"w": wv, "b": bv}))
    exe = kiln.build(mod, params={"w": wv, "b": bv})
    xv = RNG.standard_normal((2, 7, 30)).astype("float32")
    np.testing.assert_allclose(exe(xv), np.maximum(xv @ wv.T + bv, 0), rtol=1e-4, atol=1e-5)


def conv_module(groups: int, channels: int) -> tuple[kiln.IRModule, np.ndarray]:
    w = RNG.standard_normal((channels, 8 // groups, 3, 3)).astype("float32")
    x = kiln.var("x", shape=(1, 8, 9, 9), dtype="float32")
    body = nn.relu(nn.conv2d(x, kiln.const(w), strides=2, padding=1, groups=groups))
    return kiln.IRModule.from_expr(kiln.Function([x], body)), w


def test_conv_weights_are_packed_but_not_depthwise() -> None:
    torch = pytest.importorskip("torch")
    mod, w = conv_module(groups=2, channels=10)
    out = run(mod)
    (packed,) = [c for c in calls(out) if c.op.name == "nn.conv2d_packed"]
    assert packed.attrs.channels == 10 and tuple(packed.attrs.kernel_size) == (3, 3)
    x = RNG.standard_normal((1, 8, 9, 9)).astype("float32")
    want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                                 stride=2, padding=1, groups=2)).numpy()
    np.testing.assert_allclose(kiln.interpret(out, x), want, rtol=1e-5, atol=1e-5)
    if native_available():
        np.testing.assert_allclose(kiln.build(mod)(x), want, rtol=1e-4, atol=1e-4)
    depthwise, _ = conv_module(groups=8, channels=8)
    assert [c.op.name for c in calls(run(depthwise))] == ["nn.conv2d", "nn.relu"]
