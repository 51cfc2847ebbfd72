"""nn.contrib_conv2d_NCHWc (TVM's convolution on channel-blocked tensors) against PyTorch.

The oracle is torch.nn.functional.conv2d on NCHW / OIHW arrays; the blocked inputs are made from
them, and the results read back, with numpy reshapes and transposes (tests/op/helpers.py; not with
kiln's layout code).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import kiln
from kiln.ir.ty import TensorType

from .helpers import blocked, blocked_kernel, check, covers, infer, unblocked

NAME = "nn.contrib_conv2d_NCHWc"


def torch_conv(x: np.ndarray, w: np.ndarray, strides=(1, 1), padding=(0, 0, 0, 0),
               dilation=(1, 1), groups: int = 1) -> np.ndarray:
    """conv2d by PyTorch in float64; padding (top, left, bottom, right) applied by np.pad."""
    top, left, bottom, right = padding
    x = np.pad(x.astype("float64"), ((0, 0), (0, 0), (top, bottom), (left, right)))
    out = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w.astype("float64")),
                                     stride=strides, dilation=dilation, groups=groups)
    return out.numpy()


# (data shape NCHW, weight shape OIHW, data block, kernel in-block, kernel out-block, attrs)
CASES = [
    ((1, 8, 5, 5), (8, 8, 3, 3), 4, 4, 4, {"padding": (1, 1, 1, 1)}),
    ((2, 4, 6, 7), (6, 4, 3, 2), 2, 2, 3,
     {"strides": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2)}),
    ((1, 8, 5, 4), (4, 4, 3, 3), 4, 2, 2, {"groups": 2, "padding": (1, 1, 1, 1)}),
    ((1, 6, 4, 4), (6, 6, 1, 1), 3, 3, 6, {}),
    ((1, 4, 4, 4), (8, 4, 2, 2), 1, 1, 8, {"strides": (2, 2)}),  # blocks of 1
]


@covers(NAME)
@pytest.mark.parametrize(("dshape", "wshape", "db", "ib", "ob", "attrs"), CASES,
                         ids=[str(c[-1]) for c in CASES])
def test_blocked_conv_against_torch(dshape, wshape, db, ib, ob, attrs) -> None:
    rng = np.random.default_rng(len(str(attrs)))
    x = rng.standard_normal(dshape)
    w = rng.standard_normal(wshape)
    expected = torch_conv(x, w, strides=attrs.get("strides", (1, 1)),
                          padding=attrs.get("padding", (0, 0, 0, 0)),
                          dilation=attrs.get("dilation", (1, 1)), groups=attrs.get("groups", 1))
    out = check(NAME, [blocked(x, db), blocked_kernel(w, ib, ob)], blocked(expected, ob),
                rtol=1e-10, atol=1e-12, channels=wshape[0], kernel_size=wshape[2:],
                data_layout=f"NCHW{db}c", kernel_layout=f"OIHW{ib}i{ob}o",
                out_layout=f"NCHW{ob}c", **attrs)
    assert out.flags.c_contiguous


@covers(NAME)
def test_out_layout_defaults_to_data_layout_and_may_differ() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 4, 4, 4)), rng.standard_normal((8, 4, 3, 3))
    expected = torch_conv(x, w, padding=(1, 1, 1, 1))
    xb, wb = blocked(x, 2), blocked_kernel(w, 2, 4)
    common = {"padding": 1, "data_layout": "NCHW2c", "kernel_layout": "OIHW2i4o"}
    check(NAME, [xb, wb], blocked(expected, 2), rtol=1e-10, atol=1e-12, **common)
    # the result unblocked (NCHW) and blocked by 8
    check(NAME, [xb, wb], expected, rtol=1e-10, atol=1e-12, out_layout="NCHW", **common)
    check(NAME, [xb, wb], blocked(expected, 8), rtol=1e-10, atol=1e-12,
          out_layout="NCHW8c", **common)


@covers(NAME)
def test_unblocked_layouts_are_conv2d() -> None:
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    check(NAME, [x, w], torch_conv(x, w, strides=(2, 2)), rtol=1e-10, atol=1e-12, strides=2)


@covers(NAME)
def test_mixed_integer_inputs_accumulate_exactly_in_out_dtype() -> None:
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, size=(1, 4, 4, 4)).astype("uint8")
    w = rng.integers(-128, 128, size=(4, 4, 3, 3)).astype("int8")
    expected = torch_conv(x, w, padding=(1, 1, 1, 1))  # exact in float64 at these sizes
    check(NAME, [blocked(x, 4), blocked_kernel(w, 4, 4)],
          blocked(expected, 4).astype("int32"), padding=1, out_dtype="int32",
          data_layout="NCHW4c", kernel_layout="OIHW4i4o", out_layout="NCHW4c")


def _types(dshape, wshape, dtype: str = "float32") -> list[TensorType]:
    return [TensorType(dshape, dtype), TensorType(wshape, dtype)]


def test_relation_is_tvms_shape_in_the_out_layout() -> None:
    # TVM's AlterOpLayout output for a 3x3 conv of (1, 4, 4, 4) data, printed by TVM 0.12
    t = infer(NAME, _types((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4)), padding=(1, 1, 1, 1),
              channels=4, kernel_size=(3, 3), data_layout="NCHW4c",
              kernel_layout="OIHW4i4o", out_layout="NCHW4c")
    assert t == TensorType((1, 1, 4, 4, 4), "float32")
    t = infer(NAME, _types((2, 2, 9, 9, 8), (4, 2, 3, 3, 8, 16)), strides=2,
              data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW32c",
              out_dtype="float64")
    assert t == TensorType((2, 2, 4, 4, 32), "float64")
    # unknown spatial sizes stay unknown
    t = infer(NAME, _types((1, 2, kiln.ANY, 5, 4), (1, 2, 3, 3, 4, 4)),
              data_layout="NCHW4c", kernel_layout="OIHW4i4o")
    assert isinstance(t, TensorType) and t.shape[2] == kiln.ANY and t.shape[3] == 3


@pytest.mark.parametrize(("dshape", "wshape", "attrs", "message"), [
    ((1, 2, 4, 4, 4), (1, 1, 3, 3, 4, 4), {}, "8 channels.*expects 4 input channels"),
    ((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4), {"channels": 8}, "channels=8.*4 output channels"),
    ((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4), {"kernel_size": (2, 2)}, "kernel_size=\\[2, 2\\]"),
    ((1, 1, 4, 4, 3), (1, 1, 3, 3, 4, 4), {}, "has 3 in the axis of block 4c"),
    ((1, 1, 4, 4), (1, 1, 3, 3, 4, 4), {}, "rank 4, but layout NCHW4c has 5"),
    ((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4), {"out_layout": "NCHW8c"},
     "axis C of size 4 cannot be split into blocks of 8"),
    ((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4), {"data_layout": "NCDW4c"}, "axes NCHW"),
    ((1, 1, 4, 4, 4), (1, 1, 3, 3, 4, 4), {"kernel_layout": "OIHW4i4c"}, "invalid layout"),
    ((1, 1, 2, 2, 4), (1, 1, 3, 3, 4, 4), {}, "padded input has only 2"),
])
def test_relation_errors_say_what_is_wrong(dshape, wshape, attrs, message) -> None:
    full = {"data_layout": "NCHW4c", "kernel_layout": "OIHW4i4o", **attrs}
    with pytest.raises(kiln.TypeCheckError, match=message):
        infer(NAME, _types(dshape, wshape), **full)


# TVM 0.12's output for a 3x3 conv with a bias and relu on x86, as tvm.relay printed it:
# after AlterOpLayout (nchwc_altered.rly), and after FuseOps too (nchwc_fused.rly: the fused
# functions carry TVM's attributes, Primitive, hash and the layouts).
DATA = Path(__file__).parent / "data"


@covers(NAME)
@pytest.mark.parametrize("name", ["nchwc_altered.rly", "nchwc_fused.rly"])
def test_tvm_printed_program_runs_in_the_interpreter_and_compiled(name: str) -> None:
    mod = kiln.parse((DATA / name).read_text(), source_name=name)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    w = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    b = rng.standard_normal(8).astype("float32")
    expected = np.maximum(torch_conv(x, w, padding=(1, 1, 1, 1)) + b.reshape(1, 8, 1, 1), 0)
    interpreted = kiln.interpret(mod, x, w, b)
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-5)
    compiled = kiln.build(mod)(x, w, b)
    np.testing.assert_allclose(compiled, expected, rtol=1e-5, atol=1e-5)


def test_gradient_is_conv2ds_in_the_blocked_layouts() -> None:
    # d/dx and d/dw of sum(conv * seed), against PyTorch's autograd, through kiln.grad.
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((1, 4, 5, 5)), rng.standard_normal((6, 4, 3, 3))
    seed = rng.standard_normal((1, 6, 2, 5))
    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    out = torch.nn.functional.conv2d(torch.nn.functional.pad(xt, (1, 1, 0, 0)), wt,
                                     stride=(2, 1))
    (out * torch.from_numpy(seed)).sum().backward()
    assert xt.grad is not None and wt.grad is not None

    xv = kiln.var("x", shape=(1, 2, 5, 5, 2), dtype="float64")
    wv = kiln.var("w", shape=(3, 2, 3, 3, 2, 2), dtype="float64")
    sv = kiln.var("s", shape=(1, 3, 2, 5, 2), dtype="float64")
    conv = kiln.op.nn.contrib_conv2d_nchwc(xv, wv, strides=(2, 1), padding=(0, 1),
                                           data_layout="NCHW2c", kernel_layout="OIHW2i2o")
    loss = kiln.op.sum(kiln.op.multiply(conv, sv))
    fn = kiln.infer_types(kiln.Function([xv, wv, sv], loss))
    for mode in ("higher_order", "first_order"):
        gfn = kiln.grad(fn, mode=mode, wrt=(0, 1), keeping=())
        dx, dw = kiln.interpret(gfn, blocked(x, 2), blocked_kernel(w, 2, 2), blocked(seed, 2))
        np.testing.assert_allclose(unblocked(dx), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dw, blocked_kernel(wt.grad.numpy(), 2, 2), rtol=1e-10,
                                   atol=1e-12)
