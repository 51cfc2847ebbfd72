"""Inputs and outputs by name: an executable knows the model's own names and types, as an
ONNX Runtime session does, keeps them through save/load and Relay text, and runs on a feed
of them. Names, shapes, types and results are checked against onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.runtime import artifact
from kiln.runtime.named_io import ValueInfo, read_io

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


@pytest.fixture(scope="module")
def model():
    return classifier()


@pytest.fixture(scope="module")
def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exe(model):
    mod, params = from_onnx(model)
    return kiln.build(mod, params=params, target="evaluator")


@pytest.fixture(scope="module")
def feed():
    return {"input.1": np.random.default_rng(1).standard_normal((2, 3)).astype("float32")}


def described(infos):
    return [(i.name, tuple(i.shape), i.type) for i in infos]


def assert_named_like_ort(exe, session):
    assert described(exe.inputs) == described(session.get_inputs())
    assert described(exe.outputs) == described(session.get_outputs())


def assert_runs_like_ort(exe, session, feed):
    want = session.run(None, feed)
    got = exe.run(None, feed)
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_an_executable_knows_the_onnx_names_and_types(exe, session):
    assert_named_like_ort(exe, session)
    assert exe.inputs[0] == ValueInfo("input.1", ("batch", 3), "float32")
    assert [o.name for o in exe.outputs] == ["logits", "probs"]
    assert exe.outputs[0].dtype == "float32" and exe.outputs[0].type == "tensor(float)"


def test_run_by_name_as_onnx_runtime(exe, session, feed):
    assert_runs_like_ort(exe, session, feed)
    want = dict(zip(["logits", "probs"], session.run(None, feed)))
    # run(feed) is run(None, feed); a list of names picks outputs, in its order.
    np.testing.assert_allclose(exe.run(feed)[1], want["probs"], rtol=1e-5, atol=1e-6)
    probs, logits = exe.run(["probs", "logits"], feed)
    np.testing.assert_allclose(probs, want["probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, want["logits"], rtol=1e-5, atol=1e-6)
    (only,) = exe.run(["logits"], feed)
    np.testing.assert_allclose(only, session.run(["logits"], feed)[0], rtol=1e-5, atol=1e-6)
    named = exe.run_named(feed)
    assert list(named) == ["logits", "probs"]
    for k, v in want.items():
        np.testing.assert_allclose(named[k], v, rtol=1e-5, atol=1e-6)
    assert list(exe.run_named(feed, ["probs"])) == ["probs"]


def test_positional_and_keyword_calls_still_work(exe, session, feed):
    x = feed["input.1"]
    want = session.run(None, feed)
    for got in (exe(x), exe(input_1=x), exe(**{"input.1": x})):
        assert isinstance(got, tuple)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    named = exe.named_outputs(exe(x))
    np.testing.assert_allclose(named["probs"], want[1], rtol=1e-5, atol=1e-6)


def test_wrong_names_are_errors_that_list_the_names(exe, feed):
    x = feed["input.1"]
    with pytest.raises(kiln.Error, match=r"no input named 'input_1'; did you mean 'input\.1'\? "
                                         r"\(its inputs: 'input\.1'\)"):
        exe.run(None, {"input_1": x})
    with pytest.raises(kiln.Error, match=r"input 'input\.1' is not given"):
        exe.run(None, {})
    with pytest.raises(kiln.Error, match=r"no output named 'logit'; did you mean 'logits'\? "
                                         r"\(its outputs: 'logits', 'probs'\)"):
        exe.run(["logit"], feed)
    with pytest.raises(kiln.Error, match="output 'probs' is asked for twice"):
        exe.run(["probs", "probs"], feed)
    with pytest.raises(kiln.Error, match="output names first"):
        exe.run(feed, feed)
    with pytest.raises(kiln.Error, match="is given twice"):
        exe(input_1=x, **{"input.1": x})
    with pytest.raises(kiln.Error, match=r"expects Tensor\[\(batch, 3\), float32\]"):
        exe.run(None, {"input.1": x.astype("float64")})


def test_names_survive_save_and_load(exe, session, feed, tmp_path):
    exe.save(tmp_path / "m.kiln")
    loaded = kiln.load(tmp_path / "m.kiln")
    assert_named_like_ort(loaded, session)
    assert_runs_like_ort(loaded, session, feed)


def test_names_survive_relay_text(model, session, feed):
    # `kiln import` writes the weights as constants; --save-params keeps them parameters.
    for params_as in ("constants", "params"):
        mod, params = from_onnx(model, params_as=params_as)
        text = kiln.astext(mod)
        assert 'input_names=["input.1"]' in text and 'output_names=["logits", "probs"]' in text
        exe = kiln.build(kiln.parse(text), params=params, target="evaluator")
        assert_named_like_ort(exe, session)
        assert_runs_like_ort(exe, session, feed)


def test_plain_names_are_not_repeated_in_the_text():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    mod, _ = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert dict(mod["main"].attrs) == {"output_names": ("y",)}


def test_relay_programs_get_default_names():
    mod = kiln.parse("""
    def @main(%x: Tensor[(n, ?), float32], %b: int64) {
      (nn.relu(%x), %b)
    }""")
    exe = kiln.build(mod, target="evaluator")
    assert exe.inputs == [ValueInfo("x", ("n", None), "float32"), ValueInfo("b", (), "int64")]
    assert [o.name for o in exe.outputs] == ["output_0", "output_1"]
    assert exe.inputs[1].type == "tensor(int64)"
    x = np.array([[-1.0, 2.0]], "float32")
    got = exe.run_named({"x": x, "b": np.array(3)})
    np.testing.assert_array_equal(got["output_0"], [[0.0, 2.0]])
    assert got["output_1"] == 3
    single = kiln.build(kiln.parse("def @main(%x: Tensor[(2), float32]) { negative(%x) }"),
                        target="evaluator")
    assert [o.name for o in single.outputs] == ["output"]


def test_relay_programs_may_name_their_inputs_and_outputs(tmp_path):
    mod = kiln.parse("""
    def @main(%x: Tensor[(2), float32], %y: Tensor[(2), float32],
              input_names=["first input"], output_names=["sum", "difference"]) {
      (add(%x, %y), subtract(%x, %y))
    }""")
    exe = kiln.build(mod, target="evaluator")
    assert [i.name for i in exe.inputs] == ["first input", "y"]
    one, two = np.ones(2, "float32"), np.full(2, 2, "float32")
    (diff,) = exe.run(["difference"], {"first input": one, "y": two})
    np.testing.assert_array_equal(diff, [-1.0, -1.0])
    exe.save(tmp_path / "n.kiln")
    assert kiln.load(tmp_path / "n.kiln").run_named({"first input": one, "y": two}).keys() == {
        "sum", "difference"}
    # A tuple of one field keeps its default name through save and load too.
    one_field = kiln.build(kiln.parse("def @main(%x: Tensor[(2), float32]) { (%x,) }"),
                           target="evaluator")
    one_field.save(tmp_path / "o.kiln")
    again = kiln.load(tmp_path / "o.kiln")
    assert [o.name for o in again.outputs] == ["output_0"]
    np.testing.assert_array_equal(again.run([], {"x": one}), [])
    np.testing.assert_array_equal(again.run({"x": one})[0], one)


@pytest.mark.parametrize("attrs,message", [
    ('output_names=["a", "b"]', "names 2 outputs"),
    ('output_names=["a"], input_names=["x", "y"]', "gives 2 names"),
    ('output_names=[1]', "list of non-empty strings"),
    ('output_names=["a", "a"]', "names 'a' twice"),
])
def test_malformed_name_attributes_are_errors(attrs, message):
    mod = kiln.parse(f"def @main(%x: Tensor[(2), float32], {attrs}) {{ negative(%x) }}")
    with pytest.raises(kiln.Error, match=message):
        kiln.build(mod, target="evaluator")


def relay_exe():
    return kiln.build(kiln.parse("""
    def @main(%x: Tensor[(b, 2), float32], output_names=["y"]) { negative(%x) }"""),
        target="evaluator")


def test_a_file_without_names_loads_with_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(artifact, "write_io", lambda inputs, outputs: None)
    relay_exe().save(tmp_path / "old.kiln")
    loaded = kiln.load(tmp_path / "old.kiln")
    assert [o.name for o in loaded.outputs] == ["output"]
    assert loaded.inputs == [ValueInfo("x", ("b", 2), "float32")]


@pytest.mark.parametrize("io,message", [
    ([], "record of inputs and outputs is malformed"),
    ({"inputs": [], "outputs": []}, "records 0 inputs"),
    ({"inputs": [{"name": "x", "shape": ["b", 2], "dtype": "float128"}], "outputs": []},
     "unknown dtype"),
    ({"inputs": [{"name": "x", "shape": ["b", 2.5], "dtype": "float32"}], "outputs": []},
     "malformed shape"),
    ({"inputs": [{"name": 7, "shape": ["b", 2], "dtype": "float32"}], "outputs": []},
     "name is not a non-empty string"),
    ({"inputs": [{"name": "x", "shape": ["b", 3], "dtype": "float32"}],
      "outputs": [{"name": "y", "shape": ["b", 2], "dtype": "float32"}]},
     "do not match its program's parameters"),
    ({"inputs": [{"name": "x", "shape": ["b", 2], "dtype": "float32"}],
      "outputs": [{"name": "y", "shape": ["b", 2], "dtype": "int8"}]},
     "do not match its program's result"),
    ({"inputs": [{"name": "x", "shape": ["b", 2], "dtype": "float32"}],
      "outputs": [{"name": "y", "shape": ["b", 2], "dtype": "float32", "more": 1}]},
     "record is malformed"),
])
def test_a_malformed_record_of_names_is_refused(tmp_path, monkeypatch, io, message):
    monkeypatch.setattr(artifact, "write_io", lambda inputs, outputs: io)
    relay_exe().save(tmp_path / "bad.kiln")
    with pytest.raises(kiln.Error, match=f"not a valid kiln executable: .*{message}"):
        kiln.load(tmp_path / "bad.kiln")


def test_read_io_checks_names_twice():
    from kiln.ir.ty import TensorType

    t = TensorType((2,), "float32")
    rows = [{"name": "a", "shape": [2], "dtype": "float32"}] * 2
    with pytest.raises(kiln.Error, match="two inputs are named 'a'"):
        read_io({"inputs": rows, "outputs": []}, [("p", t), ("q", t)], t, kiln.Error)


def test_torch_dict_outputs_are_named_by_their_keys():
    torch = pytest.importorskip("torch")
    from kiln.frontend.torch import from_torch

    class Heads(torch.nn.Module):
        def forward(self, x):
            return {"double": x * 2, "plus_one": x + 1}

    x = torch.arange(3, dtype=torch.float32)
    mod, params = from_torch(Heads(), (x,))
    exe = kiln.build(mod, params=params, target="evaluator")
    assert [i.name for i in exe.inputs] == ["x"]
    assert [o.name for o in exe.outputs] == ["double", "plus_one"]
    got = exe.run_named({"x": x.numpy()})
    want = Heads()(x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k].numpy())
