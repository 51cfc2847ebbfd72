"""Views and shape operators: view, permute, slicing, joining, splitting, indexing, padding.

torch's views share storage; kiln's values are immutable, so a view is simply a new value
(``clone`` and ``alias`` are the identity). Sizes come from the shapes torch recorded, so a
``view`` does not need to evaluate the size arithmetic that produced its argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr, const
from kiln.op import (
    broadcast_to,
    concatenate,
    dyn,
    expand_dims,
    nn,
    split,
    squeeze,
    stack,
    strided_slice,
    take,
    tile,
    transpose,
)

_END = 2**31 - 1  # an end at or past this is "to the end of the axis" for strided_slice


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.view_copy.default")
def view(n: AtenCall, x: Expr, _size: object) -> Expr:
    return n.reshape(x, n.out_sizes)


@converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
           "aten.lift_fresh_copy.default", "aten.contiguous.default")
def identity(n: AtenCall, x: Expr, *_: object) -> Expr:
    return x


@converter("aten.permute.default")
def permute(n: AtenCall, x: Expr, dims: Sequence[int]) -> Expr:
    rank = n.rank(x)
    axes = [axis(d, rank, n) for d in dims]
    return x if axes == list(range(rank)) else transpose(x, axes=axes)


@converter("aten.transpose.int")
def transpose_(n: AtenCall, x: Expr, dim0: int, dim1: int) -> Expr:
    rank = n.rank(x)
    a, b = axis(dim0, rank, n), axis(dim1, rank, n)
    if a == b or rank < 2:
        return x
    axes = list(range(rank))
    axes[a], axes[b] = b, a
    return transpose(x, axes=axes)


@converter("aten.t.default", "aten.numpy_T.default")
def t(n: AtenCall, x: Expr) -> Expr:
    return x if n.rank(x) < 2 else transpose(x, axes=list(range(n.rank(x)))[::-1])


@converter("aten.unsqueeze.default")
def unsqueeze(n: AtenCall, x: Expr, dim: int) -> Expr:
    return expand_dims(x, axis=axis(dim, n.rank(x) + 1, n))


@converter("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def squeeze_(n: AtenCall, x: Expr, dims: int | Sequence[int] | None = None) -> Expr:
    shape, rank = n.shape(x), n.rank(x)
    if dims is None:
        candidates = list(range(rank))
    else:
        candidates = [axis(d, rank, n) for d in ([dims] if isinstance(dims, int) else dims)]
    axes = sorted({a for a in candidates if rank > 0 and shape[a] == 1})  # torch skips others
    return squeeze(x, axis=axes) if axes else x


@converter("aten.expand.default", "aten.expand_copy.default")
def expand(n: AtenCall, x: Expr, _size: object, *_: object) -> Expr:
    if tuple(n.out.shape) == tuple(n.shape(x)):
        return x
    if not n.out.is_static:  # to sizes computed when the program runs
        return dyn.broadcast_to(x, n.shape_tensor(n.out_sizes))
    return broadcast_to(x, shape=n.static_out("expand"))


@converter("aten.repeat.default")
def repeat(n: AtenCall, x: Expr, repeats: Sequence[int]) -> Expr:
    extra = len(repeats) - n.rank(x)
    if extra > 0:
        x = expand_dims(x, axis=0, num_newaxis=extra)  # torch.repeat adds leading axes
    return tile(x, reps=list(repeats))


@converter("aten.cat.default")
def cat(n: AtenCall, tensors: list[Expr], dim: int = 0) -> Expr:
    # torch lets a 1-D empty tensor join anything (an old convention); kiln does not.
    parts = [x for x in tensors if not (n.rank(x) == 1 and n.shape(x)[0] == 0)]
    if not parts:
        return tensors[0]
    rank = n.rank(parts[0])
    parts = [n.tensor(x, n.out.dtype) for x in parts]
    if len(parts) == 1:
        return parts[0]
    return concatenate(parts, axis=axis(dim, rank, n))


@converter("aten.stack.default")
def stack_(n: AtenCall, tensors: list[Expr], dim: int = 0) -> Expr:
    rank = n.rank(tensors[0])
    return stack([n.tensor(x, n.out.dtype) for x in tensors], axis=axis(dim, rank + 1, n))


def _split(n: AtenCall, x: Expr, sizes: Sequence[int], ax: int) -> list[Expr]:
    if len(sizes) == 1:
        return [x]
    bounds = list(np.cumsum(sizes[:-1]).tolist())
    parts = split(x, indices_or_sections=bounds, axis=ax)
    return [parts[i] for i in range(len(sizes))]


@converter("aten.split_with_sizes.default")
def split_with_sizes(n: AtenCall, x: Expr, sizes: Sequence[Any], dim: int = 0) -> list[Expr]:
    ax = axis(dim, n.rank(x), n)
    if not all(isinstance(s, int) for s in sizes):
        return split_at_run_time(n, x, ax)
    return _split(n, x, list(sizes), ax)


def split_at_run_time(n: AtenCall, x: Expr, ax: int) -> list[Expr]:
    """Pieces along an axis of symbolic size (chunk, split): each a ``dyn.strided_slice``
    between offsets summed from the pieces' sizes torch traced (ints or symbolic sizes,
    computed when the program runs). torch.export fixes the number of pieces."""
    vals = n.node.meta.get("val")
    if not isinstance(vals, (list, tuple)) or not vals:
        raise n.error("splitting along a symbolic dimension: torch recorded no pieces")
    sizes = [v.shape[ax] for v in vals]
    if len(sizes) == 1:
        return [x]
    pieces: list[Expr] = []
    start: Any = 0
    big = [_END] * ax
    ones = const(np.ones(ax + 1, "int64"))
    for k, size in enumerate(sizes):
        stop = start + size
        end = n.shape_tensor([*big, _END if k == len(sizes) - 1 else stop])
        pieces.append(dyn.strided_slice(x, n.shape_tensor([*[0] * ax, start]), end, ones))
        start = stop
    return pieces


@converter("aten.split.Tensor")
def split_tensor(n: AtenCall, x: Expr, size: int, dim: int = 0) -> list[Expr]:
    ax = axis(dim, n.rank(x), n)
    total = n.shape(x)[ax]
    if not isinstance(total, int):  # the pieces' sizes as torch traced them
        return split_at_run_time(n, x, ax)
    sizes = [min(size, total - start) for start in range(0, total, size)] or [0]
    return _split(n, x, sizes, ax)


@converter("aten.unbind.int")
def unbind(n: AtenCall, x: Expr, dim: int = 0) -> list[Expr]:
    ax = axis(dim, n.rank(x), n)
    count = n.shape(x)[ax]
    if not isinstance(count, int):
        raise n.error(f"unbind along a symbolic dimension ({count}) is not supported")
    return [squeeze(part, axis=[ax]) for part in _split(n, x, [1] * count, ax)]


@converter("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(n: AtenCall, x: Expr, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Expr:
    ax = axis(dim, n.rank(x), n)
    size = n.shape(x)[ax]
    if not all(v is None or isinstance(v, int) for v in (start, end)):
        return _slice_at_run_time(n, x, ax, start, end, step)
    begin = 0 if start is None else _bound(n, start)
    stop = _END if end is None else min(_bound(n, end), _END)
    if isinstance(size, int):
        begin, stop, _ = slice(begin, stop, step).indices(size)
        if (begin, stop, step) == (0, size, 1):
            return x
    elif (begin, stop, step) == (0, _END, 1):
        return x
    return strided_slice(x, begin=[begin], end=[stop], strides=[step], axes=[ax])


def _slice_at_run_time(n: AtenCall, x: Expr, ax: int, start: Any, end: Any,
                       step: int) -> Expr:
    """A slice whose bounds are symbolic sizes, computed when the program runs (positive
    steps: the bounds then clamp as Python's slices do)."""
    if not isinstance(step, int) or step <= 0:
        raise n.error(f"slicing with bounds computed at run time takes a positive step, not "
                      f"{step}")
    lead = [0] * ax
    begin = n.shape_tensor([*lead, 0 if start is None else start])
    stop = n.shape_tensor([*[_END] * ax, _END if end is None else end])
    strides = const(np.asarray([1] * ax + [step], "int64"))
    return dyn.strided_slice(x, begin, stop, strides)


def _bound(n: AtenCall, v: Any) -> int:
    if not isinstance(v, int):
        raise n.error(f"slicing at a symbolic position ({v}) is not supported")
    return max(min(v, _END), -_END)


@converter("aten.select.int", "aten.select_copy.int")
def select(n: AtenCall, x: Expr, dim: int, index: int) -> Expr:
    ax = axis(dim, n.rank(x), n)
    size = n.shape(x)[ax]
    if isinstance(size, int) and index < 0:
        index += size
    stop = _END if index == -1 else index + 1
    part = strided_slice(x, begin=[index], end=[stop], axes=[ax])
    return squeeze(part, axis=[ax])


@converter("aten.index_select.default")
def index_select(n: AtenCall, x: Expr, dim: int, index: Expr) -> Expr:
    return take(x, index, axis=axis(dim, n.rank(x), n), mode="wrap")


@converter("aten.embedding.default")
def embedding(n: AtenCall, weight: Expr, indices: Expr, *_: object) -> Expr:
    return take(weight, indices, axis=0, mode="wrap")


@converter("aten.flip.default")
def flip(n: AtenCall, x: Expr, dims: Sequence[int]) -> Expr:
    axes = sorted({axis(d, n.rank(x), n) for d in dims})
    if not axes:
        return x
    return strided_slice(x, begin=[-1] * len(axes), end=[-_END - 1] * len(axes),
                         strides=[-1] * len(axes), axes=axes)


@converter("aten.constant_pad_nd.default")
def constant_pad_nd(n: AtenCall, x: Expr, pad: Sequence[int], value: float = 0) -> Expr:
    rank = n.rank(x)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise n.error(f"bad padding {list(pad)} for a tensor of rank {rank}")
    widths = [[0, 0] for _ in range(rank)]
    for k in range(len(pad) // 2):  # pairs from the last axis backwards
        widths[rank - 1 - k] = [pad[2 * k], pad[2 * k + 1]]
    crops = [(a, -b, -e) for a, (b, e) in enumerate(widths) if b < 0 or e < 0]
    if crops:  # negative padding removes elements
        x = strided_slice(x, begin=[max(b, 0) for _, b, _ in crops],
                          end=[-e if e > 0 else _END for _, _, e in crops],
                          axes=[a for a, _, _ in crops])
    widths = [[max(b, 0), max(e, 0)] for b, e in widths]
    if not any(b or e for b, e in widths):
        return x
    return nn.pad(x, pad_width=widths, pad_value=const(value, n.out.dtype))
