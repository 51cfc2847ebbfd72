"""Matrix products: linear, addmm, mm, bmm and matmul, onto nn.dense and nn.batch_matmul.

``nn.dense(x, w)`` computes ``x @ w.T``, the layout of torch's Linear weight, so ``linear``
maps onto it directly; ``addmm``/``mm`` of a transposed weight (what core ATen makes of a
Linear) drop the transpose instead of transposing twice.
"""

from __future__ import annotations

from typing import TypeGuard

from kiln.frontend.runtime_shapes import batch_matmul
from kiln.frontend.torch.registry import AtenCall, converter, is_transpose_2d
from kiln.ir import Call, Expr, Op
from kiln.op import (
    add,
    broadcast_to,
    expand_dims,
    multiply,
    nn,
    reshape,
    squeeze,
    sum,
    transpose,
)
from kiln.op.shape import TransposeAttrs


def _dense(a: Expr, b: Expr) -> Expr:
    """``a @ b`` for a matrix ``b``, as nn.dense of b's transpose."""
    weight = b.args[0] if is_transpose_2d(b) else transpose(b, axes=[1, 0])
    return nn.dense(a, weight)


def _add_bias(n: AtenCall, y: Expr, bias: Expr) -> Expr:
    """``y + bias`` with bias_add when the bias is one value per output feature."""
    bshape = n.shape(bias)
    if len(bshape) == 1 and n.out.ndim >= 1 and bshape[0] == n.out.shape[-1]:
        return nn.bias_add(y, bias, axis=-1)
    return add(y, bias)


@converter("aten.linear.default")
def linear(n: AtenCall, x: Expr, weight: Expr, bias: Expr | None = None) -> Expr:
    y = nn.dense(x, weight)
    return y if bias is None else _add_bias(n, y, bias)


@converter("aten.addmm.default")
def addmm(n: AtenCall, bias: Expr, a: Expr, b: Expr, beta: float = 1,
          alpha: float = 1) -> Expr:
    y = _dense(a, b)
    if alpha != 1:
        y = multiply(y, n.tensor(alpha, n.out.dtype))
    if beta == 0:
        return y
    if beta != 1:
        return add(y, multiply(bias, n.tensor(beta, n.out.dtype)))
    return _add_bias(n, y, bias)


@converter("aten.mm.default")
def mm(n: AtenCall, a: Expr, b: Expr) -> Expr:
    return _dense(a, b)


def _is_batch_transpose(x: Expr) -> TypeGuard[Call]:
    return (isinstance(x, Call) and x.op == Op("transpose")
            and tuple(TransposeAttrs.view(x.attrs).axes or ()) == (0, 2, 1))


@converter("aten.bmm.default")
def bmm(n: AtenCall, a: Expr, b: Expr) -> Expr:
    if _is_batch_transpose(b):
        return nn.batch_matmul(a, b.args[0], transpose_b=True)
    return nn.batch_matmul(a, b, transpose_b=False)


@converter("aten.matmul.default")
def matmul(n: AtenCall, a: Expr, b: Expr) -> Expr:
    ra, rb = n.rank(a), n.rank(b)
    if ra == 1 and rb == 1:
        return sum(multiply(a, b))
    if rb == 1:  # matrix (or batch) times vector
        return squeeze(nn.dense(a, expand_dims(b, axis=0)), axis=[-1])
    if rb == 2:
        return _dense(a, b)  # dense takes any leading dimensions
    if ra == 1:  # vector times a batch of matrices
        return squeeze(matmul(n, expand_dims(a, axis=0), b), axis=[-2])
    return _batched(n, a, b)


def _batched(n: AtenCall, a: Expr, b: Expr) -> Expr:
    """Batches of matrices with broadcast batch dimensions, through a 3-D nn.batch_matmul."""
    out = n.out.shape
    batch = out[:-2]
    (m, k), (k2, p) = n.shape(a)[-2:], n.shape(b)[-2:]

    def as_3d(x: Expr, rows: object, cols: object) -> Expr:
        own = n.shape(x)[:-2]
        if not own:
            return expand_dims(x, axis=0)  # a batch of 1, which nn.batch_matmul broadcasts
        if tuple(own) != tuple(batch):
            if not all(isinstance(d, int) for d in batch):
                raise n.error("matmul with broadcast symbolic batch dimensions is not supported")
            x = broadcast_to(x, shape=[*batch, rows, cols])
        return x if len(batch) == 1 else reshape(x, newshape=[-1, rows, cols])

    if not all(isinstance(d, int) for d in (m, k, k2, p)) or (
            not all(isinstance(d, int) for d in batch)
            and any(tuple(n.shape(x)[:-2]) not in ((), tuple(batch)) for x in (a, b))):
        return batch_matmul(a, n.rank(a), b, n.rank(b))  # shapes known when it runs
    y = nn.batch_matmul(as_3d(a, m, k), as_3d(b, k2, p), transpose_b=False)
    if len(batch) == 1:
        return y
    sizes = [d if isinstance(d, int) else -1 for d in batch]
    if sizes.count(-1) > 1:
        return batch_matmul(a, n.rank(a), b, n.rank(b))  # shapes known when it runs
    return reshape(y, newshape=[*sizes, m, p])
