"""nn.max_pool2d_grad's kernel (kiln/loops/pool_grad_kernels.py), built and run natively,
against the numpy reference bit for bit (ties included: the first largest tap of a window in
row-major order wins, a NaN before any number) and against torch's backward where no window
has a tie."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir import Function, IRModule, var
from kiln.op import nn
from kiln.op.nn.pool import _max_pool2d_grad, max_pool2d_grad

from ..op.helpers import run

# (data shape, attrs): odd sizes, padding past half the window, asymmetric padding, ceil
# mode (whose last window may start in the padding), stride above the kernel, dilation, a
# window wider than the data, and ResNet-18's stem pool at a small size.
CASES = [
    ((2, 3, 9, 11), {"pool_size": 3, "strides": 2, "padding": 1}),
    ((1, 2, 7, 8), {"pool_size": 2, "strides": 2}),
    ((1, 2, 7, 9), {"pool_size": (2, 3), "strides": (1, 2), "padding": (1, 1)}),
    ((1, 2, 8, 7), {"pool_size": 3, "strides": 2, "padding": (0, 1, 2, 2), "ceil_mode": True}),
    ((1, 3, 10, 11), {"pool_size": 2, "strides": 3, "padding": 1}),
    ((1, 2, 9, 8), {"pool_size": 2, "strides": 2, "dilation": 2, "ceil_mode": True,
                    "padding": (0, 1)}),
    ((1, 1, 3, 4), {"pool_size": (4, 5), "strides": 1, "padding": 2}),
    ((2, 4, 28, 28), {"pool_size": 3, "strides": 2, "padding": 1}),
]


def _built(g: np.ndarray, x: np.ndarray, attrs: dict) -> np.ndarray:
    gv, xv = var("g", shape=g.shape, dtype=g.dtype.name), var("x", shape=x.shape,
                                                              dtype=x.dtype.name)
    exe = kiln.build(IRModule.from_expr(Function((gv, xv), nn.max_pool2d_grad(gv, xv, **attrs))))
    return np.asarray(exe(g, x))


def _reference(g: np.ndarray, x: np.ndarray, attrs: dict) -> np.ndarray:
    return _max_pool2d_grad([g, x], max_pool2d_grad.normalize_attrs(attrs))


@pytest.mark.parametrize(("shape", "attrs"), CASES)
def test_max_pool2d_grad_kernel_equals_the_reference_with_ties(shape, attrs) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 2, size=shape).astype("float32")  # four values: most windows tie
    x.flat[rng.choice(x.size, 3, replace=False)] = np.nan
    x.flat[rng.choice(x.size, 3, replace=False)] = -np.inf
    pooled = np.asarray(run("nn.max_pool2d", x, **attrs))
    g = rng.integers(-8, 8, size=pooled.shape).astype("float32") / 4
    np.testing.assert_array_equal(_built(g, x, attrs), _reference(g, x, attrs))


def test_max_pool2d_grad_kernel_of_a_window_all_minus_inf() -> None:
    # No tap beats -inf: the first tap wins, and adds nothing when it is in the padding.
    x = np.full((1, 1, 5, 6), -np.inf, "float32")
    attrs = {"pool_size": 3, "strides": 2, "padding": 1}
    g = np.arange(1, 10, dtype="float32").reshape(1, 1, 3, 3)
    np.testing.assert_array_equal(_built(g, x, attrs), _reference(g, x, attrs))


@pytest.mark.parametrize(("shape", "attrs"), [c for c in CASES if "dilation" not in c[1]
                                              and c[1].get("padding", 0) in (0, 1)])
def test_max_pool2d_grad_kernel_against_torch(shape, attrs) -> None:
    rng = np.random.default_rng(4)
    x = rng.permutation(int(np.prod(shape))).reshape(shape).astype("float32")  # no ties
    tx = torch.from_numpy(x).requires_grad_()
    out = F.max_pool2d(tx, attrs["pool_size"], attrs["strides"], attrs.get("padding", 0),
                       ceil_mode=attrs.get("ceil_mode", False))
    g = rng.standard_normal(out.shape).astype("float32")
    out.backward(torch.from_numpy(g))
    got = _built(g, x, attrs)
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-6, atol=1e-6)
