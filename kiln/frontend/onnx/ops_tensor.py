"""Converters of ONNX's tensor-shaped operators: constants, casts, shapes and layouts.

Shape arguments that ONNX passes as tensors (Reshape's shape, Squeeze's axes, Tile's repeats)
must be known at import time; they become the static attributes of kiln's operators.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import op
from kiln.frontend.onnx import dynamic
from kiln.frontend.onnx.context import NodeContext, RandomOutput, cast, const_like, kiln_dtype
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr
from kiln.ir.ty import SymDim
from kiln.op import dyn


def norm_axis(ctx: NodeContext, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def reshape(x: Expr, shape: tuple[int, ...] | list[int]) -> Expr:
    """``x`` reshaped to a shape of numbers (a 0 is a 0, not "copy the dimension")."""
    return op.reshape(x, newshape=[int(d) for d in shape], allowzero=1)


# --- constants and casts --------------------------------------------------------------------


@converter("Constant", since=1)
def constant(ctx: NodeContext) -> Expr:
    scalar_kinds = {"value_float": "float32", "value_int": "int64"}
    list_kinds = {"value_floats": "float32", "value_ints": "int64"}
    for name, dtype in scalar_kinds.items():
        if name in ctx.attrs:
            return Constant(np.asarray(ctx.attrs[name], dtype=dtype))
    for name, dtype in list_kinds.items():
        if name in ctx.attrs:
            return Constant(np.asarray(ctx.attrs[name], dtype=dtype).reshape(-1))
    if "value" in ctx.attrs:
        return Constant(ctx.attrs["value"])
    given = ", ".join(sorted(ctx.attrs)) or "none"
    raise ctx.error(f"a Constant needs a numeric value attribute (value, value_float(s), "
                    f"value_int(s)); it has {given}")


@converter("Identity", since=1)
def identity(ctx: NodeContext) -> Expr:
    return ctx.x(0)


@converter("Cast", since=6)
def cast_op(ctx: NodeContext) -> Expr:
    dtype = kiln_dtype(ctx.need_attr("to"), f"{ctx.where}: the target type")
    return ctx.x(0) if ctx.dtype(0) == dtype else cast(ctx.x(0), dtype)


@converter("CastLike", since=15)
def cast_like(ctx: NodeContext) -> Expr:
    dtype = ctx.dtype(1)
    return ctx.x(0) if ctx.dtype(0) == dtype else cast(ctx.x(0), dtype)


@converter("Shape", since=1)
def shape_(ctx: NodeContext) -> Expr:
    dims = ctx.t(0).shape
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    picked = dims[slice(start, end)]
    if not all(isinstance(d, int) for d in picked):  # computed at run time (dynamic axes)
        return dynamic.shape_of(ctx, 0, start, end)
    return Constant(np.asarray(picked, dtype="int64"))


@converter("Size", since=1)
def size(ctx: NodeContext) -> Expr:
    return Constant(np.asarray(math.prod(ctx.shape(0)), dtype="int64"))


@converter("ConstantOfShape", since=9)
def constant_of_shape(ctx: NodeContext) -> Expr:
    if ctx.const(0) is None:  # a shape computed at run time
        value = ctx.attr("value")
        fill = np.zeros((), "float32") if value is None else np.asarray(value).reshape(-1)
        if fill.size != 1:
            raise ctx.error(f"attribute 'value' must hold one element, not {fill.size}")
        target, _ = dynamic.shape_input(ctx, 0, "shape")
        return dyn.full(Constant(fill.reshape(())), target)
    shape = ctx.ints(0, "shape")
    ctx.check_shape(shape, "the result")
    value = ctx.attr("value")
    if value is not None and np.asarray(value).size != 1:
        raise ctx.error(f"attribute 'value' must hold one element, not {np.asarray(value).size}")
    fill = np.zeros((), "float32") if value is None else np.asarray(value).reshape(-1)[0]
    dtype = fill.dtype.name
    if math.prod(shape) <= 1 << 16:
        return Constant(np.full(shape, fill, dtype=dtype))
    return op.full(const_like(fill, dtype), shape=shape, dtype=dtype)


@converter("EyeLike", since=9)
def eye_like(ctx: NodeContext) -> Expr:
    shape = ctx.shape(0)
    if len(shape) != 2:
        raise ctx.error(f"EyeLike takes a 2-D input, not one of shape {shape}")
    rows, cols = shape
    dtype = ctx.dtype(0)
    if "dtype" in ctx.attrs:
        dtype = kiln_dtype(ctx.attrs["dtype"], f"{ctx.where}: dtype")
    ctx.check_elements(shape, "the identity matrix")
    k = min(max(int(ctx.attr("k", 0)), -rows), cols)  # further out is all zeros too
    return Constant(np.eye(rows, cols, k=k, dtype=dtype))


@converter("Range", since=11)
def range_(ctx: NodeContext) -> Expr:
    start, limit, delta = ctx.const(0), ctx.const(1), ctx.const(2)
    dtype = ctx.dtype(0)
    if start is not None and limit is not None and delta is not None:
        first, last, step = (np.asarray(v).reshape(-1)[0].item() for v in (start, limit, delta))
        if not all(math.isfinite(v) for v in (first, last, step)) or step == 0:
            raise ctx.error(f"Range({first}, {last}, {step}) has no length: start, limit and "
                            "delta must be finite and delta non-zero")
        if isinstance(first, int) and isinstance(last, int) and isinstance(step, int):
            n = max(-((first - last) // step), 0)  # ceil((last - first) / step), exactly
        else:
            n = max(math.ceil((last - first) / step), 0)
        ctx.check_elements((n,), "the range")
        values = first + np.arange(n) * step
        return Constant(np.asarray(values).astype(dtype))
    return op.arange(ctx.x(0), ctx.x(1), ctx.x(2), dtype=dtype)


# --- reshapes -------------------------------------------------------------------------------


def onnx_reshape(ctx: NodeContext, x: Expr, shape: list[int], allowzero: int) -> Expr:
    t = ctx.t(0)
    if t.is_static:
        ishape = t.static_shape
        out = [ishape[k] if d == 0 and not allowzero else d for k, d in enumerate(shape)]
        if -1 in out:
            known = math.prod(d for d in out if d != -1)
            total = math.prod(ishape)
            if known == 0 or total % known:
                raise ctx.error(f"cannot reshape a tensor of shape {tuple(ishape)} to {shape}")
            out[out.index(-1)] = total // known
        return reshape(x, out)
    return op.reshape(x, newshape=shape, allowzero=allowzero)


@converter("Reshape", since=5)
def reshape_5(ctx: NodeContext) -> Expr:
    if ctx.const(1) is None:  # a shape computed at run time
        shape, n = dynamic.shape_input(ctx, 1, "shape")
        y = dyn.reshape(ctx.x(0), shape, allowzero=ctx.attr("allowzero", 0))
        return dynamic.refined(ctx, y, ctx.x(1), n)
    return onnx_reshape(ctx, ctx.x(0), ctx.ints(1, "shape"), ctx.attr("allowzero", 0))


@converter("Reshape", since=1)
def reshape_1(ctx: NodeContext) -> Expr:
    return onnx_reshape(ctx, ctx.x(0), list(ctx.need_attr("shape")), 0)


@converter("Flatten", since=1)
def flatten(ctx: NodeContext) -> Expr:
    shape = ctx.t(0).shape
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ctx.error(f"axis {ctx.attr('axis')} is out of range for rank {len(shape)}")
    if axis == 1 and len(shape) >= 1 and not isinstance(shape[0], int):
        return op.reshape(ctx.x(0), newshape=[0, -1])  # a symbolic batch stays symbolic
    if not ctx.t(0).is_static:
        return dynamic.flatten(ctx, axis)
    static = ctx.shape(0)
    return reshape(ctx.x(0), [math.prod(static[:axis]), math.prod(static[axis:])])


def _squeeze(ctx: NodeContext, axes: list[int] | None) -> Expr:
    ndim = ctx.ndim(0)
    if axes is None:
        shape = ctx.t(0).shape
        axes = [k for k, d in enumerate(shape) if d == 1]
        if not all(isinstance(d, int) for d in shape):
            raise ctx.error("Squeeze without axes needs a static input shape")
    axes = sorted({norm_axis(ctx, a, ndim) for a in axes})
    return ctx.x(0) if not axes else op.squeeze(ctx.x(0), axis=axes)


@converter("Squeeze", since=13)
def squeeze_13(ctx: NodeContext) -> Expr:
    return _squeeze(ctx, ctx.ints(1, "axes") if ctx.has(1) else None)


@converter("Squeeze", since=1)
def squeeze_1(ctx: NodeContext) -> Expr:
    axes = ctx.attr("axes")
    return _squeeze(ctx, list(axes) if axes is not None else None)


def _unsqueeze(ctx: NodeContext, axes: list[int]) -> Expr:
    rank = ctx.ndim(0) + len(axes)
    ctx.check_rank(rank, "the result")
    out = sorted(norm_axis(ctx, a, rank) for a in axes)
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {axes} repeat an axis")
    x = ctx.x(0)
    for a in out:
        x = op.expand_dims(x, axis=a)
    return x


@converter("Unsqueeze", since=13)
def unsqueeze_13(ctx: NodeContext) -> Expr:
    return _unsqueeze(ctx, ctx.ints(1, "axes"))


@converter("Unsqueeze", since=1)
def unsqueeze_1(ctx: NodeContext) -> Expr:
    return _unsqueeze(ctx, list(ctx.need_attr("axes")))


@converter("Transpose", since=1)
def transpose(ctx: NodeContext) -> Expr:
    perm = ctx.attr("perm")
    return op.transpose(ctx.x(0), axes=list(perm) if perm is not None else None)


@converter("Concat", since=4)
def concat(ctx: NodeContext) -> Expr:
    xs = [ctx.x(i) for i in range(len(ctx.inputs)) if ctx.has(i)]
    axis = norm_axis(ctx, ctx.need_attr("axis"), ctx.ndim(0))
    return op.concatenate(xs, axis=axis)


def _split(ctx: NodeContext, sizes: list[int] | None) -> list[Expr]:
    shape = ctx.t(0).shape
    axis = norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    n = shape[axis]
    if not isinstance(n, int):  # known at run time: the sizes must be given (and add up)
        if sizes is None:
            raise ctx.error(f"Split into equal parts needs dimension {axis} to be static, but "
                            f"input 0 has shape ({', '.join(map(str, shape))})")
        ctx.check_unroll(len(sizes), "the number of parts it splits into")
        n = sum(sizes)
    if sizes is None:
        parts = ctx.attr("num_outputs", ctx.num_outputs)
        if parts < 1:
            raise ctx.error(f"it splits into {parts} parts; it needs at least 1")
        ctx.check_unroll(parts, "the number of parts it splits into")
        step = -(-n // parts)  # the last part may be smaller (opset 18)
        sizes = [min(step, n - k * step) for k in range(parts)]
    ctx.check_unroll(len(sizes), "the number of parts it splits into")
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {sizes} do not add up to dimension {axis} ({n})")
    outs: list[Expr] = []
    start = 0
    for s in sizes:
        outs.append(op.strided_slice(ctx.x(0), begin=[start], end=[start + s], axes=[axis]))
        start += s
    return outs


@converter("Split", since=13)
def split_13(ctx: NodeContext) -> list[Expr]:
    return _split(ctx, ctx.ints(1, "split") if ctx.has(1) else None)


@converter("Split", since=2)
def split_2(ctx: NodeContext) -> list[Expr]:
    sizes = ctx.attr("split")
    return _split(ctx, list(sizes) if sizes else None)


@converter("Expand", since=8)
def expand(ctx: NodeContext) -> Expr:
    if ctx.const(1) is None:  # a shape computed at run time
        return dynamic.expand(ctx)
    target = ctx.ints(1, "shape")
    shape = ctx.shape(0)
    ndim = max(len(shape), len(target))
    ctx.check_rank(ndim, "the result")
    a = (1,) * (ndim - len(shape)) + tuple(shape)
    b = (1,) * (ndim - len(target)) + tuple(target)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ctx.error(f"cannot expand shape {shape} to {target}")
        out.append(x if y == 1 else y)
    return ctx.x(0) if tuple(out) == tuple(shape) else op.broadcast_to(ctx.x(0), shape=out)


@converter("Tile", since=6)
def tile(ctx: NodeContext) -> Expr:
    return op.tile(ctx.x(0), reps=ctx.ints(1, "repeats"))


def _blocksize(ctx: NodeContext) -> int:
    b = ctx.need_attr("blocksize")
    if not isinstance(b, int) or b < 1:
        raise ctx.error(f"attribute blocksize must be a positive integer, not {b!r}")
    return b


@converter("SpaceToDepth", since=1)
def space_to_depth(ctx: NodeContext) -> Expr:
    b = _blocksize(ctx)
    n, c, h, w = ctx.shape(0)
    x = reshape(ctx.x(0), [n, c, h // b, b, w // b, b])
    if ctx.attr("mode", "DCR") == "DCR":  # block offsets, then channels (the only mode < 28)
        x = op.transpose(x, axes=[0, 3, 5, 1, 2, 4])
    else:
        x = op.transpose(x, axes=[0, 1, 3, 5, 2, 4])
    return reshape(x, [n, c * b * b, h // b, w // b])


@converter("DepthToSpace", since=11)
def depth_to_space(ctx: NodeContext) -> Expr:
    b = _blocksize(ctx)
    n, c, h, w = ctx.shape(0)
    if ctx.attr("mode", "DCR") == "DCR":
        x = reshape(ctx.x(0), [n, b, b, c // (b * b), h, w])
        x = op.transpose(x, axes=[0, 3, 4, 1, 5, 2])
    else:
        x = reshape(ctx.x(0), [n, c // (b * b), b, b, h, w])
        x = op.transpose(x, axes=[0, 1, 4, 2, 5, 3])
    return reshape(x, [n, c // (b * b), h * b, w * b])


@converter("Dropout", since=7)
def dropout(ctx: NodeContext) -> list[Expr]:
    training = bool(ctx.need_const(2, "training_mode").reshape(-1)[0]) if ctx.has(2) else False
    if training:
        ratio = float(np.asarray(ctx.need_const(1, "ratio")).reshape(-1)[0]) if ctx.has(1) \
            else 0.5
        if ratio != 0.0:
            raise RandomOutput(f"{ctx.where}: kiln imports Dropout for inference: in training "
                               "mode it drops random elements, which kiln does not do")
    x = ctx.x(0)
    t = ctx.t(0)
    small = t.is_static and math.prod(t.static_shape) <= 1 << 16  # else made at run time
    mask = (Constant(np.ones(t.static_shape, dtype=bool)) if small
            else op.ones_like(cast(x, "bool")))
    return [x, mask]


def dims_text(dims: tuple[object, ...]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def is_static(dims: tuple[object, ...]) -> bool:
    return not any(isinstance(d, SymDim) or not isinstance(d, int) for d in dims)
