"""2-D pooling against PyTorch and against a direct loop written from TVM's definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.ty import ANY, SymDim, TensorType

from .helpers import blocked, check, covers, infer, rand

T = torch.from_numpy


def naive_pool(
    x: np.ndarray,
    kind: str,
    kernel,
    strides,
    dilation,
    padding,
    ceil_mode: bool,
    count_include_pad: bool = False,
) -> np.ndarray:
    """Pooling one output position at a time, straight from TVM's rules."""
    top, left, bottom, right = padding
    h, w = x.shape[2:]
    sizes = []
    for size, pad, k, d, s in (
        (h, top + bottom, kernel[0], dilation[0], strides[0]),
        (w, left + right, kernel[1], dilation[1], strides[1]),
    ):
        room = size + pad - ((k - 1) * d + 1)
        sizes.append((room + (s - 1 if ceil_mode else 0)) // s + 1)
    out = np.zeros(x.shape[:2] + tuple(sizes), np.float64)
    for i in range(sizes[0]):
        for j in range(sizes[1]):
            values, counted = [], 0
            for a in range(kernel[0]):
                for b in range(kernel[1]):
                    r = i * strides[0] + a * dilation[0] - top
                    c = j * strides[1] + b * dilation[1] - left
                    inside = 0 <= r < h and 0 <= c < w
                    in_padding = -top <= r < h + bottom and -left <= c < w + right
                    if inside:
                        values.append(x[:, :, r, c].astype(np.float64))
                    if inside or (count_include_pad and in_padding):
                        counted += 1
            if kind == "max":
                out[:, :, i, j] = np.max(values, axis=0) if values else -np.inf
            else:
                total = np.sum(values, axis=0) if values else 0.0
                out[:, :, i, j] = total / max(counted, 1)
    return out.astype(x.dtype)


@st.composite
def poolings(draw):
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return dict(
        hw=(draw(st.integers(1, 7)), draw(st.integers(1, 7))),
        kernel=kernel,
        strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        dilation=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
        padding=tuple(draw(st.integers(0, k // 2)) for k in kernel + kernel),
        ceil_mode=draw(st.booleans()),
        count_include_pad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _fits(p: dict) -> bool:
    top, left, bottom, right = p["padding"]
    spans = [(k - 1) * d + 1 for k, d in zip(p["kernel"], p["dilation"], strict=True)]
    return p["hw"][0] + top + bottom >= spans[0] and p["hw"][1] + left + right >= spans[1]


@covers("nn.max_pool2d", "nn.avg_pool2d")
@pytest.mark.parametrize("kind", ["max", "avg"])
@settings(max_examples=80, deadline=None)
@given(p=poolings())
def test_pool_against_direct_loop(kind: str, p: dict) -> None:
    assume(_fits(p))
    x = rand(np.random.default_rng(p["seed"]), (2, 3, *p["hw"]))
    attrs = dict(
        pool_size=p["kernel"],
        strides=p["strides"],
        dilation=p["dilation"],
        padding=p["padding"],
        ceil_mode=p["ceil_mode"],
    )
    if kind == "avg":
        attrs["count_include_pad"] = p["count_include_pad"]
    expected = naive_pool(
        x,
        kind,
        p["kernel"],
        p["strides"],
        p["dilation"],
        p["padding"],
        p["ceil_mode"],
        p["count_include_pad"],
    )
    check(f"nn.{kind}_pool2d", [x], expected, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("kind", ["max", "avg"])
@settings(max_examples=40, deadline=None)
@given(p=poolings())
def test_pool_against_torch(kind: str, p: dict) -> None:
    # Torch pads symmetrically, and has no dilation for average pooling.
    top, left = p["padding"][:2]
    dilation = p["dilation"] if kind == "max" else (1, 1)
    p = dict(p, padding=(top, left, top, left), dilation=dilation)
    assume(_fits(p))
    x = rand(np.random.default_rng(p["seed"]), (2, 3, *p["hw"]))
    if kind == "max":
        expected = F.max_pool2d(
            T(x), p["kernel"], p["strides"], (top, left), dilation, ceil_mode=p["ceil_mode"]
        )
        extra = {}
    else:
        expected = F.avg_pool2d(
            T(x),
            p["kernel"],
            p["strides"],
            (top, left),
            ceil_mode=p["ceil_mode"],
            count_include_pad=p["count_include_pad"],
        )
        extra = {"count_include_pad": p["count_include_pad"]}
    # In ceil mode torch drops a last window that would start in the padding; TVM keeps it.
    ty = infer(
        f"nn.{kind}_pool2d",
        [TensorType(x.shape)],
        pool_size=p["kernel"],
        strides=p["strides"],
        padding=(top, left),
        dilation=dilation,
        ceil_mode=p["ceil_mode"],
        **extra,
    )
    assume(ty.shape == tuple(expected.shape))
    check(
        f"nn.{kind}_pool2d",
        [x],
        expected.numpy(),
        rtol=1e-5,
        atol=1e-6,
        pool_size=p["kernel"],
        strides=p["strides"],
        padding=(top, left),
        dilation=dilation,
        ceil_mode=p["ceil_mode"],
        **extra,
    )


def test_ceil_mode_keeps_a_window_starting_in_the_padding() -> None:
    # TVM's shape rule: (5 + 2 - 2 + 1) // 2 + 1 = 4 windows; torch would make 3.
    x = np.arange(25, dtype="float32").reshape(1, 1, 5, 5)
    ty = infer(
        "nn.max_pool2d", [TensorType(x.shape)], pool_size=2, strides=2, padding=1, ceil_mode=True
    )
    assert ty == TensorType((1, 1, 4, 4))
    expected = naive_pool(x, "avg", (2, 2), (2, 2), (1, 1), (1, 1, 1, 1), True, True)
    check(
        "nn.avg_pool2d",
        [x],
        expected,
        pool_size=2,
        strides=2,
        padding=1,
        ceil_mode=True,
        count_include_pad=True,
    )


def test_ceil_mode_room_is_never_counted() -> None:
    # The last window covers input rows 2-3 and one row of ceil mode's room: divide by 2 rows.
    x = rand(np.random.default_rng(4), (1, 2, 4, 4))
    expected = F.avg_pool2d(T(x), 3, 2, ceil_mode=True, count_include_pad=True).numpy()
    check(
        "nn.avg_pool2d",
        [x],
        expected,
        rtol=1e-6,
        pool_size=3,
        strides=2,
        ceil_mode=True,
        count_include_pad=True,
    )


def test_integer_pooling() -> None:
    x = rand(np.random.default_rng(0), (1, 2, 4, 4), "int32", -20, 20)
    expected = F.max_pool2d(T(x).double(), 2, 2).numpy().astype("int32")
    check("nn.max_pool2d", [x], expected, pool_size=2, strides=2)
    sums = F.avg_pool2d(T(x).double(), 2, 2).numpy() * 4
    expected = np.trunc(sums / 4).astype("int32")  # integer averages truncate toward zero
    check("nn.avg_pool2d", [x], expected, pool_size=2, strides=2)


def test_pool_relation() -> None:
    n = SymDim("n")
    ty = infer("nn.max_pool2d", [TensorType((n, 3, ANY, 9))], pool_size=3, strides=2, padding=1)
    assert ty == TensorType((n, 3, ANY, 5))
    with pytest.raises(kiln.TypeCheckError, match=r"layout NCHW or NCHW\[b\]c"):
        infer("nn.avg_pool2d", [TensorType((1, 3, 4, 4))], pool_size=2, layout="NHWC")
    with pytest.raises(kiln.TypeCheckError, match="in the same layout"):
        infer("nn.avg_pool2d", [TensorType((1, 3, 4, 4, 8))], pool_size=2, layout="NCHW8c",
              out_layout="NCHW")
    with pytest.raises(kiln.TypeCheckError, match="axis of the channel block"):
        infer("nn.max_pool2d", [TensorType((1, 3, 4, 4, 4))], pool_size=2, layout="NCHW8c")
    with pytest.raises(kiln.TypeCheckError, match="adjoint supports layout NCHW only"):
        infer("nn.max_pool2d_grad", [TensorType((1, 3, 2, 2, 8)), TensorType((1, 3, 4, 4, 8))],
              pool_size=2, strides=2, layout="NCHW8c")
    ty = infer("nn.global_avg_pool2d", [TensorType((n, 3, 7, 5, 16))], layout="NCHW16c")
    assert ty == TensorType((n, 3, 1, 1, 16))


@covers("nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d")
@pytest.mark.parametrize("b", [4, 16])
def test_blocked_pools_against_torch(b: int) -> None:
    # the convert-layout pass's NCHW16c: windows over rows and columns, each channel alone
    x = np.random.default_rng(b).standard_normal((2, 2 * b, 9, 11))
    t = T(x)
    cases = [
        ("nn.max_pool2d", F.max_pool2d(t, 3, 2, 1),
         {"pool_size": 3, "strides": 2, "padding": 1}),
        ("nn.avg_pool2d", F.avg_pool2d(t, (3, 2), 2, (1, 1), count_include_pad=False),
         {"pool_size": (3, 2), "strides": 2, "padding": 1}),
        ("nn.avg_pool2d", F.avg_pool2d(t, 2, 1, 0, ceil_mode=True),
         {"pool_size": 2, "ceil_mode": True, "count_include_pad": True}),
        ("nn.global_avg_pool2d", t.mean(dim=(2, 3), keepdim=True), {}),
        ("nn.global_max_pool2d", t.amax(dim=(2, 3), keepdim=True), {}),
    ]
    for name, want, attrs in cases:
        check(name, [blocked(x, b)], blocked(want.numpy(), b), layout=f"NCHW{b}c", **attrs)
    with pytest.raises(kiln.TypeCheckError, match="window spans 5"):
        infer("nn.max_pool2d", [TensorType((1, 3, 4, 4))], pool_size=5)
    with pytest.raises(kiln.TypeCheckError, match="strides must be positive"):
        infer("nn.max_pool2d", [TensorType((1, 3, 4, 4))], pool_size=2, strides=0)
    with pytest.raises(kiln.Error, match="needs attribute 'pool_size'"):
        kiln.op.nn.max_pool2d(kiln.var("x", shape=(1, 1, 2, 2)))


@covers("nn.global_avg_pool2d", "nn.global_max_pool2d")
@pytest.mark.parametrize("seed", range(3))
def test_global_pools_against_torch(seed: int) -> None:
    x = rand(np.random.default_rng(seed), (2, 3, 4 + seed, 5))
    check("nn.global_avg_pool2d", [x], F.adaptive_avg_pool2d(T(x), 1).numpy(), rtol=1e-5)
    check("nn.global_max_pool2d", [x], F.adaptive_max_pool2d(T(x), 1).numpy())
    n = SymDim("n")
    ty = infer("nn.global_max_pool2d", [TensorType((n, 3, ANY, ANY))])
    assert ty == TensorType((n, 3, 1, 1))
