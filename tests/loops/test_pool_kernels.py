"""Max pooling's two-pass kernel (kiln/loops/pool_kernels.py) against a brute-force numpy
window maximum: strides, padding, dilation, ceil mode, NaNs, one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.op import nn
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(11)


def brute_force(x: np.ndarray, pool: tuple, strides: tuple, padding: tuple, dilation: tuple,
                out_hw: tuple) -> np.ndarray:
    """Each output element the max of its window's taps inside the image (-inf if none);
    a NaN tap makes it NaN."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (top, left) = pool, strides, dilation, padding[:2]
    out = np.full((n, c) + tuple(out_hw), -np.inf, dtype=x.dtype)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            taps = [x[:, :, y, xx] for ky in range(kh) for kx in range(kw)
                    if 0 <= (y := oy * sh + ky * dh - top) < h
                    and 0 <= (xx := ox * sw + kx * dw - left) < w]
            if taps:
                stack = np.stack(taps)
                out[:, :, oy, ox] = np.where(np.isnan(stack).any(0), np.nan, stack.max(0))
    return out


CASES = [  # shape, pool, strides, padding (top, left, bottom, right), dilation, ceil mode
    ((1, 8, 32, 32), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),  # ResNet's, small
    ((2, 3, 17, 23), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
    ((1, 4, 15, 15), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),  # ceil: a window past the end
    ((1, 2, 9, 12), (3, 2), (1, 3), (2, 0, 1, 2), (2, 1), False),  # dilated, uneven padding
    ((1, 5, 4, 4), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), False),  # windows larger than the image
    ((1, 3, 40, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),  # a row shorter than a vector
]


@pytest.mark.parametrize("shape,pool,strides,padding,dilation,ceil", CASES)
def test_max_pool2d_rows_then_columns(shape: tuple, pool: tuple, strides: tuple,
                                      padding: tuple, dilation: tuple, ceil: bool) -> None:
    x = kiln.var("x", shape=shape, dtype="float32")
    body = nn.max_pool2d(x, pool_size=pool, strides=strides, padding=padding,
                         dilation=dilation, ceil_mode=ceil)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], body)))
    (f,) = exe.kernels.functions.values()
    assert any(s.get("kernel") == "max pool rows" for _, s in f.kernel.attrs["schedules"])
    a = RNG.standard_normal(shape).astype(np.float32)
    a.flat[RNG.integers(0, a.size, 3)] = np.nan
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(a))
    np.testing.assert_array_equal(results[0], results[1])
    want = brute_force(a, pool, strides, padding, dilation, results[0].shape[2:])
    np.testing.assert_array_equal(results[0], want)
