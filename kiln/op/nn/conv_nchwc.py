"""nn.contrib_conv2d_NCHWc: 2-D convolution on channel-blocked tensors (TVM's operator).

TVM's alter-op-layout rewrote ``nn.conv2d`` for x86 into this operator: data in ``NCHW[x]c``
(channels split into blocks of x, the block innermost), kernel in ``OIHW[x]i[y]o`` and the
result in ``out_layout`` (``NCHW[y]c``). The arithmetic is conv2d's: the element of logical
channel ``C = c0 * x + c1`` lives at ``[n, c0, h, w, c1]`` (see `kiln.op.layout`). Its attributes
are conv2d's (TVM's Conv2DAttrs) and its type relation is TVM's: the result is the NCHW
convolution's shape written in ``out_layout`` ('' means data_layout), of dtype out_dtype. TVM
requires ``channels`` and ``kernel_size`` and does not look at the weight; kiln reads them from
the weight when they are missing and checks the weight against them when they are given.

Any layouts whose primal axes are N, C, H, W (data, result) and O, I, H, W (kernel) are taken,
blocked or not. The reference and the lowering read the inputs in NCHW / OIHW through the layout
index math, convolve as conv2d does, and write the result in ``out_layout``; the gradient is
conv2d's, moved between the layouts with ``layout_transform``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    check_dims_equal,
    check_window_attrs,
    padding4,
    pair,
    shape_str,
    tensor_args,
    unify_dim,
    window_out_size,
)
from kiln.op.grad_helpers import call
from kiln.op.layout import (
    Layout,
    from_logical,
    layout_shape,
    logical_shape,
    parse_layout,
    read_in_layout,
    to_logical,
)
from kiln.op.nn.conv import (
    Conv2DAttrs,
    _conv2d_lower_nchw,
    _conv2d_nchw,
    _geometry,
    _output_padding,
    _window_attrs,
    check_input_dtypes,
)
from kiln.op.registry import Attr, OpPattern, register

NAME = "nn.contrib_conv2d_NCHWc"
_NCHW, _OIHW = parse_layout("NCHW"), parse_layout("OIHW")


def _layout(text: str, primal: str, what: str) -> Layout:
    """``text`` parsed; a TypeCheckError unless its primal axes are those of ``primal``."""
    layout = parse_layout(text)
    if sorted(layout.primal) != sorted(primal):
        raise TypeCheckError(
            f"{NAME} needs a {what} layout with the axes {primal} (blocked or not, such as "
            f"{primal}8{primal[1].lower()}), got {text!r}"
        )
    return layout


def _layouts(attrs: Conv2DAttrs) -> tuple[Layout, Layout, Layout]:
    """(data, kernel, result) layouts of a call."""
    data = _layout(attrs.data_layout, "NCHW", "data_layout")
    kernel = _layout(attrs.kernel_layout, "OIHW", "kernel_layout")
    out = _layout(attrs.out_layout or attrs.data_layout, "NCHW", "out_layout")
    return data, kernel, out


def _check_shape(t: TensorType, layout: Layout, what: str) -> None:
    """``t`` has one axis per axis of ``layout`` and each block axis the block's size."""
    if t.ndim != len(layout.axes):
        raise TypeCheckError(
            f"{what} of shape {shape_str(t.shape)} has rank {t.ndim}, but layout {layout.text} "
            f"has {len(layout.axes)} axes"
        )
    for (axis, block), d in zip(layout.axes, t.shape, strict=True):
        if block is not None and isinstance(d, int) and d != block:
            raise TypeCheckError(
                f"{what} of shape {shape_str(t.shape)} has {d} in the axis of block "
                f"{block}{axis} of layout {layout.text}"
            )


def _logical(t: TensorType, layout: Layout, target: str, what: str) -> tuple[Dim, ...]:
    """The unblocked shape of ``t`` (in ``layout``) with its axes in the order ``target``."""
    _check_shape(t, layout, what)
    sizes = logical_shape(t.shape, layout)
    return tuple(sizes[a] for a in target)


def _relation(arg_types: Sequence[Type], attrs: Conv2DAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    check_input_dtypes(data, weight, attrs)
    n, c, h, w = _logical(data, data_layout, "NCHW", f"data ({data_layout.text})")
    o, i, kh, kw = _logical(weight, kernel_layout, "OIHW", f"weight ({kernel_layout.text})")
    groups = attrs.groups
    if groups < 1:
        raise TypeCheckError(f"groups must be positive, got {groups}")
    if isinstance(i, int):
        check_dims_equal(
            c, i * groups,
            f"data of shape {shape_str(data.shape)} ({data_layout.text}) has {c} channels, but "
            f"weight of shape {shape_str(weight.shape)} ({kernel_layout.text}) expects {i} input "
            f"channels per group times groups={groups}, that is {i * groups}",
        )
    if isinstance(o, int) and o % groups:
        raise TypeCheckError(
            f"weight of shape {shape_str(weight.shape)} ({kernel_layout.text}) has {o} output "
            f"channels, which groups={groups} does not divide"
        )
    if attrs.channels is not None:
        check_dims_equal(
            attrs.channels, o,
            f"channels={attrs.channels} but weight of shape {shape_str(weight.shape)} "
            f"({kernel_layout.text}) has {o} output channels",
        )
        o = unify_dim(o, attrs.channels)
    if attrs.kernel_size is not None:
        want = pair(attrs.kernel_size, "kernel_size")
        for axis, (k, have) in zip("HW", zip(want, (kh, kw), strict=True), strict=True):
            check_dims_equal(
                k, have,
                f"kernel_size={list(want)} but weight of shape {shape_str(weight.shape)} "
                f"({kernel_layout.text}) has {have} along {axis}",
            )
        kh, kw = unify_dim(kh, want[0]), unify_dim(kw, want[1])
    strides = pair(attrs.strides, "strides")
    dilation = pair(attrs.dilation, "dilation")
    top, left, bottom, right = padding4(attrs.padding, "padding")
    oh: Dim = ANY
    ow: Dim = ANY
    if isinstance(kh, int) and isinstance(kw, int):
        check_window_attrs((kh, kw), strides, dilation)
        oh = window_out_size(h, top + bottom, kh, dilation[0], strides[0])
        ow = window_out_size(w, left + right, kw, dilation[1], strides[1])
    shape = layout_shape({"N": n, "C": o, "H": oh, "W": ow}, out_layout)
    return TensorType(shape, attrs.out_dtype or data.dtype)


def _static(d: Dim) -> int:
    assert isinstance(d, int), "a lowered or differentiated tensor has a static shape"
    return d


def _unblocked(x: np.ndarray, layout: Layout, target: str) -> np.ndarray:
    """An array in ``layout`` as an array of its primal axes in the order ``target``."""
    logical = to_logical(x, layout)
    return logical.transpose([layout.primal.index(a) for a in target])


def _compute(arrays: list[np.ndarray], attrs: Conv2DAttrs) -> np.ndarray:
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    x = _unblocked(np.asarray(arrays[0]), data_layout, "NCHW")
    w = _unblocked(np.asarray(arrays[1]), kernel_layout, "OIHW")
    return from_logical(_conv2d_nchw(x, w, attrs), "NCHW", out_layout)


def fast_form(data: Layout, kernel: Layout, out: Layout, groups: int, channels: int,
              kernel_in: int) -> str | None:
    """Which kernel of kiln/loops/nchwc_kernels.py takes a float32 call in these layouts:
    "direct" (groups = 1; data ``NCHW[bi]c``, or NCHW with bi = 1; kernel ``OIHW[bi]i[bo]o``; result
    ``NCHW[bo]c``), "depthwise" (a channel per group; data and result ``NCHW[b]c``, kernel
    ``OIHW1i[b]o``), or None (the plain reduction)."""
    bo = out.factor("C")
    bi = data.factor("C") or 1
    if bo is None or out.text != f"NCHW{bo}c" or data.text not in ("NCHW", f"NCHW{bi}c"):
        return None
    if groups == 1 and kernel.text == f"OIHW{bi}i{bo}o":
        return "direct"
    if (groups == channels and kernel_in == 1 and bi == bo and data.text != "NCHW"
            and kernel.text == f"OIHW1i{bo}o"):
        return "depthwise"
    return None


def _fast(x: Tensor, w: Tensor, attrs: Conv2DAttrs, out: TensorType,
          layouts: tuple[Layout, Layout, Layout]) -> Tensor | None:
    """The call as a kernel of kiln/loops/nchwc_kernels.py, where `fast_form` gives one."""
    from kiln.loops import nchwc_kernels
    from kiln.loops.compute import BufferTensor, extern

    data_layout, kernel_layout, out_layout = layouts
    if x.dtype != "float32" or w.dtype != "float32" or out.dtype != "float32":
        return None
    channels = _static(logical_shape(x.shape, data_layout)["C"])
    kernel_in = _static(logical_shape(w.shape, kernel_layout)["I"])
    form = fast_form(data_layout, kernel_layout, out_layout, attrs.groups, channels, kernel_in)
    if form is None:
        return None
    strides, dilation = pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    top, left, _, _ = padding4(attrs.padding, "padding")
    shape = out.static_shape
    if not isinstance(w, BufferTensor):
        return None
    weight = w
    if form == "direct":
        pixels, blocks, chunks, tuned = nchwc_kernels.chosen_tile(
            x.shape, w.shape, strides, (top, left), dilation, shape)
        t = extern(shape, out.dtype, lambda write: nchwc_kernels.conv_nchwc(
            x, weight, strides, (top, left), dilation, shape, write, (pixels, blocks),
            chunks=chunks))
        t.schedule = {"kernel": "nchwc direct", "pixels": pixels, "blocks": blocks,
                      "chunks": chunks, "tuned": tuned,
                      "key": nchwc_kernels.nchwc_key(x.shape, w.shape, strides, (top, left),
                                                     dilation, shape)}
        return t
    elif isinstance(x, BufferTensor):
        data = x
        tile, chunks, tuned = nchwc_kernels.depthwise_schedule(
            x.shape, w.shape, strides, (top, left), dilation, shape)
        t = extern(shape, out.dtype, lambda write: nchwc_kernels.depthwise_nchwc(
            data, weight, strides, (top, left), dilation, shape, write, most_pixels=tile,
            chunks=chunks))
        t.schedule = {"kernel": "nchwc depthwise", "pixels": tile, "chunks": chunks,
                      "tuned": tuned,
                      "key": nchwc_kernels.depthwise_key(x.shape, w.shape, strides,
                                                         (top, left), dilation, shape)}
        return t
    return None


@oplib.zeros_if_empty
def _lower(inputs: list[Tensor], attrs: Conv2DAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    fast = _fast(inputs[0], inputs[1], attrs, out, (data_layout, kernel_layout, out_layout))
    if fast is not None:
        return fast
    # Otherwise conv2d's plain reduction over the inputs read through the layouts' index
    # math, its result read back into out_layout.
    x = read_in_layout(inputs[0], data_layout, _NCHW)
    w = read_in_layout(inputs[1], kernel_layout, _OIHW)
    sizes = logical_shape(out.static_shape, out_layout)
    shape = tuple(_static(sizes[a]) for a in "NCHW")
    y = _conv2d_lower_nchw(x, w, attrs, shape, out.dtype, fast=False)
    return read_in_layout(y, _NCHW, out_layout)


def _moved(e: Expr, src: Layout, dst: Layout) -> Expr:
    """``e`` moved from layout ``src`` to ``dst`` (itself when they are the same)."""
    if src.text == dst.text:
        return e
    return call("layout_transform", e, src_layout=src.text, dst_layout=dst.text)


def _grad(c: Call, g: Expr) -> list[Expr | None]:
    # conv2d's adjoints in NCHW / OIHW, with the arguments and the result's adjoint moved there
    # and the adjoints moved back.
    data, weight = c.args
    attrs = Conv2DAttrs.view(c.attrs)
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    source = gh.dtype(data)
    if gh.dtype(c) != source:  # out_dtype: differentiate in the inputs' dtype
        g = call("cast", g, dtype=source)
    dsizes = logical_shape(gh.static_shape(data, NAME), data_layout)
    wsizes = logical_shape(gh.static_shape(weight, NAME), kernel_layout)
    osizes = logical_shape(gh.static_shape(c, NAME), out_layout)
    h, w = _static(dsizes["H"]), _static(dsizes["W"])
    kernel = (_static(wsizes["H"]), _static(wsizes["W"]))
    out_hw = (_static(osizes["H"]), _static(osizes["W"]))
    x4 = _moved(data, data_layout, _NCHW)
    w4 = _moved(weight, kernel_layout, _OIHW)
    g4 = _moved(g, out_layout, _NCHW)
    dx = call(
        "nn.conv2d_transpose", g4, w4,
        channels=_static(dsizes["C"]), kernel_size=kernel,
        output_padding=_output_padding((h, w), out_hw, kernel, attrs),
        **_geometry(attrs),
    )
    dw = call(
        "nn.conv2d_backward_weight", g4, x4,
        channels=_static(wsizes["O"]), kernel_size=kernel, **_geometry(attrs),
    )
    return [_moved(dx, _NCHW, data_layout), _moved(dw, _OIHW, kernel_layout)]


def _attrs() -> tuple[Attr, ...]:
    return _window_attrs(
        (Attr("data_layout", "NCHW", kind="str",
              doc="layout of data, such as NCHW8c (axes N, C, H, W; C may be blocked)"),),
        "OIHW",
        (Attr("out_layout", "", kind="str",
              doc="layout of the result, such as NCHW8c ('': data_layout)"),),
    )


contrib_conv2d_nchwc = register(
    NAME,
    inputs=("data", "weight"),
    attrs_type=Conv2DAttrs,
    attrs=_attrs(),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="2-D convolution of channel-blocked data (NCHW8c) with a blocked kernel (OIHW8i8o).",
    gradient=_grad,
    lower=_lower,
)

__all__ = ["contrib_conv2d_nchwc"]
