"""nn.conv2d in the layouts TVM's Conv2DRel accepts (NCHW/NHWC data; OIHW/HWIO/HWOI/OHWI
kernels) and with mixed input dtypes (uint8 x int8 -> int32). The oracle is a convolution
written here in NHWC/HWIO with explicit taps; inputs in other layouts are made from it with
numpy transposes whose axes are spelled out below."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType

from .helpers import check, covers, infer

# numpy transposes from NHWC data / HWIO kernels into each layout (and back for results).
DATA_FROM_NHWC = {"NHWC": (0, 1, 2, 3), "NCHW": (0, 3, 1, 2)}
KERNEL_FROM_HWIO = {"HWIO": (0, 1, 2, 3), "OIHW": (3, 2, 0, 1), "HWOI": (0, 1, 3, 2),
                    "OHWI": (3, 0, 1, 2)}


def conv_nhwc(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0,
              dilation: int = 1, groups: int = 1, acc: str = "float64") -> np.ndarray:
    """out[n, y, x, o] = sum over taps (i, j) and channels c of the group of
    xpad[n, y*s + i*d, x*s + j*d, c] * w[i, j, c, o]."""
    x = np.pad(x.astype(acc), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    w = w.astype(acc)
    n, h, wd, c = x.shape
    kh, kw, cg, o = w.shape
    og = o // groups
    oh = (h - (kh - 1) * dilation - 1) // stride + 1
    ow = (wd - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, oh, ow, o), acc)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dilation, i * dilation + (oh - 1) * stride + 1, stride)
                cols = slice(j * dilation, j * dilation + (ow - 1) * stride + 1, stride)
                patch = x[:, rows, cols, g * cg:(g + 1) * cg]
                out[..., g * og:(g + 1) * og] += np.einsum(
                    "nhwc,co->nhwo", patch, w[i, j, :, g * og:(g + 1) * og])
    return out


@covers("nn.conv2d")
@pytest.mark.parametrize("data_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kernel_layout", ["OIHW", "HWIO", "HWOI", "OHWI"])
def test_layouts_against_the_nhwc_oracle(data_layout: str, kernel_layout: str) -> None:
    rng = np.random.default_rng(hash((data_layout, kernel_layout)) % 1000)
    x = rng.standard_normal((2, 7, 6, 3))
    w = rng.standard_normal((3, 2, 3, 4))
    expected = conv_nhwc(x, w, stride=2, pad=1)
    out = check("nn.conv2d",
                [x.transpose(DATA_FROM_NHWC[data_layout]),
                 w.transpose(KERNEL_FROM_HWIO[kernel_layout])],
                expected.transpose(DATA_FROM_NHWC[data_layout]),
                rtol=1e-10, atol=1e-12, strides=2, padding=1,
                data_layout=data_layout, kernel_layout=kernel_layout)
    assert out.flags.c_contiguous


def test_out_layout_differs_from_data_layout() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 5, 5, 2)), rng.standard_normal((3, 3, 2, 4))
    expected = conv_nhwc(x, w, pad=1).transpose(0, 3, 1, 2)  # NHWC -> NCHW
    check("nn.conv2d", [x, w], expected, rtol=1e-10, atol=1e-12, padding=1,
          data_layout="NHWC", kernel_layout="HWIO", out_layout="NCHW")


def test_depthwise_nhwc_hwoi() -> None:
    rng = np.random.default_rng(4)
    c = 4
    x, w = rng.standard_normal((1, 6, 6, c)), rng.standard_normal((3, 3, c, 1))  # HWOI
    expected = conv_nhwc(x, w.transpose(0, 1, 3, 2), pad=1, groups=c)  # as HWIO: (3,3,1,c)
    check("nn.conv2d", [x, w], expected, rtol=1e-10, atol=1e-12, padding=1, groups=c,
          channels=c, data_layout="NHWC", kernel_layout="HWOI")


def test_relation_shapes_in_each_layout() -> None:
    t = infer("nn.conv2d", [TensorType((1, 32, 32, 3), "float32"),
                            TensorType((5, 5, 3, 16), "float32")],
              strides=2, padding=2, data_layout="NHWC", kernel_layout="HWIO")
    assert t == TensorType((1, 16, 16, 16), "float32")
    with pytest.raises(kiln.TypeCheckError, match="3 channels"):
        infer("nn.conv2d", [TensorType((1, 8, 8, 3), "float32"),
                            TensorType((3, 3, 4, 16), "float32")],
              data_layout="NHWC", kernel_layout="HWIO")
    with pytest.raises(kiln.TypeCheckError, match="supports data_layout NCHW or NHWC"):
        infer("nn.conv2d", [TensorType((1, 8, 8, 3), "float32")] * 2, data_layout="NWHC")


def test_uint8_by_int8_accumulates_exactly_in_int32() -> None:
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, size=(1, 9, 9, 16)).astype("uint8")
    w = rng.integers(-128, 128, size=(3, 3, 16, 8)).astype("int8")
    expected = conv_nhwc(x, w, pad=1, acc="int64")
    assert np.abs(expected).max() > 2**16  # would overflow an int16 accumulator
    check("nn.conv2d", [x, w], expected.astype("int32"), padding=1, out_dtype="int32",
          data_layout="NHWC", kernel_layout="HWIO")
    check("nn.conv2d", [x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)],
          expected.transpose(0, 3, 1, 2).astype("int32"), padding=1, out_dtype="int32")


def test_mixed_dtypes_need_out_dtype() -> None:
    with pytest.raises(kiln.TypeCheckError, match="same"):
        infer("nn.conv2d", [TensorType((1, 2, 4, 4), "uint8"), TensorType((2, 2, 1, 1), "int8")])


# A quantized NHWC convolution as TVM 0.12 prints one (after qnn legalization).
TVM_TEXT = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 6, 6, 4), uint8], %weight: Tensor[(3, 3, 4, 2), int8]) {
  nn.conv2d(%data, %weight, padding=[1, 1, 1, 1], channels=2, kernel_size=[3, 3],
            data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
}
"""


@pytest.mark.parametrize("target", ["evaluator", "llvm"])
def test_tvm_text_nhwc_quantized_conv_builds(target: str) -> None:
    mod = kiln.parse(TVM_TEXT)
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, size=(1, 6, 6, 4)).astype("uint8")
    w = rng.integers(-128, 128, size=(3, 3, 4, 2)).astype("int8")
    expected = conv_nhwc(x, w, pad=1, acc="int64").astype("int32")
    np.testing.assert_array_equal(kiln.interpret(mod, x, w), expected)
    out = kiln.build(mod, target=target)(x, w)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected)


def test_nhwc_float_conv_with_constant_weight_builds() -> None:
    # alter-layout packs constant NCHW/OIHW weights; an HWIO weight must stay as it is.
    rng = np.random.default_rng(7)
    w = rng.standard_normal((3, 3, 4, 8)).astype("float32")
    x = kiln.var("x", shape=(1, 8, 8, 4))
    fn = kiln.Function((x,), kiln.op.nn.relu(kiln.op.nn.conv2d(
        x, kiln.const(w), padding=1, data_layout="NHWC", kernel_layout="HWIO")))
    xv = rng.standard_normal((1, 8, 8, 4)).astype("float32")
    expected = np.maximum(conv_nhwc(xv, w, pad=1), 0)
    np.testing.assert_allclose(kiln.build(fn)(xv), expected, rtol=1e-4, atol=1e-4)


@covers("nn.conv2d")
@pytest.mark.parametrize("data_layout", ["NCHW", "NHWC"])
def test_float32_channels_with_equal_weights_are_bitwise_equal(data_layout: str) -> None:
    # Regression: ONNX's light squeezenet (constant weights) makes all 1000 class scores equal
    # up to rounding, near 1e10, and its softmax is uniform only when they are bitwise equal.
    # A float32 BLAS product rounds output channels differently by the tile they fall in,
    # however equal their weights; the reference sums in float64 and rounds once, as ORT's
    # scores come out: every channel the same, and the exact sum correctly rounded.
    import torch

    rng = np.random.default_rng(8)
    x = rng.uniform(0.0, 1.0, size=(1, 13, 13, 96)).astype("float32")  # NHWC
    w = np.full((1, 1, 96, 40), 0.0123, "float32")  # HWIO: 40 identical output channels
    exact = torch.nn.functional.conv2d(torch.from_numpy(x).double().permute(0, 3, 1, 2),
                                       torch.from_numpy(w).double().permute(3, 2, 0, 1))
    expected = exact.permute(0, 2, 3, 1).numpy().astype("float32")  # NHWC
    to = DATA_FROM_NHWC[data_layout]
    kernel_layout = {"NCHW": "OIHW", "NHWC": "HWIO"}[data_layout]
    out = check("nn.conv2d", [x.transpose(to), w.transpose(KERNEL_FROM_HWIO[kernel_layout])],
                expected.transpose(to), rtol=0, data_layout=data_layout,
                kernel_layout=kernel_layout)
    channels = out.transpose(np.argsort(to))  # back to NHWC
    np.testing.assert_array_equal(channels, np.broadcast_to(channels[..., :1], channels.shape))
