"""Advanced indexing: ``x[i, :, j]`` with index tensors (``aten.index.Tensor``) and its
assignment ``x[i, j] = v`` (``aten.index_put``), as PyTorch defines them.

The index tensors (``None`` is a full slice) broadcast together to a shape B. When they are
adjacent, B takes their place in the result (``x[:, i, j]`` of an (a, m, n, c) tensor is
(a, *B, c)); when a slice separates them, B comes first and the other axes follow in order.
Both are one ``take``: the indexed axes are moved together (a transpose when they are apart)
and merged into one (a reshape), and the indices combined into a position along it,
``Σₖ (iₖ mod nₖ)·strideₖ`` (``mod``: torch's negative indices count from the end). The
assignment scatters along that merged axis (`scatter.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from kiln.frontend.torch.registry import AtenCall, converter
from kiln.frontend.torch.scatter import scatter_along
from kiln.ir import Constant, Expr, const
from kiln.ir.ty import TensorType
from kiln.op import add, broadcast_to, cast, dyn, floor_mod, multiply, reshape, take
from kiln.op import sum as sum_
from kiln.op import transpose as transpose_


@dataclass(frozen=True)
class _Plan:
    """How an indexing is done as one ``take`` along a merged axis."""

    order: list[int]  # the input's axes, indexed ones together (the identity when adjacent)
    first: int  # where the merged axis stands after the move
    merged: list[Any]  # the shape with the indexed axes merged (torch sizes: int or SymInt)
    position: Expr  # the position along the merged axis, shaped B
    broadcast: tuple[int, ...]  # B


def _plan(n: AtenCall, x: Expr, indices: Sequence[Expr | None]) -> _Plan:
    static = n.type(x).is_static
    # torch's sizes: where some are symbolic, the strides and the merged shape are computed
    # when the program runs (`n.size_expr`, `n.shape_tensor`)
    shape = n.sizes(x) if not static else n.static_shape(x, "indexing with index tensors")
    rank = len(shape)
    if len(indices) > rank:
        raise n.error(f"{len(indices)} indices for a tensor of rank {rank}")
    used = [k for k, i in enumerate(indices) if i is not None]
    if not used:
        raise n.error("indexing without an index tensor")
    tensors = []
    for k in used:
        i = indices[k]
        assert i is not None
        if n.dtype(i) in ("bool", "uint8"):
            raise n.error("indexing with a boolean mask has a shape that depends on the data; "
                          "kiln needs static shapes (use torch.where instead)")
        tensors.append(i)
    static = static and all(n.type(i).is_static for i in tensors)
    b = tuple(np.broadcast_shapes(*(n.static_shape(i, "an index tensor") for i in tensors))) \
        if static else ()
    adjacent = used == list(range(used[0], used[-1] + 1))
    rest = [k for k in range(rank) if k not in used]
    order = list(range(rank)) if adjacent else used + rest
    first = used[0] if adjacent else 0
    moved = [shape[k] for k in order]
    merged = [*moved[:first], prod(shape[k] for k in used), *moved[first + len(used):]]
    sizes = [shape[k] for k in used]
    position: Expr | None = None
    for j, (i, size) in enumerate(zip(tensors, sizes)):
        term = _wrapped(n, i, size)
        stride = prod(sizes[j + 1:])
        if not isinstance(stride, int):
            term = multiply(term, n.size_expr(stride))
        elif stride != 1:
            term = multiply(term, const(np.int64(stride)))
        position = term if position is None else add(position, term)
    assert position is not None
    if static and len(tensors) == 1 and tuple(n.static_shape(tensors[0], "an index tensor")) != b:
        position = broadcast_to(position, shape=b)
    return _Plan(order, first, merged, position, b)


def _wrapped(n: AtenCall, i: Expr, size: Any) -> Expr:
    """An index tensor as int64 in [0, size): negative indices counted from the end."""
    if not isinstance(size, int):
        as64 = i if n.dtype(i) == "int64" else cast(i, dtype="int64")
        return floor_mod(as64, n.size_expr(size))
    if isinstance(i, Constant):
        values = i.data.astype(np.int64)
        return const(np.where(values < 0, values + size, values))
    as64 = i if n.dtype(i) == "int64" else cast(i, dtype="int64")
    return floor_mod(as64, const(np.int64(size)))


def _masked(n: AtenCall, x: Expr, mask: Expr) -> Expr:
    """``x[mask]`` with a boolean mask over the leading axes: the positions of its true
    elements (``argwhere``, counted on the host when the program runs) as offsets along the
    leading axes merged into one, taken in order."""
    shape = n.static_shape(x, "indexing with a boolean mask")
    lead = n.static_shape(mask, "a boolean mask")
    if tuple(shape[:len(lead)]) != tuple(lead):
        raise n.error(f"a boolean mask of shape {lead} does not match the leading axes of "
                      f"{shape}")
    strides = [prod(lead[j + 1:]) for j in range(len(lead))]
    positions = cast(dyn.argwhere(mask), dtype="int64")  # (count, len(lead))
    flat = sum_(multiply(positions, const(np.asarray(strides, "int64"))), axis=[1])
    rows = reshape(x, newshape=[prod(lead), *shape[len(lead):]])
    return take(rows, flat, axis=0, mode="clip")


def _moved(n: AtenCall, x: Expr, plan: _Plan) -> Expr:
    """``x`` with its indexed axes together and merged into one."""
    if plan.order != sorted(plan.order):
        x = transpose_(x, axes=plan.order)
    if all(isinstance(d, int) for d in plan.merged):
        return reshape(x, newshape=plan.merged)
    return dyn.reshape(x, n.shape_tensor(plan.merged), allowzero=1)


@converter("aten.index.Tensor")
def index(n: AtenCall, x: Expr, indices: list[Expr | None]) -> Expr:
    used = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(used) == 1 and n.dtype(used[0][1]) not in ("bool", "uint8"):
        k, i = used[0]
        return take(x, i, axis=k, mode="wrap")  # wrap: torch's negative indices count back
    if len(used) == 1 and used[0][0] == 0 and n.dtype(used[0][1]) == "bool":
        return _masked(n, x, used[0][1])
    plan = _plan(n, x, indices)
    return take(_moved(n, x, plan), plan.position, axis=plan.first, mode="clip")


@converter("aten.index_put.default")
def index_put(n: AtenCall, x: Expr, indices: list[Expr | None], values: Expr,
              accumulate: bool = False) -> Expr:
    """``x[indices] = values`` (``+=`` with ``accumulate``): a scatter along the merged axis.
    Where an index repeats without ``accumulate``, torch keeps one of the values, kiln the
    last."""
    if not n.type(x).is_static:
        raise n.error("index_put of a tensor of symbolic shape is not supported")
    plan = _plan(n, x, indices)
    dtype = n.out.dtype
    data = n.note(_moved(n, x, plan), TensorType(tuple(plan.merged), dtype))
    # The updates and their positions, shaped as x[indices] with B flattened to one axis.
    before, after = plan.merged[:plan.first], plan.merged[plan.first + 1:]
    picked = (*before, *plan.broadcast, *after)
    full = (*before, prod(plan.broadcast), *after)
    v = n.tensor(values, dtype)
    if tuple(n.static_shape(values, "index_put's values")) != picked:
        v = broadcast_to(v, shape=picked)
    v = reshape(v, newshape=list(full))
    where = reshape(plan.position, newshape=[1] * len(before) + [-1] + [1] * len(after))
    where = broadcast_to(where, shape=full)
    y = scatter_along(n, data, plan.first, n.note(where, TensorType(full, "int64")),
                      n.note(v, TensorType(full, dtype)), "sum" if accumulate else "update")
    shape = n.static_shape(x, "index_put")
    y = reshape(y, newshape=[shape[k] for k in plan.order])
    if plan.order != sorted(plan.order):
        y = transpose_(y, axes=[plan.order.index(k) for k in range(len(shape))])
    return y
