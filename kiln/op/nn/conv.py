"""2-D convolution: nn.conv2d in NCHW data / OIHW kernel layout, grouped and dilated."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import ANY, TensorType, Type
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
from kiln.op.registry import Attr, OpPattern, register


def _conv2d_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout)
    if layouts[:2] != ("NCHW", "OIHW") or layouts[2] not in ("", "NCHW"):
        raise TypeCheckError(
            "kiln's nn.conv2d supports data_layout NCHW, kernel_layout OIHW and out_layout "
            f"NCHW only; got data_layout={layouts[0]!r}, kernel_layout={layouts[1]!r}, "
            f"out_layout={layouts[2]!r}"
        )
    same_dtype(args, ("data", "weight"))
    require_dtype(data, "data", "numeric")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "weight (OIHW)", 4)
    n, c, h, w = data.shape
    o, i, kh, kw = weight.shape
    groups = attrs.groups
    if groups < 1:  # type: ignore[operator]
        raise TypeCheckError(f"groups must be positive, got {groups}")
    if isinstance(i, int):
        check_dims_equal(
            c,
            i * groups,  # type: ignore[operator]
            f"data of shape {shape_str(data.shape)} has {c} channels (dimension 1), but weight "
            f"of shape {shape_str(weight.shape)} expects {i} input channels per group times "
            f"groups={groups}, that is {i * groups}",  # type: ignore[operator]
        )
    if isinstance(o, int) and o % groups:  # type: ignore[operator]
        raise TypeCheckError(
            f"weight of shape {shape_str(weight.shape)} has {o} output channels, which "
            f"groups={groups} does not divide"
        )
    if attrs.channels is not None:
        check_dims_equal(
            attrs.channels,
            o,  # type: ignore[arg-type]
            f"channels={attrs.channels} but weight of shape {shape_str(weight.shape)} has {o} "
            "output channels (dimension 0)",
        )
        o = unify_dim(o, attrs.channels)  # type: ignore[arg-type]
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
    return TensorType((n, o, oh, ow), attrs.out_dtype or data.dtype)  # type: ignore[arg-type]


def _conv2d(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, w = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = attrs.out_dtype or x.dtype.name
    acc = "float32" if out == "float16" else out
    top, left, bottom, right = padding4(attrs.padding, "padding")
    x = np.pad(x.astype(acc), ((0, 0), (0, 0), (top, bottom), (left, right)))
    w = w.astype(acc)
    windows = windows_2d(
        x, w.shape[2:], pair(attrs.strides, "strides"), pair(attrs.dilation, "dilation")
    )  # (N, C, OH, OW, kh, kw)
    groups = attrs.groups
    cg, og = x.shape[1] // groups, w.shape[0] // groups  # type: ignore[operator]
    parts = []
    for g in range(groups):  # type: ignore[call-overload]
        xg = windows[:, g * cg : (g + 1) * cg]
        wg = w[g * og : (g + 1) * og]
        parts.append(np.tensordot(xg, wg, axes=([1, 4, 5], [1, 2, 3])))  # (N, OH, OW, og)
    return as_array(np.concatenate(parts, axis=-1).transpose(0, 3, 1, 2), out)  # type: ignore


conv2d = register(
    "nn.conv2d",
    inputs=("data", "weight"),
    attrs=(
        Attr("strides", (1, 1), kind="ints", convert=pair, doc="step of the window (h, w)"),
        # TVM's default is (0, 0); a given padding is normalized to (top, left, bottom, right).
        Attr(
            "padding",
            (0, 0),
            kind="ints",
            convert=padding4,
            doc="zero padding: 1, 2 or 4 numbers, kept as (top, left, bottom, right)",
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
        Attr("data_layout", "NCHW", kind="str", doc="layout of data (only NCHW)"),
        Attr("kernel_layout", "OIHW", kind="str", doc="layout of weight (only OIHW)"),
        Attr("out_layout", "", kind="str", doc="layout of the result ('' or NCHW)"),
        Attr("out_dtype", "", kind="dtype", doc="result dtype; '': that of data"),
    ),
    relation=_conv2d_relation,
    compute=_conv2d,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="2-D convolution (cross-correlation) of NCHW data with an OIHW kernel.",
)

__all__ = ["conv2d"]
