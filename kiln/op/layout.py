"""Data layouts as TVM writes them, and the operators that move data between them.

A layout names each axis of a tensor: an upper-case letter is a whole (primal) axis, a number
and a lower-case letter a block of that axis: ``NCHW16c`` is N, C/16, H, W, then 16 channels,
and ``OIHW4i4o`` blocks both I and O by 4. The element at logical index ``C = c0 * 16 + c1``
lives at ``[.., c0, .., c1]``. ``layout_transform`` (TVM's operator) moves a tensor from one
layout to another with the same primal axes; ``copy`` is TVM's identity copy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.loops.compute import Tensor, WriteFn, compute, extern
from kiln.loops.ir import Const, For, LetStmt, Stmt
from kiln.loops.ir import Expr as LExpr
from kiln.loops.ir import Var as LVar
from kiln.loops.schedule import PARALLEL_MIN_ELEMENTS, lowering_target
from kiln.op.common import shape_str, tensor_arg
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpPattern, register

_AXIS = re.compile(r"([0-9]*)([A-Za-z])")


@dataclass(frozen=True)
class Layout:
    """A parsed layout: for each position, its axis letter and block size (None: primal)."""

    text: str
    axes: tuple[tuple[str, int | None], ...]

    @property
    def primal(self) -> str:
        """The primal axes in the order they appear (``NCHW`` for ``NCHW16c``)."""
        return "".join(a for a, f in self.axes if f is None)

    def factor(self, axis: str) -> int | None:
        """The block size of primal ``axis`` (its lower-case sub-axis), or None."""
        for a, f in self.axes:
            if f is not None and a == axis.lower():
                return f
        return None

    def position(self, axis: str) -> int:
        return next(i for i, (a, _) in enumerate(self.axes) if a == axis)


def parse_layout(text: str) -> Layout:
    """``NCHW16c`` as a `Layout`; a TypeCheckError saying what is wrong otherwise."""
    axes: list[tuple[str, int | None]] = []
    pos = 0
    while pos < len(text):
        m = _AXIS.match(text, pos)
        if m is None:
            raise TypeCheckError(f"invalid layout {text!r}: expected letters and blocks like 16c")
        digits, letter = m.groups()
        pos = m.end()
        if letter.isupper():
            if digits:
                raise TypeCheckError(f"invalid layout {text!r}: a primal axis ({letter}) takes "
                                     "no size; a block is a number and a lower-case letter")
            axes.append((letter, None))
        else:
            if not digits or int(digits) <= 0:
                raise TypeCheckError(f"invalid layout {text!r}: the block {letter} needs a "
                                     "positive size, as in 16c")
            axes.append((letter, int(digits)))
    letters = [a for a, _ in axes]
    if len(set(letters)) != len(letters):
        raise TypeCheckError(f"invalid layout {text!r}: an axis appears twice")
    for a, f in axes:
        if f is not None and a.upper() not in letters:
            raise TypeCheckError(f"invalid layout {text!r}: block {a} of an axis "
                                 f"{a.upper()} it does not have")
    return Layout(text, tuple(axes))


def logical_shape(shape: Sequence[Dim], layout: Layout) -> dict[str, Dim]:
    """Each primal axis's full size for a tensor of ``shape`` in ``layout``."""
    out: dict[str, Dim] = {}
    for (a, f), d in zip(layout.axes, shape, strict=True):
        if f is None:
            block = layout.factor(a)
            if block is None:
                out[a] = d
            else:
                out[a] = d * block if isinstance(d, int) else ANY
    return out


def layout_shape(sizes: dict[str, Dim], layout: Layout) -> tuple[Dim, ...]:
    """The shape in ``layout`` of a tensor whose primal axes have ``sizes``."""
    shape: list[Dim] = []
    for a, f in layout.axes:
        if f is not None:
            shape.append(f)
            continue
        block = layout.factor(a)
        d = sizes[a]
        if block is None:
            shape.append(d)
        elif isinstance(d, int):
            if d % block:
                raise TypeCheckError(f"axis {a} of size {d} cannot be split into blocks of "
                                     f"{block} (layout {layout.text})")
            shape.append(d // block)
        else:
            shape.append(ANY)
    return tuple(shape)


def _check_layout(t: TensorType, layout: Layout, what: str) -> None:
    if t.ndim != len(layout.axes):
        raise TypeCheckError(f"{what} of shape {shape_str(t.shape)} has rank {t.ndim}, but "
                             f"layout {layout.text} has {len(layout.axes)} axes")
    for (a, f), d in zip(layout.axes, t.shape, strict=True):
        if f is not None and isinstance(d, int) and d != f:
            raise TypeCheckError(f"{what} of shape {shape_str(t.shape)} has {d} in the axis "
                                 f"of block {f}{a} of layout {layout.text}")


def transform_shape(shape: Sequence[Dim], src: Layout, dst: Layout) -> tuple[Dim, ...]:
    """The shape of a tensor of ``shape`` moved from layout ``src`` to ``dst``."""
    return layout_shape(logical_shape(shape, src), dst)


def _static(d: Dim) -> int:
    assert isinstance(d, int), "a lowered or computed tensor has a static shape"
    return d


def to_logical(x: np.ndarray, layout: Layout) -> np.ndarray:
    """An array in ``layout`` as an array of its primal axes (in ``layout.primal`` order)."""
    order: list[int] = []
    for a in layout.primal:
        order.append(layout.position(a))
        if layout.factor(a) is not None:
            order.append(layout.position(a.lower()))
    y = x.transpose(order)
    sizes = logical_shape(x.shape, layout)
    return y.reshape([_static(sizes[a]) for a in layout.primal])


def from_logical(x: np.ndarray, primal: str, layout: Layout) -> np.ndarray:
    """An array of primal axes ``primal`` laid out as ``layout``."""
    x = x.transpose([primal.index(a) for a in layout.primal])
    split: list[int] = []
    names: list[str] = []
    for a, d in zip(layout.primal, x.shape, strict=True):
        f = layout.factor(a)
        if f is None:
            split.append(d)
            names.append(a)
        else:
            split.extend((d // f, f))
            names.extend((a, a.lower()))
    x = x.reshape(split)
    return np.ascontiguousarray(x.transpose([names.index(a) for a, _ in layout.axes]))


def read_in_layout(x: Tensor, src: Layout, dst: Layout) -> Tensor:
    """``x`` (in ``src``) read as a tensor in ``dst``: each index computed from the other's."""
    shape = tuple(_static(d) for d in transform_shape(x.shape, src, dst))

    def element(*i: LExpr) -> LExpr:
        logical: dict[str, LExpr] = {}
        for (a, f), idx in zip(dst.axes, i, strict=True):
            if f is None:
                block = dst.factor(a)
                logical[a] = idx if block is None else idx * block + i[dst.position(a.lower())]
        at: list[LExpr] = []
        for a, f in src.axes:
            if f is not None:
                at.append(logical[a.upper()] % f)
            elif (src_block := src.factor(a)) is not None:
                at.append(logical[a] // src_block)
            else:
                at.append(logical[a])
        return x(*at)

    return compute(shape, x.dtype, element)


# --- layout_transform ---------------------------------------------------------------------


class LayoutTransformAttrs(Attrs):
    __slots__ = ()
    src_layout: str
    dst_layout: str


def _layouts(attrs: LayoutTransformAttrs) -> tuple[Layout, Layout]:
    src, dst = parse_layout(attrs.src_layout), parse_layout(attrs.dst_layout)
    if sorted(src.primal) != sorted(dst.primal):
        raise TypeCheckError(f"layouts {src.text} and {dst.text} do not have the same axes")
    return src, dst


def _layout_transform_relation(arg_types: Sequence[Type],
                               attrs: LayoutTransformAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    src, dst = _layouts(attrs)
    _check_layout(data, src, "data")
    return TensorType(transform_shape(data.shape, src, dst), data.dtype)


def _layout_transform(arrays: list[np.ndarray], attrs: LayoutTransformAttrs) -> np.ndarray:
    src, dst = _layouts(attrs)
    return from_logical(to_logical(np.asarray(arrays[0]), src), src.primal, dst)


def _layout_transform_grad(c: Call, g: Expr) -> list[Expr | None]:
    attrs = LayoutTransformAttrs.view(c.attrs)
    return [call("layout_transform", g, src_layout=attrs.dst_layout,
                 dst_layout=attrs.src_layout)]


def _layout_transform_lower(inputs: list[Tensor], attrs: LayoutTransformAttrs,
                            out_type: Type) -> Tensor:
    src, dst = _layouts(attrs)
    x = inputs[0]
    if src.text == "NCHW" and _channel_blocks(dst):
        return _blocks_moved(x, _channel_blocks(dst), into=True)
    if dst.text == "NCHW" and _channel_blocks(src):
        return _blocks_moved(x, _channel_blocks(src), into=False)
    return read_in_layout(x, src, dst)


def _channel_blocks(layout: Layout) -> int:
    """b for ``NCHW[b]c``, else 0."""
    text = layout.text
    return int(text[4:-1]) if re.fullmatch(r"NCHW[0-9]+c", text) else 0


def _blocks_moved(x: Tensor, b: int, into: bool) -> Tensor:
    """NCHW → NCHW[b]c (``into``) or back, a block of channels and a row of the image at a
    time, its b·W values in L1: into blocks, each pixel's vector of b channels gathered from
    the block's b rows; out of them, each of the b rows a vector gathered from the block's
    row of pixels. As the output's axes in order (`read_in_layout`), a 64-channel 56² image
    took 62 and 69 µs (the vectors out of blocks gathered a channel at a time through the
    whole image, every line from L2), now 33 and 34 (2 threads, Emerald Rapids). The moves
    write through fused consumers of their shape; a consumer of another shape (the slice
    that drops convert-layout's padding channels) reads them from a buffer: 24 channels of
    32 at 56², 21 → 24 µs, where a 96-channel 112² image out of blocks takes 333 → 178."""
    shape = [int(d) for d in x.shape]
    n, h, w = shape[0], shape[2], shape[3]
    blocks = shape[1] // b if into else shape[1]
    out = (n, blocks, h, w, b) if into else (n, blocks * b, h, w)
    units = blocks * h
    parallel = "parallel" if lowering_target().cores > 1 and units > 1 \
        and n * blocks * b * h * w >= PARALLEL_MIN_ELEMENTS else "serial"

    def emit(write: WriteFn) -> Stmt:
        img, u, c0, y, c1, col = (LVar(v) for v in ("n", "u", "c0", "y", "c1", "x"))
        if into:
            one = For(c1, Const(0), Const(b), write((img, c0, y, col, c1), x(
                img, c0 * b + c1, y, col)), "vectorized")
            rows = For(col, Const(0), Const(w), one, "rolled")
        else:
            one = For(col, Const(0), Const(w), write((img, c0 * b + c1, y, col), x(
                img, c0, y, col, c1)), "vectorized")
            rows = For(c1, Const(0), Const(b), one, "rolled")
        body = LetStmt(c0, u // h, LetStmt(y, u % h, rows))
        return For(img, Const(0), Const(n), For(u, Const(0), Const(units), body, parallel))

    return extern(out, x.dtype, emit)


layout_transform = register(
    "layout_transform",
    inputs=("data",),
    attrs_type=LayoutTransformAttrs,
    attrs=(
        Attr("src_layout", kind="str", doc="the layout of data, such as NCHW"),
        Attr("dst_layout", kind="str", doc="the layout of the result, such as NCHW16c"),
    ),
    relation=_layout_transform_relation,
    compute=_layout_transform,
    pattern=OpPattern.INJECTIVE,
    doc="The tensor moved from one data layout to another (TVM's, e.g. NCHW to NCHW16c).",
    gradient=_layout_transform_grad,
    lower=_layout_transform_lower,
)


# --- copy ---------------------------------------------------------------------------------


def _copy_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    return tensor_arg(arg_types[0], "data")


copy = register(
    "copy",
    inputs=("data",),
    relation=_copy_relation,
    compute=lambda arrays, attrs: np.array(arrays[0], copy=True),
    pattern=OpPattern.ELEMWISE,
    doc="A copy of the tensor (TVM's copy).",
    gradient=lambda c, g: [g],
    lower=lambda inputs, attrs, out: compute(inputs[0].shape, inputs[0].dtype, inputs[0]),
)

__all__ = ["copy", "layout_transform", "parse_layout"]
