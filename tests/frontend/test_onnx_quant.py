"""Quantized ONNX models through kiln's qnn operators, against ONNX Runtime on the same file.

- MatMulInteger and ConvInteger (int32 results): bit for bit.
- QLinearMatMul and QLinearConv: bit for bit too, since kiln's epilogue is ORT's
  (float32(acc) * float32((x_scale * w_scale) / y_scale), halves to even, + y_zero_point).
- QuantizeLinear / DequantizeLinear: exact (x / scale rounded halves to even, as ONNX says).
- Models quantized by ``onnxruntime.quantization.quantize_static`` (QDQ and QOperator) from a
  small CNN and an MLP with random weights and random calibration data: compared with ORT's
  own int8 run, in output quantization steps. Measured (20 random inputs per model, 1520
  outputs): identical, 0 steps, in every case. The test allows 1 step on at most 2% of the
  outputs, for a rounding at a half that ORT's fused kernels may order differently.
  The models are quantized with ``reduce_range=True`` (7-bit weights): with full 8-bit
  weights, ORT's uint8 x int8 x86 kernels saturate pairs of products in int16 (vpmaddubsw)
  and differ from the ONNX definition by up to 22 steps (measured here), while kiln's sums
  are exact — test_matmul_integer_exact shows this on one node against the definition.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend import from_onnx  # noqa: E402

RNG = np.random.default_rng(11)
REDUCE = True


def _session(model):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _kiln(model, *inputs, compiled=True):
    mod, params = from_onnx(model)
    if compiled:
        out = kiln.build(mod, params=params)(*inputs)
    else:
        out = kiln.interpret(mod, *inputs, params=params)
    return mod, np.asarray(out[0] if isinstance(out, tuple) else out)


def _model(node, inputs, output, inits, opset=13):
    graph = helper.make_graph([node], "g", inputs, [output], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


U8, I8, I32, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.FLOAT


@pytest.mark.parametrize(("m", "k", "n"), [(3, 37, 5), (1, 67, 17)])
def test_matmul_integer_exact(m, k, n) -> None:
    a = RNG.integers(0, 256, (m, k)).astype("uint8")
    b = RNG.integers(-128, 128, (k, n)).astype("int8")
    for zb in (np.int8(-3), RNG.integers(-3, 4, n).astype("int8")):
        node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
        model = _model(node, [_info("a", U8, [m, k])], _info("y", I32, [m, n]),
                       [_init("b", b), _init("za", np.uint8(121)), _init("zb", zb)])
        mod, got = _kiln(model, a)
        assert "qnn.dense" in kiln.astext(mod)
        # ONNX's definition, in int64
        definition = (a.astype(np.int64) - 121) @ (b.astype(np.int64) - zb.astype(np.int64))
        np.testing.assert_array_equal(got, definition)
    # ORT's uint8 x int8 kernels on x86 sum pairs of products in saturating int16
    # (vpmaddubsw; ORT documents this): with weights of 7 bits, no pair saturates and ORT
    # gives the definition too.
    b7 = (b // 2).astype("int8")
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    model = _model(node, [_info("a", U8, [m, k])], _info("y", I32, [m, n]),
                   [_init("b", b7), _init("za", np.uint8(121)), _init("zb", np.int8(-3))])
    np.testing.assert_array_equal(_kiln(model, a)[1], _session(model).run(None, {"a": a})[0])


def test_conv_integer_exact() -> None:
    x = RNG.integers(0, 256, (1, 3, 9, 7)).astype("uint8")
    w = RNG.integers(0, 256, (4, 3, 3, 3)).astype("uint8")
    node = helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], pads=[1, 1, 1, 1],
                            strides=[2, 1])
    model = _model(node, [_info("x", U8, [1, 3, 9, 7])], _info("y", I32, [1, 4, 5, 7]),
                   [_init("w", w), _init("zx", np.uint8(100)), _init("zw", np.uint8(130))])
    expected = _session(model).run(None, {"x": x})[0]
    mod, got = _kiln(model, x)
    assert "qnn.conv2d" in kiln.astext(mod)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_exact(per_channel) -> None:
    x = RNG.integers(0, 256, (2, 5, 8, 9)).astype("uint8")
    o = 6
    w = RNG.integers(-64, 64, (o, 5, 3, 3)).astype("int8")  # no int16 saturation in ORT
    w_scale = (RNG.random(o) * 0.01 + 0.001).astype("float32") if per_channel \
        else np.float32(0.004)
    bias = RNG.integers(-3000, 3000, o).astype("int32")
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"],
                            ["y"], pads=[1, 0, 1, 2], dilations=[1, 2])
    zw = np.zeros(o, "int8") if per_channel else np.int8(0)
    model = _model(node, [_info("x", U8, [2, 5, 8, 9])], _info("y", U8, [2, 6, 8, 7]),
                   [_init("sx", np.float32(0.02)), _init("zx", np.uint8(118)), _init("w", w),
                    _init("sw", w_scale), _init("zw", zw), _init("sy", np.float32(0.05)),
                    _init("zy", np.uint8(125)), _init("b", bias)], opset=13)
    expected = _session(model).run(None, {"x": x})[0]
    for compiled in (True, False):
        mod, got = _kiln(model, x, compiled=compiled)
        np.testing.assert_array_equal(got, expected)
    assert "qnn.conv2d" in kiln.astext(mod)


def test_qlinear_matmul_exact() -> None:
    a = RNG.integers(-128, 128, (7, 45)).astype("int8")
    b = RNG.integers(-64, 64, (45, 11)).astype("int8")
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    model = _model(node, [_info("a", I8, [7, 45])], _info("y", I8, [7, 11]),
                   [_init("sa", np.float32(0.03)), _init("za", np.int8(-4)), _init("b", b),
                    _init("sb", np.float32(0.011)), _init("zb", np.int8(0)),
                    _init("sy", np.float32(0.3)), _init("zy", np.int8(3))])
    expected = _session(model).run(None, {"a": a})[0]
    _, got = _kiln(model, a)
    np.testing.assert_array_equal(got, expected)


def test_quantize_and_dequantize_linear_exact() -> None:
    x = (RNG.standard_normal((3, 4, 5)) * 4).astype("float32")
    x.reshape(-1)[:6] = [0.25, 0.75, -0.25, -0.75, 1.25, 2.5]  # halves at scale 0.5
    scale = np.array([0.5, 0.05, 0.02, 0.5], "float32")
    zp = np.array([3, -2, 0, 127], "int8")
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)
    dq = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)
    graph = helper.make_graph([q, dq], "g", [_info("x", F32, [3, 4, 5])],
                              [_info("q", I8, [3, 4, 5]), _info("y", F32, [3, 4, 5])],
                              initializer=[_init("s", scale), _init("z", zp)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    expected = _session(model).run(None, {"x": x})
    mod, params = from_onnx(model)
    assert "qnn.quantize" in kiln.astext(mod)
    got = kiln.build(mod, params=params)(x)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(g), e)


# --- models quantized by onnxruntime.quantization.quantize_static --------------------------


def _cnn() -> onnx.ModelProto:
    def w(name, *shape):
        return _init(name, (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:])))
                     .astype("float32"))

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    inits = [w("w1", 8, 3, 3, 3), _init("b1", RNG.standard_normal(8).astype("float32") * 0.1),
             w("w2", 12, 8, 3, 3), _init("b2", RNG.standard_normal(12).astype("float32") * 0.1),
             w("w3", 10, 12), _init("b3", RNG.standard_normal(10).astype("float32") * 0.1)]
    graph = helper.make_graph(nodes, "cnn", [_info("x", F32, [1, 3, 12, 12])],
                              [_info("y", F32, [1, 10])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _mlp() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    inits = [_init("w1", (RNG.standard_normal((37, 29)) / 6).astype("float32")),
             _init("b1", RNG.standard_normal(29).astype("float32") * 0.1),
             _init("w2", (RNG.standard_normal((29, 7)) / 5).astype("float32")),
             _init("b2", RNG.standard_normal(7).astype("float32") * 0.1)]
    graph = helper.make_graph(nodes, "mlp", [_info("x", F32, [4, 37])],
                              [_info("y", F32, [4, 7])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _quantized(model, shape, fmt, tmp_path, per_channel=False):
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{"x": RNG.standard_normal(shape).astype("float32")}
                              for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    src, dst = tmp_path / "float.onnx", tmp_path / f"{fmt}.onnx"
    onnx.save(model, src)
    q.quantize_static(str(src), str(dst), Reader(), quant_format=getattr(q.QuantFormat, fmt),
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                      per_channel=per_channel, reduce_range=REDUCE)
    return onnx.load(str(dst))


def _output_step(model) -> float:
    """The scale of the model's last quantized tensor (one int8 step of its output)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in reversed(model.graph.node):
        if node.op_type in ("DequantizeLinear", "QuantizeLinear"):
            return float(inits[node.input[1]].reshape(-1)[0])
    raise AssertionError("no quantized output")


def _compare_with_ort(model, shape, op_name):
    x = RNG.standard_normal(shape).astype("float32")
    expected = _session(model).run(None, {"x": x})[0]
    mod, params = from_onnx(model)
    optimized = kiln.astext(kiln.optimize(mod, params=params))
    # integer sums: a dense / conv (packed or not) whose result is int32
    assert any(op_name in line and line.rsplit("ty=", 1)[-1].endswith("int32] */;")
               for line in optimized.splitlines()), f"no {op_name} of integers"
    got = np.asarray(kiln.build(mod, params=params)(x))
    steps = np.abs(got - expected) / _output_step(model)
    assert steps.max() <= 1.0 + 1e-3, f"kiln differs from ORT by {steps.max():.2f} steps"
    assert np.mean(steps > 0.5) <= 0.02, f"{np.mean(steps > 0.5):.0%} of outputs differ"
    return steps


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_quantize_static_mlp_agrees_with_ort(fmt, tmp_path) -> None:
    model = _quantized(_mlp(), (4, 37), fmt, tmp_path)
    _compare_with_ort(model, (4, 37), "dense")


@pytest.mark.parametrize(("fmt", "per_channel"), [("QDQ", False), ("QDQ", True),
                                                  ("QOperator", False)])
def test_quantize_static_cnn_agrees_with_ort(fmt, per_channel, tmp_path) -> None:
    model = _quantized(_cnn(), (1, 3, 12, 12), fmt, tmp_path, per_channel)
    _compare_with_ort(model, (1, 3, 12, 12), "conv2d")


def _cnn_pool() -> onnx.ModelProto:
    """The CNN with a MaxPool (3×3, stride 2, padded) between its convolutions."""
    model = _cnn()
    nodes = list(model.graph.node)
    pool = helper.make_node("MaxPool", ["r1"], ["m1"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    nodes[2] = helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(nodes[:2] + [pool] + nodes[2:], "cnn_pool",
                              list(model.graph.input), list(model.graph.output),
                              initializer=list(model.graph.initializer))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_quantize_static_max_pool_runs_on_the_8_bit_tensor(tmp_path) -> None:
    # quantize(max_pool(dequantize(q))) with one scale and zero point is max_pool(q)
    model = _quantized(_cnn_pool(), (1, 3, 12, 12), "QDQ", tmp_path, per_channel=True)
    mod, params = from_onnx(model)
    text = kiln.astext(kiln.optimize(mod, params=params))
    pools = [line for line in text.splitlines() if "nn.max_pool2d(" in line]
    assert pools and all(", uint8] */" in line for line in pools), pools
    steps = _compare_with_ort(model, (1, 3, 12, 12), "conv2d")
    assert steps.max() == 0, f"kiln differs from ORT by {steps.max():.2f} steps"


def test_quantize_dynamic_mlp_equals_ort(tmp_path) -> None:
    # quantize_dynamic: DynamicQuantizeLinear (through its ONNX function body: the scale and
    # zero point computed at run time) feeding MatMulInteger — integer sums, equal to ORT's
    from onnxruntime import quantization as q

    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_mlp(), src)
    q.quantize_dynamic(str(src), str(dst), weight_type=q.QuantType.QInt8, reduce_range=REDUCE)
    model = onnx.load(str(dst))
    assert "DynamicQuantizeLinear" in {n.op_type for n in model.graph.node}
    mod, params = from_onnx(model)
    text = kiln.astext(kiln.optimize(mod, params=params))
    assert any("dense" in line and "int32]" in line for line in text.splitlines())
    exe = kiln.build(mod, params=params)
    for _ in range(3):
        x = RNG.standard_normal((4, 37)).astype("float32")
        np.testing.assert_array_equal(np.asarray(exe(x)), _session(model).run(None, {"x": x})[0])
