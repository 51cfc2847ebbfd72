"""convert-layout: CNNs run in channel blocks between their convolutions.

What the pass makes (which calls are blocked, where the transforms go) is read off the
optimized program; what it computes is checked against PyTorch on the plain NCHW network.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import kiln
from kiln.ir.expr import Call, Op
from kiln.ir.traverse import post_order
from kiln.op import nn
from kiln.transform import PassContext

torch = pytest.importorskip("torch")
F = torch.nn.functional
RNG = np.random.default_rng(5)
LANES = kiln.Target.host().lanes("float32")


def ops(mod: kiln.IRModule) -> collections.Counter:
    """How many calls of each operator the module's functions make."""
    return collections.Counter(node.op.name for f in mod.functions.values()
                               for node in post_order(f)
                               if isinstance(node, Call) and isinstance(node.op, Op))


def optimized(mod: kiln.IRModule, params: dict, on: bool = True) -> kiln.IRModule:
    with PassContext(config={"convert-layout": on}):
        return kiln.optimize(mod, params=params)


def small_mobilenet(c: int = 2 * LANES, size: int = 12):
    """stem 3 -> c (stride 2), shift, relu6; depthwise, shift, relu6; 1×1 c -> c, plus the
    block's input; global average pool, dense. Returns (module, params, torch twin)."""
    p = {
        "stem": RNG.standard_normal((c, 3, 3, 3)).astype(np.float32) / 3,
        "s1": RNG.standard_normal((c, 1, 1)).astype(np.float32),
        "dw": RNG.standard_normal((c, 1, 3, 3)).astype(np.float32) / 3,
        "s2": RNG.standard_normal((c, 1, 1)).astype(np.float32),
        "pw": (RNG.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype(np.float32),
        "fc": RNG.standard_normal((10, c)).astype(np.float32),
    }
    x = kiln.var("x", shape=(1, 3, size, size))
    v = {k: kiln.var(k, shape=a.shape) for k, a in p.items()}
    h = nn.conv2d(x, v["stem"], strides=(2, 2), padding=(1, 1))
    h = kiln.op.clip(kiln.op.add(h, v["s1"]), a_min=0.0, a_max=6.0)
    y = nn.conv2d(h, v["dw"], padding=(1, 1), groups=c)
    y = kiln.op.clip(kiln.op.add(y, v["s2"]), a_min=0.0, a_max=6.0)
    y = nn.conv2d(y, v["pw"])
    h = nn.relu(kiln.op.add(h, y))
    out = nn.dense(nn.batch_flatten(nn.global_avg_pool2d(h)), v["fc"])
    mod = kiln.IRModule.from_expr(kiln.Function([x, *v.values()], out))

    def twin(a: np.ndarray) -> np.ndarray:
        t = {k: torch.from_numpy(b.astype(np.float64)) for k, b in p.items()}
        h = F.conv2d(torch.from_numpy(a.astype(np.float64)), t["stem"], stride=2, padding=1)
        h = torch.clamp(h + t["s1"], 0, 6)
        y = torch.clamp(F.conv2d(h, t["dw"], padding=1, groups=c) + t["s2"], 0, 6)
        h = torch.relu(h + F.conv2d(y, t["pw"]))
        return (h.mean(dim=(2, 3)) @ t["fc"].T).numpy()

    return mod, p, twin


def test_blocks_between_convolutions_and_one_transform_at_the_edge() -> None:
    mod, params, twin = small_mobilenet()
    count = ops(optimized(mod, params))
    assert count["nn.contrib_conv2d_NCHWc"] == 3
    assert count["nn.conv2d"] == count["nn.conv2d_packed"] == 0
    # the stem reads the image as it is; the pooling needs NCHW: one transform
    assert count["layout_transform"] == 1
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    exe = kiln.build(mod, params=params)
    np.testing.assert_allclose(exe(x), twin(x), rtol=1e-4, atol=1e-4)


def test_config_turns_it_off() -> None:
    mod, params, twin = small_mobilenet()
    count = ops(optimized(mod, params, on=False))
    assert count["nn.contrib_conv2d_NCHWc"] == count["layout_transform"] == 0
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    with PassContext(config={"convert-layout": False}):
        exe = kiln.build(mod, params=params)
    np.testing.assert_allclose(exe(x), twin(x), rtol=1e-4, atol=1e-4)


def test_weights_not_bound_stay_nchw() -> None:
    mod, _, _ = small_mobilenet()
    count = ops(optimized(mod, {}))
    assert count["nn.contrib_conv2d_NCHWc"] == count["layout_transform"] == 0


def test_channels_padded_to_the_lanes() -> None:
    # 24 channels on AVX-512 (12 on AVX2) run as 32 (16), the padding's weights zero; the
    # result leaves its blocks through one transform and a slice
    c = LANES + LANES // 2
    mod, params, twin = small_mobilenet(c=c)
    count = ops(optimized(mod, params))
    assert count["nn.contrib_conv2d_NCHWc"] == 3
    assert count["layout_transform"] == count["strided_slice"] == 1
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(kiln.build(mod, params=params)(x), twin(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c", [2 * LANES, LANES + LANES // 2])
def test_a_bias_add_stays_in_blocks(c: int) -> None:
    # ONNX's Conv with a bias imports as nn.conv2d + nn.bias_add: the bias is added in
    # blocks (zeros for padding channels), not after moving the result back to NCHW
    w1 = RNG.standard_normal((c, 3, 3, 3)).astype(np.float32) / 3
    w2 = (RNG.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b1, b2 = (RNG.standard_normal((c,)).astype(np.float32) for _ in range(2))
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    x = kiln.var("x", shape=(1, 3, 10, 10))
    v = {k: kiln.var(k, shape=a.shape) for k, a in params.items()}
    h = nn.relu(nn.bias_add(nn.conv2d(x, v["w1"], padding=(1, 1)), v["b1"]))
    h = nn.bias_add(nn.conv2d(h, v["w2"], padding=(1, 1)), v["b2"], axis=-3)
    mod = kiln.IRModule.from_expr(kiln.Function([x, *v.values()], h))
    count = ops(optimized(mod, params))
    assert count["nn.contrib_conv2d_NCHWc"] + count["nn.conv2d_winograd"] == 2
    assert count["nn.bias_add"] == 0 and count["layout_transform"] == 1
    data = RNG.standard_normal((1, 3, 10, 10)).astype(np.float32)
    t = {k: torch.from_numpy(a.astype(np.float64)) for k, a in params.items()}
    want = F.conv2d(torch.relu(F.conv2d(torch.from_numpy(data.astype(np.float64)), t["w1"],
                                        t["b1"], padding=1)), t["w2"], t["b2"], padding=1)
    np.testing.assert_allclose(kiln.build(mod, params=params)(data), want.numpy(), rtol=1e-4,
                               atol=1e-4)


def test_channels_too_few_to_pad_stay_nchw() -> None:
    mod, params, twin = small_mobilenet(c=LANES // 2 - 2)
    count = ops(optimized(mod, params))
    assert count["nn.contrib_conv2d_NCHWc"] == count["layout_transform"] == 0
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(kiln.build(mod, params=params)(x), twin(x), rtol=1e-4, atol=1e-4)


def test_padded_channels_meet_no_operator_that_could_make_them_nan() -> None:
    # conv (padded) -> divide by a per-channel constant: 0 / 0 would be NaN in the padding,
    # so the division runs in NCHW on the real channels
    c = LANES + LANES // 2
    w = RNG.standard_normal((c, c, 1, 1)).astype(np.float32)
    d = (RNG.random((c, 1, 1)) + 0.5).astype(np.float32)
    x = kiln.var("x", shape=(1, c, 5, 5))
    y = kiln.op.divide(nn.conv2d(x, kiln.const(w)), kiln.const(d))
    y = nn.conv2d(y, kiln.const(w))
    mod = kiln.IRModule.from_expr(kiln.Function([x], y))
    count = ops(optimized(mod, {}))
    assert count["divide"] == 1 and count["strided_slice"] == 2
    a = RNG.standard_normal((1, c, 5, 5)).astype(np.float32)
    tw = torch.from_numpy(w.astype(np.float64))
    t = F.conv2d(F.conv2d(torch.from_numpy(a.astype(np.float64)), tw)
                 / torch.from_numpy(d.astype(np.float64)), tw)
    np.testing.assert_allclose(kiln.build(mod)(a), t.numpy(), rtol=1e-4, atol=1e-4)


def test_plain_uses_share_one_transform_and_others_are_moved_back() -> None:
    # a blocked result read by two operators that need NCHW (a reshape and a multiply by a
    # tensor that is not a constant): both read one transform of it
    c, size = LANES, 6
    w = RNG.standard_normal((c, c, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((c, c, 1, 1)).astype(np.float32)
    x = kiln.var("x", shape=(1, c, size, size))
    scale = kiln.var("scale", shape=(c, 1, 1))
    y = nn.relu(nn.conv2d(x, kiln.const(w), padding=(1, 1)))
    z = nn.conv2d(y, kiln.const(w2))
    out = kiln.op.add(kiln.op.add(kiln.op.sum(kiln.op.multiply(y, scale)),
                                  kiln.op.sum(kiln.op.reshape(y, newshape=(-1,)))),
                      kiln.op.sum(z))
    mod = kiln.IRModule.from_expr(kiln.Function([x, scale], out))
    count = ops(optimized(mod, {}))
    assert count["nn.contrib_conv2d_NCHWc"] == 2
    assert count["layout_transform"] == 3  # the input in; the relu's result and z out once
    a = RNG.standard_normal((1, c, size, size)).astype(np.float32)
    s = RNG.standard_normal((c, 1, 1)).astype(np.float32)
    t = torch.relu(F.conv2d(torch.from_numpy(a.astype(np.float64)),
                            torch.from_numpy(w.astype(np.float64)), padding=1))
    tz = F.conv2d(t, torch.from_numpy(w2.astype(np.float64)))
    want = float((t * torch.from_numpy(s.astype(np.float64))).sum() + t.sum() + tz.sum())
    np.testing.assert_allclose(kiln.build(mod)(a, s), want, rtol=1e-4)


def test_a_lone_direct_convolution_stays_nchw() -> None:
    # moving its input into blocks and its result out would cost more than it gains
    c = LANES
    x = kiln.var("x", shape=(1, c, 8, 8))
    y = nn.relu(nn.conv2d(x, kiln.const(RNG.standard_normal((c, c, 3, 3)).astype(np.float32)),
                          padding=(1, 1)))
    count = ops(optimized(kiln.IRModule.from_expr(kiln.Function([x], y)), {}))
    assert count["nn.contrib_conv2d_NCHWc"] == count["layout_transform"] == 0


def test_a_lone_winograd_convolution_runs_in_blocks() -> None:
    # Winograd's algorithm on blocks, a group of tiles at a time, gains more than the two
    # transforms cost (kiln/transform/convert_layout.py, MIN_CONVOLUTIONS)
    c, size = LANES, 28
    x = kiln.var("x", shape=(1, c, size, size))
    w = RNG.standard_normal((c, c, 3, 3)).astype(np.float32) / 3
    mod = kiln.IRModule.from_expr(kiln.Function([x], nn.relu(nn.conv2d(
        x, kiln.const(w), padding=(1, 1)))))
    count = ops(optimized(mod, {}))
    assert count["nn.conv2d_winograd"] == 1 and count["layout_transform"] == 2
    a = RNG.standard_normal((1, c, size, size)).astype(np.float32)
    want = F.relu(F.conv2d(torch.from_numpy(a.astype(np.float64)),
                           torch.from_numpy(w.astype(np.float64)), padding=1)).numpy()
    np.testing.assert_allclose(kiln.build(mod)(a), want, rtol=1e-4, atol=1e-4)


def test_kiln_testing_mobilenet_matches_the_plain_build() -> None:
    from kiln.testing import models

    mod, params = models.mobilenet_v2(image=32, width=0.5, classes=10)
    count = ops(optimized(mod, params))
    assert count["nn.contrib_conv2d_NCHWc"] > 0
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    with PassContext(config={"convert-layout": False}):
        plain = kiln.build(mod, params=params)(x)
    np.testing.assert_allclose(kiln.build(mod, params=params)(x), plain, rtol=1e-4, atol=1e-4)


def test_pools_stay_blocked() -> None:
    # stem, max pool, conv, global average pool: blocked from the stem to the pool's
    # (N, C, 1, 1) result, moved back once there
    c = 2 * LANES
    w1 = RNG.standard_normal((c, 3, 7, 7)).astype(np.float32) / 10
    w2 = (RNG.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    x = kiln.var("x", shape=(1, 3, 20, 20))
    h = nn.relu(nn.conv2d(x, kiln.const(w1), strides=(2, 2), padding=(3, 3)))
    h = nn.max_pool2d(h, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))
    h = nn.relu(nn.conv2d(h, kiln.const(w2), strides=(2, 2), padding=(1, 1)))
    mod = kiln.IRModule.from_expr(kiln.Function([x], nn.batch_flatten(nn.global_avg_pool2d(h))))
    count = ops(optimized(mod, {}))
    assert count["nn.contrib_conv2d_NCHWc"] == 2 and count["layout_transform"] == 1
    a = RNG.standard_normal((1, 3, 20, 20)).astype(np.float32)
    t = torch.relu(F.conv2d(torch.from_numpy(a.astype(np.float64)),
                            torch.from_numpy(w1.astype(np.float64)), stride=2, padding=3))
    t = F.max_pool2d(t, 3, 2, 1)
    t = torch.relu(F.conv2d(t, torch.from_numpy(w2.astype(np.float64)), stride=2, padding=1))
    np.testing.assert_allclose(kiln.build(mod)(a), t.mean(dim=(2, 3)).numpy(), rtol=1e-4,
                               atol=1e-5)


def _blocks(mod: kiln.IRModule) -> set[str]:
    """The layouts of the blocked convolutions' results."""
    return {node.attrs.out_layout for f in mod.functions.values() for node in post_order(f)
            if isinstance(node, Call) and isinstance(node.op, Op)
            and node.op.name == "nn.contrib_conv2d_NCHWc"}


def test_a_tuning_log_may_run_a_function_in_blocks_of_two_vectors(
        caplog: pytest.LogCaptureFixture) -> None:
    # The channel block is a knob of the whole function, keyed by its convolutions' shapes:
    # the same network (other weights) has the same key, the pass records it for kiln.tune,
    # and an override of two vectors' lanes computes what the default block does.
    from kiln.loops.tunable import ScheduleOverrides, overrides_scope
    from kiln.transform.convert_layout import recorded_keys

    mod, params, twin = small_mobilenet(c=4 * LANES)
    with recorded_keys() as keys:
        assert _blocks(optimized(mod, params)) == {f"NCHW{LANES}c"}
    (key,) = keys
    assert key.startswith("convert_layout convolutions=3 digest=")
    again, other, _ = small_mobilenet(c=4 * LANES)
    with recorded_keys() as same:
        optimized(again, other)
    assert same == [key]
    with recorded_keys() as smaller:
        optimized(*small_mobilenet(c=2 * LANES)[:2])
    assert smaller and smaller != [key]
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    # half a vector is not a point of the space: the default, with a warning
    for block, want in ((2 * LANES, 2 * LANES), (LANES // 2, LANES)):
        with overrides_scope(ScheduleOverrides({key: {"block": block}}, "test")):
            assert _blocks(optimized(mod, params)) == {f"NCHW{want}c"}
            exe = kiln.build(mod, params=params)
        np.testing.assert_allclose(exe(x), twin(x), rtol=1e-4, atol=1e-4)
    assert "not a legal schedule" in caplog.text
    # a function left as it is (one direct convolution) is not recorded: no block to search
    lone = kiln.var("x", shape=(1, LANES, 8, 8))
    conv = nn.conv2d(lone, kiln.const(RNG.standard_normal((LANES, LANES, 3, 3)).astype(
        np.float32)), padding=(1, 1))
    with recorded_keys() as none:
        optimized(kiln.IRModule.from_expr(kiln.Function([lone], conv)), {})
    assert none == []
