"""Shape arithmetic kept as IR, for models with dynamic axes (batch, sequence length).

An exporter computes shapes inside the graph: ``Shape`` of a tensor, ``Gather`` of one of
its dimensions, ``Concat`` with constants, into ``Reshape``/``Expand``/``ConstantOfShape``/
``Slice``. Where the input shapes are static the importer folds all of it to constants (the
fast, static path); where a dimension is symbolic these helpers give kiln's ``shape_of`` and
``dyn.*`` operators instead (kiln/op/dyn.py), which the VM runs on the actual shapes, so one
executable serves every batch size and sequence length.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import op
from kiln.frontend import runtime_shapes
from kiln.frontend.onnx.context import NodeContext, cast
from kiln.frontend.runtime_shapes import batch_matmul as batch_matmul
from kiln.frontend.runtime_shapes import ones, triangle
from kiln.ir.expr import Call, Constant, Expr, Op, Tuple, Var
from kiln.ir.ty import TensorType
from kiln.op import dyn
from kiln.op.shape import StridedSliceAttrs

_INT64_MAX = np.iinfo(np.int64).max


def shape_of(ctx: NodeContext, i: int, start: int = 0, end: int | None = None) -> Expr:
    """``Shape`` of input ``i`` (dimensions ``start:end``, ONNX's clamped bounds) as int64."""
    rank = ctx.ndim(i)
    lo = min(max(start + rank if start < 0 else start, 0), rank)
    hi = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    s: Expr = op.shape_of(ctx.x(i), dtype="int64")
    if (lo, hi) != (0, rank):
        s = op.strided_slice(s, begin=[lo], end=[max(hi, lo)])
    return s


def static_dims(ctx: NodeContext, shape: Expr, index: np.ndarray | None) -> Expr | None:
    """``Gather`` of constant positions from a shape tensor computed at run time
    (`known_values`) where the entries picked are known at import: a constant, so what is
    computed from them (Swin's window padding from H and W under a dynamic batch) stays
    known too."""
    if index is None or ctx.ndim(0) != 1:
        return None
    values = known_values(shape, _resolver(ctx))
    if values is None:
        return None
    at = np.asarray(index).astype("int64")
    at = np.where(at < 0, at + len(values), at)
    if at.size == 0 or at.min() < 0 or at.max() >= len(values):
        return None  # the take reports it
    picked = [values[int(k)] for k in at.reshape(-1)]
    if any(v is None for v in picked):
        return None
    return Constant(np.asarray(picked, "int64").reshape(at.shape))


def _resolver(ctx: NodeContext) -> Callable[[Var], Expr | None]:
    """What a variable of the graph being imported stands for: a let-bound expression, or
    the array of an initializer kept as a parameter (looked up once, when first asked)."""
    table: dict[int, Expr] = {}
    filled = False

    def resolve(v: Var) -> Expr | None:
        nonlocal filled
        if not filled and ctx.graph is not None:
            for value in ctx.graph.env.values():
                if isinstance(value.expr, Var) and value.const is not None:
                    table[id(value.expr)] = Constant(value.const)
            for var, e in ctx.graph.bindings:
                table[id(var)] = e
        filled = True
        return table.get(id(v))

    return resolve


# int64 arithmetic on the known entries of shape tensors (`known_values`)
_ARITH = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
          "multiply": lambda a, b: a * b, "floor_divide": lambda a, b: a // b if b else None,
          "divide": lambda a, b: int(a / b) if b else None,
          "floor_mod": lambda a, b: a % b if b else None}


def known_values(root: Expr, resolve: Callable[[Var], Expr | None] = lambda v: None
                 ) -> list[int | None] | None:
    """The entries of a small integer tensor (a shape, 0-d or 1-D) that are known at import
    although the tensor is computed when the program runs: constants, and static dimensions
    read through ``shape_of`` of a typed variable, carried through slices, takes, concats,
    casts and arithmetic, and through let-bound variables (``resolve``). None where the
    expression is something else. (An explicit stack: such expressions are shallow, but
    nothing here recurses.)"""
    done: dict[int, list[int | None] | None] = {}
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in done:
            continue
        if isinstance(e, Var):
            bound = resolve(e)
            if bound is None:
                done[id(e)] = None
            elif id(bound) in done:
                done[id(e)] = done[id(bound)]
            else:
                stack.extend([(e, False), (bound, False)])
            continue
        if isinstance(e, Constant):
            a = np.asarray(e.data)
            ok = a.ndim <= 1 and a.dtype.kind in "iu"
            done[id(e)] = [int(v) for v in a.reshape(-1)] if ok else None
            continue
        if isinstance(e, Tuple):  # concatenate's argument: the fields joined
            if not ready:
                stack.append((e, True))
                stack.extend((f, False) for f in e.fields)
                continue
            fields = [done.get(id(f)) for f in e.fields]
            done[id(e)] = None if any(f is None for f in fields) else \
                [v for f in fields if f is not None for v in f]
            continue
        if not isinstance(e, Call) or not isinstance(e.op, Op):
            done[id(e)] = None
            continue
        name = e.op.name
        if name == "shape_of":
            x = e.args[0]
            t = x.type_annotation if isinstance(x, Var) else None
            done[id(e)] = [d if isinstance(d, int) else None for d in t.shape] \
                if isinstance(t, TensorType) else None
            continue
        if not ready:
            stack.append((e, True))
            stack.extend((a, False) for a in e.args)
            continue
        args = [done.get(id(a)) for a in e.args]
        done[id(e)] = _known_call(e, name, args)
    return done[id(root)]


def _known_call(e: Call, name: str, args: list[list[int | None] | None]) -> \
        list[int | None] | None:
    if any(a is None for a in args):
        return None
    vals = [a for a in args if a is not None]
    if name in ("cast", "expand_dims", "reshape", "squeeze") and len(vals[0]) <= 1:
        return vals[0]
    if name == "cast":
        return vals[0]
    if name == "concatenate" and len(vals) == 1:
        return vals[0]  # its tuple's fields, joined
    if name == "take" and len(vals[1]) == 1 and vals[1][0] is not None:
        k = vals[1][0]
        return [vals[0][k]] if -len(vals[0]) <= k < len(vals[0]) else None
    if name == "strided_slice":
        attrs = StridedSliceAttrs.view(e.attrs)
        if len(attrs.begin or ()) != 1 or attrs.strides and tuple(attrs.strides) != (1,):
            return None
        end = (attrs.end or (None,))[0]
        return vals[0][int((attrs.begin or (0,))[0]): None if end is None else int(end)]
    if name in _ARITH and len(vals) == 2:
        a, b = vals
        if len(a) != len(b) and 1 not in (len(a), len(b)):
            return None
        n = max(len(a), len(b))
        a, b = a * n if len(a) == 1 else a, b * n if len(b) == 1 else b
        fn = _ARITH[name]
        return [None if x is None or y is None else fn(x, y) for x, y in zip(a, b)]
    return None


def refined(ctx: NodeContext, y: Expr, shape: Expr, rank: int) -> Expr:
    """``y``, the ``dyn.reshape`` of a tensor to ``shape``, given the dimensions known at
    import (`known_values`) by a reshape copying the others (0): so a later ``Shape`` of
    them is a constant (Swin's window sizes under a dynamic batch)."""
    values = known_values(shape, _resolver(ctx))
    if values is None or len(values) != rank or all(v is None or v <= 0 for v in values):
        return y
    return op.reshape(y, newshape=[v if v is not None and v > 0 else 0 for v in values])


def shape_input(ctx: NodeContext, i: int, what: str) -> tuple[Expr, int]:
    """Input ``i``, a 1-D integer tensor of static length computed at run time, as int64,
    and its length."""
    t = ctx.t(i)
    if t.ndim != 1 or not isinstance(t.shape[0], int):
        raise ctx.error(f"input {i} ({what}) must be a 1-D tensor of known length, not {t}")
    if not t.dtype.startswith(("int", "uint")):
        raise ctx.error(f"input {i} ({what}) must hold integers, not {t.dtype}")
    x = ctx.x(i)
    return (x if t.dtype == "int64" else cast(x, "int64")), t.shape[0]


def expand(ctx: NodeContext) -> Expr:
    """``Expand`` to a shape computed at run time: ONNX broadcasts both ways, so the result's
    shape is the elementwise maximum of the two shapes aligned at the right (each dimension is
    either equal or 1 where they differ)."""
    target, n = shape_input(ctx, 1, "shape")
    rank = ctx.ndim(0)
    ndim = max(rank, n)
    ctx.check_rank(ndim, "the result")
    mine: Expr = op.shape_of(ctx.x(0), dtype="int64")
    if ndim > rank:
        mine = op.concatenate([ones(ndim - rank), mine], axis=0)
    if ndim > n:
        target = op.concatenate([ones(ndim - n), target], axis=0)
    return dyn.broadcast_to(ctx.x(0), op.maximum(mine, target))


def _dim(shape: Expr, k: int) -> Expr:
    return op.take(shape, Constant(np.array(k, "int64")))


def gather_elements(ctx: NodeContext, axis: int) -> Expr:
    """``GatherElements`` with shapes known at run time (kiln/frontend/runtime_shapes.py,
    shared with torch.gather)."""
    rank = ctx.ndim(0)
    if ctx.ndim(1) != rank:
        raise ctx.error(f"indices must have the data's rank {rank}, not {ctx.ndim(1)}")
    data, index = ctx.t(0).shape, ctx.t(1).shape
    same = [a == b for a, b in zip(data, index)]
    return runtime_shapes.gather_elements(ctx.x(0), ctx.x(1), axis, rank, same, ctx.dtype(1))


def flatten(ctx: NodeContext, axis: int) -> Expr:
    """``Flatten`` at ``axis`` of a tensor whose shape is known at run time."""
    shape = op.shape_of(ctx.x(0), dtype="int64")
    rows: Expr = Constant(np.array(1, "int64"))
    for k in range(axis):
        rows = op.multiply(rows, _dim(shape, k))
    target = op.concatenate([op.expand_dims(rows, axis=0), Constant(np.array([-1], "int64"))],
                            axis=0)
    return dyn.reshape(ctx.x(0), target)


def trilu(ctx: NodeContext, k: int, upper: bool) -> Expr:
    """``Trilu`` of a tensor whose last two dimensions are known at run time: the mask
    compares column minus row with ``k`` (upper keeps j - i >= k, lower j - i <= k)."""
    if ctx.ndim(0) < 2:
        raise ctx.error(f"Trilu takes a tensor of rank 2 or more, not rank {ctx.ndim(0)}")
    shape = op.shape_of(ctx.x(0), dtype="int64")
    rank = ctx.ndim(0)
    keep = triangle(_dim(shape, rank - 2), _dim(shape, rank - 1), k, upper)
    return op.where(keep, ctx.x(0), op.zeros_like(ctx.x(0)))


def slice_(ctx: NodeContext) -> Expr:
    """``Slice`` (opset 10+) with starts or ends computed at run time. The axes and steps must
    be known; positive steps only (ONNX's bounds then clamp as Python's slices do)."""
    # the axes and steps must be known (a kiln.Error saying so, and how, if not)
    axes_c = ctx.need_const(3, "axes") if ctx.has(3) else None
    steps_c = ctx.need_const(4, "steps") if ctx.has(4) else None
    starts, n = shape_input(ctx, 1, "starts")
    ends, n_end = shape_input(ctx, 2, "ends")
    if n_end != n:
        raise ctx.error(f"starts has {n} values but ends has {n_end}")
    rank = ctx.ndim(0)
    axes = [int(a) for a in np.asarray(axes_c).reshape(-1)] if axes_c is not None \
        else list(range(n))
    steps = [int(s) for s in np.asarray(steps_c).reshape(-1)] if steps_c is not None \
        else [1] * n
    if len(axes) != n or len(steps) != n:
        raise ctx.error(f"starts, ends, axes {axes} and steps {steps} must have one value per "
                        "sliced axis")
    axes = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != n:
        raise ctx.error(f"axes {axes} are not distinct axes of a tensor of rank {rank}")
    if any(s <= 0 for s in steps):
        raise ctx.error(f"Slice with bounds computed at run time takes positive steps, not "
                        f"{steps}")
    lead = max(axes) + 1
    begin: list[Expr] = []
    end: list[Expr] = []
    stride: list[int] = []
    for k in range(lead):
        if k in axes:
            j = axes.index(k)
            at = Constant(np.array(j, "int64"))
            begin.append(op.expand_dims(op.take(starts, at), axis=0))
            end.append(op.expand_dims(op.take(ends, at), axis=0))
            stride.append(steps[j])
        else:
            begin.append(Constant(np.zeros(1, "int64")))
            end.append(Constant(np.array([_INT64_MAX], "int64")))
            stride.append(1)
    return dyn.strided_slice(ctx.x(0), op.concatenate(begin, axis=0),
               op.concatenate(end, axis=0), Constant(np.array(stride, "int64")))


def cumulative(ctx: NodeContext, axis: int, product: bool) -> Expr:
    """``CumSum``/``CumProd`` of a tensor whose shape is known at run time (RoBERTa's
    position ids count the mask along the sequence): `runtime_shapes.scan`."""
    return runtime_shapes.scan(ctx.x(0), axis, ctx.ndim(0), product,
                               exclusive=bool(ctx.attr("exclusive", 0)),
                               reverse=bool(ctx.attr("reverse", 0)))
