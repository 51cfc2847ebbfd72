"""AveragePool and MaxPool whose window spans more than the padded input, against ONNX Runtime
and PyTorch.

ONNX Runtime truncates its output size toward zero, so such a window still gives one output
when it overshoots the padded input by less than a stride; that window starts at the padded
input's first element and only its taps inside count (with count_include_pad, the divisor is
the padded input's size, not the kernel's). PyTorch-exported EfficientNet pools its 7x7 map
with ``AvgPool2d(1280, ceil_mode=True)``, a global average.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx


def pool_model(op: str, shape: tuple[int, ...], **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * len(shape))  # any size
    graph = helper.make_graph([node], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    return model


def run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def check(model: onnx.ModelProto, x: np.ndarray, expected: np.ndarray,
          compiled: bool = False) -> None:
    mod, params = from_onnx(model)
    runs = [kiln.interpret(mod, x, params=params)]
    if compiled:
        runs.append(kiln.build(mod, params=params)(x))
    for got in runs:
        got = np.asarray(got)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# (kernel_shape, strides, pads, dilations) over a 7x7 map, each window longer than the padded
# input along at least one axis, by less than a stride.
WINDOWS_2D = {
    "efficientnet": ([1280, 1280], [1280, 1280], [0, 0, 0, 0], [1, 1]),
    "padded": ([12, 12], [12, 12], [1, 1, 2, 2], [1, 1]),
    "uneven-pads": ([12, 12], [12, 12], [2, 0, 0, 3], [1, 1]),
    "stride-below-kernel": ([12, 12], [5, 4], [1, 2, 1, 0], [1, 1]),
    "one-axis": ([12, 3], [12, 2], [1, 0, 2, 1], [1, 1]),
    "dilated": ([6, 3], [6, 2], [1, 0, 1, 1], [2, 1]),
}


@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("window", list(WINDOWS_2D))
def test_average_pool_2d(window: str, count_include_pad: int, ceil_mode: int) -> None:
    kernel, strides, pads, dilations = WINDOWS_2D[window]
    model = pool_model("AveragePool", (2, 3, 7, 7), kernel_shape=kernel, strides=strides,
                       pads=pads, dilations=dilations, ceil_mode=ceil_mode,
                       count_include_pad=count_include_pad)
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype("float32")
    expected = run_ort(model, x)
    assert expected.shape[2] == 1
    check(model, x, expected)


@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("window", list(WINDOWS_2D))
def test_max_pool_2d(window: str, ceil_mode: int) -> None:
    kernel, strides, pads, dilations = WINDOWS_2D[window]
    model = pool_model("MaxPool", (2, 3, 7, 7), kernel_shape=kernel, strides=strides,
                       pads=pads, dilations=dilations, ceil_mode=ceil_mode)
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 7)).astype("float32")
    expected = run_ort(model, x)
    assert expected.shape[2] == 1
    check(model, x, expected)


def test_count_include_pad_divides_by_the_padded_input_not_the_kernel() -> None:
    # 12 taps over 1 + 7 + 2 padded positions: the sum of the 7 inputs over 10.
    model = pool_model("AveragePool", (1, 1, 7), kernel_shape=[12], strides=[12], pads=[1, 2],
                       count_include_pad=1)
    x = np.arange(1, 8, dtype="float32").reshape(1, 1, 7)
    expected = run_ort(model, x)
    np.testing.assert_allclose(expected, [[[28 / 10]]], rtol=1e-6)
    check(model, x, expected)



@pytest.mark.parametrize("kernel,strides,pads", [([12, 12], [12, 12], [1, 1, 2, 2]),
                                                 ([12, 3], [12, 2], [1, 0, 2, 1])])
def test_lp_pool_sums_the_taps_inside(kernel: list, strides: list, pads: list) -> None:
    # kiln's LpPool is an average times the taps it divided by: those inside the padded input.
    model = pool_model("LpPool", (1, 2, 7, 7), kernel_shape=kernel, strides=strides, pads=pads,
                       p=2)
    x = np.random.default_rng(5).standard_normal((1, 2, 7, 7)).astype("float32")
    check(model, x, run_ort(model, x))

@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", {"kernel_shape": [10], "strides": [10], "ceil_mode": 1,
                     "count_include_pad": 1}),
    ("MaxPool", {"kernel_shape": [9], "strides": [3], "pads": [1, 0]}),
])
def test_1d(op: str, attrs: dict) -> None:
    model = pool_model(op, (2, 4, 7), **attrs)
    x = np.random.default_rng(2).standard_normal((2, 4, 7)).astype("float32")
    check(model, x, run_ort(model, x))


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_3d(op: str) -> None:
    attrs: dict = {"kernel_shape": [5, 9, 2], "strides": [5, 9, 2], "pads": [1, 0, 0, 0, 1, 0],
                   "ceil_mode": 1}
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    model = pool_model(op, (1, 2, 3, 7, 6), **attrs)
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 7, 6)).astype("float32")
    check(model, x, run_ort(model, x))


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_compiled(op: str) -> None:
    attrs: dict = {"kernel_shape": [12, 12], "strides": [12, 12], "pads": [1, 1, 2, 2],
                   "ceil_mode": 1}
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    model = pool_model(op, (2, 3, 7, 7), **attrs)
    x = np.random.default_rng(4).standard_normal((2, 3, 7, 7)).astype("float32")
    check(model, x, run_ort(model, x), compiled=True)


def test_window_short_of_the_input_by_a_stride_is_an_error() -> None:
    # ONNX Runtime refuses this too (its output size would be negative).
    model = pool_model("AveragePool", (1, 1, 7, 7), kernel_shape=[10, 10], strides=[1, 1])
    with pytest.raises(kiln.Error, match=r"pool.*spans 10.*padded input has only 7"):
        from_onnx(model)


# --- exported from PyTorch ---------------------------------------------------------------


class Pooler(torch.nn.Module):
    """Hugging Face EfficientNet's head: a pool as wide as the hidden size, then a reshape."""

    def __init__(self, pool: torch.nn.Module) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.conv(x))
        return y.reshape(y.shape[:2])


TORCH_POOLS = {
    "efficientnet-avg": lambda: torch.nn.AvgPool2d(1280, ceil_mode=True),
    "efficientnet-max": lambda: torch.nn.MaxPool2d(1280, ceil_mode=True),
    "avg-padded": lambda: torch.nn.AvgPool2d(12, stride=12, padding=2, ceil_mode=True),
    "avg-padded-exclude": lambda: torch.nn.AvgPool2d(12, stride=12, padding=2, ceil_mode=True,
                                                     count_include_pad=False),
    "max-padded": lambda: torch.nn.MaxPool2d(12, stride=12, padding=2, ceil_mode=True),
}


@pytest.mark.parametrize("name", list(TORCH_POOLS))
def test_torch_exported_pooler(name: str) -> None:
    torch.manual_seed(0)
    module = Pooler(TORCH_POOLS[name]()).eval()
    x = torch.randn(2, 3, 7, 7)
    with torch.no_grad():
        expected = module(x).numpy()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated
        torch.onnx.export(module, (x,), buffer, dynamo=False, input_names=["x"],
                          output_names=["y"])
    model = onnx.load_from_string(buffer.getvalue())
    assert any(n.op_type in ("AveragePool", "MaxPool") for n in model.graph.node)
    np.testing.assert_allclose(run_ort(model, x.numpy()), expected, rtol=1e-5, atol=1e-6)
    check(model, x.numpy(), expected, compiled=name == "efficientnet-avg")
