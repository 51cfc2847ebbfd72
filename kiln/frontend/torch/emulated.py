"""ATen operators kiln has no operator for, composed from ones it has (static shapes only).

    gather(x, dim, index)   take(flatten(x), Σₖ iₖ·strideₖ) where i_dim = index and every other
                            iₖ is the position along axis k (an arange, broadcast)
    cumsum(x, dim)          x (moved so ``dim`` is last) times the lower-triangular ones matrix:
                            y[j] = Σ_{i ≤ j} x[i], one ``nn.dense``, for floats; for integers
                            (which a product would round) and cumprod, every prefix at once:
                            sum (prod) over i of where(i ≤ j, x[i], 0 (1)), an L×L mask
    upsample_bilinear2d     x·A_wᵀ along the width, then along the height: A is the (out, in)
                            matrix of torch's interpolation weights, two per row

All cost more than a dedicated operator would (gather builds its flat indices at run time,
cumsum and cumprod do L² work for a length L, bilinear upsampling multiplies by mostly-zero
matrices), which is fine for the modest sizes they usually meet.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import Error
from kiln.frontend.runtime_shapes import gather_elements, scan
from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr, const
from kiln.ir.dtype import dtype_of
from kiln.op import (
    add,
    broadcast_to,
    cast,
    dyn,
    expand_dims,
    maximum,
    multiply,
    nn,
    prod,
    reshape,
    strided_slice,
    subtract,
    take,
    transpose,
    where,
)
from kiln.op import sum as sum_


@converter("aten.gather.default")
def gather(n: AtenCall, x: Expr, dim: int, index: Expr, sparse_grad: bool = False) -> Expr:
    if not (n.type(x).is_static and n.type(index).is_static):
        return _gather_at_run_time(n, x, dim, index)
    shape = n.static_shape(x, "gather")
    out = n.static_shape(index, "gather")
    rank = len(shape)
    if len(out) != rank:
        raise n.error(f"gather's index has rank {len(out)} but its input has rank {rank}")
    d = axis(dim, rank, n)
    strides = [int(np.prod(shape[k + 1:])) for k in range(rank)]
    flat: Expr = multiply(cast(index, dtype="int64"), const(np.int64(strides[d])))
    for k in range(rank):
        if k == d or out[k] == 1:
            continue
        along = np.arange(out[k], dtype="int64") * strides[k]
        flat = add(flat, const(along.reshape([out[k] if j == k else 1 for j in range(rank)])))
    return take(reshape(x, newshape=[-1]), flat, axis=0, mode="clip")


@converter("aten.cumsum.default", "aten.cumprod.default")
def cumsum(n: AtenCall, x: Expr, dim: int, dtype: str | None = None) -> Expr:
    out = n.out.dtype
    if not n.type(x).is_static:  # sizes known when it runs (RoBERTa's positions of a mask)
        rank = n.rank(x)
        if rank == 0:
            return n.tensor(x, out)
        return scan(n.tensor(x, out), axis(dim, rank, n), rank,
                    product=n.target == "aten.cumprod.default")
    shape = n.static_shape(x, n.target.split(".")[1])
    rank = len(shape)
    d = axis(dim, rank, n)
    x = n.tensor(x, out)
    if rank == 0:
        return x
    moved = _move_last(x, d, rank)
    length = shape[d]
    if n.target == "aten.cumsum.default" and dtype_of(out).is_float:
        y = nn.dense(moved, const(np.tril(np.ones((length, length), dtype=out))))
    else:  # every prefix at once: (..., 1, L) against the (L, L) lower triangle
        lower = const(np.tril(np.ones((length, length), dtype=bool)))
        rows = expand_dims(moved, axis=rank - 1)
        if n.target == "aten.cumsum.default":
            y = sum_(where(lower, rows, const(0, out)), axis=[rank])
        else:
            y = prod(where(lower, rows, const(1, out)), axis=[rank])
    return _move_back(y, d, rank)


def _gather_at_run_time(n: AtenCall, x: Expr, dim: int, index: Expr) -> Expr:
    """torch.gather of shapes known when the program runs (kiln/frontend/runtime_shapes.py,
    shared with ONNX's GatherElements)."""
    rank = n.rank(x)
    if n.rank(index) != rank:
        raise n.error(f"gather's index has rank {n.rank(index)} but its input has rank {rank}")
    same = [a == b for a, b in zip(n.shape(x), n.shape(index))]
    return gather_elements(x, index, axis(dim, rank, n), rank, same, n.dtype(index))


def _move_last(x: Expr, d: int, rank: int) -> Expr:
    return x if d == rank - 1 else transpose(x, axes=[k for k in range(rank) if k != d] + [d])


def _move_back(y: Expr, d: int, rank: int) -> Expr:
    if d == rank - 1:
        return y
    order = [k for k in range(rank) if k != d] + [d]
    return transpose(y, axes=[order.index(k) for k in range(rank)])


@converter("aten.upsample_bilinear2d.vec")
def upsample_bilinear2d_vec(n: AtenCall, x: Expr, _size: object, align_corners: bool,
                            scales: list[float] | None) -> Expr:
    return _bilinear(n, x, align_corners, scales or [None, None])


@converter("aten.upsample_bilinear2d.default")
def upsample_bilinear2d(n: AtenCall, x: Expr, _size: object, align_corners: bool,
                        scale_h: float | None = None, scale_w: float | None = None) -> Expr:
    return _bilinear(n, x, align_corners, [scale_h, scale_w])


def _bilinear(n: AtenCall, x: Expr, align_corners: bool,
              scales: Sequence[float | None]) -> Expr:
    shape = n.static_shape(x, "upsample_bilinear2d")
    if len(shape) != 4:
        raise n.error("upsample_bilinear2d needs NCHW data")
    (h, w), (oh, ow) = shape[2:], n.static_out("upsample_bilinear2d")[2:]
    dtype = n.out.dtype
    a_h = _weights(h, oh, align_corners, scales[0], dtype)
    a_w = _weights(w, ow, align_corners, scales[1], dtype)
    y = nn.dense(x, const(a_w))  # (N, C, H, OW)
    y = nn.dense(transpose(y, axes=[0, 1, 3, 2]), const(a_h))  # (N, C, OW, OH)
    return transpose(y, axes=[0, 1, 3, 2])


def _weights(size: int, out: int, align_corners: bool, scale: float | None,
             dtype: str) -> np.ndarray:
    """The (out, size) matrix of linear interpolation, as torch's ``upsample_bilinear2d``
    computes source positions (``area_pixel_compute_source_index``)."""
    dst = np.arange(out, dtype="float64")
    if align_corners:
        src = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
    else:
        step = 1.0 / scale if scale else size / out
        src = np.maximum(step * (dst + 0.5) - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype("int64"), size - 1)
    high = np.minimum(low + 1, size - 1)
    frac = src - low
    a = np.zeros((out, size), dtype="float64")
    np.add.at(a, (np.arange(out), low), 1.0 - frac)
    np.add.at(a, (np.arange(out), high), frac)
    return a.astype(dtype)


# --- shapes that depend on the data: counted on the host when the program runs ---------------


@converter("aten.nonzero.default")
def nonzero(n: AtenCall, x: Expr) -> Expr:
    return cast(dyn.argwhere(x), dtype="int64")  # (count, rank), as torch.nonzero


@converter("aten.masked_select.default")
def masked_select(n: AtenCall, x: Expr, mask: Expr) -> Expr:
    """``x[mask]`` flattened: the positions of the true elements (argwhere, on the host)
    turned into offsets of the broadcast ``x`` and taken from it, in order."""
    shape = tuple(np.broadcast_shapes(n.static_shape(x, "masked_select"),
                                      n.static_shape(mask, "masked_select")))
    if tuple(n.shape(x)) != shape:
        x = broadcast_to(x, shape=list(shape))
    if tuple(n.shape(mask)) != shape:
        mask = broadcast_to(mask, shape=list(shape))
    if not shape:
        x, mask, shape = reshape(x, newshape=[1]), reshape(mask, newshape=[1]), (1,)
    strides = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
    positions = cast(dyn.argwhere(mask), dtype="int64")
    flat = sum_(multiply(positions, const(np.asarray(strides, "int64"))), axis=[1])
    return take(reshape(x, newshape=[-1]), flat, axis=0, mode="clip")


@converter("aten.masked_scatter.default")
def masked_scatter(n: AtenCall, x: Expr, mask: Expr, source: Expr) -> Expr:
    """``x`` with its elements where ``mask`` (broadcast to ``x``) is true replaced by the
    first elements of ``source``, in order: the k-th true element takes ``source``'s k-th,
    k counted by a prefix sum of the mask (`counts`). A source with fewer elements than
    the mask has true ones is an error when the program runs, as in torch."""
    shape = n.static_shape(x, "masked_scatter")
    mshape = n.static_shape(mask, "masked_scatter's mask")
    if tuple(np.broadcast_shapes(shape, mshape)) != tuple(shape):
        raise n.error(f"masked_scatter's mask of shape {list(mshape)} does not broadcast to "
                      f"the input's shape {list(shape)}")
    total = int(np.prod(n.static_shape(source, "masked_scatter's source")))
    size = int(np.prod(shape))
    if size == 0:
        return x
    if total == 0:
        raise n.error("masked_scatter with an empty source (kiln needs at least one element)")
    if tuple(mshape) != tuple(shape):
        mask = broadcast_to(mask, shape=list(shape))
    flat = reshape(mask, newshape=[size])
    count = counts(cast(flat, dtype="float32"), size)  # true elements up to each, inclusive
    at = maximum(subtract(count, const(np.int64(1))), const(np.int64(0)))
    # mode fast: an index past the source is an error when the program runs
    picked = take(reshape(n.tensor(source, n.out.dtype), newshape=[total]), at, axis=0,
                  mode="fast")
    return reshape(where(flat, picked, reshape(n.tensor(x, n.out.dtype), newshape=[size])),
                   newshape=list(shape))


def counts(ones: Expr, size: int) -> Expr:
    """The inclusive prefix sums of a 1-D float32 vector of 0s and 1s, as int64. Two levels
    of triangular products, in blocks of b: within each block (size·b work), then over the
    blocks' totals ((size/b)² work); b ≈ (2·size)^(1/3) balances the two. float32 counts
    are exact below 2²⁴."""
    if size >= 2**24:
        raise Error(f"a prefix count over {size} elements (kiln counts up to 2^24)")
    block = max(1, min(size, round((2 * size) ** (1 / 3))))
    blocks = -(-size // block)
    padded = ones if blocks * block == size else nn.pad(
        ones, pad_width=[[0, blocks * block - size]], pad_value=const(np.float32(0)))
    rows = reshape(padded, newshape=[blocks, block])
    inner = nn.dense(rows, const(np.tril(np.ones((block, block), "float32"))))  # (blocks, b)
    if blocks > 1:
        totals = strided_slice(inner, begin=[block - 1], end=[block], axes=[1])  # (blocks, 1)
        before = nn.dense(reshape(totals, newshape=[1, blocks]),
                          const(np.tril(np.ones((blocks, blocks), "float32"), k=-1)))
        inner = add(inner, reshape(before, newshape=[blocks, 1]))
    prefix = reshape(inner, newshape=[blocks * block])
    if blocks * block != size:
        prefix = strided_slice(prefix, begin=[0], end=[size])
    return cast(prefix, dtype="int64")
