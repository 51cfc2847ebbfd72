"""The operators gradients are built from, against PyTorch and adjoint identities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir.ty import TensorType

from .helpers import check, covers, infer, rand, run


def _t(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(a), requires_grad=grad)


# --- collapse_sum_like, broadcast_to_like, reshape_like ------------------------------------

SHAPE_PAIRS = [((2, 3, 4), (3, 1)), ((2, 3), (2, 3)), ((4, 1, 5), (1, 1, 1)), ((3, 2), ())]


@covers("collapse_sum_like", "broadcast_to_like")
@pytest.mark.parametrize(("big", "small"), SHAPE_PAIRS)
def test_collapse_and_broadcast_like_against_torch(big, small) -> None:
    rng = np.random.default_rng(0)
    x = rand(rng, big, "float64")
    like = rand(rng, small, "float32")  # only the shape matters
    expected = _t(x).sum_to_size(small).numpy() if small else np.asarray(x.sum())
    check("collapse_sum_like", [x, like], expected.reshape(small), rtol=1e-12)
    y = rand(rng, small, "float64")
    wide = rand(rng, big, "float32")
    check("broadcast_to_like", [y, wide], torch.broadcast_to(_t(y), big).numpy())


def test_like_relations_reject_shapes_that_do_not_broadcast() -> None:
    with pytest.raises(kiln.TypeCheckError, match="cannot broadcast"):
        infer("collapse_sum_like", [TensorType((2, 3), "float32"), TensorType((2,), "float32")])
    with pytest.raises(kiln.TypeCheckError, match="does not broadcast"):
        infer("collapse_sum_like", [TensorType((1, 3), "float32"), TensorType((3, 1), "float32")])
    with pytest.raises(kiln.TypeCheckError, match="more dimensions"):
        infer("broadcast_to_like", [TensorType((1, 2, 3), "float32"), TensorType((3,), "float32")])
    with pytest.raises(kiln.TypeCheckError, match="numbers of elements differ"):
        infer("reshape_like", [TensorType((2, 3), "float32"), TensorType((5,), "int32")])


@covers("reshape_like")
def test_reshape_like_against_torch() -> None:
    x = np.arange(24.0).reshape(2, 3, 4)
    like = np.zeros((6, 4), "int32")
    check("reshape_like", [x, like], _t(x).reshape(6, 4).numpy())
    assert infer(
        "reshape_like", [TensorType((2, "n"), "float32"), TensorType(("n", 2), "float32")]
    ) == TensorType(("n", 2), "float32")


# --- take_grad, strided_slice_grad ---------------------------------------------------------


@covers("take_grad")
@pytest.mark.parametrize(
    ("shape", "indices", "attrs"),
    [
        ((5, 3), [[0, 4], [4, 2]], {"axis": 0}),
        ((2, 6), [1, 1, 5], {"axis": 1}),
        ((3, 4), [11, 0, 11], {}),  # axis None: the flattened tensor
        ((2, 5, 3), [[7, -1], [2, 2]], {"axis": 1, "mode": "wrap"}),
        ((2, 5, 3), [[9, 1], [0, -4]], {"axis": 1, "mode": "clip", "batch_dims": 1}),
    ],
)
def test_take_grad_is_the_gradient_of_take_in_torch(shape, indices, attrs) -> None:
    rng = np.random.default_rng(1)
    x = rand(rng, shape, "float64")
    idx = np.asarray(indices, "int64")
    out = run("take", x, idx, **attrs)
    g = rand(rng, np.shape(out), "float64")
    # torch oracle: gather the same elements by explicit (clipped/wrapped) positions
    tx = _t(x, grad=True)
    axis, batch = attrs.get("axis"), attrs.get("batch_dims", 0)
    n = x.size if axis is None else x.shape[axis]
    pos = np.clip(idx, 0, n - 1) if attrs.get("mode", "clip") == "clip" else np.mod(idx, n)
    if axis is None:
        taken = tx.reshape(-1)[torch.tensor(pos)]
    elif batch:
        taken = torch.stack([tx[b].index_select(0, torch.tensor(pos[b]).reshape(-1))
                             .reshape(*pos[b].shape, *x.shape[2:]) for b in range(x.shape[0])])
    else:
        taken = torch.index_select(tx, axis, torch.tensor(pos).reshape(-1))
        taken = taken.reshape(*x.shape[:axis], *pos.shape, *x.shape[axis + 1:])
    taken.backward(_t(g))
    check("take_grad", [g, x, idx], tx.grad.numpy(), rtol=1e-12, **attrs)


@covers("strided_slice_grad")
@pytest.mark.parametrize(
    "attrs",
    [
        {"begin": [1, 0], "end": [3, 4], "strides": [1, 2]},
        {"begin": [0], "end": [-1], "axes": [1]},
        {"begin": [1, 1], "end": [2, 3], "slice_mode": "size"},
    ],
)
def test_strided_slice_grad_is_the_gradient_of_slicing_in_torch(attrs) -> None:
    rng = np.random.default_rng(2)
    x = rand(rng, (4, 5), "float64")
    out = run("strided_slice", x, **attrs)
    g = rand(rng, np.shape(out), "float64")
    tx = _t(x, grad=True)
    index = [slice(None)] * 2
    axes = attrs.get("axes", range(len(attrs["begin"])))
    for k, a in enumerate(axes):
        b, e = attrs["begin"][k], attrs["end"][k]
        if attrs.get("slice_mode") == "size":
            e = b + e
        index[a] = slice(b, e, attrs.get("strides", [1] * 2)[k])
    tx[tuple(index)].backward(_t(g))
    check("strided_slice_grad", [g, x], tx.grad.numpy(), rtol=1e-12, **attrs)


def test_strided_slice_grad_with_negative_strides_places_each_element() -> None:
    x = np.zeros((6,))
    g = np.array([1.0, 2.0, 3.0])
    out = run("strided_slice_grad", g, x, begin=[5], end=[0], strides=[-2])
    np.testing.assert_array_equal(out, [0, 3, 0, 2, 0, 1])


# --- convolution adjoints ------------------------------------------------------------------

CONV_CASES = [
    # (data shape, weight OIHW shape, attrs)
    ((2, 4, 7, 6), (6, 4, 3, 3), {"strides": 2, "padding": 1}),
    ((1, 4, 6, 6), (4, 2, 3, 2), {"groups": 2, "dilation": (2, 1), "padding": (1, 0)}),
    ((2, 3, 5, 5), (3, 1, 3, 3), {"groups": 3, "strides": (1, 2), "padding": 2}),
]


@covers("nn.conv2d_backward_weight")
@pytest.mark.parametrize(("dshape", "wshape", "attrs"), CONV_CASES)
def test_conv2d_backward_weight_against_torch(dshape, wshape, attrs) -> None:
    rng = np.random.default_rng(3)
    x, w = rand(rng, dshape, "float64"), rand(rng, wshape, "float64")
    y = run("nn.conv2d", x, w, **attrs)
    g = rand(rng, np.shape(y), "float64")
    tw = _t(w, grad=True)
    pad = attrs.get("padding", 0)
    F.conv2d(_t(x), tw, stride=attrs.get("strides", 1), padding=pad,
             dilation=attrs.get("dilation", 1), groups=attrs.get("groups", 1)).backward(_t(g))
    check("nn.conv2d_backward_weight", [g, x], tw.grad.numpy(), rtol=1e-10,
          kernel_size=wshape[2:], channels=wshape[0], **attrs)


@covers("nn.conv2d_transpose")
@pytest.mark.parametrize(("dshape", "wshape", "attrs"), CONV_CASES)
def test_conv2d_transpose_against_torch(dshape, wshape, attrs) -> None:
    # conv2d_transpose(y, w) with output_padding recovers the shape of conv2d's data.
    rng = np.random.default_rng(4)
    x, w = rand(rng, dshape, "float64"), rand(rng, wshape, "float64")
    y = rand(rng, np.shape(run("nn.conv2d", x, w, **attrs)), "float64")
    strides = np.broadcast_to(attrs.get("strides", 1), 2)
    dilation = np.broadcast_to(attrs.get("dilation", 1), 2)
    pad = np.broadcast_to(attrs.get("padding", 0), 2)
    extra = [
        dshape[2 + i] + 2 * pad[i] - dilation[i] * (wshape[2 + i] - 1) - 1
        - (y.shape[2 + i] - 1) * strides[i] for i in range(2)
    ]
    expected = F.conv_transpose2d(
        _t(y), _t(w), stride=tuple(strides), padding=tuple(pad), output_padding=tuple(extra),
        groups=attrs.get("groups", 1), dilation=tuple(dilation),
    ).numpy()
    out = check("nn.conv2d_transpose", [y, w], expected, rtol=1e-10, output_padding=extra,
                **attrs)
    assert out.shape == dshape


def test_conv2d_transpose_is_the_adjoint_of_conv2d_with_asymmetric_padding() -> None:
    # <conv2d(x, w), y> == <x, conv2d_transpose(y, w)>, an oracle independent of both.
    rng = np.random.default_rng(5)
    attrs = {"strides": (2, 3), "padding": (2, 0, 1, 1), "dilation": (1, 2), "groups": 2}
    x, w = rand(rng, (2, 4, 9, 10), "float64"), rand(rng, (6, 2, 3, 3), "float64")
    conv = run("nn.conv2d", x, w, **attrs)
    y = rand(rng, np.shape(conv), "float64")
    extra = [(9 + 3 - 3) % 2, (10 + 1 - 5) % 3]
    back = run("nn.conv2d_transpose", y, w, output_padding=extra, **attrs)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.sum(conv * y), np.sum(x * back), rtol=1e-12)


def test_conv2d_transpose_relation_checks_its_arguments() -> None:
    d, w = TensorType((1, 4, 5, 5), "float32"), TensorType((4, 3, 3, 3), "float32")
    assert infer("nn.conv2d_transpose", [d, w], strides=2, padding=1) == TensorType(
        (1, 3, 9, 9), "float32"
    )
    with pytest.raises(kiln.TypeCheckError, match="output_padding"):
        infer("nn.conv2d_transpose", [d, w], output_padding=1)
    with pytest.raises(kiln.TypeCheckError, match="expects 4 input channels"):
        infer("nn.conv2d_transpose", [TensorType((1, 3, 5, 5), "float32"), w])
    with pytest.raises(kiln.TypeCheckError, match="needs kernel_size"):
        infer("nn.conv2d_backward_weight", [TensorType((1, 4, 3, 3), "float32"), d])


# --- pooling adjoints ----------------------------------------------------------------------

POOL_CASES = [
    {"pool_size": 2, "strides": 2},
    {"pool_size": 3, "strides": 2, "padding": 1},
    {"pool_size": (2, 3), "strides": (1, 2), "padding": (1, 1)},
]


@covers("nn.max_pool2d_grad")
@pytest.mark.parametrize("attrs", POOL_CASES)
def test_max_pool2d_grad_against_torch(attrs) -> None:
    rng = np.random.default_rng(6)
    x = rand(rng, (2, 3, 7, 8), "float64")
    g = rand(rng, np.shape(run("nn.max_pool2d", x, **attrs)), "float64")
    tx = _t(x, grad=True)
    F.max_pool2d(tx, attrs["pool_size"], attrs["strides"], attrs.get("padding", 0)).backward(_t(g))
    check("nn.max_pool2d_grad", [g, x], tx.grad.numpy(), rtol=1e-12, **attrs)


@covers("nn.avg_pool2d_grad")
@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_grad_against_torch(attrs, count_include_pad) -> None:
    rng = np.random.default_rng(7)
    x = rand(rng, (2, 3, 7, 8), "float64")
    out = run("nn.avg_pool2d", x, count_include_pad=count_include_pad, **attrs)
    g = rand(rng, np.shape(out), "float64")
    tx = _t(x, grad=True)
    F.avg_pool2d(tx, attrs["pool_size"], attrs["strides"], attrs.get("padding", 0),
                 count_include_pad=count_include_pad).backward(_t(g))
    check("nn.avg_pool2d_grad", [g, x], tx.grad.numpy(), rtol=1e-12,
          count_include_pad=count_include_pad, **attrs)


def test_pool_grads_are_adjoints_in_ceil_mode_with_dilation() -> None:
    # <pool(x), g> = <x, pool_grad(g, x)> for the linear average pooling, and for max pooling
    # at a point without ties (where max pooling is locally linear).
    rng = np.random.default_rng(8)
    attrs = {"pool_size": 2, "strides": 2, "dilation": 2, "ceil_mode": True, "padding": (0, 1)}
    x = rand(rng, (1, 2, 9, 8), "float64")
    for op in ("nn.avg_pool2d", "nn.max_pool2d"):
        out = run(op, x, **attrs)
        g = rand(rng, np.shape(out), "float64")
        back = run(op + "_grad", g, x, **attrs)
        np.testing.assert_allclose(np.sum(out * g), np.sum(x * back), rtol=1e-12)


def test_pool_grad_relation_checks_out_grad_shape() -> None:
    d = TensorType((1, 2, 6, 6), "float32")
    with pytest.raises(kiln.TypeCheckError, match="out_grad has shape"):
        infer("nn.max_pool2d_grad", [TensorType((1, 2, 2, 2), "float32"), d], pool_size=2,
              strides=2)
