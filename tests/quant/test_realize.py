"""kiln.quantize's annotate / calibrate / realize on a small CNN, against a numpy simulation
of the same fake-quantized network written here."""

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.ir.expr import Call, Function, Op, Var, const
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order
from kiln.ir.ty import TensorType
from kiln.quant import Range, annotate, calibrate, realize

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((4, 3, 3, 3)).astype("float32") * 0.4
B1 = RNG.standard_normal(4).astype("float32") * 0.1
W2 = RNG.standard_normal((6, 4, 3, 3)).astype("float32") * 0.3
B2 = RNG.standard_normal(6).astype("float32") * 0.1
W3 = RNG.standard_normal((5, 6 * 4 * 4)).astype("float32") * 0.2
B3 = RNG.standard_normal(5).astype("float32") * 0.1
CAL = [RNG.standard_normal((2, 3, 8, 8)).astype("float32") for _ in range(3)]


def model() -> IRModule:
    x = Var("x", TensorType((2, 3, 8, 8), "float32"))
    h = op.nn.relu(op.nn.bias_add(op.nn.conv2d(x, const(W1), padding=(1, 1)), const(B1), axis=1))
    h = op.nn.max_pool2d(h, pool_size=(2, 2), strides=(2, 2))
    h = op.add(op.nn.conv2d(h, const(W2), padding=(1, 1)), const(B2.reshape(6, 1, 1)))
    h = op.nn.batch_flatten(h)
    h = op.nn.bias_add(op.nn.dense(h, const(W3)), const(B3), axis=1)
    return IRModule.from_expr(Function([x], h))


# --- numpy: the float network and its fake-quantized twin ----------------------------------

def conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3, padding 1, stride 1, in int64 for integers."""
    n, c, hh, ww = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], hh, ww), np.int64 if x.dtype.kind in "iu" else np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + hh, j:j + ww].astype(out.dtype),
                             w[:, :, i, j].astype(out.dtype))
    return out


def pool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def float_net(x: np.ndarray) -> dict[str, np.ndarray]:
    y1 = np.maximum(conv(x, W1) + B1.reshape(-1, 1, 1), 0)
    p = pool(y1)
    y2 = conv(p, W2) + B2.reshape(-1, 1, 1)
    f = y2.reshape(len(x), -1)
    return {"x": x, "y1": y1, "p": p, "y2": y2, "f": f, "out": f @ W3.T + B3}


def wq(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = (np.abs(w.reshape(len(w), -1)).max(1) / np.float32(127)).astype(np.float32)
    return np.clip(np.round(w / s.reshape((-1,) + (1,) * (w.ndim - 1))), -127, 127), s


def fake_quantized(x: np.ndarray, s: dict[str, float]) -> np.ndarray:
    """The int8 network: int64 sums, requantize rounding halves up, int8/uint8 saturation."""
    v = x / np.float32(s["x"])
    xq = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127)          # halves away
    q1, s1 = wq(W1)
    a1 = conv(xq, q1) + np.rint(B1 / (np.float32(s["x"]) * s1)).reshape(-1, 1, 1)
    r1 = (np.float32(s["x"]) * s1).astype(np.float64).reshape(-1, 1, 1) / np.float32(s["y1"])
    y1q = np.clip(np.floor(a1 * r1 + 0.5), 0, 255)                          # relu = clamp at 0
    pq = pool(y1q)                                                          # stays uint8
    q2, s2 = wq(W2)
    sc2 = (np.float32(s["y1"]) * s2).astype(np.float32)
    a2 = conv(pq, q2) + np.rint(B2 / sc2).reshape(-1, 1, 1)
    r2 = sc2.astype(np.float64).reshape(-1, 1, 1) / np.float32(s["f"])
    y2q = np.clip(np.floor(a2 * r2 + 0.5), -128, 127)                       # stays int8
    fq = y2q.reshape(len(x), -1)                                            # flattened int8
    q3, s3 = wq(W3)
    sc3 = (np.float32(s["f"]) * s3).astype(np.float32)
    a3 = fq.astype(np.int64) @ q3.T.astype(np.int64) + np.rint(B3 / sc3)
    return a3.astype(np.float32) * sc3


def scales() -> dict[str, float]:
    outs = [float_net(x.astype(np.float64)) for x in CAL]
    amax = {k: max(float(np.abs(o[k]).max()) for o in outs) for k in outs[0]}
    return {"x": amax["x"] / 127, "y1": amax["y1"] / 255, "f": amax["f"] / 127}


def test_calibrate_minmax_matches_numpy() -> None:
    ann = annotate(model())
    ranges = calibrate(ann, CAL, "minmax", executor="interpret")
    outs = [float_net(x.astype(np.float64)) for x in CAL]
    want = {"x": "x", "y1": "y1", "p": "p", "y2": "y2", "f": "f"}
    got = [r.threshold for r in ranges]
    for key in want:
        t = max(float(np.abs(o[key]).max()) for o in outs)
        assert any(abs(g - t) <= 1e-5 * t for g in got), key
    dts = {r.dtype for r in ranges}
    assert dts == {"uint8", "int8"}  # relu outputs unsigned, the rest signed


def test_realized_layers_match_numpy_simulation() -> None:
    ann = annotate(model())
    s = scales()
    # the ranges of the observed tensors, from numpy's float network (not kiln's)
    outs = [float_net(x.astype(np.float64)) for x in CAL]
    by_value = []
    for e in ann.observed:
        t = e.checked_type
        key = {(2, 3, 8, 8): "x", (2, 4, 8, 8): "y1", (2, 4, 4, 4): "p", (2, 96): "f",
               (2, 6, 4, 4): "y2", (2, 5): "out"}[tuple(t.shape)]
        amax = max(float(np.abs(o[key]).max()) for o in outs)
        unsigned = key in ("y1", "p")
        sc = {"x": s["x"], "y1": s["y1"], "p": s["y1"], "f": s["f"]}.get(key, amax / 127)
        by_value.append(Range("uint8" if unsigned else "int8", float(np.float32(sc)), 0.0,
                              amax, amax))
    qmod = realize(ann, tuple(by_value))
    s = {k: float(np.float32(v)) for k, v in s.items()}
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    want = fake_quantized(x, s)
    got = kiln.build(qmod)(x)
    step = np.float32(s["f"]) * wq(W3)[1]
    assert np.all(np.abs(got - want) <= 1.01 * step), np.abs(got - want) / step
    np.testing.assert_array_equal(kiln.interpret(qmod, x), got)
    # and it is close to the float network (8-bit rounding: a few percent of the range)
    ref = float_net(x.astype(np.float64))["out"]
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()


def _ops(mod: IRModule) -> list[str]:
    return [n.op.name for n in post_order(mod["main"].body)
            if isinstance(n, Call) and isinstance(n.op, Op)]


def test_int8_stays_int8_between_layers() -> None:
    qmod, params = kiln.quantize(model(), calibration=CAL, executor="interpret")
    assert params == {}
    names = _ops(qmod)
    assert names.count("qnn.conv2d") == 2 and names.count("qnn.dense") == 1
    # conv1 -> max_pool -> conv2 in 8 bits: conv2's data is the pooled requantize output
    conv2 = [n for n in post_order(qmod["main"].body) if isinstance(n, Call)
             and isinstance(n.op, Op) and n.op.name == "qnn.conv2d"][1]
    pooled = conv2.args[0]
    assert pooled.op.name == "nn.max_pool2d" and pooled.checked_type.dtype == "uint8"
    assert pooled.args[0].op.name == "qnn.requantize"
    assert "nn.relu" not in names  # folded into the requantize's clamp
    # the dense's data is conv2's int8 output, flattened: one quantize, of the input
    dense = next(n for n in post_order(qmod["main"].body) if isinstance(n, Call)
                 and isinstance(n.op, Op) and n.op.name == "qnn.dense")
    assert dense.args[0].op.name == "nn.batch_flatten"
    assert dense.args[0].checked_type.dtype == "int8"
    assert names.count("qnn.quantize") == 1 and names.count("qnn.requantize") == 2
    assert "qnn.dequantize" in names  # only for the float result


def test_skip_by_name_index_predicate_and_first_last() -> None:
    for skip in (["dense_2"], [2], lambda layer: layer.op == "nn.dense"):
        qmod, _ = kiln.quantize(model(), calibration=CAL, skip=skip, executor="interpret")
        names = _ops(qmod)
        assert "qnn.dense" not in names and "nn.dense" in names
        assert names.count("qnn.conv2d") == 2
    qmod, _ = kiln.quantize(model(), calibration=CAL, skip_first=True, skip_last=True,
                            executor="interpret")
    names = _ops(qmod)
    assert names.count("qnn.conv2d") == 1 and names.count("nn.conv2d") == 1
    assert "qnn.dense" not in names
    with pytest.raises(kiln.Error, match="no layer is named 'fc'"):
        kiln.quantize(model(), calibration=CAL, skip=["fc"])


def test_errors() -> None:
    with pytest.raises(kiln.Error, match="calibration set is empty"):
        kiln.quantize(model(), calibration=[], executor="interpret")
    with pytest.raises(kiln.Error, match=r"has shape \(1, 3, 8, 8\)"):
        kiln.quantize(model(), calibration=[CAL[0][:1]], executor="interpret")
    with pytest.raises(kiln.Error, match="no calibration scheme 'max'"):
        kiln.quantize(model(), calibration=CAL, scheme="max")
    x = Var("x", TensorType((2, 4), "float32"))
    w = Var("w", TensorType((3, 4), "float32"))
    mod = IRModule.from_expr(Function([x, w], op.nn.dense(x, w)))
    why = r"stays float \(w \(nn.dense\): its weight is not a constant"
    with pytest.raises(kiln.Error, match=why):
        kiln.quantize(mod, calibration=[np.zeros((2, 4), "float32")])


@pytest.mark.parametrize("scheme", ["percentile", "kl"])
def test_calibrate_schemes_on_the_observed_tensors(scheme: str) -> None:
    ann = annotate(model())
    ranges = calibrate(ann, CAL, scheme, percentile=99.0, executor="interpret")
    x = np.abs(np.concatenate([c.reshape(-1) for c in CAL]))
    r = ranges[ann.slot(ann.layers[0].data)]
    assert r.dtype == "int8" and r.scale == pytest.approx(r.threshold / 127, rel=1e-6)
    if scheme == "percentile":
        assert r.threshold == pytest.approx(float(np.percentile(x, 99.0)), rel=1e-6)
    else:  # a bin edge of the 2048-bin histogram of |x|, inside it
        edges = np.histogram_bin_edges(x, bins=2048, range=(0, float(x.max())))
        assert np.min(np.abs(edges - r.threshold)) <= 1e-5 * x.max()
        assert 0 < r.threshold <= x.max()


def test_biases_fold_and_torch_style_names() -> None:
    # conv2d -> bias_add -> add (a folded batch norm's shift) -> relu: one layer, one bias;
    # the weights are params named as torch.export names them (p_<state-dict key>)
    x = Var("x", TensorType((2, 3, 8, 8), "float32"))
    w = Var("p_0_weight", TensorType(W1.shape, "float32"))
    v = Var("p_2_weight", TensorType(W3[:, :64].shape, "float32"))
    shift = RNG.standard_normal((4, 1, 1)).astype("float32") * 0.1
    h = op.nn.relu(op.add(op.nn.bias_add(op.nn.conv2d(x, w, padding=(1, 1)), const(B1)),
                          const(shift)))
    h = op.nn.dense(op.reshape(op.nn.max_pool2d(h, pool_size=(2, 2), strides=(2, 2)),
                               newshape=(2, 64)), v)
    mod = IRModule.from_expr(Function([x, w, v], h))
    params = {"p_0_weight": W1, "p_2_weight": W3[:, :64].copy()}
    ann = annotate(mod, params)
    assert [lay.name for lay in ann.layers] == ["p_0_weight", "p_2_weight"]
    np.testing.assert_allclose(ann.layers[0].bias_value, B1 + shift.reshape(-1), rtol=1e-6)
    assert ann.layers[0].relu is not None
    qmod, _ = kiln.quantize(mod, params, calibration=CAL, executor="interpret")
    names = _ops(qmod)
    assert "add" not in names and "nn.relu" not in names and names.count("qnn.requantize") == 1
    xs = CAL[0]
    ref = kiln.interpret(mod, xs, params=params)
    got = kiln.build(qmod)(xs)
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()
    for skip in (["0.weight"], ["0"], ["p_0_weight"]):
        names = _ops(kiln.quantize(mod, params, calibration=CAL, skip=skip,
                                   executor="interpret")[0])
        assert "qnn.conv2d" not in names and "qnn.dense" in names


def test_calibration_items_by_name_and_count() -> None:
    ann = annotate(model())
    by_name = calibrate(ann, [{"x": c} for c in CAL], executor="interpret")
    plain = calibrate(ann, CAL, executor="interpret")
    assert [r.scale for r in by_name] == [r.scale for r in plain]
    with pytest.raises(kiln.Error, match="calibration input 0 has no x"):
        calibrate(ann, [{"y": CAL[0]}], executor="interpret")
    with pytest.raises(kiln.Error, match="has 2 tensors; the model takes 1"):
        calibrate(ann, [(CAL[0], CAL[1])], executor="interpret")
    with pytest.raises(kiln.Error, match="executor must be"):
        calibrate(ann, CAL, executor="vm")
