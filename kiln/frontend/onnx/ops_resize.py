"""Converters of ONNX's Resize and Upsample, as one matrix (or one gather) per resized axis.

Resizing is separable: along each axis, every output position is a fixed combination of a
few input positions, whose weights depend only on the shapes and attributes — all known at
import time. So the converter computes, in numpy, a weight matrix ``W`` (output length x
input length) per resized axis and applies it with ``nn.dense`` on that axis moved last:

    y = dense(x moved so the axis is last, W)  (+ the extrapolation value where ONNX's
    ``tf_crop_and_resize`` samples outside the input)

``nearest`` mode, where each row of ``W`` has a single 1, becomes ``take`` with the chosen
indices instead: exact for every dtype. The weights follow the ONNX specification: the
coordinate transformations (``half_pixel``, ``half_pixel_symmetric``, ``pytorch_half_pixel``,
``align_corners``, ``asymmetric``, ``tf_crop_and_resize``), ``nearest_mode``, linear and
cubic kernels (``cubic_coeff_a``), ``exclude_outside``, ``antialias``, ``axes`` and
``keep_aspect_ratio_policy``. Edge samples repeat the border (ONNX pads in "edge" mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr

Kernel = Callable[[float, float], np.ndarray]  # (ratio, scale) -> weights of n neighbours


def nearest_kernel(mode: str) -> Kernel:
    def weights(ratio: float, scale: float) -> np.ndarray:
        if ratio == 1.0:  # on a sample (see `axis_weights`): take it
            return np.array([0.0, 1.0])
        pick_right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                      "floor": False, "ceil": True}[mode]
        return np.array([0.0, 1.0]) if pick_right else np.array([1.0, 0.0])
    return weights


def linear_kernel(antialias: bool) -> Kernel:
    def weights(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1.0 - ratio, ratio])
        s = min(scale, 1.0)  # a wider triangle when shrinking
        start = int(math.floor(-1 / s) + 1)
        args = (np.arange(start, 2 - start) - ratio) * s
        w = np.clip(1 - np.abs(args), 0, 1)
        return w / w.sum()
    return weights


def cubic_kernel(a: float, antialias: bool) -> Kernel:
    def k(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
        return 0.0

    def weights(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([k(ratio + 1), k(ratio), k(1 - ratio), k(2 - ratio)])
        s = min(scale, 1.0)
        start = int(math.floor(-2 / s) + 1)
        w = np.array([k(s * (i - ratio)) for i in range(start, 2 - start)])
        return w / w.sum()
    return weights


def source_coordinates(mode: str, n_out: int, n_in: int, scale: float,
                       roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Where each output position samples the input, and which fall outside it (extrapolated,
    for ``tf_crop_and_resize`` only)."""
    y = np.arange(n_out, dtype=np.float64)
    out_len = scale * n_in  # ONNX's formulas use the real-valued output length
    outside = np.zeros(n_out, dtype=bool)
    if mode == "align_corners":
        x = np.zeros(n_out) if out_len == 1 else y * (n_in - 1) / (out_len - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        x = (np.full(n_out, (end - start) * (n_in - 1) / 2) if out_len == 1
             else y * (end - start) * (n_in - 1) / (out_len - 1))
        x = x + start * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if out_len == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / out_len)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {mode!r} is not one ONNX defines")
    return x, outside


def axis_weights(kernel: Kernel, coordinate_mode: str, n_out: int, n_in: int, scale: float,
                 roi: tuple[float, float], exclude_outside: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The (n_out, n_in) weights of one axis, and the rows that are extrapolated."""
    xs, outside = source_coordinates(coordinate_mode, n_out, n_in, scale, roi)
    w = np.zeros((n_out, n_in), dtype=np.float64)
    for o, x in enumerate(xs):
        if outside[o]:
            continue
        base = math.floor(x)
        on_sample = x == base
        ratio = 1.0 if on_sample else x - base  # ONNX prefers the sample on the left
        coeffs = np.array(kernel(ratio, scale), dtype=np.float64)
        n = len(coeffs)
        # The n positions nearest to x, ties to the smaller one.
        if n % 2 == 0:
            start = base - n // 2 + (0 if on_sample else 1)
        else:
            start = base - (n - 1) // 2 + (1 if x - base > 0.5 else 0)
        idx = np.arange(start, start + n)
        if exclude_outside:
            coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
            total = coeffs.sum()
            coeffs = coeffs / (total if total != 0 else 1.0)
        np.add.at(w[o], np.clip(idx, 0, n_in - 1), coeffs)
    return w, outside


def apply_axis(x: Expr, shape: list[int], axis: int, w: np.ndarray, outside: np.ndarray,
               extrapolation: float, nearest: bool, dtype: str) -> Expr:
    """``x`` resized along ``axis`` by the weights ``w``."""
    if nearest and not outside.any() and np.all(np.count_nonzero(w, axis=1) == 1) \
            and np.all(w.max(axis=1) == 1.0):
        return op.take(x, Constant(np.argmax(w, axis=1).astype("int64")), axis=axis)
    rank = len(shape)
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved = op.transpose(x, axes=perm) if axis != rank - 1 else x
    rows = int(np.prod([shape[d] for d in perm[:-1]], dtype=np.int64))
    compute = dtype if dtype in ("float32", "float64") else "float32"
    flat = op.reshape(cast(moved, compute), newshape=[rows, shape[axis]])
    y: Expr = op.nn.dense(flat, Constant(w.astype(compute)))
    if outside.any():
        y = op.add(y, Constant(np.where(outside, extrapolation, 0.0).astype(compute)))
    n_out = w.shape[0]
    y = op.reshape(y, newshape=[shape[d] for d in perm[:-1]] + [n_out])
    if axis != rank - 1:
        inverse = [perm.index(d) for d in range(rank)]
        y = op.transpose(y, axes=inverse)
    if compute != dtype:
        info = np.iinfo(dtype) if dtype != "bool" else None
        y = op.round(y)
        if info is not None:
            y = op.clip(y, a_min=float(info.min), a_max=float(info.max))
        y = cast(y, dtype)
    return y


def resize(ctx: NodeContext, scales: list[float] | None, sizes: list[int] | None,
           roi: list[float] | None, mode: str, coordinate_mode: str, nearest_mode: str
           ) -> Expr:
    """The resize of input 0 (``scales`` or ``sizes`` given for the axes in ``axes``)."""
    shape = list(ctx.shape(0))
    rank = len(shape)
    axes = [a % rank for a in ctx.attr("axes", list(range(rank)))]
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"mode {mode!r} is not one of nearest, linear, cubic")
    antialias = bool(ctx.attr("antialias", 0)) and mode != "nearest"
    full_roi = [0.0] * rank + [1.0] * rank
    if roi:
        if len(roi) != 2 * len(axes):
            raise ctx.error(f"roi has {len(roi)} values; it needs 2 per resized axis "
                            f"({2 * len(axes)})")
        if not all(math.isfinite(r) for r in roi):
            raise ctx.error(f"roi {roi} must be finite")
        for k, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = roi[k], roi[len(axes) + k]
    scale = [1.0] * rank
    out = list(shape)
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ctx.error(f"sizes has {len(sizes)} values for {len(axes)} axes")
        for a, n in zip(axes, sizes):
            if n < 0:
                raise ctx.error(f"sizes {sizes} must not be negative")
            scale[a], out[a] = n / shape[a] if shape[a] else 1.0, int(n)
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = {"not_larger": min, "not_smaller": max}.get(policy)
            if pick is None:
                raise ctx.error(f"keep_aspect_ratio_policy {policy!r} is not one of stretch, "
                                "not_larger, not_smaller")
            common = pick(scale[a] for a in axes)
            for a in axes:
                scale[a], out[a] = common, int(common * shape[a] + 0.5)
    elif scales is not None:
        if len(scales) != len(axes):
            raise ctx.error(f"scales has {len(scales)} values for {len(axes)} axes")
        for a, s in zip(axes, scales):
            if not s > 0:
                raise ctx.error(f"scales must be positive, not {s}")
            ctx.check_scale(float(s), f"the scale of axis {a}")
            scale[a], out[a] = float(s), int(math.floor(s * shape[a]))
    else:
        raise ctx.error("it needs scales or sizes")
    if mode == "cubic" and not math.isfinite(float(ctx.attr("cubic_coeff_a", -0.75))):
        raise ctx.error(f"cubic_coeff_a must be finite, not {ctx.attr('cubic_coeff_a')}")
    kernel = {"nearest": lambda: nearest_kernel(nearest_mode),
              "linear": lambda: linear_kernel(antialias),
              "cubic": lambda: cubic_kernel(float(ctx.attr("cubic_coeff_a", -0.75)),
                                            antialias)}[mode]()
    x, dtype = ctx.x(0), ctx.dtype(0)
    current = list(shape)
    for a in axes:
        a_roi = (full_roi[a], full_roi[rank + a])
        if out[a] == shape[a] and scale[a] == 1.0 and a_roi == (0.0, 1.0):
            continue
        if shape[a] == 0 or out[a] == 0:
            raise ctx.error(f"axis {a} resizes from {shape[a]} to {out[a]} elements; kiln "
                            "resizes non-empty axes only")
        # The weights are made row by row, in numpy, now: a bounded table and loop.
        ctx.check_scale(scale[a], f"the scale of axis {a} ({shape[a]} to {out[a]})",
                        shrink=antialias)
        ctx.check_unroll(out[a], f"the output length of axis {a} (kiln computes the weights "
                         "of each output position in turn)")
        ctx.check_elements((out[a], shape[a]), f"the weight matrix of axis {a}")
        w, outside = axis_weights(kernel, coordinate_mode, out[a], shape[a], scale[a], a_roi,
                                  bool(ctx.attr("exclude_outside", 0)))
        x = apply_axis(x, current, a, w, outside, float(ctx.attr("extrapolation_value", 0.0)),
                       mode == "nearest", dtype)
        current[a] = out[a]
    return x


def _optional_floats(ctx: NodeContext, i: int, what: str) -> list[float] | None:
    if not ctx.has(i):
        return None
    values = [float(v) for v in np.asarray(ctx.need_const(i, what)).reshape(-1)]
    return values or None


@converter("Resize", since=11)
def resize_11(ctx: NodeContext) -> Expr:
    sizes = ctx.ints(3, "sizes") if ctx.has(3) else None
    mode = ctx.attr("mode", "nearest")
    coordinate_mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    roi = _optional_floats(ctx, 1, "roi") if coordinate_mode == "tf_crop_and_resize" else None
    return resize(ctx, _optional_floats(ctx, 2, "scales"), sizes or None, roi, mode,
                  coordinate_mode, ctx.attr("nearest_mode", "round_prefer_floor"))


@converter("Resize", since=10)
def resize_10(ctx: NodeContext) -> Expr:
    # Resize-10 is Upsample-9 renamed: asymmetric coordinates, nearest rounds down.
    return resize(ctx, _optional_floats(ctx, 1, "scales"), None, None,
                  ctx.attr("mode", "nearest"), "asymmetric", "floor")


@converter("Upsample", since=9)
def upsample_9(ctx: NodeContext) -> Expr:
    return resize(ctx, _optional_floats(ctx, 1, "scales"), None, None,
                  ctx.attr("mode", "nearest"), "asymmetric", "floor")


@converter("Upsample", since=7)
def upsample_7(ctx: NodeContext) -> Expr:
    return resize(ctx, [float(s) for s in ctx.need_attr("scales")], None, None,
                  ctx.attr("mode", "nearest"), "asymmetric", "floor")
