"""`from_onnx` on small models built with onnx.helper, checked against ONNX Runtime.

Each model runs three ways on the same inputs: ONNX Runtime (the oracle), kiln's reference
interpreter (`kiln.interpret(mod, x, params=params)`) and compiled code
(`kiln.build(mod, params=params)(x)`). The tests also pin the calling convention: the graph's
inputs are @main's leading parameters in graph order, its initializers the remaining ones,
bound by name; one output is an array, several a tuple; a path, bytes and a ModelProto all
import.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir.ty import SymDim

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def run_ort(model: onnx.ModelProto, *inputs: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))


def as_list(result) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]


def check(model: onnx.ModelProto, *inputs: np.ndarray, compiled: bool = True,
          rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """kiln's interpreter (and compiled code) agree with ONNX Runtime on ``inputs``."""
    expected = run_ort(model, *inputs)
    mod, params = from_onnx(model)
    runs = [as_list(kiln.interpret(mod, *inputs, params=params))]
    if compiled:
        runs.append(as_list(kiln.build(mod, params=params)(*inputs)))
    for got in runs:
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# --- models -------------------------------------------------------------------------------


def mlp_model() -> onnx.ModelProto:
    w1, b1, w2, b2 = rand(8, 16), rand(16), rand(16, 4), rand(4)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2t", "b2"], ["y"], name="fc2", transB=1),
    ]
    return make_model(
        nodes, [helper.make_tensor_value_info("x", F, [3, 8])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
        [init("w1", w1), init("b1", b1), init("w2t", w2.T.copy()), init("b2", b2)])


def cnn_model() -> onnx.ModelProto:
    c = 6
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="conv", pads=[1, 1, 1, 1],
                         strides=[1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"],
                         name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    inits = [init("w", rand(c, 3, 3, 3)), init("b", rand(c)),
             init("scale", rand(c)), init("bias", rand(c)), init("mean", rand(c)),
             init("var", np.abs(rand(c)) + 0.5), init("fw", rand(5, c)), init("fb", rand(5))]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", F, [2, 5])], inits)


def test_mlp_gemm_relu():
    check(mlp_model(), rand(3, 8))


def test_cnn_conv_batchnorm_pool():
    check(cnn_model(), rand(2, 3, 8, 8))


def test_shapes_reshape_transpose_concat_slice():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Concat", ["t", "t"], ["c"], name="concat", axis=1),
        helper.make_node("Slice", ["c", "starts", "ends", "axes", "steps"], ["y"],
                         name="slice"),
    ]
    inits = [init("shape", np.array([2, 3, 4], "int64")),
             init("starts", np.array([1, 0], "int64")), init("ends", np.array([7, 3], "int64")),
             init("axes", np.array([1, 2], "int64")), init("steps", np.array([2, 1], "int64"))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 12])],
                       [helper.make_tensor_value_info("y", F, [2, 3, 3])], inits)
    check(model, rand(2, 12))


def test_if_on_a_runtime_condition():
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t_out"])], "then", [],
        [helper.make_tensor_value_info("t_out", F, [4])], [init("two", np.float32([2.0]))])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
        [helper.make_tensor_value_info("e_out", F, [4])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g,
                         else_branch=else_g),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [4])],
                       [helper.make_tensor_value_info("y", F, [4])],
                       [init("zero", np.float32(0.0))])
    x = np.float32([1, 2, 3, 4])
    check(model, x)
    check(model, -x)


def test_loop_accumulates_state_and_scan_outputs():
    # for i in range(trip): acc = acc * x + i ; emit acc
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc_in", "x"], ["m"]),
         helper.make_node("Add", ["m", "fi"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [3]),
         helper.make_tensor_value_info("scan_out", F, [3])])
    nodes = [helper.make_node("Loop", ["trip", "cond", "acc0"], ["acc", "accs"], name="loop",
                              body=body)]
    model = make_model(
        nodes, [helper.make_tensor_value_info("x", F, [3]),
                helper.make_tensor_value_info("acc0", F, [3])],
        [helper.make_tensor_value_info("acc", F, [3]),
         helper.make_tensor_value_info("accs", F, [5, 3])],
        [init("trip", np.array(5, "int64")), init("cond", np.array(True))])
    check(model, np.float32([0.5, -1.0, 2.0]), np.float32([1.0, 0.0, -1.0]))


def symbolic_batch_model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Sigmoid", ["m"], ["y"], name="sigmoid")]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 5])],
                      [helper.make_tensor_value_info("y", F, ["batch", 2])],
                      [init("w", rand(5, 2))])


def test_symbolic_batch_dimension():
    model = symbolic_batch_model()
    mod, params = from_onnx(model)
    (x_param, _) = mod["main"].params
    assert isinstance(x_param.type_annotation.shape[0], SymDim)
    assert x_param.type_annotation.shape[0].name == "batch"
    for batch in (1, 4):
        check(model, rand(batch, 5))


def test_inputs_lead_and_weights_follow_by_name():
    a, b = rand(2, 3), rand(2, 3)
    nodes = [helper.make_node("Sub", ["a", "b"], ["d"], name="sub"),
             helper.make_node("Mul", ["d", "w"], ["y"], name="mul")]
    w = rand(2, 3)
    model = make_model(nodes, [helper.make_tensor_value_info("a", F, [2, 3]),
                               helper.make_tensor_value_info("b", F, [2, 3])],
                       [helper.make_tensor_value_info("y", F, [2, 3])], [init("w", w)])
    mod, params = from_onnx(model)
    names = [p.name_hint for p in mod["main"].params]
    assert names == ["a", "b", "w"]
    assert set(params) == {"w"} and np.array_equal(params["w"], w)
    got = kiln.interpret(mod, a, b, params=params)
    np.testing.assert_allclose(got, (a - b) * w, rtol=1e-6)
    # Weights embedded as constants instead: @main takes the inputs only.
    mod_c, params_c = from_onnx(model, params_as="constants")
    assert params_c == {} and len(mod_c["main"].params) == 2
    np.testing.assert_allclose(kiln.interpret(mod_c, a, b), (a - b) * w, rtol=1e-6)


def test_several_outputs_are_a_tuple():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Neg", ["x"], ["n"], name="neg")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [4])],
                       [helper.make_tensor_value_info("r", F, [4]),
                        helper.make_tensor_value_info("n", F, [4])])
    mod, params = from_onnx(model)
    x = rand(4)
    got = kiln.interpret(mod, x, params=params)
    assert isinstance(got, tuple) and len(got) == 2
    check(model, x)


def test_path_bytes_and_proto(tmp_path):
    model = mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    x = rand(3, 8)
    expected = run_ort(model, x)[0]
    for source in (model, model.SerializeToString(), str(path), path):
        mod, params = from_onnx(source)
        np.testing.assert_allclose(kiln.interpret(mod, x, params=params), expected,
                                   rtol=1e-4, atol=1e-5)


def test_summary_names_inputs_outputs_and_operators():
    from kiln.frontend.onnx import summary

    text = summary(cnn_model())
    for word in ("x", "y", "Conv", "BatchNormalization", "float32", "parameters"):
        assert word in text
    with pytest.raises(kiln.Error):
        summary(b"not a model")
    # Importing the submodule of the same name (as `kiln show` does) keeps the call working.
    import importlib

    package = importlib.import_module("kiln.frontend.onnx")
    importlib.import_module("kiln.frontend.onnx.summary")
    assert package.summary(cnn_model()) == text


# --- operators composed by the importer (Resize, recurrent layers, quantization, trig) ----


@pytest.mark.parametrize("mode,coordinates", [
    ("nearest", "asymmetric"), ("linear", "half_pixel"), ("linear", "align_corners"),
    ("cubic", "pytorch_half_pixel")])
def test_resize(mode, coordinates):
    # By sizes: with a scale whose output length is fractional (5 * 1.5), ONNX's reference
    # (which kiln follows) and ONNX Runtime differ for align_corners.
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize",
                              mode=mode, coordinate_transformation_mode=coordinates)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 4, 5])],
                       [helper.make_tensor_value_info("y", F, [1, 2, 8, 7])],
                       [init("sizes", np.array([1, 2, 8, 7], "int64"))], opset=13)
    check(model, rand(1, 2, 4, 5))
    scaled = make_model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode=mode,
                          coordinate_transformation_mode=coordinates)],
        [helper.make_tensor_value_info("x", F, [1, 2, 4, 5])],
        [helper.make_tensor_value_info("y", F, [1, 2, 8, 10])],
        [init("scales", np.float32([1, 1, 2, 2]))], opset=13)
    check(scaled, rand(1, 2, 4, 5), compiled=False)


@pytest.mark.parametrize("kind,gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
def test_recurrent_layers_unrolled(kind, gates):
    seq, batch, size, hidden = 4, 2, 3, 5
    w = rand(2, gates * hidden, size) * 0.5
    r = rand(2, gates * hidden, hidden) * 0.5
    b = rand(2, 2 * gates * hidden) * 0.1
    outs = ["y", "y_h"] + (["y_c"] if kind == "LSTM" else [])
    nodes = [helper.make_node(kind, ["x", "w", "r", "b"], outs, name="rnn",
                              hidden_size=hidden, direction="bidirectional")]
    infos = [helper.make_tensor_value_info("y", F, [seq, 2, batch, hidden])] + [
        helper.make_tensor_value_info(o, F, [2, batch, hidden]) for o in outs[1:]]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [seq, batch, size])],
                       infos, [init("w", w), init("r", r), init("b", b)], opset=14)
    check(model, rand(seq, batch, size), compiled=kind == "LSTM")


def test_quantize_dequantize_round_trip():
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quant",
                              axis=1),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="dequant",
                              axis=1)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                       [helper.make_tensor_value_info("y", F, [2, 3, 4])],
                       [init("scale", np.float32([0.02, 0.05, 0.1])),
                        init("zero", np.array([0, 10, 250], "uint8"))], opset=13)
    # Halves of the scale (ties) included: ONNX rounds them to even.
    x = rand(2, 3, 4) * 3
    x[0, 0, :2] = [0.01, 0.03]
    check(model, x, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name,fn", [("Atan", np.arctan), ("Asin", np.arcsin),
                                     ("Acos", np.arccos)])
def test_inverse_trig_is_accurate(name, fn):
    x = np.concatenate([np.linspace(-1, 1, 2001), [-1.0, 1.0, 0.0]]).astype("float32")
    if name == "Atan":
        x = np.concatenate([x * 50, x, [np.inf, -np.inf]]).astype("float32")
    model = make_model([helper.make_node(name, ["x"], ["y"], name="f")],
                       [helper.make_tensor_value_info("x", F, [x.size])],
                       [helper.make_tensor_value_info("y", F, [x.size])])
    mod, params = from_onnx(model)
    got = kiln.interpret(mod, x, params=params)
    np.testing.assert_allclose(got, fn(x.astype("float64")), rtol=5e-7, atol=5e-7)


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij,jk", [(3, 4), (4, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)])])
def test_einsum(equation, shapes):
    expected = np.einsum(equation, *(np.zeros(s) for s in shapes)).shape
    ins = [helper.make_tensor_value_info(f"x{k}", F, list(s)) for k, s in enumerate(shapes)]
    model = make_model([helper.make_node("Einsum", [i.name for i in ins], ["y"], name="e",
                                         equation=equation)],
                       ins, [helper.make_tensor_value_info("y", F, list(expected))])
    check(model, *(rand(*s) for s in shapes), compiled=equation == "bij,bjk->bik")


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift(direction):
    model = make_model([helper.make_node("BitShift", ["x", "k"], ["y"], name="shift",
                                         direction=direction)],
                       [helper.make_tensor_value_info("x", TensorProto.UINT32, [6]),
                        helper.make_tensor_value_info("k", TensorProto.UINT32, [6])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT32, [6])])
    x = np.array([1, 7, 0xFFFFFFFF, 12345, 2**31, 5], "uint32")
    k = np.array([0, 3, 4, 31, 1, 2], "uint32")
    check(model, x, k)


@pytest.mark.parametrize("name", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(name):
    model = make_model([helper.make_node(name, ["a", "b"], ["y"], name="bits")],
                       [helper.make_tensor_value_info("a", TensorProto.INT8, [8]),
                        helper.make_tensor_value_info("b", TensorProto.INT8, [8])],
                       [helper.make_tensor_value_info("y", TensorProto.INT8, [8])], opset=18)
    a = np.array([0, 1, -1, 127, -128, 85, -86, 7], "int8")
    b = np.array([5, -1, -1, -128, 127, 51, 15, -8], "int8")
    check(model, a, b, compiled=name == "BitwiseXor")


def test_dft_against_numpy():
    model = make_model([helper.make_node("DFT", ["x", "", "axis"], ["y"], name="dft",
                                         onesided=1)],
                       [helper.make_tensor_value_info("x", F, [2, 8, 1])],
                       [helper.make_tensor_value_info("y", F, [2, 5, 2])],
                       [init("axis", np.array(1, "int64"))], opset=20)
    x = rand(2, 8, 1)
    mod, params = from_onnx(model)
    got = kiln.interpret(mod, x, params=params)
    spectrum = np.fft.rfft(x[..., 0].astype("float64"), axis=1)
    np.testing.assert_allclose(got, np.stack([spectrum.real, spectrum.imag], -1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,padding,align", [
    ("linear", "zeros", 0), ("nearest", "border", 1), ("cubic", "reflection", 0),
    ("linear", "reflection", 1)])
def test_grid_sample(mode, padding, align):
    model = make_model([helper.make_node("GridSample", ["x", "grid"], ["y"], name="sample",
                                         mode=mode, padding_mode=padding,
                                         align_corners=align)],
                       [helper.make_tensor_value_info("x", F, [2, 3, 5, 4]),
                        helper.make_tensor_value_info("grid", F, [2, 6, 7, 2])],
                       [helper.make_tensor_value_info("y", F, [2, 3, 6, 7])], opset=20)
    grid = (RNG.random((2, 6, 7, 2)) * 2.6 - 1.3).astype("float32")  # some outside [-1, 1]
    check(model, rand(2, 3, 5, 4), grid, compiled=mode == "linear" and padding == "zeros")


# --- ResNet-18 -----------------------------------------------------------------------------


def resnet18_model(batch: int | str = 1, size: int = 224, classes: int = 1000
                   ) -> onnx.ModelProto:
    """ResNet-18 (He et al.; torchvision's layout) in ONNX: Conv, BatchNormalization, Relu,
    MaxPool, Add, GlobalAveragePool, Flatten, Gemm; random weights."""
    rng = np.random.default_rng(18)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def weight(name: str, *shape: int, scale: float = 1.0) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        inits.append(init(name, (rng.standard_normal(shape) * scale
                                 / np.sqrt(fan_in)).astype("float32")))
        return name

    def conv_bn(x: str, name: str, cin: int, cout: int, k: int, stride: int,
                relu: bool) -> str:
        nodes.append(helper.make_node(
            "Conv", [x, weight(f"{name}.weight", cout, cin, k, k)], [f"{name}.conv"],
            name=f"{name}.conv", kernel_shape=[k, k], strides=[stride, stride],
            pads=[k // 2] * 4))
        bn = [weight(f"{name}.bn.scale", cout), weight(f"{name}.bn.bias", cout),
              weight(f"{name}.bn.mean", cout, scale=0.1)]
        inits.append(init(f"{name}.bn.var", (rng.random(cout) + 0.5).astype("float32")))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn,
                                                             f"{name}.bn.var"],
                                      [f"{name}.bn"], name=f"{name}.bn"))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"],
                                      name=f"{name}.relu"))
        return f"{name}.relu"

    x = conv_bn("input", "conv1", 3, 64, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["pool1"], name="pool1", kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool1", 64
    for stage, cout in enumerate([64, 128, 256, 512], start=1):
        for block in range(2):
            name = f"layer{stage}.{block}"
            stride = 2 if stage > 1 and block == 0 else 1
            h = conv_bn(x, f"{name}.conv1", cin, cout, 3, stride, True)
            h = conv_bn(h, f"{name}.conv2", cout, cout, 3, 1, False)
            short = (conv_bn(x, f"{name}.downsample", cin, cout, 1, stride, False)
                     if stride != 1 or cin != cout else x)
            nodes.append(helper.make_node("Add", [h, short], [f"{name}.add"], name=f"{name}.add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"],
                                          name=f"{name}.out"))
            x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["flat", weight("fc.weight", classes, 512),
                                           weight("fc.bias", classes)], ["logits"], name="fc",
                                  transB=1))
    return make_model(nodes, [helper.make_tensor_value_info("input", F, [batch, 3, size, size])],
                      [helper.make_tensor_value_info("logits", F, [batch, classes])], inits)


def test_resnet18_small_input():
    # The full architecture (and parameter count) on a 32x32 image, interpreted.
    model = resnet18_model(batch="batch", size=32, classes=10)
    check(model, rand(2, 3, 32, 32), compiled=False, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_resnet18_imagenet_size_compiled():
    check(resnet18_model(), rand(1, 3, 224, 224), rtol=1e-3, atol=1e-4)
