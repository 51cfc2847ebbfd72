"""simplify-expr: remove shape operations that cancel or do nothing (TVM's SimplifyExpr).

Chains of reshape-like operators (reshape, squeeze, expand_dims, batch_flatten) become one
reshape; a reshape to the shape it already has disappears; transpose of transpose becomes one
transpose (or nothing); a cast to the dtype it already has, or a lossless round trip through a
wider dtype, disappears; so do an identity strided_slice and broadcast_to. Each row of the
table keeps the value and type of what it replaces exactly; shapes must be known for the
rows that reason about shapes (a ``?`` dimension stops them).
"""

from __future__ import annotations

import numpy as np

from kiln.ir.expr import Call, Expr
from kiln.ir.module import IRModule
from kiln.ir.ty import AnyDim, TensorType
from kiln.op import reshape, transpose
from kiln.op.elementwise import CastAttrs
from kiln.op.shape import ExpandDimsAttrs, SqueezeAttrs, StridedSliceAttrs, TransposeAttrs
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable

x = Pat.var("x")

RESHAPE_LIKE = ("reshape", "squeeze", "expand_dims", "nn.batch_flatten")


def _known(t: TensorType | None) -> bool:
    """A tensor type whose dimensions are all integers or named sizes (no ``?``)."""
    return t is not None and not any(isinstance(d, AnyDim) for d in t.shape)


def _same_shape(a: Expr, b: Expr, ctx: RewriteContext) -> bool:
    ta, tb = ctx.tensor_type(a), ctx.tensor_type(b)
    return _known(ta) and ta == tb


def merge_reshapes(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    """reshape(reshape(x)) -> reshape(x): only the final (static) shape matters."""
    shape = ctx.static_shape(root)
    if shape is None:
        return None
    # A 0 in newshape copies an input dimension unless allowzero says it is a size.
    return reshape(x, newshape=list(shape), allowzero=int(0 in shape))


def drop_if_same_shape(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    """A reshape-like operator that leaves the shape as it was is the identity."""
    return x if _same_shape(x, root, ctx) else None


def full_axes(axes: tuple[int, ...] | None, ndim: int) -> list[int]:
    """A transpose's axes in full: None reverses them, a negative axis counts from the end."""
    if axes is None:
        return list(range(ndim))[::-1]
    return [a + ndim if a < 0 else a for a in axes]


def compose_transposes(x: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """transpose(transpose(x, p), q) -> transpose(x, p∘q), or x when that is the identity."""
    t = ctx.tensor_type(x)
    if t is None:
        return None
    p = full_axes(TransposeAttrs.view(inner.attrs).axes, t.ndim)
    q = full_axes(TransposeAttrs.view(root.attrs).axes, t.ndim)
    composed = [p[i] for i in q]
    return x if composed == list(range(t.ndim)) else transpose(x, axes=composed)


def drop_identity_transpose(x: Expr, root: Call, ctx: RewriteContext) -> Expr | None:
    """transpose(x, [0, 1, ..]) -> x."""
    t = ctx.tensor_type(x)
    if t is None or full_axes(TransposeAttrs.view(root.attrs).axes, t.ndim) != list(range(t.ndim)):
        return None
    return x


def drop_same_dtype_cast(x: Expr, root: Call, ctx: RewriteContext) -> Expr | None:
    """cast(x, dtype of x) -> x."""
    t = ctx.tensor_type(x)
    return x if t is not None and t.dtype == CastAttrs.view(root.attrs).dtype else None


def lossless(src: str, dst: str) -> bool:
    """True when every value of dtype ``src`` survives a cast to ``dst`` and back."""
    s, d = np.dtype(src), np.dtype(dst)
    if s == np.bool_:
        return True
    if s.kind == "f":
        return d.kind == "f" and d.itemsize >= s.itemsize
    if d.kind == "f":  # an integer fits when its magnitude bits fit the significand
        bits = s.itemsize * 8 - (1 if s.kind == "i" else 0)
        return bits <= np.finfo(d).nmant + 1
    if d.kind in "iu":
        si, di = np.iinfo(s), np.iinfo(d)
        return di.min <= si.min and si.max <= di.max
    return False


def drop_round_trip_cast(x: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """cast(cast(x, wider), dtype of x) -> x when the wider dtype holds every value of x."""
    t = ctx.tensor_type(x)
    wider = CastAttrs.view(inner.attrs).dtype
    if t is None or CastAttrs.view(root.attrs).dtype != t.dtype or not lossless(t.dtype, wider):
        return None
    return x


def drop_squeezed_new_axis(x: Expr, inner: Call, root: Call, ctx: RewriteContext) -> Expr | None:
    """squeeze(expand_dims(x, a), [a]) -> x, whatever the other dimensions are."""
    t = ctx.tensor_type(x)
    expand, squeeze = ExpandDimsAttrs.view(inner.attrs), SqueezeAttrs.view(root.attrs)
    if t is None or expand.num_newaxis != 1 or squeeze.axis is None:
        return None
    at = expand.axis + t.ndim + 1 if expand.axis < 0 else expand.axis
    squeezed = [a + t.ndim + 1 if a < 0 else a for a in squeeze.axis]
    return x if squeezed == [at] else None


def drop_identity_slice(x: Expr, root: Call, ctx: RewriteContext) -> Expr | None:
    """strided_slice(x) that keeps every element in order -> x."""
    shape = ctx.static_shape(x)
    a = StridedSliceAttrs.view(root.attrs)
    if shape is None or a.slice_mode != "end":
        return None
    axes = a.axes if a.axes is not None else range(len(a.begin))
    strides = list(a.strides or ()) + [1] * (len(a.begin) - len(a.strides or ()))
    for axis, b, e, s in zip(axes, a.begin, a.end, strides):
        if s != 1 or b != 0 or e < shape[axis]:
            return None
    return x


RULES = RewriteTable([
    # reshape(reshape(x)) -> reshape(x)  (squeeze, expand_dims, batch_flatten alike)
    (Pat.op(RESHAPE_LIKE, Pat.op(RESHAPE_LIKE, x)), merge_reshapes),
    # reshape(x) to the shape x has -> x
    (Pat.op(RESHAPE_LIKE, x), drop_if_same_shape),
    # squeeze(expand_dims(x, a), [a]) -> x
    (Pat.op("squeeze", Pat.op("expand_dims", x, name="inner")), drop_squeezed_new_axis),
    # transpose(transpose(x)) -> transpose(x) or x
    (Pat.op("transpose", Pat.op("transpose", x, name="inner")), compose_transposes),
    # transpose(x, identity) -> x
    (Pat.op("transpose", x), drop_identity_transpose),
    # cast(cast(x, wider), x.dtype) -> x
    (Pat.op("cast", Pat.op("cast", x, name="inner")), drop_round_trip_cast),
    # cast(x, x.dtype) -> x
    (Pat.op("cast", x), drop_same_dtype_cast),
    # strided_slice(x, everything) -> x
    (Pat.op("strided_slice", x), drop_identity_slice),
    # broadcast_to(x, shape of x) -> x
    (Pat.op("broadcast_to", x), drop_if_same_shape),
])


@module_pass("simplify-expr", opt_level=0)
def SimplifyExpr(mod: IRModule, ctx: PassContext) -> IRModule:
    """Remove reshapes, transposes, casts and slices that cancel or do nothing."""
    return RULES.apply_to_module(mod, ctx)
