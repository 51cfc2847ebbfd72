"""Bad ONNX models: each is one `kiln.Error` naming what is wrong and where, never a crash.

The hand-written cases check the message (the node, the value, the operator and its opset);
the fuzz tests mutate valid models — flipped and truncated bytes, changed protobuf fields
(dimensions, attribute values, input names, operator types) — and check that nothing but a
`kiln.Error` escapes `from_onnx`, and that a model it accepts also runs or fails with one.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import InternalError
from kiln.frontend import from_onnx

F = TensorProto.FLOAT
RNG = np.random.default_rng(1)


def small_model() -> onnx.ModelProto:
    """x[2, 4] -> Gemm -> Relu -> Reshape -> Softmax, with named nodes."""
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["s"], name="reshape"),
        helper.make_node("Softmax", ["s"], ["y"], name="softmax", axis=-1),
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal((3, 4)).astype("float32"), "w"),
             numpy_helper.from_array(RNG.standard_normal(3).astype("float32"), "b"),
             numpy_helper.from_array(np.array([3, 2], "int64"), "shape")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", F, [2, 4])],
                              [helper.make_tensor_value_info("y", F, [3, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Transpose", ["p"], ["t"], name="transpose", perm=[0, 2, 3, 1]),
        helper.make_node("ReduceMean", ["t"], ["y"], name="mean", axes=[1, 2], keepdims=0),
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 2, 3, 3)).astype("float32"), "w")]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", F, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", F, [1, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def error_of(model) -> str:
    with pytest.raises(kiln.Error) as info:
        from_onnx(model)
    assert not isinstance(info.value, InternalError), info.value
    return str(info.value)


def test_truncated_file(tmp_path):
    data = small_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    message = error_of(str(path))
    assert "cut.onnx" in message and "not a valid ONNX model" in message
    assert "not a valid ONNX model" in error_of(b"")
    assert "cannot read" in error_of(str(tmp_path / "missing.onnx"))


def test_cycle_names_its_nodes():
    model = small_model()
    # relu reads the output of reshape, which reads relu's: a cycle.
    model.graph.node[1].input[0] = "s"
    message = error_of(model)
    assert "cycle" in message and "'relu'" in message and "'reshape'" in message


def test_input_never_produced():
    model = small_model()
    model.graph.node[3].input[0] = "nowhere"
    message = error_of(model)
    assert "'softmax'" in message and "'nowhere'" in message and "never produced" in message


def test_shape_contradicting_an_initializer():
    model = small_model()
    # Declare the weight as a graph input of a different shape than its initializer.
    model.graph.input.append(helper.make_tensor_value_info("w", F, [5, 4]))
    message = error_of(model)
    assert "'w'" in message and "(3, 4)" in message and "(5, 4)" in message


def test_initializer_of_wrong_shape_for_its_node():
    model = small_model()
    model.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.ones((3, 5), "float32"), "w"))
    message = error_of(model)
    assert "'fc'" in message and "Gemm" in message


def test_unknown_attribute_type():
    model = small_model()
    attr = helper.make_attribute("axis", 1)
    attr.type = onnx.AttributeProto.TYPE_PROTO  # a kind kiln does not read
    model.graph.node[3].attribute[0].CopyFrom(attr)
    message = error_of(onnx_bytes(model))  # the ONNX checker's message
    assert "softmax" in message and "axis" in message
    with pytest.raises(kiln.Error) as info:  # kiln's own, without the checker
        from_onnx(model, check=False)
    assert "'softmax'" in str(info.value) and "'axis'" in str(info.value)
    assert "TYPE_PROTO" in str(info.value)


def test_unsupported_operators_are_listed_together():
    model = small_model()
    model.graph.node[1].op_type = "Frobnicate"
    model.graph.node[3].op_type = "Frobnicate"
    model.graph.node.append(helper.make_node("Zap", ["y"], ["z"], name="zapper",
                                             domain="com.example"))
    model.opset_import.append(helper.make_opsetid("com.example", 2))
    message = error_of(model)
    assert "Frobnicate" in message and "opset 17" in message
    assert "'relu'" in message and "'softmax'" in message
    assert "Zap" in message and "com.example" in message and "'zapper'" in message
    assert "opset 2" in message


def test_an_opset_beyond_the_table():
    model = small_model()
    model.opset_import[0].version = 99
    assert "opset 99" in error_of(model)


def test_not_a_model_at_all():
    assert "takes a path, bytes or an onnx.ModelProto" in error_of(42)
    assert "not a valid ONNX model" in error_of(b"\x08\x07garbage that is not protobuf")


# --- fuzzing -------------------------------------------------------------------------------


def onnx_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


SEEDS = [small_model(), conv_model()]
X = {0: RNG.standard_normal((2, 4)).astype("float32"),
     1: RNG.standard_normal((1, 2, 6, 6)).astype("float32")}


def import_and_run(data: bytes | onnx.ModelProto, which: int) -> None:
    """Import a mutated model, run it when it imports: only kiln.Error may come out."""
    try:
        mod, params = from_onnx(data)
    except InternalError:
        raise
    except kiln.Error:
        return
    try:
        kiln.interpret(mod, X[which], params=params)
    except InternalError:
        raise
    except kiln.Error:
        pass


@st.composite
def byte_mutations(draw):
    which = draw(st.integers(0, len(SEEDS) - 1))
    data = bytearray(onnx_bytes(SEEDS[which]))
    kind = draw(st.sampled_from(["flip", "truncate", "splice"]))
    if kind == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            k = draw(st.integers(0, len(data) - 1))
            data[k] = draw(st.integers(0, 255))
    else:
        k = draw(st.integers(0, len(data)))
        data[k:k] = draw(st.binary(min_size=1, max_size=16))
    return which, bytes(data)


OP_TYPES = ["Relu", "Gemm", "Conv", "Reshape", "Softmax", "Add", "MatMul", "Concat", "Slice",
            "Transpose", "Identity", "If", "Loop", "Squeeze", "Gather", "ReduceMean", "Nope", ""]


@st.composite
def field_mutations(draw):
    which = draw(st.integers(0, len(SEEDS) - 1))
    model = onnx.ModelProto()
    model.CopyFrom(SEEDS[which])
    g = model.graph
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["dim", "attr", "input", "op", "init", "output", "opset"]))
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        if kind == "dim":
            dims = g.input[0].type.tensor_type.shape.dim
            d = dims[draw(st.integers(0, len(dims) - 1))]
            if draw(st.booleans()):
                d.dim_value = draw(st.integers(-2, 9))
            else:
                d.dim_param = draw(st.sampled_from(["batch", "N", "", "1x"]))
        elif kind == "attr" and node.attribute:
            a = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
            if a.type == onnx.AttributeProto.INT:
                a.i = draw(st.integers(-5, 5))
            elif a.type == onnx.AttributeProto.INTS:
                del a.ints[:]
                a.ints.extend(draw(st.lists(st.integers(-3, 7), max_size=5)))
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
            else:
                a.type = draw(st.integers(0, 14))
        elif kind == "input" and node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            names = [i.name for i in g.input] + [t.name for t in g.initializer] + \
                [o for n in g.node for o in n.output] + ["", "ghost"]
            node.input[k] = draw(st.sampled_from(names))
        elif kind == "op":
            node.op_type = draw(st.sampled_from(OP_TYPES))
        elif kind == "init" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            if draw(st.booleans()) and t.dims:
                t.dims[draw(st.integers(0, len(t.dims) - 1))] = draw(st.integers(0, 6))
            else:
                t.data_type = draw(st.integers(0, 25))
        elif kind == "output":
            g.output[0].name = draw(st.sampled_from(["y", "h", "x", "ghost", ""]))
        else:
            model.opset_import[0].version = draw(st.integers(0, 30))
    return which, model


FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=2000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FAST
@given(byte_mutations())
def test_fuzz_bytes(case):
    import_and_run(case[1], case[0])


@FAST
@given(field_mutations())
def test_fuzz_fields(case):
    import_and_run(case[1], case[0])


@pytest.mark.slow
@SLOW
@given(byte_mutations())
def test_fuzz_bytes_long(case):
    import_and_run(case[1], case[0])


@pytest.mark.slow
@SLOW
@given(field_mutations())
def test_fuzz_fields_long(case):
    import_and_run(case[1], case[0])


def test_a_shape_known_only_at_run_time_is_computed_then_or_bound_by_constants():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6]),
                                           helper.make_tensor_value_info("shape",
                                                                         TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", F, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, 6)).astype("float32")
    mod, params = from_onnx(model)  # a dyn.reshape: the VM reads the shape when it runs
    exe = kiln.build(mod, params=params)
    np.testing.assert_array_equal(exe(x, np.array([3, 4])), x.reshape(3, 4))
    np.testing.assert_array_equal(exe(x, np.array([-1, 2])), x.reshape(6, 2))
    with pytest.raises(kiln.Error, match="cannot reshape"):
        exe(x, np.array([5, 5]))
    mod, params = from_onnx(model, constants={"shape": np.array([3, 4], "int64")})
    np.testing.assert_array_equal(kiln.interpret(mod, x, params=params), x.reshape(3, 4))


def test_an_input_that_is_not_a_tensor():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["y"], name="id")], "g",
        [helper.make_tensor_sequence_value_info("s", F, [2])],
        [helper.make_tensor_sequence_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert "'s' is a sequence" in error_of(model)
