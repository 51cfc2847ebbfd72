"""2-D pooling: nn.max_pool2d, nn.avg_pool2d and their global forms.

Data is NCHW, or channel-blocked ``NCHW[b]c`` (``layout="NCHW16c"``: N, C/16, H, W, 16, as
the convert-layout pass keeps a CNN between its convolutions); the result is in the data's
layout. The adjoints take NCHW only.

Output sizes follow TVM: ``(H + pad - ((k - 1) * d + 1) + (s - 1 if ceil_mode)) // s + 1``.
Unlike PyTorch, ceil mode keeps a last window even when it starts in the bottom or right
padding. Padding is ``-inf`` (or the dtype's minimum) for max pooling and 0 for average
pooling; ``count_include_pad`` divides by the window positions inside the padded input (never
the extra room ceil mode adds), otherwise by those inside the input alone (at least 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from kiln.errors import EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib, pool_grad_kernels, pool_kernels
from kiln.loops.compute import Tensor, extern, reduce
from kiln.loops.ir import (
    Binary,
    Const,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.pool_grad_kernels import PoolGeometry
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    as_array,
    check_dims_equal,
    check_window_attrs,
    padding4,
    pair,
    require_dtype,
    require_rank,
    same_dtype,
    shape_str,
    tensor_arg,
    tensor_args,
    trunc_divide,
    window_out_size,
    windows_2d,
)
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpPattern, register


class PoolLayoutAttrs(Attrs):
    """The layouts every 2-D pooling takes (all that the global poolings take)."""

    __slots__ = ()
    layout: str
    out_layout: str


class PoolAttrs(PoolLayoutAttrs):
    __slots__ = ()
    pool_size: tuple[int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]
    padding: tuple[int, int, int, int]
    ceil_mode: bool


class AvgPoolAttrs(PoolAttrs):
    __slots__ = ()
    count_include_pad: bool


def _check_layout(attrs: PoolLayoutAttrs, blocked: bool = True) -> int | None:
    """The channel block of the layout (``NCHW16c``: 16; NCHW: None), which the result
    keeps; a TypeCheckError for any other layout (and for a blocked one unless
    ``blocked``: the adjoints take NCHW only)."""
    match = re.fullmatch(r"NCHW([1-9][0-9]*)c", attrs.layout)
    if (attrs.layout == "NCHW" or match and blocked) and attrs.out_layout in ("",
                                                                             attrs.layout):
        return int(match.group(1)) if match else None
    raise TypeCheckError(
        f"kiln's 2-D pooling{'' if blocked else ' adjoint'} supports layout NCHW"
        f"{' or NCHW[b]c (such as NCHW16c), the result in the same layout' if blocked else ''}"
        f" only; got layout={attrs.layout!r}, out_layout={attrs.out_layout!r}"
    )


def _check_data(data: TensorType, attrs: PoolLayoutAttrs) -> int | None:
    """The channel block (see `_check_layout`) after checking ``data`` against it."""
    block = _check_layout(attrs)
    if block is None:
        require_rank(data, "data (NCHW)", 4)
    else:
        require_rank(data, f"data ({attrs.layout})", 5)
        check_dims_equal(data.shape[4], block,
                         f"data of shape {shape_str(data.shape)} has {data.shape[4]} in the "
                         f"axis of the channel block of layout {attrs.layout}")
    require_dtype(data, "data", "numeric")
    return block


def _pool_relation(arg_types: Sequence[Type], attrs: PoolAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    _check_data(data, attrs)
    kernel = pair(attrs.pool_size, "pool_size")
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    check_window_attrs(kernel, strides, dilation)
    top, left, bottom, right = padding4(attrs.padding, "padding")
    n, c, h, w = data.shape[:4]
    oh = window_out_size(h, top + bottom, kernel[0], dilation[0], strides[0], attrs.ceil_mode)
    ow = window_out_size(w, left + right, kernel[1], dilation[1], strides[1], attrs.ceil_mode)
    return TensorType((n, c, oh, ow, *data.shape[4:]), data.dtype)


Pair = tuple[int, int]


def _geometry(attrs: PoolAttrs) -> tuple[Pair, Pair, Pair, tuple[int, int, int, int], Pair]:
    """Kernel, strides, dilation, padding (top, left, bottom, right) and ceil mode's extra room."""
    strides = pair(attrs.strides, "strides")
    # Ceil mode: extra room at the bottom and right lets a last, partial window fit.
    extra = (strides[0] - 1, strides[1] - 1) if attrs.ceil_mode else (0, 0)
    return (
        pair(attrs.pool_size, "pool_size"),
        strides,
        pair(attrs.dilation, "dilation"),
        padding4(attrs.padding, "padding"),
        extra,
    )


def _windows(x: np.ndarray, attrs: PoolAttrs, fill: float) -> np.ndarray:
    """Every pooling window over the last two axes of ``x``, padded with ``fill``."""
    kernel, strides, dilation, (top, left, bottom, right), extra = _geometry(attrs)
    pads = [(0, 0)] * (x.ndim - 2) + [(top, bottom + extra[0]), (left, right + extra[1])]
    padded = np.pad(x, pads, constant_values=fill)
    return windows_2d(padded, kernel, strides, dilation)


def _spatial_last(f: Callable[[list[np.ndarray], Any], np.ndarray]
                  ) -> Callable[[list[np.ndarray], Any], np.ndarray]:
    """A reference over NCHW data (windows over the last two axes) made to take
    ``NCHW[b]c`` too: the block moved before the rows and back."""
    def run(arrays: list[np.ndarray], attrs: Any) -> np.ndarray:
        x = np.asarray(arrays[0])
        if _check_layout(attrs) is None:
            return f([x], attrs)
        return np.ascontiguousarray(np.moveaxis(f([np.moveaxis(x, 4, 2)], attrs), 2, 4))
    return run


@_spatial_last
def _max_pool2d(arrays: list[np.ndarray], attrs: PoolAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    lowest = np.iinfo(x.dtype).min if dtype_of(x.dtype.name).is_integer else -np.inf
    return as_array(_windows(x, attrs, lowest).max(axis=(-2, -1)), x.dtype.name)


def _divisors(hw: tuple[int, ...], attrs: AvgPoolAttrs, dtype: DTypeLike) -> np.ndarray:
    """Each average-pooling window's divisor, shape (OH, OW).

    It is how many of the window's positions lie in the region that counts, the input with its
    padding or the input alone; never the extra room of ceil mode; at least 1.
    """
    kernel, strides, dilation, (top, left, bottom, right), extra = _geometry(attrs)
    h, w = hw
    counted = np.zeros((top + h + bottom + extra[0], left + w + right + extra[1]), dtype)
    if attrs.count_include_pad:
        counted[: top + h + bottom, : left + w + right] = 1
    else:
        counted[top : top + h, left : left + w] = 1
    counts = windows_2d(counted, kernel, strides, dilation).sum(axis=(-2, -1))
    return np.maximum(counts, 1)


@_spatial_last
def _avg_pool2d(arrays: list[np.ndarray], attrs: AvgPoolAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    acc = _avg_acc(x.dtype.name)  # the accumulator the lowering uses
    sums = _windows(x.astype(acc), attrs, 0).sum(axis=(-2, -1))
    counts = _divisors(x.shape[-2:], attrs, acc)
    if dtype_of(x.dtype.name).is_integer:
        return as_array(trunc_divide(sums, counts), x.dtype.name)
    return as_array(sums / counts, x.dtype.name)


# --- lowering: windows read with clamped indices; padding is a select -------------------------


class _Window:
    """The geometry of a pooling window over NCHW data of ``shape`` giving ``out_hw``."""

    def __init__(self, attrs: PoolAttrs, shape: tuple[int, ...], out_hw: tuple[int, ...]) -> None:
        (self.kh, self.kw), (self.sh, self.sw), (self.dh, self.dw), pads, _ = _geometry(attrs)
        self.top, self.left, self.bottom, self.right = pads
        self.h, self.w = shape[2], shape[3]
        self.oh, self.ow = out_hw
        self.spans = [None, None,
                      oplib.window_span(self.oh, self.sh, self.kh, self.dh, self.top),
                      oplib.window_span(self.ow, self.sw, self.kw, self.dw, self.left),
                      None][:len(shape)]
        self.count_include_pad = bool(attrs.get("count_include_pad", False))

    def at(self, o: tuple, ry: LExpr, rx: LExpr) -> list[LExpr]:
        """Where tap (ry, rx) of output element ``o``'s window reads the input."""
        b, c, y, x = o[:4]
        return [b, c, y * self.sh + ry * self.dh - self.top,
                x * self.sw + rx * self.dw - self.left, *o[4:]]

    def read(self, t: Tensor, o: tuple, ry: LExpr, rx: LExpr, fill: LExpr) -> LExpr:
        return oplib.guarded_read(t, self.at(o, ry, rx), self.spans, fill)

    def divisor(self, y: LExpr, x: LExpr) -> LExpr:
        """How many taps of window (y, x) count for average pooling (at least 1), int64.

        Along an axis, tap r sits at o * stride + r * dilation in padded coordinates; the
        taps inside [lo, hi) number clamp(ceil((hi - base) / d)) - clamp(ceil((lo - base) / d)).
        """
        def along(o: LExpr, s: int, d: int, k: int, before: int, size: int, after: int) -> LExpr:
            lo, hi = (0, before + size + after) if self.count_include_pad else (before,
                                                                                  before + size)
            base = o * s

            def taps_below(edge: int) -> LExpr:
                return oplib.clamp((Const(edge + d - 1) - base) // d, 0, k)

            return taps_below(hi) - taps_below(lo)

        rows = along(y, self.sh, self.dh, self.kh, self.top, self.h, self.bottom)
        cols = along(x, self.sw, self.dw, self.kw, self.left, self.w, self.right)
        return Binary("max", rows * cols, Const(1))


def _avg_acc(dtype: str) -> str:
    return "int64" if dtype_of(dtype).is_integer else ("float32" if dtype == "float16" else dtype)


def _average(total: LExpr, count: LExpr, out_dtype: str) -> LExpr:
    """``total / count`` as the reference divides: truncated for integers."""
    op = "div" if dtype_of(total.dtype).is_float else "truncdiv"
    return oplib.convert(Binary(op, total, oplib.convert(count, total.dtype)), out_dtype)


@oplib.zeros_if_empty
def _max_pool2d_lower(inputs: list[Tensor], attrs: PoolAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    win = _Window(attrs, x.shape, out.static_shape[2:4])
    low = oplib.lowest(x.dtype)
    if dtype_of(x.dtype).is_float and len(x.shape) == 4:  # rows, then columns
        # (kiln/loops/pool_kernels.py); blocked data: the reduction below, vectorized
        # across the block
        t = extern(out.static_shape, out.dtype, lambda write: pool_kernels.max_pool2d(
            x, (win.kh, win.kw), (win.sh, win.sw), (win.dh, win.dw), (win.top, win.left),
            out.static_shape, write))
        t.schedule = {"kernel": "max pool rows"}
        return t
    return reduce(out.static_shape, out.dtype, (win.kh, win.kw), "max",
                  lambda o, r: win.read(x, o, r[0], r[1], low), low)


@oplib.zeros_if_empty
def _avg_pool2d_lower(inputs: list[Tensor], attrs: AvgPoolAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    win = _Window(attrs, x.shape, out.static_shape[2:4])
    acc = _avg_acc(x.dtype)
    zero = oplib.dtype_const(0, x.dtype)
    return reduce(out.static_shape, out.dtype, (win.kh, win.kw), "add",
                  lambda o, r: oplib.convert(win.read(x, o, r[0], r[1], zero), acc),
                  oplib.dtype_const(0, acc),
                  lambda total, o: _average(total, win.divisor(o[2], o[3]), x.dtype), acc)


def _pool_attrs(count_include_pad: bool) -> tuple[Attr, ...]:
    attrs: tuple[Attr, ...] = (
        Attr("pool_size", kind="ints", convert=pair, doc="window size (h, w)"),
        Attr("strides", (1, 1), kind="ints", convert=pair, doc="step of the window (h, w)"),
        Attr("dilation", (1, 1), kind="ints", convert=pair, doc="spacing of window taps"),
        # TVM's default is (0, 0); a given padding is normalized to (top, left, bottom, right).
        Attr(
            "padding",
            (0, 0),
            kind="ints",
            convert=padding4,
            doc="padding: 1, 2 or 4 numbers, kept as (top, left, bottom, right)",
        ),
        Attr("layout", "NCHW", kind="str", doc="layout of data: NCHW or NCHW[b]c (NCHW16c)"),
        Attr("out_layout", "", kind="str", doc="layout of the result ('': the data's)"),
        Attr("ceil_mode", False, kind="bool", doc="round the output size up, not down"),
    )
    if count_include_pad:
        attrs += (
            Attr(
                "count_include_pad",
                False,
                kind="bool",
                doc="divide by window positions in the padding too",
            ),
        )
    return attrs


max_pool2d = register(
    "nn.max_pool2d",
    inputs=("data",),
    attrs_type=PoolAttrs,
    attrs=_pool_attrs(count_include_pad=False),
    relation=_pool_relation,
    compute=_max_pool2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Largest element of each 2-D window of NCHW (or NCHW[b]c) data.",
    gradient=lambda c, g: [call("nn.max_pool2d_grad", g, c.args[0], **dict(c.attrs))],
    lower=_max_pool2d_lower,
)
avg_pool2d = register(
    "nn.avg_pool2d",
    inputs=("data",),
    attrs_type=AvgPoolAttrs,
    attrs=_pool_attrs(count_include_pad=True),
    relation=_pool_relation,
    compute=_avg_pool2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Mean of each 2-D window of NCHW (or NCHW[b]c) data.",
    gradient=lambda c, g: [call("nn.avg_pool2d_grad", g, c.args[0], **dict(c.attrs))],
    lower=_avg_pool2d_lower,
)


# --- the adjoints of pooling (TVM's max_pool2d_grad and avg_pool2d_grad) ------------------


def _pool_grad_relation(arg_types: Sequence[Type], attrs: PoolAttrs) -> Type | None:
    args = tensor_args(arg_types, ("out_grad", "data"))
    if args is None:
        return None
    out_grad, data = args
    _check_layout(attrs, blocked=False)
    pooled = _pool_relation([data], attrs)
    assert isinstance(pooled, TensorType)
    require_dtype(data, "data", "float")
    same_dtype(args, ("out_grad", "data"))
    for i, (a, b) in enumerate(zip(out_grad.shape, pooled.shape, strict=False)):
        check_dims_equal(
            a,
            b,
            f"out_grad has shape {shape_str(out_grad.shape)} but pooling data of shape "
            f"{shape_str(data.shape)} gives {shape_str(pooled.shape)} (dimension {i})",
        )
    require_rank(out_grad, "out_grad (NCHW)", 4)
    return data


def _scatter_windows(
    x_shape: tuple[int, ...], attrs: PoolAttrs, per_tap: np.ndarray, dtype: str
) -> np.ndarray:
    """Add ``per_tap`` (N, C, OH, OW, kh, kw) into each window's place in the padded input,
    and crop the padding away."""
    kernel, strides, dilation, (top, left, bottom, right), extra = _geometry(attrs)
    n, c, h, w = x_shape
    oh, ow = per_tap.shape[2:4]
    padded = np.zeros((n, c, top + h + bottom + extra[0], left + w + right + extra[1]), dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            rows = slice(i * dilation[0], i * dilation[0] + (oh - 1) * strides[0] + 1, strides[0])
            cols = slice(j * dilation[1], j * dilation[1] + (ow - 1) * strides[1] + 1, strides[1])
            padded[:, :, rows, cols] += per_tap[..., i, j]
    return padded[:, :, top : top + h, left : left + w]


def _max_pool2d_grad(arrays: list[np.ndarray], attrs: PoolAttrs) -> np.ndarray:
    g, x = np.asarray(arrays[0]), np.asarray(arrays[1])
    windows = _windows(x, attrs, -np.inf)  # (N, C, OH, OW, kh, kw)
    kh, kw = windows.shape[-2:]
    flat = windows.reshape(*windows.shape[:4], kh * kw)
    # The adjoint goes to the first largest element of each window (row-major order).
    first = np.argmax(flat, axis=-1)
    taps = np.zeros(flat.shape, g.dtype)
    np.put_along_axis(taps, first[..., None], g[..., None], axis=-1)
    return _scatter_windows(x.shape, attrs, taps.reshape(windows.shape), g.dtype.name)


def _avg_pool2d_grad(arrays: list[np.ndarray], attrs: AvgPoolAttrs) -> np.ndarray:
    g, x = np.asarray(arrays[0]), np.asarray(arrays[1])
    # Each window's share of its adjoint: the same divisor the forward pass used.
    share = (g / _divisors(x.shape[2:], attrs, g.dtype))[..., None, None]
    kernel = pair(attrs.pool_size, "pool_size")
    taps = np.broadcast_to(share, (*g.shape, *kernel))
    return _scatter_windows(x.shape, attrs, taps, g.dtype.name)


@oplib.zeros_if_empty
def _max_pool2d_grad_lower(inputs: list[Tensor], attrs: PoolAttrs, out: Type) -> Tensor:
    """One pass over each plane's windows, each window's out_grad added at its first largest
    element (kiln/loops/pool_grad_kernels.py)."""
    g, x = inputs
    win = _Window(attrs, x.shape, g.shape[2:])
    geo = PoolGeometry((win.kh, win.kw), (win.sh, win.sw), (win.dh, win.dw),
                       (win.top, win.left), (win.h, win.w), (win.oh, win.ow))
    return extern(x.shape, x.dtype, lambda write: pool_grad_kernels.max_pool2d_grad(
        g, x, geo, write))


@oplib.zeros_if_empty
def _avg_pool2d_grad_lower(inputs: list[Tensor], attrs: AvgPoolAttrs, out_type: Type) -> Tensor:
    """Gathered: input element (y, x) sums, over the taps of the windows covering it, each
    window's out_grad divided by that window's divisor (as the forward pass divided)."""
    out = oplib.out_tensor_type(out_type)
    g, x = inputs
    win = _Window(attrs, x.shape, g.shape[2:])
    zero = oplib.dtype_const(0, g.dtype)

    def source(p: LExpr, r: LExpr, size: int, k: int, s: int, d: int, pad: int) -> tuple:
        offset = p + pad - r * d
        lo, hi = pad - (k - 1) * d, size - 1 + pad
        exact = None if s == 1 else Binary("eq", offset % s, Const(0))
        return offset // s, (lo // s, hi // s), exact

    def body(o: tuple, r: tuple) -> LExpr:
        b, c, y, xx = o
        oy, span_y, exact_y = source(y, r[0], win.h, win.kh, win.sh, win.dh, win.top)
        ox, span_x, exact_x = source(xx, r[1], win.w, win.kw, win.sw, win.dw, win.left)
        exact = [e for e in (exact_y, exact_x) if e is not None]

        def share(at: list[LExpr]) -> LExpr:
            count = oplib.convert(win.divisor(at[2], at[3]), g.dtype)
            return Binary("div", g(*at), count)

        return oplib.guarded_read(g, [b, c, oy, ox], [None, None, span_y, span_x], zero, exact,
                                  read=share)

    return reduce(out.static_shape, out.dtype, (win.kh, win.kw), "add", body, zero)


max_pool2d_grad = register(
    "nn.max_pool2d_grad",
    inputs=("out_grad", "data"),
    attrs_type=PoolAttrs,
    attrs=_pool_attrs(count_include_pad=False),
    relation=_pool_grad_relation,
    compute=_max_pool2d_grad,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="The adjoint of max_pool2d: each window's out_grad added at its largest element.",
    # Its own derivative would gather at each window's largest element, an operator kiln lacks.
    differentiable=False,
    lower=_max_pool2d_grad_lower,
)
avg_pool2d_grad = register(
    "nn.avg_pool2d_grad",
    inputs=("out_grad", "data"),
    attrs_type=AvgPoolAttrs,
    attrs=_pool_attrs(count_include_pad=True),
    relation=_pool_grad_relation,
    compute=_avg_pool2d_grad,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="The adjoint of avg_pool2d: each window's out_grad spread evenly over the window.",
    # Linear in out_grad, whose adjoint is avg_pool2d again; data gives only the shape.
    gradient=lambda c, g: [call("nn.avg_pool2d", g, **dict(c.attrs)), None],
    lower=_avg_pool2d_grad_lower,
)


def _global_pool_relation(arg_types: Sequence[Type], attrs: PoolLayoutAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    _check_data(data, attrs)
    return TensorType((*data.shape[:2], 1, 1, *data.shape[4:]), data.dtype)


def _global_avg_pool2d(arrays: list[np.ndarray], attrs: PoolLayoutAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    count = x.shape[2] * x.shape[3]
    if count == 0:
        raise EvalError(f"global average pooling over no elements (shape {x.shape})")
    if dtype_of(x.dtype.name).is_integer:
        total = x.astype(np.int64).sum(axis=(2, 3), keepdims=True)
        return as_array(trunc_divide(total, count), x.dtype.name)
    return as_array(x.mean(axis=(2, 3), keepdims=True), x.dtype.name)


def _global_max_pool2d(arrays: list[np.ndarray], attrs: PoolLayoutAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    if x.shape[2] * x.shape[3] == 0:
        raise EvalError(f"global max pooling over no elements (shape {x.shape})")
    return as_array(x.max(axis=(2, 3), keepdims=True), x.dtype.name)


GLOBAL_POOL_ATTRS = (
    Attr("layout", "NCHW", kind="str", doc="layout of data: NCHW or NCHW[b]c (NCHW16c)"),
    Attr("out_layout", "", kind="str", doc="layout of the result ('': the data's)"),
)

def _global_avg_lower(inputs: list[Tensor], attrs: PoolLayoutAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    count = x.shape[2] * x.shape[3]
    if count == 0:
        return oplib.fail(out.static_shape, out.dtype,
                          f"global average pooling over no elements (shape {x.shape})")
    acc = _avg_acc(x.dtype)
    return reduce(out.static_shape, out.dtype, x.shape[2:4], "add",
                  lambda o, r: oplib.convert(x(o[0], o[1], *r, *o[4:]), acc),
                  oplib.dtype_const(0, acc),
                  lambda total, o: _average(total, Const(count), x.dtype), acc)


def _global_max_lower(inputs: list[Tensor], attrs: PoolLayoutAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    if x.shape[2] * x.shape[3] == 0:
        return oplib.fail(out.static_shape, out.dtype,
                          f"global max pooling over no elements (shape {x.shape})")
    return reduce(out.static_shape, out.dtype, x.shape[2:4], "max",
                  lambda o, r: x(o[0], o[1], *r, *o[4:]), oplib.lowest(x.dtype))


global_avg_pool2d = register(
    "nn.global_avg_pool2d",
    inputs=("data",),
    attrs_type=PoolLayoutAttrs,
    attrs=GLOBAL_POOL_ATTRS,
    relation=_global_pool_relation,
    compute=_global_avg_pool2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Mean over the whole height and width of NCHW data, as (N, C, 1, 1) (or NCHW[b]c).",
    gradient=lambda c, g: [
        call("broadcast_to_like", g, c.args[0]) / gh.element_count(c.args[0], (2, 3))
    ],
    lower=_global_avg_lower,
)
global_max_pool2d = register(
    "nn.global_max_pool2d",
    inputs=("data",),
    attrs_type=PoolLayoutAttrs,
    attrs=GLOBAL_POOL_ATTRS,
    relation=_global_pool_relation,
    compute=_global_max_pool2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Largest element over the height and width of NCHW data, as (N, C, 1, 1) (or NCHW[b]c).",
    gradient=lambda c, g: _global_max_grad(c, g),
    lower=_global_max_lower,
)


def _global_max_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Every element equal to its channel's maximum receives the adjoint.
    x = c.args[0]
    hit = call("equal", x, call("broadcast_to_like", c, x))
    return [call("where", hit, call("broadcast_to_like", g, x), gh.zeros_like(x))]

__all__ = [
    "avg_pool2d",
    "avg_pool2d_grad",
    "global_avg_pool2d",
    "global_max_pool2d",
    "max_pool2d",
    "max_pool2d_grad",
]
