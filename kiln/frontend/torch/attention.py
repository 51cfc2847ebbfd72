"""Scaled dot-product attention (what ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` export to), decomposed into kiln operators:

    softmax(q @ kᵀ · scale + mask) @ v

over a batch of matrices: the leading (batch, head) dimensions are flattened into one for
``nn.batch_matmul``. A boolean mask keeps the scores where it is true; a float mask is added;
``is_causal`` keeps the lower triangle. As in torch, a row that the mask removes entirely
gives zeros rather than the NaNs of a softmax over nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.frontend.runtime_shapes import batch_matmul, triangle
from kiln.frontend.torch.registry import AtenCall, converter
from kiln.ir import Expr, const
from kiln.op import (
    add,
    any,
    broadcast_to,
    logical_and,
    multiply,
    nn,
    not_equal,
    reshape,
    take,
    transpose,
    where,
)


@converter("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(n: AtenCall, q: Expr, k: Expr, v: Expr,
                                 mask: Expr | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Expr:
    if dropout_p:
        raise n.error("attention dropout is random; call model.eval() before importing")
    dtype = n.out.dtype
    qs, ks, vs = n.shape(q), n.shape(k), n.shape(v)
    length, depth, source = qs[-2], qs[-1], ks[-2]
    if not isinstance(depth, int):
        raise n.error("attention needs a static feature size")
    lead = n.out.shape[:-2]
    if enable_gqa and qs[-3] != ks[-3]:  # grouped-query attention: repeat the key/value heads
        k, v = _repeat_heads(n, k, qs[-3], ks[-3]), _repeat_heads(n, v, qs[-3], ks[-3])
        ks, vs = (*ks[:-3], qs[-3], *ks[-2:]), (*vs[:-3], qs[-3], *vs[-2:])
    if not (isinstance(length, int) and isinstance(source, int) and isinstance(vs[-1], int)
            and all(isinstance(d, int) for d in lead)):
        return _attention_at_run_time(n, q, k, v, mask, is_causal, scale, depth)

    q3 = _as_3d(n, q, qs, lead)
    k3 = _as_3d(n, k, ks, lead)
    v3 = _as_3d(n, v, vs, lead)
    factor = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    scores = multiply(nn.batch_matmul(q3, k3), const(factor, dtype))  # q @ kᵀ

    keep: Expr | None = None
    if is_causal:
        keep = const(np.tril(np.ones((length, source), dtype=bool)))
    if mask is not None:
        boolean = n.dtype(mask) == "bool"
        m = _as_3d(n, mask if boolean else n.tensor(mask, dtype), n.shape(mask), lead,
                   matrix=(length, source))
        if boolean:
            keep = m if keep is None else logical_and(keep, m)
        else:
            scores = add(scores, m)
    if keep is not None:
        scores = where(keep, scores, const(-math.inf, dtype))
    probs = nn.softmax(scores, axis=-1)
    if mask is not None:
        alive = any(not_equal(scores, const(-math.inf, dtype)), axis=[-1], keepdims=True)
        probs = where(alive, probs, const(0.0, dtype))
    out = nn.batch_matmul(probs, v3, transpose_b=False)
    if len(lead) == 1:
        return out
    sizes = [d if isinstance(d, int) else -1 for d in n.out.shape]
    if sizes.count(-1) > 1:
        raise n.error("attention with more than one symbolic batch dimension is not supported")
    return reshape(out, newshape=sizes)


def _attention_at_run_time(n: AtenCall, q: Expr, k: Expr, v: Expr, mask: Expr | None,
                           is_causal: bool, scale: float | None, depth: int) -> Expr:
    """Attention over sequences whose lengths are known when the program runs: the products
    through the run-time batched matmul (kiln/frontend/runtime_shapes.py) at full rank, the
    masks broadcasting against the scores as they are."""
    dtype = n.out.dtype
    rq, rk = n.rank(q), n.rank(k)
    kt = transpose(k, axes=[*range(rk - 2), rk - 1, rk - 2])
    factor = 1.0 / math.sqrt(depth) if scale is None else float(scale)
    scores = multiply(batch_matmul(q, rq, kt, rk), const(factor, dtype))
    keep: Expr | None = None
    if is_causal:  # j <= i, from the lengths of the two sequences
        keep = triangle(n.tensor(n.sizes(q)[-2], "int64"), n.tensor(n.sizes(k)[-2], "int64"), 0,
                        upper=False)
    if mask is not None:
        if n.dtype(mask) == "bool":
            keep = mask if keep is None else logical_and(keep, mask)
        else:
            scores = add(scores, n.tensor(mask, dtype))
    if keep is not None:
        scores = where(keep, scores, const(-math.inf, dtype))
    probs = nn.softmax(scores, axis=-1)
    if mask is not None:
        alive = any(not_equal(scores, const(-math.inf, dtype)), axis=[-1], keepdims=True)
        probs = where(alive, probs, const(0.0, dtype))
    return batch_matmul(probs, max(rq, rk), v, n.rank(v))


def _as_3d(n: AtenCall, x: Expr, shape: tuple[Any, ...], lead: tuple[Any, ...],
           matrix: tuple[int, int] | None = None) -> Expr:
    """``x`` broadcast to the leading dimensions ``lead`` and flattened to (batch, rows, cols)."""
    if matrix is not None and len(shape) <= 2:
        return x  # a (rows, cols) mask broadcasts against the (batch, rows, cols) scores
    rows_cols = tuple(shape[-2:]) if matrix is None else matrix
    if tuple(shape[:-2]) != tuple(lead) or tuple(shape[-2:]) != rows_cols:
        full = (*lead, *rows_cols)
        if not all(isinstance(d, int) for d in full):
            raise n.error(f"cannot broadcast an attention input of shape {shape} to {full}")
        x = broadcast_to(x, shape=list(full))
    if len(lead) == 1:
        return x
    return reshape(x, newshape=[-1, *rows_cols])


def _repeat_heads(n: AtenCall, x: Expr, heads: Any, kv_heads: Any) -> Expr:
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads:
        raise n.error(f"grouped-query attention with {heads} query and {kv_heads} key heads")
    index = np.repeat(np.arange(kv_heads, dtype="int64"), heads // kv_heads)
    return take(x, const(index), axis=n.rank(x) - 3)
