"""fold-transposes: move transposes to where they cost nothing, or into a matmul's flags.

Exporters spell attention with transposes around every step. PyTorch's
``nn.MultiheadAttention`` exported to ONNX splits its packed q/k/v projection through a
five-axis transpose of the whole (seq, batch, 3, d) tensor, takes q, k and v out of that
copy, transposes k's last two axes, scales it, and feeds ``MatMul`` — which imports as
``nn.batch_matmul(q, kᵀ, transpose_b=False)``: two copies that a batch_matmul with
``transpose_b=True`` reading k as it is never makes. Each row below keeps the value (and
the type) of what it replaces:

- ``transpose(x, p)`` that moves only axes of size 1 is a ``reshape`` (a view);
- ``squeeze(transpose(x, p))`` squeezes first: ``transpose(squeeze(x), q)``;
- ``take(transpose(x, p), i, axis)`` with a scalar index takes from ``x`` and transposes
  what is left, so three takes of one transposed tensor read ``x`` in place instead of a
  copy of all of it;
- a transpose of the last two axes moves out through a ``reshape`` that leaves those two
  axes alone, and any transpose through ``multiply``/``divide``/``add``/``subtract`` by a
  one-element constant;
- ``nn.batch_matmul`` of a transpose of the last two axes flips ``transpose_a`` or
  ``transpose_b`` instead.

The simplify-expr rules run in the same fixpoint, so the reshapes and transposes these rows
bring together merge. ViT-style attention exported from PyTorch (benchmarks/peers.py's
ViT): see docs/passes.md.
"""

from __future__ import annotations

from kiln.ir.expr import Call, Constant, Expr
from kiln.ir.module import IRModule
from kiln.op import reshape, squeeze, take, transpose
from kiln.op.nn import batch_matmul
from kiln.op.nn.linear import BatchMatmulAttrs
from kiln.op.shape import SqueezeAttrs, TakeAttrs, TransposeAttrs
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable
from kiln.transform.simplify_expr import RULES as SIMPLIFY_RULES
from kiln.transform.simplify_expr import full_axes

x = Pat.var("x")
c = Pat.const("c", where=lambda data: data.size == 1)

SCALED = ("multiply", "divide", "add", "subtract")


def _permutation(t: Call, ctx: RewriteContext) -> list[int] | None:
    """The axes of transpose ``t`` in full (None where its input's rank is unknown)."""
    arg = ctx.tensor_type(t.args[0])
    return None if arg is None else full_axes(TransposeAttrs.view(t.attrs).axes, arg.ndim)


def _swaps_last_two(p: list[int]) -> bool:
    n = len(p)
    return n >= 2 and p == [*range(n - 2), n - 1, n - 2]


def _reshape(x: Expr, shape: tuple[int, ...]) -> Expr:
    # a 0 in newshape copies an input dimension unless allowzero says it is a size
    return reshape(x, newshape=list(shape), allowzero=int(0 in shape))


def _without(p: list[int], dropped: set[int]) -> list[int]:
    """``p`` with the output axes ``dropped`` removed, renumbered over the input axes left."""
    gone = sorted(p[a] for a in dropped)
    return [v - sum(g < v for g in gone) for a, v in enumerate(p) if a not in dropped]


def unit_axes_only(x: Expr, root: Call, ctx: RewriteContext) -> Expr | None:
    """transpose(x, p) that keeps every axis longer than 1 in its order -> reshape(x)."""
    shape, out = ctx.static_shape(x), ctx.static_shape(root)
    p = _permutation(root, ctx)
    if shape is None or out is None or p is None or p == list(range(len(p))):
        return None
    moved = [a for a in p if shape[a] != 1]
    return _reshape(x, out) if moved == sorted(moved) else None


def squeeze_first(x: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """squeeze(transpose(x, p), axes) -> transpose(squeeze(x, p[axes]), q)."""
    p = _permutation(inner, ctx)
    axes = SqueezeAttrs.view(root.attrs).axis
    if p is None or axes is None:
        return None
    dropped = {a + len(p) if a < 0 else a for a in axes}
    q = _without(p, dropped)
    return transpose(squeeze(x, axis=sorted(p[a] for a in dropped)), axes=q)


def take_first(x: Expr, i: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """take(transpose(x, p), i, axis=a), i a scalar -> transpose(take(x, i, axis=p[a]), q)."""
    a = TakeAttrs.view(root.attrs)
    index = ctx.tensor_type(i)
    p = _permutation(inner, ctx)
    if a.axis is None or a.batch_dims != 0 or index is None or index.ndim != 0 or p is None:
        return None
    axis = a.axis + len(p) if a.axis < 0 else a.axis
    taken = take(x, i, axis=p[axis], mode=a.mode)
    q = _without(p, {axis})
    return taken if q == list(range(len(q))) else transpose(taken, axes=q)


def reshape_first(x: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """reshape(transpose(x, last two swapped)) keeping those two axes -> the transpose after."""
    shape, out = ctx.static_shape(x), ctx.static_shape(root)
    p = _permutation(inner, ctx)
    if shape is None or out is None or p is None or not _swaps_last_two(p) or len(out) < 2:
        return None
    if tuple(out[-2:]) != (shape[-1], shape[-2]):
        return None
    n = len(out)
    return transpose(_reshape(x, (*out[:-2], shape[-2], shape[-1])),
                     axes=[*range(n - 2), n - 1, n - 2])


def _scale_first(x: Expr, c: Constant, inner: Call, root: Call, ctx: RewriteContext,
                 left: bool) -> Expr | None:
    """op(transpose(x, p), c) (``left``) or op(c, transpose(x, p)), c of one element ->
    transpose(op(x, c), p)."""
    t = ctx.tensor_type(x)
    if t is None or c.data.ndim > t.ndim:
        return None
    args = (x, c) if left else (c, x)
    return transpose(Call(root.op, args, root.attrs), axes=_permutation(inner, ctx))


def _into_flags(a: Expr, b: Expr, inner: Call, root: Call, ctx: RewriteContext,
                of_b: bool) -> Expr | None:
    """nn.batch_matmul(a, transpose(b)) (``of_b``) or (transpose(a), b), the transpose
    swapping the last two axes -> that operand's flag flipped instead."""
    p = _permutation(inner, ctx)
    if p is None or len(p) != 3 or not _swaps_last_two(p):
        return None
    attrs = BatchMatmulAttrs.view(root.attrs)
    ta, tb = attrs.transpose_a, attrs.transpose_b
    if of_b:
        tb = not tb
    else:
        ta = not ta
    return batch_matmul(a, b, out_dtype=attrs.out_dtype, transpose_a=ta, transpose_b=tb)


_T = Pat.op("transpose", x, name="inner")
a, b = Pat.var("a"), Pat.var("b")

RULES = SIMPLIFY_RULES + RewriteTable([
    # transpose(x, p) moving only axes of size 1 -> reshape(x)
    (Pat.op("transpose", x), unit_axes_only),
    # squeeze(transpose(x, p)) -> transpose(squeeze(x))
    (Pat.op("squeeze", _T), squeeze_first),
    # take(transpose(x, p), scalar i) -> transpose(take(x, i))
    (Pat.op("take", _T, Pat.var("i")), take_first),
    # reshape(transpose(x, .., -1, -2)) of the leading axes -> transpose(reshape(x))
    (Pat.op("reshape", _T), reshape_first),
    # op(transpose(x), one-element constant) -> transpose(op(x, c))
    (Pat.op(SCALED, _T, c),
     lambda x, c, inner, root, ctx: _scale_first(x, c, inner, root, ctx, left=True)),
    (Pat.op(SCALED, c, _T),
     lambda x, c, inner, root, ctx: _scale_first(x, c, inner, root, ctx, left=False)),
    # nn.batch_matmul(a, transpose(b, last two)) -> transpose_b flipped (and of a alike)
    (Pat.op("nn.batch_matmul", a, Pat.op("transpose", b, name="inner")),
     lambda a, b, inner, root, ctx: _into_flags(a, b, inner, root, ctx, of_b=True)),
    (Pat.op("nn.batch_matmul", Pat.op("transpose", a, name="inner"), b),
     lambda a, b, inner, root, ctx: _into_flags(a, b, inner, root, ctx, of_b=False)),
])


@module_pass("fold-transposes", opt_level=1)
def FoldTransposes(mod: IRModule, ctx: PassContext) -> IRModule:
    """Move transposes out of the way of takes, squeezes, reshapes and scalings, and into
    batch_matmul's flags."""
    return RULES.apply_to_module(mod, ctx)


__all__ = ["FoldTransposes", "RULES"]
