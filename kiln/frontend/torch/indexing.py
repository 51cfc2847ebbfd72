"""Advanced indexing: ``x[i, :, j]`` with index tensors (``aten.index.Tensor``) and its
assignment ``x[i, j] = v`` (``aten.index_put``), as PyTorch defines them.

The index tensors (``None`` is a full slice) broadcast together to a shape B. When they are
adjacent, B takes their place in the result (``x[:, i, j]`` of an (a, m, n, c) tensor is
(a, *B, c)); when a slice separates them, B comes first and the other axes follow in order.
Both are one ``take``: the indexed axes are moved together (a transpose when they are apart)
and merged into one (a reshape), and the indices combined into a position along it,
``Σₖ (iₖ mod nₖ)·strideₖ`` (``mod``: torch's negative indices count from the end). The
assignment scatters along that merged axis (`scatter.py`).

A boolean mask beside other index tensors (``x[mask, i]``) stands, as in torch, for the
positions of its true elements: one int64 index tensor per axis it covers, the columns of
``argwhere(mask)`` (their length counted when the program runs), which then broadcast with the
other index tensors like any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from kiln.frontend.torch.emulated import counts
from kiln.frontend.torch.registry import AtenCall, converter
from kiln.frontend.torch.scatter import scatter_along
from kiln.ir import Constant, Expr, const
from kiln.ir.ty import ANY, TensorType
from kiln.op import (
    add,
    any_,
    arange,
    broadcast_to,
    cast,
    dyn,
    equal,
    expand_dims,
    floor_mod,
    logical_and,
    maximum,
    multiply,
    reshape,
    subtract,
    take,
    where,
)
from kiln.op import max as max_
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
            raise n.error("x[mask, i] = v (a boolean mask beside other index tensors in an "
                          "assignment) is not supported: use torch.where")
        tensors.append(i)
    static_indices = all(n.type(i).is_static for i in tensors)
    b = tuple(np.broadcast_shapes(*(n.static_shape(i, "an index tensor") for i in tensors))) \
        if static_indices else ()
    static = static and static_indices
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


def _masked(n: AtenCall, x: Expr, mask: Expr, first: int) -> Expr:
    """``x[mask]`` (``x[:, mask]``, ``x[..., mask]``) with a boolean mask over the axes from
    ``first``: the positions of its true elements (``argwhere``, counted on the host when the
    program runs) as offsets along those axes merged into one, taken in order. The mask's
    axes must be static; the others may be symbolic."""
    lead = n.static_shape(mask, "a boolean mask")
    sizes = n.sizes(x)
    covered = tuple(sizes[first:first + len(lead)])
    if len(covered) != len(lead) or any(not isinstance(d, int) for d in covered) \
            or covered != tuple(lead):
        raise n.error(f"a boolean mask of shape {list(lead)} does not match axes {first} to "
                      f"{first + len(lead) - 1} of a tensor of shape {list(n.shape(x))} "
                      "(kiln needs those axes static)")
    if not lead:
        raise n.error("indexing with a 0-d boolean mask is not supported")
    strides = [prod(lead[j + 1:]) for j in range(len(lead))]
    positions = cast(dyn.argwhere(mask), dtype="int64")  # (count, len(lead))
    flat = sum_(multiply(positions, const(np.asarray(strides, "int64"))), axis=[1])
    merged = [*sizes[:first], prod(lead), *sizes[first + len(lead):]]
    if all(isinstance(d, int) for d in merged):
        rows = reshape(x, newshape=merged)
    else:
        rows = dyn.reshape(x, n.shape_tensor(merged), allowzero=1)
    return take(rows, flat, axis=first, mode="clip")


def _unmasked(n: AtenCall, x: Expr, indices: Sequence[Expr | None]) -> list[Expr | None]:
    """``indices`` with each boolean mask replaced by the int64 positions of its true
    elements, one index tensor per axis it covers (torch's rule for a mask beside other
    index tensors); the mask's axes must be static."""
    out: list[Expr | None] = []
    sizes = n.sizes(x)
    for i in indices:
        if i is None or n.dtype(i) not in ("bool", "uint8"):
            out.append(i)
            continue
        if n.dtype(i) == "uint8":
            raise n.error("indexing with a uint8 mask beside other index tensors (torch's "
                          "deprecated form): cast the mask to bool")
        lead = n.static_shape(i, "a boolean mask")
        at = len(out)
        covered = tuple(sizes[at:at + len(lead)])
        if not lead or covered != tuple(lead):
            raise n.error(f"a boolean mask of shape {list(lead)} does not match axes {at} to "
                          f"{at + len(lead) - 1} of a tensor of shape {list(n.shape(x))} "
                          "(kiln needs those axes static)")
        positions = cast(dyn.argwhere(i), dtype="int64")  # (count, len(lead))
        for j in range(len(lead)):
            column = reshape(take(positions, const(np.int64(j)), axis=1), newshape=[-1])
            out.append(n.note(column, TensorType((ANY,), "int64")))
    return out


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
    if len(used) == 1 and n.dtype(used[0][1]) == "bool":
        return _masked(n, x, used[0][1], used[0][0])
    plan = _plan(n, x, _unmasked(n, x, indices))
    return take(_moved(n, x, plan), plan.position, axis=plan.first, mode="clip")


@converter("aten.index_put.default")
def index_put(n: AtenCall, x: Expr, indices: list[Expr | None], values: Expr,
              accumulate: bool = False) -> Expr:
    """``x[indices] = values`` (``+=`` with ``accumulate``): a scatter along the merged axis.
    Where an index repeats without ``accumulate``, torch keeps one of the values, kiln the
    last."""
    used = [i for i in indices if i is not None]
    if len(used) == 1 and n.dtype(used[0]) == "bool":
        return _put_masked(n, x, indices, values, bool(accumulate))
    plan = _plan(n, x, indices)
    if not n.type(x).is_static:
        return _put_at_run_time(n, x, plan, values, bool(accumulate))
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
    at = reshape(plan.position, newshape=[1] * len(before) + [-1] + [1] * len(after))
    at = broadcast_to(at, shape=full)
    y = scatter_along(n, data, plan.first, n.note(at, TensorType(full, "int64")),
                      n.note(v, TensorType(full, dtype)), "sum" if accumulate else "update")
    shape = n.static_shape(x, "index_put")
    y = reshape(y, newshape=[shape[k] for k in plan.order])
    if plan.order != sorted(plan.order):
        y = transpose_(y, axes=[plan.order.index(k) for k in range(len(shape))])
    return y


def _put_at_run_time(n: AtenCall, x: Expr, plan: _Plan, values: Expr | object,
                     accumulate: bool) -> Expr:
    """index_put into a tensor of symbolic shape (the index tensors static): each target t
    of the merged axis (T of them, known when the program runs) against each of the M index
    positions, ``hit[t, m] = position[m] == t``; with ``accumulate`` the values that hit t
    are added, otherwise t takes the last one that hits it, as on torch's CPU."""
    if not plan.broadcast:
        raise n.error("index_put into a tensor of symbolic shape needs index tensors of "
                      "static shape")
    dtype = n.out.dtype
    data = _moved(n, x, plan)  # (*before, T, *after)
    first, merged = plan.first, plan.merged
    before, after = merged[:first], merged[first + 1:]
    m = prod(plan.broadcast)
    targets = merged[first]
    count = targets if isinstance(targets, int) else None
    ramp = const(np.arange(count, dtype=np.int64)) if count is not None else \
        arange(const(np.int64(0)), n.size_expr(targets), const(np.int64(1)), dtype="int64")
    where_at = reshape(plan.position, newshape=[1, m])
    hit = equal(expand_dims(ramp, axis=1), where_at)  # (T, M)
    # the values as x[indices] has them, B flattened: (*before, M, *after)
    picked = [*before, *plan.broadcast, *after]
    v = n.tensor(values, dtype)
    vshape = tuple(n.sizes(values)) if isinstance(values, Expr) else ()
    if len(vshape) != len(picked) or any(not _same(a, b) for a, b in zip(vshape, picked)):
        v = dyn.broadcast_to(v, n.shape_tensor(picked))
    v = dyn.reshape(v, n.shape_tensor([*before, m, *after]), allowzero=1)
    v = expand_dims(v, axis=first)  # (*before, 1, M, *after)
    chosen: Expr = hit
    if not accumulate:  # the last m hitting each t
        order = const(np.arange(m, dtype=np.int64))
        final = max_(where(hit, order, const(np.int64(-1))), axis=[1], keepdims=True)
        chosen = logical_and(hit, equal(order, final))
    hits = any_(hit, axis=[1])  # (T,)
    view = len(before), len(after)
    chosen = _spread(chosen, *view, 2)
    total = sum_(where(chosen, v, const(0, dtype)), axis=[first + 1])
    if n.dtype(x) != dtype:
        data = cast(data, dtype=dtype)
    if accumulate:
        y = add(data, total)
    else:
        y = where(_spread(hits, *view, 1), total, data)
    moved = [n.sizes(x)[k] for k in plan.order]
    y = dyn.reshape(y, n.shape_tensor(moved), allowzero=1)
    if plan.order != sorted(plan.order):
        y = transpose_(y, axes=[plan.order.index(k) for k in range(len(plan.order))])
    return y


def _spread(t: Expr, before: int, after: int, rank: int) -> Expr:
    """A tensor of the merged axis (and M) given ``before`` leading and ``after`` trailing
    axes of size 1, to broadcast against the data."""
    if before:
        t = expand_dims(t, axis=0, num_newaxis=before)
    if after:
        t = expand_dims(t, axis=before + rank, num_newaxis=after)
    return t


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return str(a) == str(b)


def _put_masked(n: AtenCall, x: Expr, indices: list[Expr | None], values: object,
                accumulate: bool) -> Expr:
    """``x[mask] = v`` (``+=``) with one boolean mask over the axes from k: a ``where`` over
    the mask. A ``v`` of one element is broadcast; otherwise ``v`` holds one slice per true
    element along axis k (``x[:, m] += 2`` records ``x[:, m] + 2``), and the j-th true
    element takes the j-th, j counted by a prefix sum of the mask, as in masked_scatter."""
    k = next(j for j, i in enumerate(indices) if i is not None)
    mask = indices[k]
    assert mask is not None
    dtype = n.out.dtype
    lead = n.static_shape(mask, "a boolean mask")
    rank = n.rank(x)
    v = n.tensor(values, dtype)
    vshape = tuple(n.shape(values)) if isinstance(values, Expr) else ()
    data = n.tensor(x, dtype)
    if all(d == 1 for d in vshape):
        if vshape:
            v = reshape(v, newshape=[])
        m = mask
        if k:
            m = expand_dims(m, axis=0, num_newaxis=k)
        if rank - k - len(lead):
            m = expand_dims(m, axis=k + len(lead), num_newaxis=rank - k - len(lead))
        return where(m, add(data, v) if accumulate else v, data)
    if len(vshape) != rank - len(lead) + 1:
        raise n.error(f"x[mask] = v with v of shape {list(vshape)}: kiln takes a v of one "
                      "element or one slice per true element (for others use "
                      "torch.masked_scatter)")
    sizes = n.sizes(x)
    size = prod(lead)
    merged = [*sizes[:k], size, *sizes[k + len(lead):]]
    static = all(isinstance(d, int) for d in merged)
    rows = reshape(data, newshape=merged) if static else \
        dyn.reshape(data, n.shape_tensor(merged), allowzero=1)
    flat = reshape(mask, newshape=[size])
    at = maximum(subtract(counts(cast(flat, dtype="float32"), size), const(np.int64(1))),
                 const(np.int64(0)))
    picked = v if vshape[k] == 1 else take(v, at, axis=k, mode="fast")  # past v: an error
    m = flat
    if k:
        m = expand_dims(m, axis=0, num_newaxis=k)
    if len(merged) - k - 1:
        m = expand_dims(m, axis=k + 1, num_newaxis=len(merged) - k - 1)
    y = where(m, add(rows, picked) if accumulate else picked, rows)
    target = [*sizes]
    if all(isinstance(d, int) for d in target):
        return reshape(y, newshape=target)
    return dyn.reshape(y, n.shape_tensor(target), allowzero=1)
