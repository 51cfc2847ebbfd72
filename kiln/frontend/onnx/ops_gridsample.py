"""The converter of ONNX's GridSample: sampling an N-C-spatial tensor at run-time positions.

The grid gives, for every output position, normalized coordinates in [-1, 1] (x first: the
last spatial axis). Each is mapped to an input coordinate (``align_corners`` decides whether
-1 and 1 are the centers or the outer edges of the border samples), moved back inside by the
``padding_mode`` (``border`` clamps, ``reflection`` reflects), and interpolated from its
neighbours: 1 (``nearest``, halves to even), 2 (``linear``) or 4 (``cubic``, Keys' kernel
with a = -0.75) per spatial axis. Every combination of neighbours is one ``take`` from the
input flattened to (N * spatial, C), with run-time indices, weighted and summed; ``zeros``
padding gives neighbours outside the input weight 0. This follows ONNX's reference
implementation step by step, for any number of spatial axes.
"""

from __future__ import annotations

import itertools

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr

_A = -0.75  # the cubic kernel's parameter in ONNX's reference


def reflect(v: Expr, lo: float, hi: float, dtype: str) -> Expr:
    """``v`` reflected at the borders ``lo`` and ``hi`` until it lies between them."""
    def c(x: float) -> Expr:
        return const_like(x, dtype)

    span = hi - lo
    if span <= 0:
        return op.add(op.zeros_like(v), c(lo))  # a single sample: every position is it
    below = op.subtract(c(lo), v)
    above = op.subtract(v, c(hi))

    def fold(dx: Expr, near: float, far: float, sign: float) -> Expr:
        n = op.floor(op.divide(dx, c(span)))
        r = op.subtract(dx, op.multiply(n, c(span)))
        even = op.equal(op.floor_mod(n, c(2.0)), c(0.0))
        return op.where(even, op.add(c(near), op.multiply(c(sign), r)),
                        op.subtract(c(far), op.multiply(c(sign), r)))

    low = fold(below, lo, hi, 1.0)
    high = fold(above, hi, lo, -1.0)
    return op.where(op.less(v, c(lo)), low, op.where(op.greater(v, c(hi)), high, v))


def _cubic(t: Expr, dtype: str) -> list[Expr]:
    """Keys' cubic weights of the neighbours at -1, 0, 1, 2 for a fraction ``t``."""
    def c(x: float) -> Expr:
        return const_like(x, dtype)

    def far(d: Expr) -> Expr:  # 1 < |d| < 2
        return op.subtract(op.multiply(op.add(op.multiply(op.subtract(
            op.multiply(c(_A), d), c(5 * _A)), d), c(8 * _A)), d), c(4 * _A))

    def near(d: Expr) -> Expr:  # |d| <= 1
        return op.add(op.multiply(op.multiply(op.subtract(
            op.multiply(c(_A + 2), d), c(_A + 3)), d), d), c(1.0))

    one_minus = op.subtract(c(1.0), t)
    return [far(op.add(t, c(1.0))), near(t), near(one_minus), far(op.add(one_minus, c(1.0)))]


@converter("GridSample", since=16)
def grid_sample(ctx: NodeContext) -> Expr:
    shape, gshape = ctx.shape(0), ctx.shape(1)
    k = len(shape) - 2
    if k < 1 or len(gshape) != k + 2 or gshape[-1] != k or gshape[0] != shape[0]:
        raise ctx.error(f"the grid must have shape (N, ..., {k}) for an input of shape "
                        f"{shape}, not {gshape}")
    mode = ctx.attr("mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)  # GridSample-16 names
    padding = ctx.attr("padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border",
                                                                       "reflection"):
        raise ctx.error(f"mode {mode!r} / padding_mode {padding!r} is not one ONNX defines")
    align = bool(ctx.attr("align_corners", 0))
    taps_per_axis = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    ctx.check_unroll(taps_per_axis ** k, f"the samples per output element ({taps_per_axis} per "
                     f"axis over {k} axes, each a gather kiln builds in turn)")
    ctx.check_elements((shape[0],), "its table of batch offsets")
    n, channels, sizes = shape[0], shape[1], shape[2:]
    out = list(gshape[1:-1])
    dtype, gdtype = ctx.dtype(0), ctx.dtype(1)

    def c(x: float) -> Expr:
        return const_like(x, gdtype)

    grid = ctx.x(1)
    axes: list[list[tuple[Expr, Expr, Expr | None]]] = []  # per axis: (index, weight, valid)
    for i, size in enumerate(sizes):
        g = op.take(grid, const_like(k - 1 - i, "int64"), axis=len(gshape) - 1)
        pos: Expr = (
            op.multiply(op.divide(op.add(g, c(1.0)), c(2.0)), c(size - 1)) if align else
            op.divide(op.subtract(op.multiply(op.add(g, c(1.0)), c(size)), c(1.0)), c(2.0)))
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            pos = op.nearbyint(pos)  # halves to even
        if padding == "border":
            outside = op.logical_or(op.less(pos, c(lo)), op.greater(pos, c(hi)))
            pos = op.where(outside, op.clip(pos, a_min=0.0, a_max=float(size - 1)), pos)
        elif padding == "reflection":
            pos = reflect(pos, lo, hi, gdtype)

        def pixel(index: Expr, size: int = size, lo: float = lo, hi: float = hi
                  ) -> tuple[Expr, Expr | None]:
            """An integer coordinate made valid by the padding mode (and zeros' mask)."""
            if padding == "zeros":
                valid = op.logical_and(op.greater_equal(index, c(0.0)),
                                       op.less(index, c(float(size))))
                return op.clip(index, a_min=0.0, a_max=float(size - 1)), valid
            if padding == "reflection":
                index = reflect(index, lo, hi, gdtype)
            return op.clip(index, a_min=0.0, a_max=float(size - 1)), None

        base = op.floor(pos)
        frac = op.subtract(pos, base)
        if mode == "nearest":
            taps: list[tuple[Expr, Expr]] = [(pos, op.ones_like(pos))]
        elif mode == "linear":
            taps = [(base, op.subtract(c(1.0), frac)), (op.add(base, c(1.0)), frac)]
        else:
            weights = _cubic(frac, gdtype)
            taps = [(op.add(base, c(float(d))), w) for d, w in zip((-1, 0, 1, 2), weights)]
        entries: list[tuple[Expr, Expr, Expr | None]] = []
        for index, tap_weight in taps:
            fixed, valid = pixel(index)
            # Truncation toward zero, as the reference's int() (reflected values are >= -0.5).
            entries.append((cast(fixed, "int64"), tap_weight, valid))
        axes.append(entries)
    # X as (N * spatial, C): row n * S + flat index.
    spatial = int(np.prod(sizes))
    flat_x = op.reshape(op.transpose(ctx.x(0), axes=[0, *range(2, k + 2), 1]),
                        newshape=[n * spatial, channels])
    strides = [int(np.prod(sizes[i + 1:])) for i in range(k)]
    batch_offset = Constant((np.arange(n) * spatial).reshape([n] + [1] * len(out))
                            .astype("int64"))
    total: Expr | None = None
    for combo in itertools.product(*axes):
        flat: Expr = batch_offset
        weight: Expr | None = None
        for (index, w, valid), stride in zip(combo, strides):
            flat = op.add(flat, op.multiply(index, const_like(stride, "int64")))
            if valid is not None:
                w = op.where(valid, w, c(0.0))
            weight = w if weight is None else op.multiply(weight, w)
        assert weight is not None
        sample = op.take(flat_x, flat, axis=0)  # (N, out..., C)
        term = op.multiply(sample, op.expand_dims(cast(weight, dtype), axis=len(out) + 1))
        total = term if total is None else op.add(total, term)
    assert total is not None
    return op.transpose(total, axes=[0, len(out) + 1, *range(1, len(out) + 1)])
