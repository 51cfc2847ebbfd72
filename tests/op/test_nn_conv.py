"""nn.conv2d against torch.nn.functional.conv2d: strides, padding, dilation, groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.ty import ANY, SymDim, TensorType

from .helpers import check, covers, infer, rand

T = torch.from_numpy


@st.composite
def convolutions(draw):
    groups = draw(st.sampled_from([1, 2, 3]))
    cin = groups * draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    if depthwise:
        groups = cin
    cout = groups * draw(st.integers(1, 2))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = tuple(draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)))
    return dict(
        n=draw(st.integers(1, 2)),
        cin=cin,
        cout=cout,
        groups=groups,
        hw=(draw(st.integers(1, 8)), draw(st.integers(1, 8))),
        kernel=kernel,
        strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        dilation=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
        padding=padding,
        seed=draw(st.integers(0, 2**16)),
        dtype=draw(st.sampled_from(["float32", "float64"])),
    )


def _fits(c: dict) -> bool:
    top, left, bottom, right = c["padding"]
    spans = [(k - 1) * d + 1 for k, d in zip(c["kernel"], c["dilation"], strict=True)]
    return c["hw"][0] + top + bottom >= spans[0] and c["hw"][1] + left + right >= spans[1]


@covers("nn.conv2d")
@settings(max_examples=60, deadline=None)
@given(c=convolutions())
def test_conv2d_against_torch(c: dict) -> None:
    assume(_fits(c))
    rng = np.random.default_rng(c["seed"])
    x = rand(rng, (c["n"], c["cin"], *c["hw"]), c["dtype"])
    w = rand(rng, (c["cout"], c["cin"] // c["groups"], *c["kernel"]), c["dtype"])
    top, left, bottom, right = c["padding"]
    padded = F.pad(T(x), (left, right, top, bottom))  # torch pads the last axis first
    expected = F.conv2d(
        padded, T(w), stride=c["strides"], dilation=c["dilation"], groups=c["groups"]
    ).numpy()
    tol = 1e-4 if c["dtype"] == "float32" else 1e-10
    check(
        "nn.conv2d",
        [x, w],
        expected,
        rtol=tol,
        atol=tol,
        strides=c["strides"],
        padding=c["padding"],
        dilation=c["dilation"],
        groups=c["groups"],
        channels=c["cout"],
        kernel_size=c["kernel"],
    )


@pytest.mark.parametrize(
    ("padding", "torch_padding"), [(1, (1, 1)), ((2, 1), (2, 1)), ([0], (0, 0))]
)
def test_conv2d_short_padding_forms(padding, torch_padding) -> None:
    rng = np.random.default_rng(0)
    x, w = rand(rng, (1, 2, 5, 6)), rand(rng, (3, 2, 3, 3))
    expected = F.conv2d(T(x), T(w), padding=torch_padding).numpy()
    check("nn.conv2d", [x, w], expected, rtol=1e-4, atol=1e-5, padding=padding)


def test_conv2d_padding_normalizes_to_four_numbers() -> None:
    x, w = kiln.var("x", shape=(1, 1, 4, 4)), kiln.var("w", shape=(1, 1, 3, 3))
    assert kiln.op.nn.conv2d(x, w, padding=1).attrs["padding"] == (1, 1, 1, 1)
    assert kiln.op.nn.conv2d(x, w, padding=(1, 2)).attrs["padding"] == (1, 2, 1, 2)
    assert kiln.op.nn.conv2d(x, w, strides=2).attrs["strides"] == (2, 2)
    with pytest.raises(kiln.Error, match="1, 2 or 4"):
        kiln.op.nn.conv2d(x, w, padding=(1, 2, 3))


def test_conv2d_integers_with_wider_output() -> None:
    rng = np.random.default_rng(1)
    x, w = rand(rng, (1, 2, 4, 4), "int8", -50, 50), rand(rng, (2, 2, 2, 2), "int8", -50, 50)
    expected = F.conv2d(T(x).double(), T(w).double()).numpy().astype("int32")
    check("nn.conv2d", [x, w], expected, out_dtype="int32")


def test_conv2d_relation_errors() -> None:
    data, weight = TensorType((1, 4, 8, 8)), TensorType((6, 2, 3, 3))
    with pytest.raises(kiln.TypeCheckError, match="NCHW or NHWC.*OIHW.*data_layout='NCWH'"):
        infer("nn.conv2d", [data, weight], data_layout="NCWH", groups=2)
    with pytest.raises(kiln.TypeCheckError, match="kernel_layout='IOHW'"):
        infer("nn.conv2d", [data, weight], kernel_layout="IOHW")
    with pytest.raises(kiln.TypeCheckError, match=r"4 channels .* 2 input channels per group"):
        infer("nn.conv2d", [data, weight])
    with pytest.raises(kiln.TypeCheckError, match="channels=5"):
        infer("nn.conv2d", [data, weight], groups=2, channels=5)
    with pytest.raises(kiln.TypeCheckError, match=r"kernel_size=\[5, 5\]"):
        infer("nn.conv2d", [data, weight], groups=2, kernel_size=5)
    with pytest.raises(kiln.TypeCheckError, match="window spans 9"):
        infer("nn.conv2d", [data, weight], groups=2, dilation=4)
    with pytest.raises(kiln.TypeCheckError, match="rank 4"):
        infer("nn.conv2d", [TensorType((4, 8, 8)), weight])


def test_conv2d_relation_with_unknown_dims() -> None:
    n = SymDim("n")
    ty = infer(
        "nn.conv2d", [TensorType((n, 3, ANY, 9)), TensorType((8, 3, 3, 3))], strides=2, padding=1
    )
    assert ty == TensorType((n, 8, ANY, 5))
