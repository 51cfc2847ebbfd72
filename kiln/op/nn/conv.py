"""2-D convolution: nn.conv2d (NCHW or NHWC data; OIHW, HWIO, HWOI or OHWI kernels), grouped
and dilated, with mixed input dtypes when out_dtype is given (uint8 x int8 -> int32)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, Tuple, const
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Indices, Tensor, compute, reduce
from kiln.loops.ir import Binary, Const
from kiln.loops.ir import Expr as LExpr
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
    tensor_args,
    unify_dim,
    window_out_size,
    windows_2d,
)
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpPattern, register


class WindowAttrs(Attrs):
    """The attributes conv2d and its adjoints share (see `_window_attrs`)."""

    __slots__ = ()
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    channels: int | None
    kernel_size: tuple[int, int] | None
    data_layout: str
    kernel_layout: str
    out_dtype: str


class Conv2DAttrs(WindowAttrs):
    __slots__ = ()
    out_layout: str


class Conv2DTransposeAttrs(WindowAttrs):
    __slots__ = ()
    out_layout: str
    output_padding: tuple[int, int]


class Conv2DBackwardWeightAttrs(WindowAttrs):
    __slots__ = ()
    grad_layout: str


def check_input_dtypes(data: TensorType, weight: TensorType, attrs: Conv2DAttrs) -> None:
    """A convolution's data and weight share a numeric dtype, or differ (uint8 data, int8
    weight) when ``out_dtype`` says what they accumulate in, as TVM's relations allow."""
    if attrs.out_dtype == "" or data.dtype == weight.dtype:
        same_dtype([data, weight], ("data", "weight"))
    else:
        require_dtype(weight, "weight", "numeric")
    require_dtype(data, "data", "numeric")


def _conv2d_relation(arg_types: Sequence[Type], attrs: Conv2DAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    check_input_dtypes(data, weight, attrs)
    require_rank(data, f"data ({data_layout})", 4)
    require_rank(weight, f"weight ({kernel_layout})", 4)
    n, c, h, w = _permuted(data.shape, data_layout, "NCHW")
    o, i, kh, kw = _permuted(weight.shape, kernel_layout, "OIHW")
    groups = attrs.groups
    if groups < 1:
        raise TypeCheckError(f"groups must be positive, got {groups}")
    if isinstance(i, int):
        check_dims_equal(
            c,
            i * groups,
            f"data of shape {shape_str(data.shape)} has {c} channels (dimension 1), but weight "
            f"of shape {shape_str(weight.shape)} expects {i} input channels per group times "
            f"groups={groups}, that is {i * groups}",
        )
    if isinstance(o, int) and o % groups:
        raise TypeCheckError(
            f"weight of shape {shape_str(weight.shape)} has {o} output channels, which "
            f"groups={groups} does not divide"
        )
    if attrs.channels is not None:
        check_dims_equal(
            attrs.channels,
            o,
            f"channels={attrs.channels} but weight of shape {shape_str(weight.shape)} has {o} "
            "output channels (dimension 0)",
        )
        o = unify_dim(o, attrs.channels)
    if attrs.kernel_size is not None:
        ks = pair(attrs.kernel_size, "kernel_size")
        for axis, (want, have) in enumerate(zip(ks, (kh, kw), strict=True)):
            check_dims_equal(
                want,
                have,
                f"kernel_size={list(ks)} but weight of shape {shape_str(weight.shape)} has "
                f"{have} in dimension {axis + 2}",
            )
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    top, left, bottom, right = padding4(attrs.padding, "padding")
    if isinstance(kh, int) and isinstance(kw, int):
        check_window_attrs((kh, kw), strides, dilation)
        oh = window_out_size(h, top + bottom, kh, dilation[0], strides[0])
        ow = window_out_size(w, left + right, kw, dilation[1], strides[1])
    else:
        oh = ow = ANY
    result = _permuted((n, o, oh, ow), "NCHW", out_layout)
    return TensorType(result, attrs.out_dtype or data.dtype)


# The layouts TVM's Conv2DRel takes for 2-D data and kernels (each a permutation of the axes).
DATA_LAYOUTS = ("NCHW", "NHWC")
KERNEL_LAYOUTS = ("OIHW", "HWIO", "HWOI", "OHWI")


def _layouts(attrs: Conv2DAttrs) -> tuple[str, str, str]:
    """(data, kernel, result) layouts of a conv2d call; a TypeCheckError for others."""
    data_layout, kernel_layout = attrs.data_layout, attrs.kernel_layout
    out_layout = attrs.out_layout or data_layout
    if (data_layout not in DATA_LAYOUTS or kernel_layout not in KERNEL_LAYOUTS
            or out_layout not in DATA_LAYOUTS):
        raise TypeCheckError(
            f"kiln's nn.conv2d supports data_layout {' or '.join(DATA_LAYOUTS)}, kernel_layout "
            f"{', '.join(KERNEL_LAYOUTS)} and out_layout {' or '.join(DATA_LAYOUTS)} (or ''); "
            f"got data_layout={data_layout!r}, kernel_layout={kernel_layout!r}, "
            f"out_layout={attrs.out_layout!r}"
        )
    return data_layout, kernel_layout, out_layout


def _permuted(shape: Sequence[Dim], layout: str, target: str) -> tuple[Dim, ...]:
    """``shape``, laid out as ``layout``, rearranged to ``target`` (same letters)."""
    return tuple(shape[layout.index(axis)] for axis in target)


def _axes(layout: str, target: str) -> tuple[int, ...]:
    """The transpose taking an array in ``layout`` to ``target``."""
    return tuple(layout.index(axis) for axis in target)


def _transposed(t: Tensor, axes: tuple[int, ...]) -> Tensor:
    """``t`` read with its axes in the order ``axes`` (numpy's ``transpose``)."""
    shape = tuple(t.shape[a] for a in axes)

    def element(*i: LExpr) -> LExpr:
        at: list[LExpr] = list(i)
        for k, a in enumerate(axes):
            at[a] = i[k]
        return t(*at)

    return compute(shape, t.dtype, element)


def _conv2d(arrays: list[np.ndarray], attrs: Conv2DAttrs) -> np.ndarray:
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    x = np.asarray(arrays[0]).transpose(_axes(data_layout, "NCHW"))
    w = np.asarray(arrays[1]).transpose(_axes(kernel_layout, "OIHW"))
    y = _conv2d_nchw(x, w, attrs)
    return np.ascontiguousarray(y.transpose(_axes("NCHW", out_layout)))


def _conv2d_nchw(x: np.ndarray, w: np.ndarray, attrs: Conv2DAttrs) -> np.ndarray:
    out = attrs.out_dtype or x.dtype.name
    # float32 sums in float64, rounded once: a float32 BLAS product rounds each output channel
    # by the tile it falls in, so channels with equal weights would differ in the last bit
    # (ONNX's light squeezenet shows it: its 1000 equal class scores near 1e10 feed a softmax).
    acc = {"float16": "float32", "float32": "float64"}.get(out, out)
    top, left, bottom, right = padding4(attrs.padding, "padding")
    x = np.pad(x.astype(acc), ((0, 0), (0, 0), (top, bottom), (left, right)))
    w = w.astype(acc)
    windows = windows_2d(
        x, w.shape[2:], pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    )  # (N, C, OH, OW, kh, kw)
    groups = attrs.groups
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    parts = []
    for g in range(groups):
        xg = windows[:, g * cg : (g + 1) * cg]
        wg = w[g * og : (g + 1) * og]
        parts.append(np.tensordot(xg, wg, axes=([1, 4, 5], [1, 2, 3])))  # (N, OH, OW, og)
    return as_array(np.concatenate(parts, axis=-1).transpose(0, 3, 1, 2), out)


def _accumulate(out_dtype: str) -> tuple[str, Callable[[LExpr, Indices], LExpr] | None]:
    """The accumulator dtype (float16 sums in float32, as the reference) and the finalizer."""
    acc = "float32" if out_dtype == "float16" else out_dtype
    if acc == out_dtype:
        return acc, None

    def fin(v: LExpr, o: Indices) -> LExpr:
        return oplib.convert(v, out_dtype)

    return acc, fin


def _product(a: LExpr, b: LExpr, acc: str) -> LExpr:
    return Binary("mul", oplib.convert(a, acc), oplib.convert(b, acc))


@oplib.zeros_if_empty
def _conv2d_lower(inputs: list[Tensor], attrs: Conv2DAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    layouts = _layouts(attrs)
    if layouts == ("NCHW", "OIHW", "NCHW"):
        return _conv2d_lower_nchw(inputs[0], inputs[1], attrs, out.static_shape, out.dtype,
                                  fast=True)
    # Other layouts: read the inputs transposed into NCHW / OIHW, convolve with the plain
    # reduction, and write the result transposed (correct first; not tuned).
    data_layout, kernel_layout, out_layout = layouts
    x = _transposed(inputs[0], _axes(data_layout, "NCHW"))
    w = _transposed(inputs[1], _axes(kernel_layout, "OIHW"))
    shape = tuple(out.static_shape[out_layout.index(axis)] for axis in "NCHW")
    y = _conv2d_lower_nchw(x, w, attrs, shape, out.dtype, fast=False)
    return _transposed(y, _axes("NCHW", out_layout))


def _conv2d_lower_nchw(x: Tensor, w: Tensor, attrs: Conv2DAttrs, out_shape: tuple[int, ...],
                       dtype: str, fast: bool) -> Tensor:
    # A plain reduction over (input channels of the group, kernel rows, kernel columns); the
    # zero padding is a select around a clamped read.
    # float32: implicit GEMM / depthwise; 8-bit inputs with int32 out: the int8 GEMM
    from kiln.loops import conv_kernels, gemm, int8_kernels

    og, cg, kh, kw = w.shape[0] // attrs.groups, w.shape[1], w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    top, left, _, _ = padding4(attrs.padding, "padding")
    if (fast and gemm.supported(x.dtype) and x.dtype == dtype == w.dtype
            and min(x.shape + w.shape) > 0):
        return conv_kernels.conv2d(x, w, (sh, sw), (top, left), (dh, dw),
                                   attrs.groups, out_shape, dtype)
    if fast and cg > 1 and int8_kernels.usable(x.dtype, w.dtype, dtype, x.shape, w.shape):
        return int8_kernels.conv2d(x, w, (sh, sw), (top, left), (dh, dw), out_shape,
                                   attrs.groups)  # (depthwise, cg = 1: the loops below)
    oh, ow = out_shape[2:]
    spans = [None, None, oplib.window_span(oh, sh, kh, dh, top),
             oplib.window_span(ow, sw, kw, dw, left)]
    acc, fin = _accumulate(dtype)
    zero = oplib.dtype_const(0, x.dtype)

    def body(o: tuple, r: tuple) -> LExpr:
        b, oc, y, xx = o
        rc, ry, rx = r
        ch = rc if attrs.groups == 1 else (oc // og) * cg + rc
        at = [b, ch, y * sh + ry * dh - top, xx * sw + rx * dw - left]
        return _product(oplib.guarded_read(x, at, spans, zero), w(oc, rc, ry, rx), acc)

    return reduce(out_shape, dtype, (cg, kh, kw), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


def _window_attrs(extra: tuple[Attr, ...], kernel_layout: str,
                  after_layout: tuple[Attr, ...] = ()) -> tuple[Attr, ...]:
    """The attributes every convolution shares, ``extra`` before the kernel layout and
    ``after_layout`` after it."""
    return (
        Attr("strides", (1, 1), kind="ints", convert=pair, doc="step of the window (h, w)"),
        Attr(
            "padding",
            (0, 0),
            kind="ints",
            convert=padding4,
            doc="padding of the convolution: 1, 2 or 4 numbers, kept as (top, left, bottom, right)",
        ),
        Attr("dilation", (1, 1), kind="ints", convert=pair, doc="spacing of kernel taps"),
        Attr("groups", 1, kind="int", doc="channel groups (groups = channels: depthwise)"),
        Attr("channels", None, kind="int", optional=True, doc="output channels, if given"),
        Attr(
            "kernel_size",
            None,
            kind="ints",
            optional=True,
            convert=pair,
            doc="kernel (h, w), if given",
        ),
        *extra,
        Attr("kernel_layout", kernel_layout, kind="str", doc=f"layout of weight ({kernel_layout})"),
        *after_layout,
        Attr("out_dtype", "", kind="dtype", doc="result dtype; '': that of data"),
    )



conv2d = register(
    "nn.conv2d",
    inputs=("data", "weight"),
    attrs_type=Conv2DAttrs,
    attrs=_window_attrs(
        (Attr("data_layout", "NCHW", kind="str", doc="layout of data: NCHW or NHWC"),),
        "OIHW",
        (Attr("out_layout", "", kind="str", doc="layout of the result ('': data_layout)"),),
    ),
    relation=_conv2d_relation,
    compute=_conv2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="2-D convolution (cross-correlation); data NCHW/NHWC, kernel OIHW/HWIO/HWOI/OHWI.",
    gradient=lambda c, g: _conv2d_grad(c, g),
    lower=_conv2d_lower,
)


# --- the adjoints of conv2d: conv2d_transpose and conv2d_backward_weight (TVM's) -----------


def _geometry(attrs: WindowAttrs) -> dict[str, object]:
    """The window attributes conv2d shares with its adjoints."""
    return {
        "strides": attrs.strides,
        "padding": attrs.padding,
        "dilation": attrs.dilation,
        "groups": attrs.groups,
    }


def _output_padding(
    size: tuple[int, int],
    out: tuple[int, int],
    kernel: tuple[int, int],
    attrs: WindowAttrs,
) -> tuple[int, int]:
    """Rows and columns of ``size`` past the last window: conv2d_transpose must add them back."""
    top, left, bottom, right = padding4(attrs.padding, "padding")
    pads = (top + bottom, left + right)
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    rows, cols = (
        size[i] + pads[i] - dilation[i] * (kernel[i] - 1) - 1 - (out[i] - 1) * strides[i]
        for i in range(2)
    )
    return rows, cols


def _data_adjoint(
    g: Expr, weight: Expr, data: Expr, out_hw: tuple[int, int], kernel: tuple[int, int],
    conv_attrs: WindowAttrs, op: str,
) -> Expr:
    """The adjoint of conv2d's data: a transposed convolution back to data's shape.

    ``out_hw`` is the size of conv2d's result and ``kernel`` that of its weight.
    """
    _, c, h, w = gh.static_shape(data, op)
    return call(
        "nn.conv2d_transpose",
        g,
        weight,
        channels=c,
        kernel_size=kernel,
        output_padding=_output_padding((h, w), out_hw, kernel, conv_attrs),
        **_geometry(conv_attrs),
    )


def _weight_adjoint(g: Expr, data: Expr, weight: Expr, conv_attrs: WindowAttrs, op: str) -> Expr:
    o, _, kh, kw = gh.static_shape(weight, op)
    return call(
        "nn.conv2d_backward_weight",
        g,
        data,
        channels=o,
        kernel_size=(kh, kw),
        **_geometry(conv_attrs),
    )


def _conv2d_grad(c: Call, g: Expr) -> list[Expr | None]:
    data, weight = c.args
    attrs = Conv2DAttrs.view(c.attrs)
    if _layouts(attrs) != ("NCHW", "OIHW", "NCHW"):
        raise Error(
            f"kiln differentiates nn.conv2d in NCHW data and OIHW kernel layouts only; this "
            f"call has data_layout={attrs.data_layout!r}, kernel_layout={attrs.kernel_layout!r}",
            c.span,
        )
    source = gh.dtype(data)
    if gh.dtype(c) != source:  # out_dtype: differentiate in the inputs' dtype
        g = call("cast", g, dtype=source)
    _, _, oh, ow = gh.static_shape(c, "nn.conv2d")
    _, _, kh, kw = gh.static_shape(weight, "nn.conv2d")
    plain = pair(attrs.dilation, "dilation") == (1, 1) and attrs.groups == 1
    if plain:
        data_adjoint = _data_adjoint_by_phases(g, data, weight, attrs, (kh, kw), (oh, ow))
    else:
        data_adjoint = _data_adjoint(g, weight, data, (oh, ow), (kh, kw), attrs, "nn.conv2d")
    return [data_adjoint, _weight_adjoint(g, data, weight, attrs, "nn.conv2d")]


# Where it can (no dilation, one group), conv2d's data adjoint is nn.conv2d itself, one per
# stride phase, whose kernels are scheduled for speed: nn.conv2d_transpose's plain reduction
# is several times slower (5 to 20 times at a small CNN's and ResNet's shapes). The weight's
# adjoint is nn.conv2d_backward_weight, whose
# float32 lowering is a blocked GEMM over the data's phase planes
# (kiln/loops/conv_grad_kernels.py): at ResNet-18's shapes, batch 8, 5 to 14 times faster
# than the convolution of the transposed data with the transposed adjoint it replaced.


def _phase(p: int, pad: int, s: int, k: int, size: int, out: int) -> tuple[list[int], int, int]:
    """Along one axis, for the data's rows ``p``, ``p + s``, ... (stride phase ``p`` of a
    convolution of stride ``s``, kernel ``k``, padding ``pad`` before, ``size`` in, ``out``
    out): the kernel taps that reach them, flipped (row a takes adjoint row a + q - t through
    tap r + s·t, r ≡ p + pad mod s), and the padding of the adjoint before and after them for
    a stride-1 convolution giving that phase's rows (either may be negative: rows to drop)."""
    r = (p + pad) % s
    taps = list(range(r, k, s))
    rows = -(-(size - p) // s)
    q = (p + pad - r) // s
    before = len(taps) - 1 - q
    return taps[::-1], before, rows + len(taps) - 1 - before - out


def _data_adjoint_by_phases(g: Expr, data: Expr, weight: Expr, attrs: WindowAttrs,
                            kernel: tuple[int, int], out_hw: tuple[int, int]) -> Expr:
    """With no dilation and one group: each stride phase (py, px) of the data (rows py,
    py + sh, ...) takes only the kernel taps congruent to it, so its adjoint is a stride-1
    convolution of the adjoint with that sub-kernel, flipped in space and its channels
    swapped (IOHW read as OIHW); the phases are then interleaved (stacked and reshaped).
    Stride 1 is one phase: the whole kernel flipped. The adjoint spread out by the stride
    and convolved with the whole kernel did sh·sw times the multiply-adds, most of them on
    the spread's zeros; a phase no tap reaches (a 1×1 kernel's odd rows) is zeros."""
    kh, kw = kernel
    top, left, _, _ = padding4(attrs.padding, "padding")
    sh, sw = pair(attrs.strides, "strides")
    n, c, h, w = gh.static_shape(data, "nn.conv2d")
    oh, ow = out_hw
    dt = gh.dtype(data)
    rows = [_phase(py, top, sh, kh, h, oh) for py in range(sh)]
    cols = [_phase(px, left, sw, kw, w, ow) for px in range(sw)]
    size_h, size_w = -(-h // sh), -(-w // sw)  # every phase padded to the first's size

    def part(py: int, px: int) -> Expr:
        (ty, by, ay), (tx, bx, ax) = rows[py], cols[px]
        ph, pw = -(-(h - py) // sh), -(-(w - px) // sw)
        begin, end = (max(-by, 0), max(-bx, 0)), (oh + min(ay, 0), ow + min(ax, 0))
        if not ty or not tx or begin[0] >= end[0] or begin[1] >= end[1] or not ph or not pw:
            return call("zeros", shape=(n, c, size_h, size_w), dtype=dt)
        adj = g
        if begin != (0, 0) or end != (oh, ow):
            adj = call("strided_slice", g, begin=[0, 0, *begin], end=[n, gh.static_shape(
                weight, "nn.conv2d")[0], *end])
        sub = weight
        for axis, taps, k in ((2, ty, kh), (3, tx, kw)):
            if taps != list(range(k)):
                sub = call("take", sub, const(np.array(taps, dtype="int32")), axis=axis)
        out = call("nn.conv2d", adj, call("transpose", sub, axes=[1, 0, 2, 3]),
                   padding=(max(by, 0), max(bx, 0), max(ay, 0), max(ax, 0)), channels=c,
                   kernel_size=(len(ty), len(tx)))
        if (ph, pw) != (size_h, size_w):
            out = call("nn.pad", out, gh.scalar(0, dt), pad_width=[
                (0, 0), (0, 0), (0, size_h - ph), (0, size_w - pw)])
        return out

    if (sh, sw) == (1, 1):
        return part(0, 0)
    # [n, c, a, b] of phase (py, px) is data's [n, c, a·sh + py, b·sw + px]
    lines = [call("reshape", call("stack", Tuple(tuple(part(py, px) for px in range(sw))),
                                  axis=4), newshape=[n, c, size_h, size_w * sw])
             for py in range(sh)]
    full = call("reshape", call("stack", Tuple(tuple(lines)), axis=3),
                newshape=[n, c, size_h * sh, size_w * sw])
    if (size_h * sh, size_w * sw) != (h, w):
        full = call("strided_slice", full, begin=[0, 0, 0, 0], end=[n, c, h, w])
    return full


def _conv2d_transpose_relation(
    arg_types: Sequence[Type], attrs: Conv2DTransposeAttrs
) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) not in (
        ("NCHW", "IOHW", ""),
        ("NCHW", "IOHW", "NCHW"),
    ):
        raise TypeCheckError(
            "kiln's nn.conv2d_transpose supports data_layout NCHW, kernel_layout IOHW and "
            f"out_layout NCHW only; got data_layout={attrs.data_layout!r}, "
            f"kernel_layout={attrs.kernel_layout!r}, out_layout={attrs.out_layout!r}"
        )
    same_dtype(args, ("data", "weight"))
    require_dtype(data, "data", "float")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "weight (IOHW)", 4)
    n, c, h, w = data.shape
    i, og, kh, kw = weight.shape
    groups = attrs.groups
    if groups < 1:
        raise TypeCheckError(f"groups must be positive, got {groups}")
    check_dims_equal(
        c,
        i,
        f"data of shape {shape_str(data.shape)} has {c} channels (dimension 1), but weight of "
        f"shape {shape_str(weight.shape)} expects {i} input channels (dimension 0)",
    )
    if isinstance(c, int) and c % groups:
        raise TypeCheckError(f"groups={groups} does not divide the {c} input channels")
    out_c: Dim = og * groups if isinstance(og, int) else ANY
    if attrs.channels is not None:
        check_dims_equal(
            attrs.channels,
            out_c,
            f"channels={attrs.channels} but weight of shape {shape_str(weight.shape)} and "
            f"groups={groups} give {out_c} output channels",
        )
        out_c = unify_dim(out_c, attrs.channels)
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    output_padding = pair(attrs.output_padding, "output_padding")
    top, left, bottom, right = padding4(attrs.padding, "padding")
    for axis in range(2):
        if not 0 <= output_padding[axis] < strides[axis]:
            raise TypeCheckError(
                f"output_padding {list(output_padding)} must be non-negative and smaller than "
                f"the strides {list(strides)}"
            )
    sizes = []
    for size, k, s, d, p, op in zip(
        (h, w), (kh, kw), strides, dilation, (top + bottom, left + right), output_padding
    ):
        if isinstance(size, int) and isinstance(k, int):
            out = (size - 1) * s - p + d * (k - 1) + op + 1
            if out <= 0:
                raise TypeCheckError(f"the padding {attrs.padding} leaves no output")
            sizes.append(out)
        else:
            sizes.append(ANY)
    if isinstance(kh, int) and isinstance(kw, int):
        check_window_attrs((kh, kw), strides, dilation)
    return TensorType((n, out_c, *sizes), attrs.out_dtype or data.dtype)


def _conv2d_transpose(arrays: list[np.ndarray], attrs: Conv2DTransposeAttrs) -> np.ndarray:
    x, w = np.asarray(arrays[0]), np.asarray(arrays[1])
    out_dtype = attrs.out_dtype or x.dtype.name
    acc = "float32" if out_dtype == "float16" else out_dtype
    x, w = x.astype(acc), w.astype(acc)
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    groups = attrs.groups
    cg = c // groups
    (sh, sw), (dh, dw) = pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    top, left, bottom, right = padding4(attrs.padding, "padding")
    oph, opw = pair(attrs.output_padding, "output_padding")
    oh = (h - 1) * sh - top - bottom + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - left - right + dw * (kw - 1) + opw + 1
    # Scatter every input element through every kernel tap into the padded output, then crop.
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, top + oh)
    full_w = max((wd - 1) * sw + dw * (kw - 1) + 1, left + ow)
    full = np.zeros((n, og * groups, full_h, full_w), acc)
    for g in range(groups):
        xg = x[:, g * cg : (g + 1) * cg]
        wg = w[g * cg : (g + 1) * cg]  # (cg, og, kh, kw)
        for i in range(kh):
            for j in range(kw):
                part = np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
                rows = slice(i * dh, i * dh + (h - 1) * sh + 1, sh)
                cols = slice(j * dw, j * dw + (wd - 1) * sw + 1, sw)
                full[:, g * og : (g + 1) * og, rows, cols] += part
    return as_array(full[:, :, top : top + oh, left : left + ow], out_dtype)


def _conv2d_transpose_grad(c: Call, g: Expr) -> list[Expr | None]:
    # conv2d_transpose(x, w) is the adjoint of conv2d(., w): its adjoints are conv2d's.
    data, weight = c.args
    attrs = Conv2DTransposeAttrs.view(c.attrs)
    ddata = call("nn.conv2d", g, weight, **_geometry(attrs))
    dweight = call(
        "nn.conv2d_backward_weight",
        data,
        g,
        channels=gh.static_shape(weight, "nn.conv2d_transpose")[0],
        kernel_size=gh.static_shape(weight, "nn.conv2d_transpose")[2:],
        **_geometry(attrs),
    )
    return [ddata, dweight]


@oplib.zeros_if_empty
def _conv2d_transpose_lower(
    inputs: list[Tensor], attrs: Conv2DTransposeAttrs, out_type: Type
) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    # Gathered rather than scattered: output row y takes input row iy through kernel row i
    # when y + top = iy * stride + i * dilation.
    x, w = inputs
    c, og, kh, kw = w.shape
    cg = c // attrs.groups
    (sh, sw), (dh, dw) = pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    top, left, _, _ = padding4(attrs.padding, "padding")
    oh, ow = out.static_shape[2:]
    acc, fin = _accumulate(out.dtype)
    zero = oplib.dtype_const(0, x.dtype)

    def source(o: LExpr, r: LExpr, size: int, k: int, s: int, d: int, pad: int) -> tuple:
        """(input index, its span, the exactness test or None) along one axis."""
        offset = o + pad - r * d
        lo, hi = pad - (k - 1) * d, size - 1 + pad
        exact = None if s == 1 else Binary("eq", offset % s, Const(0))
        return offset // s, (lo // s, hi // s), exact

    def body(o: tuple, r: tuple) -> LExpr:
        b, oc, y, xx = o
        rc, ry, rx = r
        ch = rc if attrs.groups == 1 else (oc // og) * cg + rc
        iy, span_y, exact_y = source(y, ry, oh, kh, sh, dh, top)
        ix, span_x, exact_x = source(xx, rx, ow, kw, sw, dw, left)
        exact = [e for e in (exact_y, exact_x) if e is not None]
        value = oplib.guarded_read(x, [b, ch, iy, ix], [None, None, span_y, span_x], zero, exact)
        return _product(value, w(ch, oc if attrs.groups == 1 else oc % og, ry, rx), acc)

    return reduce(out.static_shape, out.dtype, (cg, kh, kw), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


conv2d_transpose = register(
    "nn.conv2d_transpose",
    inputs=("data", "weight"),
    attrs_type=Conv2DTransposeAttrs,
    attrs=_window_attrs(
        (
            Attr("data_layout", "NCHW", kind="str", doc="layout of data (only NCHW)"),
            Attr("out_layout", "", kind="str", doc="layout of the result ('' or NCHW)"),
            Attr(
                "output_padding",
                (0, 0),
                kind="ints",
                convert=pair,
                doc="rows and columns added at the bottom and right of the result",
            ),
        ),
        "IOHW",
    ),
    relation=_conv2d_transpose_relation,
    compute=_conv2d_transpose,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Transposed 2-D convolution (the adjoint of conv2d) of NCHW data with an IOHW kernel.",
    gradient=_conv2d_transpose_grad,
    lower=_conv2d_transpose_lower,
)


def _kernel_size(attrs: Conv2DBackwardWeightAttrs) -> tuple[int, int]:
    """The kernel size, which conv2d_backward_weight requires (nothing else gives it)."""
    if attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_backward_weight needs kernel_size")
    return attrs.kernel_size


def _backward_weight_relation(
    arg_types: Sequence[Type], attrs: Conv2DBackwardWeightAttrs
) -> Type | None:
    args = tensor_args(arg_types, ("grad", "data"))
    if args is None:
        return None
    grad, data = args
    if (attrs.grad_layout, attrs.data_layout, attrs.kernel_layout) != ("NCHW", "NCHW", "OIHW"):
        raise TypeCheckError(
            "kiln's nn.conv2d_backward_weight supports grad_layout NCHW, data_layout NCHW and "
            "kernel_layout OIHW only"
        )
    same_dtype(args, ("grad", "data"))
    require_dtype(data, "data", "float")
    require_rank(grad, "grad (NCHW)", 4)
    require_rank(data, "data (NCHW)", 4)
    kh, kw = _kernel_size(attrs)
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    check_window_attrs((kh, kw), strides, dilation)
    groups = attrs.groups
    o, c = grad.shape[1], data.shape[1]
    if attrs.channels is not None:
        check_dims_equal(
            attrs.channels,
            o,
            f"channels={attrs.channels} but grad of shape {shape_str(grad.shape)} has {o}",
        )
    if isinstance(c, int) and c % groups:
        raise TypeCheckError(f"groups={groups} does not divide the {c} channels of data")
    top, left, bottom, right = padding4(attrs.padding, "padding")
    pads = (top + bottom, left + right)
    for axis, (size, want, k, s, d, p) in enumerate(
        zip(data.shape[2:], grad.shape[2:], (kh, kw), strides, dilation, pads)
    ):
        if isinstance(size, int):
            check_dims_equal(
                window_out_size(size, p, k, d, s),
                want,
                f"grad of shape {shape_str(grad.shape)} is not the shape conv2d gives for data "
                f"of shape {shape_str(data.shape)} (dimension {axis + 2})",
            )
    cg = c // groups if isinstance(c, int) else ANY
    return TensorType((o, cg, kh, kw), attrs.out_dtype or data.dtype)


def _conv2d_backward_weight(
    arrays: list[np.ndarray], attrs: Conv2DBackwardWeightAttrs
) -> np.ndarray:
    g, x = np.asarray(arrays[0]), np.asarray(arrays[1])
    out_dtype = attrs.out_dtype or x.dtype.name
    acc = "float32" if out_dtype == "float16" else out_dtype
    top, left, bottom, right = padding4(attrs.padding, "padding")
    x = np.pad(x.astype(acc), ((0, 0), (0, 0), (top, bottom), (left, right)))
    g = g.astype(acc)
    kernel = _kernel_size(attrs)
    windows = windows_2d(
        x, kernel, pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    )  # (N, C, OH, OW, kh, kw)
    groups = attrs.groups
    cg, og = x.shape[1] // groups, g.shape[1] // groups
    parts = []
    for k in range(groups):
        xg = windows[:, k * cg : (k + 1) * cg]
        gk = g[:, k * og : (k + 1) * og]
        parts.append(np.tensordot(gk, xg, axes=([0, 2, 3], [0, 2, 3])))  # (og, cg, kh, kw)
    return as_array(np.concatenate(parts, axis=0), out_dtype)


def _backward_weight_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Bilinear in (grad, data): <G, B(grad, data)> = <grad, conv2d(data, G)>.
    grad, data = c.args
    op = "nn.conv2d_backward_weight"
    _, _, oh, ow = gh.static_shape(grad, op)
    attrs = Conv2DBackwardWeightAttrs.view(c.attrs)
    kernel = _kernel_size(attrs)
    return [
        call("nn.conv2d", data, g, **_geometry(attrs)),
        _data_adjoint(grad, g, data, (oh, ow), kernel, attrs, op),
    ]


@oplib.zeros_if_empty
def _conv2d_backward_weight_lower(
    inputs: list[Tensor], attrs: Conv2DBackwardWeightAttrs, out_type: Type
) -> Tensor:
    from kiln.loops import conv_grad_kernels

    out = oplib.out_tensor_type(out_type)
    # weight[o, c, i, j] = sum over (batch, output rows, output columns) of
    # grad[b, o, y, x] * data[b, group(o) * cg + c, y * stride + i * dilation - pad, ...]
    g, x = inputs
    top, left, _, _ = padding4(attrs.padding, "padding")
    if conv_grad_kernels.usable(g, x, attrs.groups, out.dtype):  # float32: a blocked GEMM
        return conv_grad_kernels.backward_weight(
            g, x, out.static_shape[2:], pair(attrs.strides, "strides"), (top, left),
            pair(attrs.dilation, "dilation"), out.dtype)
    n, o_all, oh, ow = g.shape
    og = o_all // attrs.groups
    _, cg, kh, kw = out.static_shape
    (sh, sw), (dh, dw) = pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    top, left, _, _ = padding4(attrs.padding, "padding")
    spans = [None, None, oplib.window_span(oh, sh, kh, dh, top),
             oplib.window_span(ow, sw, kw, dw, left)]
    acc, fin = _accumulate(out.dtype)
    zero = oplib.dtype_const(0, x.dtype)

    def body(o: tuple, r: tuple) -> LExpr:
        oc, c, i, j = o
        b, y, xx = r
        ch = c if attrs.groups == 1 else (oc // og) * cg + c
        at = [b, ch, y * sh + i * dh - top, xx * sw + j * dw - left]
        return _product(g(b, oc, y, xx), oplib.guarded_read(x, at, spans, zero), acc)

    return reduce(out.static_shape, out.dtype, (n, oh, ow), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


conv2d_backward_weight = register(
    "nn.conv2d_backward_weight",
    inputs=("grad", "data"),
    attrs_type=Conv2DBackwardWeightAttrs,
    attrs=_window_attrs(
        (
            Attr("grad_layout", "NCHW", kind="str", doc="layout of grad (only NCHW)"),
            Attr("data_layout", "NCHW", kind="str", doc="layout of data (only NCHW)"),
        ),
        "OIHW",
    ),
    relation=_backward_weight_relation,
    compute=_conv2d_backward_weight,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="The adjoint of conv2d's weight: grad (of conv2d's result) correlated with data.",
    gradient=_backward_weight_grad,
    lower=_conv2d_backward_weight_lower,
)

__all__ = ["conv2d", "conv2d_backward_weight", "conv2d_transpose"]
