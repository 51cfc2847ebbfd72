"""`kiln run` by the model's own names: an ONNX graph's input `input.1` is read from the .npz
under that name and its output `logits` written under its name, whether the model is the
.onnx file, the .kiln executable built from it, or the Relay text imported from it. Results
are checked against onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.cli import main

ort = pytest.importorskip("onnxruntime")


def classifier() -> onnx.ModelProto:
    """input.1[batch, 3] -> logits = Gemm(input.1, W, B), probs = Softmax(logits)."""
    r = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["input.1", "W", "B"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(r.standard_normal((4, 3)).astype("float32"), "W"),
         numpy_helper.from_array(r.standard_normal(4).astype("float32"), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def files(tmp_path):
    model = classifier()
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3)).astype("float32")
    np.savez(tmp_path / "in.npz", **{"input.1": x})
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = dict(zip(["logits", "probs"], session.run(None, {"input.1": x})))
    return tmp_path, want


def assert_named_outputs(path, want):
    with np.load(path) as out:
        assert sorted(out.files) == ["logits", "probs"]
        for name, value in want.items():
            np.testing.assert_allclose(out[name], value, rtol=1e-5, atol=1e-6)


def test_run_an_onnx_model_by_its_names(files):
    d, want = files
    assert main(["run", str(d / "m.onnx"), "--inputs", str(d / "in.npz"), "--target",
                 "evaluator", "-o", str(d / "out.npz")]) == 0
    assert_named_outputs(d / "out.npz", want)


def test_an_executable_keeps_the_names(files, capsys):
    d, want = files
    assert main(["build", str(d / "m.onnx"), "-o", str(d / "m.kiln"), "--target",
                 "evaluator"]) == 0
    assert main(["run", str(d / "m.kiln"), "--inputs", str(d / "in.npz"), "-o",
                 str(d / "out.npz")]) == 0
    assert_named_outputs(d / "out.npz", want)
    capsys.readouterr()
    assert main(["run", str(d / "m.kiln"), "--inputs", str(d / "in.npz")]) == 0
    printed = capsys.readouterr().out
    assert "logits: float32[2, 4]" in printed and "probs: float32[2, 4]" in printed


def test_relay_text_keeps_the_names(files):
    d, want = files
    assert main(["import", str(d / "m.onnx"), "-o", str(d / "m.rly")]) == 0
    assert main(["run", str(d / "m.rly"), "--inputs", str(d / "in.npz"), "--target",
                 "evaluator", "-o", str(d / "out.npz")]) == 0
    assert_named_outputs(d / "out.npz", want)


def test_a_wrong_input_name_is_an_error_naming_the_right_one(files, capsys):
    d, _ = files
    assert main(["build", str(d / "m.onnx"), "-o", str(d / "m.kiln"), "--target",
                 "evaluator"]) == 0
    x = np.zeros((2, 3), "float32")
    np.savez(d / "wrong.npz", **{"input1": x})
    capsys.readouterr()
    for command in (["run", str(d / "m.kiln")],
                    ["run", str(d / "m.onnx"), "--target", "evaluator"]):
        assert main([*command, "--inputs", str(d / "wrong.npz")]) == 1
        err = capsys.readouterr().err
        assert "'input1'" in err and "did you mean 'input.1'?" in err
