"""Hostile ONNX models: a tiny file asking for 10^12 elements, a loop of 2^31 steps or a resize
by a million is refused at once with a `kiln.Error` that names the node and the import limit
(kiln/frontend/onnx/limits.py) — never a hang, a MemoryError or an OverflowError.

Each model is built here with ``onnx.helper``; the fuzz test sets the integer and float
attributes and constant inputs of small valid models to extreme values, and checks that every
import either succeeds or fails with a kiln.Error, quickly.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import InternalError
from kiln.frontend import from_onnx
from kiln.frontend.onnx import Limits

F, I64 = TensorProto.FLOAT, TensorProto.INT64
GUARD_S = 10.0  # a guard against hangs, not a benchmark: these imports take well under 1 s


def make(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, elem=F, shape=()):
    return helper.make_tensor_value_info(name, elem, list(shape))


def init(name, value, dtype=None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def refused(model, *fragments, **kwargs) -> str:
    """Import ``model``; it must fail fast with a kiln.Error containing every fragment."""
    start = time.monotonic()
    with pytest.raises(kiln.Error) as info:
        from_onnx(model, **kwargs)
    elapsed = time.monotonic() - start
    assert not isinstance(info.value, InternalError), info.value
    assert elapsed < GUARD_S, f"took {elapsed:.1f} s"
    message = str(info.value)
    for f in fragments:
        assert f in message, message
    return message


def imported(model, **kwargs):
    start = time.monotonic()
    mod, params = from_onnx(model, **kwargs)
    assert time.monotonic() - start < GUARD_S
    return mod, params


# --- the models of the issue ----------------------------------------------------------------


def lrn(size: int, channels: int = 3) -> onnx.ModelProto:
    return make([helper.make_node("LRN", ["x"], ["y"], name="lrn", size=size)],
                [vi("x", F, [1, channels, 2, 2])], [vi("y", F, [1, channels, 2, 2])])


def test_lrn_with_a_window_of_2_31_over_many_channels_is_refused():
    refused(lrn(2**31, channels=2**17), "node 'lrn' (LRN)", "size=2147483648",
            "max_unroll=65536", "KILN_MAX_IMPORT_UNROLL", "limits={'max_unroll'")


def test_lrn_with_a_window_of_2_31_over_three_channels_sums_them_all():
    # Past the channels the window holds only padding: three slices, not 2^31.
    mod, params = imported(lrn(2**31))
    x = np.random.default_rng(0).standard_normal((1, 3, 2, 2)).astype("float32")
    total = np.sum(x * x, axis=1, keepdims=True)
    want = x / (1.0 + 1e-4 / 2**31 * total) ** 0.75
    np.testing.assert_allclose(kiln.interpret(mod, x, params=params), want, rtol=1e-6)


def resize(scales=None, sizes=None, antialias=0) -> onnx.ModelProto:
    inits = [init("scales", scales, "float32")] if scales is not None else []
    inits += [init("sizes", sizes, "int64")] if sizes is not None else []
    node = helper.make_node("Resize", ["x", "", "scales" if scales is not None else "",
                                       "sizes" if sizes is not None else ""][:4],
                            ["y"], name="up", mode="linear", antialias=antialias)
    return make([node], [vi("x", F, [1, 1, 4, 4])], [vi("y", F, [1, 1, None, None])], inits,
                opset=18)


def test_resize_by_a_million_is_refused():
    refused(resize(scales=[1, 1, 1e6, 1e6]), "node 'up' (Resize)", "1000000.0",
            "max_resize_scale=1024", "KILN_MAX_RESIZE_SCALE")


def test_resize_to_a_million_times_the_size_is_refused():
    refused(resize(sizes=[1, 1, 4_000_000, 4_000_000]), "node 'up' (Resize)", "4 to 4000000",
            "max_resize_scale=1024")


def test_antialiased_resize_to_a_2048th_is_refused():
    # Antialiasing widens the filter to 2048 taps per output: the inverse scale is bounded.
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="down", mode="linear",
                            antialias=1)
    model = make([node], [vi("x", F, [1, 1, 1, 4096])], [vi("y", F, [1, 1, 1, 2])],
                 [init("scales", [1, 1, 1, 1 / 2048], "float32")], opset=18)
    refused(model, "node 'down' (Resize)", "antialiasing", "max_resize_scale=1024")


def test_resize_by_nan_or_inf_is_refused():
    refused(resize(scales=[1, 1, float("inf"), 1]), "node 'up' (Resize)", "inf")
    refused(resize(scales=[1, 1, float("nan"), 1]), "node 'up' (Resize)", "nan")


def test_range_of_10_12_elements_is_refused():
    model = make([helper.make_node("Range", ["a", "b", "d"], ["y"], name="rng")], [],
                 [vi("y", I64, [None])],
                 [init("a", 0, "int64"), init("b", 10**12, "int64"), init("d", 1, "int64")])
    refused(model, "node 'rng' (Range)", "1000000000000 elements", "max_elements=268435456",
            "KILN_MAX_IMPORT_ELEMENTS")


def test_range_with_a_zero_or_infinite_step_is_refused():
    for step in (0.0, float("inf"), float("nan")):
        model = make([helper.make_node("Range", ["a", "b", "d"], ["y"], name="rng")], [],
                     [vi("y", F, [None])],
                     [init("a", 0, "float32"), init("b", 5, "float32"),
                      init("d", step, "float32")])
        refused(model, "node 'rng' (Range)", "delta")


def test_one_hot_of_depth_10_12_is_refused():
    model = make([helper.make_node("OneHot", ["i", "depth", "v"], ["y"], name="oh")],
                 [vi("i", I64, [2])], [vi("y", F, [2, None])],
                 [init("depth", 10**12, "int64"), init("v", [0, 1], "float32")])
    refused(model, "node 'oh' (OneHot)", "1000000000000 elements", "max_elements")


def constant_of_shape(shape_node, value=None) -> onnx.ModelProto:
    attrs = {} if value is None else {"value": value}
    return make([shape_node, helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill",
                                              **attrs)], [], [vi("y", F, [None, None])])


def test_a_shape_of_1e30_is_refused_not_an_overflow_error():
    shape = helper.make_node("Constant", [], ["s"], name="k", value_floats=[1e30, 1.0])
    refused(constant_of_shape(shape), "node 'fill' (ConstantOfShape)", "1e+30",
            "out of the range of int64")


def test_a_nan_shape_is_refused():
    shape = helper.make_node("Constant", [], ["s"], name="k", value_floats=[float("nan"), 1])
    refused(constant_of_shape(shape), "node 'fill' (ConstantOfShape)", "nan",
            "not an integer")


def test_constant_of_shape_of_2_40_elements_is_refused():
    shape = helper.make_node("Constant", [], ["s"], name="k", value_ints=[2**20, 2**20])
    refused(constant_of_shape(shape), "node 'fill' (ConstantOfShape)",
            "1099511627776 elements", "max_tensor_elements=68719476736",
            "KILN_MAX_TENSOR_ELEMENTS")


def test_constant_of_shape_with_a_negative_dimension_is_refused():
    shape = helper.make_node("Constant", [], ["s"], name="k", value_ints=[-3, 2])
    refused(constant_of_shape(shape), "node 'fill' (ConstantOfShape)", "negative")


def test_constant_of_shape_filled_with_1e30_keeps_it():
    shape = helper.make_node("Constant", [], ["s"], name="k", value_ints=[2, 3])
    value = helper.make_tensor("value", F, [1], [1e30])
    mod, _ = imported(constant_of_shape(shape, value))
    np.testing.assert_array_equal(kiln.interpret(mod), np.full((2, 3), 1e30, "float32"))


def test_tile_to_2_62_elements_is_refused():
    model = make([helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")],
                 [vi("x", F, [2, 2])], [vi("y", F, [None, None])],
                 [init("reps", [2**31, 2**31], "int64")])
    refused(model, "node 'tile' (Tile)", "18446744073709551616 elements",
            "max_tensor_elements")


def test_tile_of_a_constant_to_2_62_elements_is_refused():
    model = make([helper.make_node("Tile", ["k", "reps"], ["y"], name="tile")], [],
                 [vi("y", F, [None, None])],
                 [init("k", np.ones((2, 2)), "float32"), init("reps", [2**31, 2**31], "int64")])
    refused(model, "node 'tile' (Tile)", "max_tensor_elements")


def test_expand_to_2_62_elements_is_refused():
    model = make([helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
                 [vi("x", F, [1, 1])], [vi("y", F, [None, None])],
                 [init("shape", [2**31, 2**31], "int64")])
    refused(model, "node 'expand' (Expand)", "4611686018427387904 elements",
            "max_tensor_elements")


def test_split_into_2_40_parts_is_refused():
    model = make([helper.make_node("Split", ["x"], ["a", "b"], name="split",
                                   num_outputs=2**40)],
                 [vi("x", F, [4])], [vi("a", F, [None]), vi("b", F, [None])], opset=18)
    refused(model, "node 'split' (Split)", "1099511627776", "max_unroll")


def test_a_graph_input_of_2_80_elements_is_refused():
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [vi("x", F, [2**40, 2**40])], [vi("y", F, [2**40, 2**40])])
    refused(model, "graph input 'x'", "max_tensor_elements")


def test_an_identity_matrix_of_2_30_elements_is_refused():
    model = make([helper.make_node("EyeLike", ["x"], ["y"], name="eye")],
                 [vi("x", F, [2**15, 2**15])], [vi("y", F, [2**15, 2**15])])
    refused(model, "node 'eye' (EyeLike)", "1073741824 elements", "max_elements")


def test_wrap_padding_by_2_31_is_refused():
    model = make([helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode="wrap")],
                 [vi("x", F, [2, 2])], [vi("y", F, [None, None])],
                 [init("pads", [0, 2**31, 0, 2**31], "int64")], opset=19)
    refused(model, "node 'pad' (Pad)", "max_elements")


def test_an_lstm_unrolled_over_a_long_sequence_is_refused():
    hidden, size, seq = 2, 3, 4096
    model = make([helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm",
                                   hidden_size=hidden)],
                 [vi("x", F, [seq, 1, size])], [vi("y", F, [seq, 1, 1, hidden])],
                 [init("W", np.zeros((1, 4 * hidden, size)), "float32"),
                  init("R", np.zeros((1, 4 * hidden, hidden)), "float32")])
    refused(model, "node 'lstm' (LSTM)", "4096 steps", "max_unroll")


def unrolled_loops(depth: int, trip: int) -> onnx.ModelProto:
    """Loops nested ``depth`` deep, each ``trip`` times, whose bodies unsqueeze at an axis
    computed from the iteration number (``i mod 1``, always 0): kiln needs the axes at import
    time, so it unrolls the loops (trip ** depth bodies). Each iteration adds ``trip``."""
    inner = None
    for level in reversed(range(depth)):
        p = f"l{level}_"
        nodes = [helper.make_node("Identity", [p + "c"], [p + "c_out"]),
                 helper.make_node("Mod", [p + "i", p + "one"], [p + "zero"]),
                 helper.make_node("Reshape", [p + "zero", p + "one"], [p + "axes"]),
                 helper.make_node("Unsqueeze", [p + "data", p + "axes"], [p + "row"]),
                 helper.make_node("ReduceSum", [p + "row"], [p + "sum"], keepdims=0),
                 helper.make_node("Add", [p + "v", p + "sum"], [p + "v_mid"])]
        inits = [init(p + "one", [1], "int64"), init(p + "data", np.ones(trip), "float32"),
                 init(p + "trip", trip, "int64")]
        if inner is None:
            nodes.append(helper.make_node("Identity", [p + "v_mid"], [p + "v_out"]))
        else:
            nodes.append(helper.make_node("Loop", [p + "trip", "", p + "v_mid"], [p + "v_out"],
                                          body=inner))
        inner = helper.make_graph(nodes, f"body{level}",
                                  [vi(p + "i", I64), vi(p + "c", TensorProto.BOOL), vi(p + "v")],
                                  [vi(p + "c_out", TensorProto.BOOL), vi(p + "v_out")], inits)
    node = helper.make_node("Loop", ["trip", "", "x"], ["y"], name="outer", body=inner)
    return make([node], [vi("x")], [vi("y")], [init("trip", trip, "int64")])


def test_an_unrolled_loop_counts_against_max_repeated_nodes():
    mod, params = imported(unrolled_loops(1, 4))
    assert kiln.interpret(mod, np.float32(0), params=params) == 4 * 4
    refused(unrolled_loops(1, 4), "node 'outer' (Loop)", "max_repeated_nodes=10",
            "KILN_MAX_REPEATED_NODES", limits={"max_repeated_nodes": 10})


def test_nested_unrolled_loops_are_refused():
    # 200 ** 3 bodies: refused after max_repeated_nodes conversions (lowered to stay fast).
    refused(unrolled_loops(3, 200), "node 'outer' (Loop)", "max_repeated_nodes=300",
            limits={"max_repeated_nodes": 300})


def nested_ifs(depth: int) -> onnx.ModelProto:
    """If nodes nested ``depth`` deep (the condition known at import time)."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "leaf", [],
                              [vi("t", F, [2])])
    empty = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "other", [],
                              [vi("e", F, [2])])
    for level in range(depth):
        node = helper.make_node("If", ["cond"], [f"o{level}"], name=f"if{level}",
                                then_branch=graph, else_branch=empty)
        graph = helper.make_graph([node], f"level{level}", [], [vi(f"o{level}", F, [2])])
    return make(list(graph.node), [vi("x", F, [2])], [vi(graph.output[0].name, F, [2])],
                [init("cond", True, "bool")])


def test_ifs_nested_as_deep_as_protobuf_allows_import():
    # protobuf refuses messages nested deeper (upb's depth limit, about 33 Ifs).
    mod, params = imported(nested_ifs(30))
    np.testing.assert_array_equal(kiln.interpret(mod, np.ones(2, "float32"), params=params), 1)


# --- the knobs ------------------------------------------------------------------------------


def small_upsample() -> onnx.ModelProto:
    """x2 by 2048 along its last axis: over the default max_resize_scale (1024)."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up")
    return make([node], [vi("x", F, [1, 1, 1, 2])], [vi("y", F, [1, 1, 1, 4096])],
                [init("scales", [1, 1, 1, 2048], "float32")], opset=18)


def test_a_raised_limit_lets_a_larger_model_through():
    refused(small_upsample(), "max_resize_scale=1024")
    mod, params = imported(small_upsample(), limits={"max_resize_scale": 4096})
    x = np.array([[[[1.0, 2.0]]]], "float32")
    y = kiln.interpret(mod, x, params=params)
    assert y.shape == (1, 1, 1, 4096)
    np.testing.assert_array_equal(y[..., :2048], 1.0)
    imported(small_upsample(), limits=Limits(max_resize_scale=2048))


def test_the_environment_sets_the_limits(monkeypatch):
    monkeypatch.setenv("KILN_MAX_RESIZE_SCALE", "4096")
    imported(small_upsample())
    monkeypatch.setenv("KILN_MAX_IMPORT_ELEMENTS", "1000")
    refused(small_upsample(), "max_elements=1000")  # the 4096 x 2 weights
    imported(small_upsample(), limits={"max_elements": 10_000})  # limits= over the variable


def test_lowered_limits_refuse_smaller_models():
    model = make([helper.make_node("Range", ["a", "b", "d"], ["y"], name="rng")], [],
                 [vi("y", I64, [None])],
                 [init("a", 0, "int64"), init("b", 5000, "int64"), init("d", 1, "int64")])
    imported(model)
    refused(model, "5000 elements", "max_elements=100", limits={"max_elements": 100})


def test_bad_limits_are_errors(monkeypatch):
    refused(small_upsample(), "'max_everything'", "not import limits",
            limits={"max_everything": 1})
    refused(small_upsample(), "limits['max_unroll'] must be an integer",
            limits={"max_unroll": "lots"})
    refused(small_upsample(), "must be positive", limits={"max_elements": 0})
    monkeypatch.setenv("KILN_MAX_IMPORT_UNROLL", "-5")
    refused(small_upsample(), "KILN_MAX_IMPORT_UNROLL must be positive")


# --- fuzzing: extreme attribute and constant values -----------------------------------------


def fuzz_seeds() -> list[onnx.ModelProto]:
    """Small valid models whose attributes and constant inputs drive work at import time."""
    x4 = [vi("x", F, [1, 4, 4, 4])]

    def one(op, inputs, out_shape, inits=(), opset=18, x=x4, n_out=1, **attrs):
        outs = ["y"] + [f"y{k}" for k in range(1, n_out)]
        return make([helper.make_node(op, inputs, outs, name=op.lower(), **attrs)], x,
                    [vi(o, F, out_shape) for o in outs], inits, opset=opset)

    w = init("w", np.ones((2, 4, 3, 3)), "float32")
    return [
        one("LRN", ["x"], [1, 4, 4, 4], size=3, alpha=1e-4, beta=0.75, bias=1.0),
        one("Resize", ["x", "", "scales"], [1, 4, 8, 8],
            [init("scales", [1, 1, 2, 2], "float32")], mode="linear"),
        one("Resize", ["x", "", "", "sizes"], [1, 4, 2, 2], [init("sizes", [1, 4, 2, 2],
                                                                   "int64")],
            mode="cubic", antialias=1, cubic_coeff_a=-0.5),
        one("Split", ["x"], [1, 2, 4, 4], n_out=2, axis=1, num_outputs=2),
        one("Tile", ["x", "reps"], [1, 4, 8, 4], [init("reps", [1, 1, 2, 1], "int64")]),
        one("Expand", ["x", "shape"], [2, 4, 4, 4], [init("shape", [2, 1, 1, 1], "int64")]),
        one("Pad", ["x", "pads"], [1, 4, 6, 6],
            [init("pads", [0, 0, 1, 1, 0, 0, 1, 1], "int64")], mode="reflect"),
        one("Conv", ["x", "w"], [1, 2, 4, 4], [w], pads=[1, 1, 1, 1], strides=[1, 1],
            dilations=[1, 1], group=1),
        one("MaxPool", ["x"], [1, 4, 2, 2], kernel_shape=[2, 2], strides=[2, 2],
            pads=[0, 0, 0, 0], ceil_mode=0),
        one("TopK", ["x", "k"], [1, 4, 4, 2], [init("k", [2], "int64")], n_out=2, axis=-1),
        one("CumSum", ["x", "axis"], [1, 4, 4, 4], [init("axis", 1, "int64")], exclusive=0),
        one("Trilu", ["x", "k"], [1, 4, 4, 4], [init("k", 1, "int64")], upper=1),
        one("OneHot", ["i", "depth", "v"], [3, 5],
            [init("i", [0, 2, 4], "int64"), init("depth", 5, "int64"),
             init("v", [0, 1], "float32")], x=[], axis=-1),
        one("Range", ["a", "b", "d"], [None],
            [init("a", 0.0, "float32"), init("b", 6.0, "float32"), init("d", 1.5, "float32")],
            x=[]),
        one("ConstantOfShape", ["s"], [2, 3], [init("s", [2, 3], "int64")], x=[],
            value=helper.make_tensor("value", F, [1], [2.5])),
        one("Gemm", ["a", "b"], [2, 2], [init("b", np.ones((3, 2)), "float32")],
            x=[vi("a", F, [2, 3])], alpha=2.0, beta=1.0, transA=0, transB=0),
        one("Elu", ["x"], [1, 4, 4, 4], alpha=1.0),
        one("Clip", ["x", "lo", "hi"], [1, 4, 4, 4],
            [init("lo", -1.0, "float32"), init("hi", 1.0, "float32")]),
        one("DFT", ["s", "n"], [1, 8, 2],
            [init("n", 8, "int64")], x=[vi("s", F, [1, 8, 1])], opset=17, axis=1),
        one("GatherElements", ["x", "idx"], [1, 4, 4, 1],
            [init("idx", np.zeros((1, 4, 4, 1)), "int64")], axis=3),
        one("Softmax", ["x"], [1, 4, 4, 4], axis=1),
        one("DepthToSpace", ["x"], [1, 1, 8, 8], blocksize=2),
        one("Flatten", ["x"], [1, 64], axis=1),
        one("LSTM", ["s", "W", "R"], [3, 1, 1, 2],
            [init("W", np.zeros((1, 8, 3)), "float32"), init("R", np.zeros((1, 8, 2)), "float32")],
            x=[vi("s", F, [3, 1, 3])], hidden_size=2, clip=5.0),
        one("Einsum", ["x", "m"], [1, 4, 4], [init("m", np.ones((4, 4)), "float32")],
            equation="abcd,dd->abc"),
        one("GridSample", ["x", "grid"], [1, 4, 2, 2],
            [init("grid", np.zeros((1, 2, 2, 2)), "float32")], mode="cubic", opset=20),
        one("Slice", ["x", "starts", "ends", "axes", "steps"], [1, 4, 2, 4],
            [init("starts", [0], "int64"), init("ends", [4], "int64"),
             init("axes", [2], "int64"), init("steps", [2], "int64")]),
        one("Reshape", ["x", "shape"], [4, 16], [init("shape", [4, -1], "int64")]),
        one("Unsqueeze", ["x", "axes"], [1, 1, 4, 4, 4], [init("axes", [0], "int64")]),
        one("ReduceSum", ["x", "axes"], [1, 1, 4, 4], [init("axes", [1], "int64")],
            keepdims=1),
        one("Gather", ["x", "idx"], [1, 4, 2, 4], [init("idx", [0, 3], "int64")], axis=2),
        one("Hardmax", ["x"], [1, 4, 4, 4], axis=-1),
        one("AveragePool", ["x"], [1, 4, 3, 3], kernel_shape=[2, 2], strides=[1, 1],
            count_include_pad=1, pads=[0, 0, 0, 0]),
        one("ConvTranspose", ["x", "wt"], [1, 2, 8, 8],
            [init("wt", np.ones((4, 2, 2, 2)), "float32")], strides=[2, 2],
            output_padding=[0, 0]),
        one("SpaceToDepth", ["x"], [1, 16, 2, 2], blocksize=2),
        one("ScatterND", ["x", "idx", "upd"], [1, 4, 4, 4],
            [init("idx", [[0, 1]], "int64"), init("upd", np.ones((1, 4, 4)), "float32")]),
        one("QuantizeLinear", ["x", "scale"], [1, 4, 4, 4],
            [init("scale", np.ones((1, 2, 4, 4)), "float32")], axis=1, block_size=2,
            opset=21),
        one("Shape", ["x"], [2], start=1, end=3),
        one("Loop", ["trip", "", "v"], [1, 4, 4, 4],
            [init("trip", 3, "int64")], x=x4[:0] + [vi("v", F, [1, 4, 4, 4])],
            body=helper.make_graph(
                [helper.make_node("Identity", ["c_in"], ["c_out"]),
                 helper.make_node("Relu", ["v_in"], ["v_out"])], "body",
                [vi("i", I64, []), vi("c_in", TensorProto.BOOL, []),
                 vi("v_in", F, [1, 4, 4, 4])],
                [vi("c_out", TensorProto.BOOL, []), vi("v_out", F, [1, 4, 4, 4])])),
    ]


INTS = [0, -1, 2**31, 2**62, -(2**63)]
FLOATS = [float("nan"), float("inf"), 1e30]


def mutations(seed: onnx.ModelProto) -> list[onnx.ModelProto]:
    """Copies of ``seed`` with one attribute, or one constant input, set to an extreme value."""
    out = []
    node = seed.graph.node[0]
    for k, a in enumerate(node.attribute):
        kind = a.type
        values: list = (INTS if kind in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)
                        else FLOATS if kind in (onnx.AttributeProto.FLOAT,
                                                onnx.AttributeProto.FLOATS) else [])
        if kind == onnx.AttributeProto.TENSOR:
            values = FLOATS + [1e300]
        for v in values:
            m = onnx.ModelProto()
            m.CopyFrom(seed)
            b = m.graph.node[0].attribute[k]
            if kind == onnx.AttributeProto.INT:
                b.i = v
            elif kind == onnx.AttributeProto.FLOAT:
                b.f = v
            elif kind == onnx.AttributeProto.INTS:
                b.ints[len(out) % len(b.ints)] = v
            elif kind == onnx.AttributeProto.FLOATS:
                b.floats[len(out) % len(b.floats)] = v
            else:
                b.t.CopyFrom(helper.make_tensor("value", TensorProto.DOUBLE, [1], [v]))
            out.append(m)
    for k, t in enumerate(seed.graph.initializer):
        array = numpy_helper.to_array(t)
        if array.size > 16:
            continue
        values = INTS if array.dtype.kind == "i" else FLOATS
        for v in values:
            m = onnx.ModelProto()
            m.CopyFrom(seed)
            changed = array.copy().reshape(-1)
            if changed.size:
                changed[len(out) % changed.size] = v
            m.graph.initializer[k].CopyFrom(numpy_helper.from_array(
                changed.reshape(array.shape), t.name))
            out.append(m)
    return out


def test_extreme_values_import_or_fail_with_a_kiln_error():
    count, start = 0, time.monotonic()
    for seed in fuzz_seeds():
        imported(seed)  # the seed itself is valid
        for model in mutations(seed):
            one = time.monotonic()
            try:
                from_onnx(model)
            except InternalError:
                raise
            except kiln.Error:
                pass
            elapsed = time.monotonic() - one
            assert elapsed < GUARD_S, (onnx.printer.to_text(model.graph), elapsed)
            count += 1
    assert count > 200
    assert time.monotonic() - start < 60
