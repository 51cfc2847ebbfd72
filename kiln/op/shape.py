"""Operators that move elements without arithmetic: reshape, transpose, expand_dims, squeeze,
concatenate, split, stack, take, strided_slice, broadcast_to, tile.

Unknown dimensions flow through: a dimension copied from the input keeps its symbol, one that
cannot be computed becomes ``?``, and only two known sizes that disagree are an error.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from kiln.errors import EvalError, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, Tuple, TupleGetItem
from kiln.ir.ty import (
    ANY,
    AnyDim,
    Dim,
    IncompleteType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    static_dims,
)
from kiln.loops import oplib
from kiln.loops.compute import (
    Indices,
    Tensor,
    WriteFn,
    broadcast_indices,
    compute,
    extern,
    reduce,
)
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Buffer,
    Check,
    Const,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
)
from kiln.loops.ir import Expr as LExpr
from kiln.loops.ir import Var as LVar
from kiln.loops.schedule import NestSchedule, loop_nest
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    broadcast_shape,
    check_dims_equal,
    dim_product,
    normalize_axis,
    require_dtype,
    same_dtype,
    shape_str,
    tensor_arg,
    tensor_args,
    unify_dim,
)
from kiln.op.grad_helpers import call, reshape_to
from kiln.op.registry import Attr, OpPattern, register

# --- reshape ------------------------------------------------------------------------------


def _quotient(total: Sequence[Dim], known: Sequence[Dim], context: str) -> Dim:
    """The size x with product(known) * x == product(total), cancelling symbols where it can.

    ``context`` opens the error message when no whole number fits.
    """
    if any(isinstance(d, AnyDim) for d in (*total, *known)):
        return ANY
    t_int = math.prod(d for d in total if isinstance(d, int))
    k_int = math.prod(d for d in known if isinstance(d, int))
    t_sym = Counter(d for d in total if isinstance(d, SymDim))
    k_sym = Counter(d for d in known if isinstance(d, SymDim))
    if k_sym - t_sym:  # a symbol on the output side that the input lacks
        return ANY
    rest = t_sym - k_sym
    if k_int == 0:
        raise TypeCheckError(f"{context}: cannot infer a size when another size is 0")
    if not rest:
        if t_int % k_int:
            raise TypeCheckError(
                f"{context}: {t_int} elements do not divide into parts of {k_int} elements"
            )
        return t_int // k_int
    if t_int == k_int and sum(rest.values()) == 1:
        return next(iter(rest))
    return ANY


def infer_reshape(ishape: Sequence[Dim], newshape: Sequence[int], allowzero: int) -> list[Dim]:
    """The output shape of Relay's reshape, with its special values 0, -1, -2, -3 and -4."""
    out: list[Dim] = []
    infer_at: int | None = None
    src = 0
    i = 0

    def take_input(code: int) -> Dim:
        if src >= len(ishape):
            raise TypeCheckError(
                f"newshape {list(newshape)}: {code} at position {i} refers to input dimension "
                f"{src}, but the input has shape {shape_str(ishape)}"
            )
        return ishape[src]

    while i < len(newshape):
        v = newshape[i]
        if v > 0 or (v == 0 and allowzero):
            out.append(v)
            src += 1
        elif v == 0:  # copy the input dimension
            out.append(take_input(0))
            src += 1
        elif v == -1:  # infer from the rest
            if infer_at is not None:
                raise TypeCheckError(f"newshape {list(newshape)} has more than one -1")
            infer_at = len(out)
            out.append(1)
            src += 1
        elif v == -2:  # copy all remaining input dimensions
            out.extend(ishape[src:])
            src = len(ishape)
        elif v == -3:  # merge two consecutive input dimensions
            first = take_input(-3)
            src += 1
            out.append(dim_product([first, take_input(-3)]))
            src += 1
        elif v == -4:  # split one input dimension into the next two values
            if i + 2 >= len(newshape):
                raise TypeCheckError(f"newshape {list(newshape)}: -4 must be followed by two sizes")
            whole = take_input(-4)
            d1, d2 = newshape[i + 1], newshape[i + 2]
            if d1 == -1 and d2 == -1 or d1 < -1 or d2 < -1:
                raise TypeCheckError(f"newshape {list(newshape)}: bad sizes after -4")
            context = f"newshape {list(newshape)}: splitting input dimension {src} ({whole})"
            if d1 == -1:
                out.extend([_quotient([whole], [d2], context), d2])
            elif d2 == -1:
                out.extend([d1, _quotient([whole], [d1], context)])
            else:
                check_dims_equal(
                    whole,
                    d1 * d2,
                    f"newshape {list(newshape)}: cannot split input "
                    f"dimension {src} of size {whole} into {d1} * {d2}",
                )
                out.extend([d1, d2])
            src += 1
            i += 2
        else:
            raise TypeCheckError(
                f"newshape {list(newshape)} may hold only sizes >= 0 and the codes -1 to -4"
            )
        i += 1
    if infer_at is not None:
        others = out[:infer_at] + out[infer_at + 1 :]
        context = f"cannot reshape a tensor of shape {shape_str(ishape)} to {list(newshape)}"
        out[infer_at] = _quotient(ishape, others, context)
    else:
        known_in = [d for d in ishape if isinstance(d, int)]
        known_out = [d for d in out if isinstance(d, int)]
        if (len(known_in) == len(ishape) and len(known_out) == len(out)
                and math.prod(known_in) != math.prod(known_out)):
            raise TypeCheckError(
                f"cannot reshape a tensor of shape {shape_str(ishape)} "
                f"({math.prod(known_in)} elements) to {shape_str(out)} "
                f"({math.prod(known_out)} elements)"
            )
    return out


class ReshapeAttrs(Attrs):
    __slots__ = ()
    newshape: tuple[int, ...]
    allowzero: int


def _reshape_relation(arg_types: Sequence[Type], attrs: ReshapeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    return TensorType(tuple(infer_reshape(data.shape, attrs.newshape, attrs.allowzero)),
                      data.dtype)


def _reshape(arrays: list[np.ndarray], attrs: ReshapeAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    # The array's shape is static, and so is the shape inferred from it.
    return x.reshape(static_dims(infer_reshape(x.shape, attrs.newshape, attrs.allowzero)))


reshape = register(
    "reshape",
    inputs=("data",),
    attrs_type=ReshapeAttrs,
    attrs=(
        Attr("newshape", kind="ints", doc="the new shape, with the codes 0, -1, -2, -3, -4"),
        Attr("allowzero", 0, kind="int", doc="1: a 0 in newshape is a size, not a copy"),
    ),
    relation=_reshape_relation,
    compute=_reshape,
    pattern=OpPattern.INJECTIVE,
    doc="The same elements in a new shape (0 copies, -1 infers, -2..-4 as in Relay).",
    gradient=lambda c, g: [reshape_to(g, c.args[0])],
    lower=lambda inputs, attrs, out: compute(
        out.shape, out.dtype,
        lambda *i: inputs[0](*oplib.reshape_indices(inputs[0].shape, out.shape, i))),
)


# --- transpose, expand_dims, squeeze ------------------------------------------------------


def _permutation(ndim: int, axes: Sequence[int] | None) -> list[int]:
    if axes is None:
        return list(range(ndim))[::-1]
    if len(axes) != ndim:
        raise TypeCheckError(f"axes {list(axes)} must list each of the {ndim} dimensions once")
    perm = [normalize_axis(a, ndim) for a in axes]
    if sorted(perm) != list(range(ndim)):
        raise TypeCheckError(f"axes {list(axes)} is not a permutation of the {ndim} dimensions")
    return perm


class TransposeAttrs(Attrs):
    __slots__ = ()
    axes: tuple[int, ...] | None


def _transpose_relation(arg_types: Sequence[Type], attrs: TransposeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    perm = _permutation(data.ndim, attrs.axes)
    return TensorType(tuple(data.shape[p] for p in perm), data.dtype)


def _transpose_grad(c: Call, g: Expr) -> list[Expr | None]:
    perm = _permutation(gh.tensor_type(c.args[0]).ndim, TransposeAttrs.view(c.attrs).axes)
    return [call("transpose", g, axes=[int(i) for i in np.argsort(perm)])]


def _transpose_lower(inputs: list[Tensor], attrs: TransposeAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    perm = _permutation(x.ndim, attrs.axes)

    def element(*i: LExpr) -> LExpr:
        idx: list[LExpr] = [Const(0)] * x.ndim
        for k, p in enumerate(perm):
            idx[p] = i[k]
        return x(*idx)

    return compute(out.static_shape, out.dtype, element)


transpose = register(
    "transpose",
    inputs=("data",),
    attrs_type=TransposeAttrs,
    attrs=(Attr("axes", None, kind="ints", optional=True, doc="the new order; None reverses"),),
    relation=_transpose_relation,
    compute=lambda arrays, attrs: np.transpose(
        arrays[0], _permutation(np.ndim(arrays[0]), attrs.axes)
    ),
    pattern=OpPattern.INJECTIVE,
    doc="Dimensions permuted (reversed when axes is None).",
    gradient=_transpose_grad,
    lower=_transpose_lower,
)


def _expanded(shape: Sequence[Dim], axis: int, count: int) -> tuple[Dim, ...]:
    ndim = len(shape)
    if not -ndim - 1 <= axis <= ndim:
        raise TypeCheckError(f"axis {axis} is out of range for expand_dims on rank {ndim}")
    if count < 0:
        raise TypeCheckError(f"num_newaxis must not be negative, got {count}")
    at = axis + ndim + 1 if axis < 0 else axis
    return (*shape[:at], *([1] * count), *shape[at:])


class ExpandDimsAttrs(Attrs):
    __slots__ = ()
    axis: int
    num_newaxis: int


def _expand_dims_relation(arg_types: Sequence[Type], attrs: ExpandDimsAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    return TensorType(_expanded(data.shape, attrs.axis, attrs.num_newaxis), data.dtype)


def _lower_as_reshape(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    """Operators that only change the shape: the same elements in row-major order."""
    out = oplib.out_tensor_type(out_type)
    x = inputs[0]
    return compute(out.static_shape, out.dtype,
                   lambda *i: x(*oplib.reshape_indices(x.shape, out.static_shape, i)))


expand_dims = register(
    "expand_dims",
    inputs=("data",),
    attrs_type=ExpandDimsAttrs,
    attrs=(
        Attr("axis", kind="int", doc="where the new axes go, in [-ndim-1, ndim]"),
        Attr("num_newaxis", 1, kind="int", doc="how many size-1 axes to insert"),
    ),
    relation=_expand_dims_relation,
    compute=lambda arrays, attrs: np.reshape(
        arrays[0], static_dims(_expanded(np.shape(arrays[0]), attrs.axis, attrs.num_newaxis))
    ),
    pattern=OpPattern.INJECTIVE,
    doc="Size-1 axes inserted at a position.",
    gradient=lambda c, g: [reshape_to(g, c.args[0])],
    lower=_lower_as_reshape,
)


def _squeezed_axes(shape: Sequence[Dim], axis: Sequence[int] | None) -> set[int]:
    if axis is None:  # every dimension known to be 1
        return {i for i, d in enumerate(shape) if d == 1}
    axes = {normalize_axis(a, len(shape)) for a in axis}
    for a in sorted(axes):
        if isinstance(shape[a], int) and shape[a] != 1:
            raise TypeCheckError(
                f"cannot squeeze dimension {a} of shape {shape_str(shape)}: its size is "
                f"{shape[a]}, not 1"
            )
    return axes


class SqueezeAttrs(Attrs):
    __slots__ = ()
    axis: tuple[int, ...] | None


def _squeeze_relation(arg_types: Sequence[Type], attrs: SqueezeAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    drop = _squeezed_axes(data.shape, attrs.axis)
    return TensorType(tuple(d for i, d in enumerate(data.shape) if i not in drop), data.dtype)


squeeze = register(
    "squeeze",
    inputs=("data",),
    attrs_type=SqueezeAttrs,
    attrs=(Attr("axis", None, kind="ints", optional=True, doc="axes to drop; None: all 1s"),),
    relation=_squeeze_relation,
    compute=lambda arrays, attrs: np.squeeze(
        arrays[0], tuple(sorted(_squeezed_axes(np.shape(arrays[0]), attrs.axis)))
    ),
    pattern=OpPattern.INJECTIVE,
    doc="Size-1 dimensions removed.",
    gradient=lambda c, g: [reshape_to(g, c.args[0])],
    lower=_lower_as_reshape,
)


# --- concatenate, stack, split ------------------------------------------------------------


def _tuple_fields(t: Type, what: str) -> list[TensorType] | None:
    """The tensor fields of a tuple argument; None while any is unknown."""
    if isinstance(t, IncompleteType):
        return None
    if not isinstance(t, TupleType):
        raise TypeCheckError(f"{what} must be a tuple of tensors, but has type {t}")
    if not t.fields:
        raise TypeCheckError(f"{what} must hold at least one tensor, but is the empty tuple")
    return tensor_args(t.fields, [f"field {i} of {what}" for i in range(len(t.fields))])


def _same_rank_and_dtype(fields: list[TensorType]) -> str:
    names = [f"field {i}" for i in range(len(fields))]
    for i, f in enumerate(fields[1:], 1):
        if f.ndim != fields[0].ndim:
            raise TypeCheckError(
                f"field 0 has shape {shape_str(fields[0].shape)} but field {i} has shape "
                f"{shape_str(f.shape)}; all must have the same rank"
            )
    return same_dtype(fields, names)


class ConcatenateAttrs(Attrs):
    __slots__ = ()
    axis: int


def _concatenate_relation(arg_types: Sequence[Type], attrs: ConcatenateAttrs) -> Type | None:
    fields = _tuple_fields(arg_types[0], "data")
    if fields is None:
        return None
    dtype = _same_rank_and_dtype(fields)
    ndim = fields[0].ndim
    if ndim == 0:
        raise TypeCheckError("cannot concatenate scalars (tensors of rank 0)")
    axis = normalize_axis(attrs.axis, ndim)
    shape = list(fields[0].shape)
    for i, f in enumerate(fields[1:], 1):
        for d in range(ndim):
            if d != axis:
                check_dims_equal(
                    shape[d],
                    f.shape[d],
                    f"field 0 has shape {shape_str(fields[0].shape)} but field {i} has shape "
                    f"{shape_str(f.shape)}: dimension {d} differs (only axis {axis} may)",
                )
                shape[d] = unify_dim(shape[d], f.shape[d])
    sizes = [f.shape[axis] for f in fields]
    known = [s for s in sizes if isinstance(s, int)]
    shape[axis] = sum(known) if len(known) == len(sizes) else ANY
    return TensorType(tuple(shape), dtype)


def _concatenate_grad(c: Call, g: Expr) -> list[Expr | None]:
    # One slice of the adjoint for each field, along the joined axis.
    fields = _tuple_fields(c.args[0].checked_type, "data")
    assert fields is not None  # a call is type-checked before it is differentiated
    axis = normalize_axis(ConcatenateAttrs.view(c.attrs).axis, len(fields[0].shape))
    slices: list[Expr] = []
    start = 0
    for i, f in enumerate(fields):
        size = f.shape[axis]
        if not isinstance(size, int):
            raise TypeCheckError(
                f"the gradient of concatenate needs the size of field {i} along axis {axis}, "
                f"but it has type {f}"
            )
        slices.append(call("strided_slice", g, begin=[start], end=[start + size], axes=[axis]))
        start += size
    return [Tuple(tuple(slices))]


@oplib.zeros_if_empty
def _concatenate_lower(
    inputs: list[tuple[Tensor, ...]], attrs: ConcatenateAttrs, out_type: Type
) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    # A chain of selects on the joined axis; each field is read at a clamped index, so every
    # arm is a safe access.
    fields = [f for f in inputs[0] if f.shape[attrs.axis % f.ndim] > 0]
    axis = attrs.axis % out.ndim

    def element(*i: LExpr) -> LExpr:
        value: LExpr | None = None
        start = sum(f.shape[axis] for f in fields)
        for f in reversed(fields):
            size = f.shape[axis]
            start -= size
            at = list(i)
            at[axis] = i[axis] - start
            if start > 0:
                at[axis] = Binary("max", at[axis], Const(0))
            if start + size < out.static_shape[axis]:
                at[axis] = Binary("min", at[axis], Const(size - 1))
            here = f(*at)
            value = here if value is None else Select(Binary("lt", i[axis], Const(start + size)),
                                                      here, value)
        assert value is not None
        return value

    if not fields:  # nothing to read: an empty result
        return compute(out.static_shape, out.dtype,
                       lambda *i: oplib.dtype_const(0, out.dtype))
    return compute(out.static_shape, out.dtype, element)


concatenate = register(
    "concatenate",
    inputs=("data",),
    attrs_type=ConcatenateAttrs,
    attrs=(Attr("axis", 0, kind="int", doc="the axis to join along"),),
    relation=_concatenate_relation,
    compute=lambda arrays, attrs: np.concatenate(list(arrays[0]), axis=attrs.axis),
    pattern=OpPattern.INJECTIVE,
    doc="A tuple of tensors joined along an existing axis.",
    gradient=_concatenate_grad,
    lower=_concatenate_lower,
)


class StackAttrs(Attrs):
    __slots__ = ()
    axis: int


def _stack_relation(arg_types: Sequence[Type], attrs: StackAttrs) -> Type | None:
    fields = _tuple_fields(arg_types[0], "data")
    if fields is None:
        return None
    dtype = _same_rank_and_dtype(fields)
    shape = list(fields[0].shape)
    for i, f in enumerate(fields[1:], 1):
        for d in range(len(shape)):
            check_dims_equal(
                shape[d],
                f.shape[d],
                f"field 0 has shape {shape_str(fields[0].shape)} but field {i} has shape "
                f"{shape_str(f.shape)}; stack needs equal shapes",
            )
            shape[d] = unify_dim(shape[d], f.shape[d])
    axis = normalize_axis(attrs.axis, len(shape) + 1)
    shape.insert(axis, len(fields))
    return TensorType(tuple(shape), dtype)


def _stack_grad(c: Call, g: Expr) -> list[Expr | None]:
    n = gh.tuple_size(c.args[0])
    axis = normalize_axis(StackAttrs.view(c.attrs).axis, gh.tensor_type(c).ndim)
    parts = call("split", g, indices_or_sections=n, axis=axis)
    return [Tuple(tuple(call("squeeze", TupleGetItem(parts, i), axis=[axis]) for i in range(n)))]


def _stack_lower(inputs: list[tuple[Tensor, ...]], attrs: StackAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    fields = list(inputs[0])
    axis = attrs.axis % out.ndim

    def element(*i: LExpr) -> LExpr:
        rest = i[:axis] + i[axis + 1:]
        value = fields[-1](*rest)
        for k in reversed(range(len(fields) - 1)):
            value = Select(Binary("eq", i[axis], Const(k)), fields[k](*rest), value)
        return value

    return compute(out.static_shape, out.dtype, element)


stack = register(
    "stack",
    inputs=("data",),
    attrs_type=StackAttrs,
    attrs=(Attr("axis", 0, kind="int", doc="the position of the new axis in the result"),),
    relation=_stack_relation,
    compute=lambda arrays, attrs: np.stack(list(arrays[0]), axis=attrs.axis),
    pattern=OpPattern.INJECTIVE,
    doc="A tuple of equal-shaped tensors joined along a new axis.",
    gradient=_stack_grad,
    lower=_stack_lower,
)


def _split_sizes(dim: Dim, sections: int | Sequence[int], axis: int) -> list[Dim]:
    if isinstance(sections, int):
        if sections <= 0:
            raise TypeCheckError(f"split needs a positive number of sections, got {sections}")
        if not isinstance(dim, int):
            return [ANY] * sections
        if dim % sections:
            raise TypeCheckError(
                f"cannot split dimension {axis} of size {dim} into {sections} equal sections"
            )
        return [dim // sections] * sections
    bounds = [0, *sections]
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise TypeCheckError(
            f"split indices {list(sections)} must be positive and strictly increasing"
        )
    if isinstance(dim, int) and bounds[-1] >= dim:
        raise TypeCheckError(
            f"split index {bounds[-1]} must be less than the size {dim} of dimension {axis}"
        )
    last: Dim = dim - bounds[-1] if isinstance(dim, int) else ANY
    return [b - a for a, b in itertools.pairwise(bounds)] + [last]


class SplitAttrs(Attrs):
    __slots__ = ()
    indices_or_sections: int | tuple[int, ...]
    axis: int


def _split_relation(arg_types: Sequence[Type], attrs: SplitAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    axis = normalize_axis(attrs.axis, data.ndim)
    sizes = _split_sizes(data.shape[axis], attrs.indices_or_sections, axis)
    return TupleType(
        tuple(
            TensorType((*data.shape[:axis], s, *data.shape[axis + 1 :]), data.dtype) for s in sizes
        )
    )


def _split_grad(c: Call, g: Expr) -> list[Expr | None]:
    parts = gh.fields(g, gh.tuple_size(c))
    return [call("concatenate", Tuple(tuple(parts)), axis=SplitAttrs.view(c.attrs).axis)]


def _split_lower(inputs: list[Tensor], attrs: SplitAttrs, out: Type) -> tuple[Tensor, ...]:
    (x,) = inputs
    assert isinstance(out, TupleType)  # split's relation makes a tuple of tensors
    axis = attrs.axis % x.ndim
    parts = []
    start = 0
    for field_type in out.fields:
        field = oplib.out_tensor_type(field_type)

        def element(*i: LExpr, start: int = start) -> LExpr:
            return x(*i[:axis], i[axis] + start, *i[axis + 1:])

        parts.append(compute(field.static_shape, field.dtype, element))
        start += field.static_shape[axis]
    return tuple(parts)


split = register(
    "split",
    inputs=("data",),
    attrs_type=SplitAttrs,
    attrs=(
        Attr(
            "indices_or_sections",
            kind="int_or_ints",
            doc="a number of equal sections, or the indices to split before",
        ),
        Attr("axis", 0, kind="int", doc="the axis to split"),
    ),
    relation=_split_relation,
    compute=lambda arrays, attrs: tuple(
        np.split(arrays[0], attrs.indices_or_sections, axis=attrs.axis)
    ),
    pattern=OpPattern.INJECTIVE,
    doc="A tensor cut along an axis into a tuple of tensors.",
    gradient=_split_grad,
    lower=_split_lower,
)


# --- take, strided_slice ------------------------------------------------------------------

TAKE_MODES = ("clip", "wrap", "fast")


class TakeAttrs(Attrs):
    __slots__ = ()
    batch_dims: int
    axis: int | None
    mode: str


def _take_relation(arg_types: Sequence[Type], attrs: TakeAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "indices"))
    if args is None:
        return None
    data, indices = args
    require_dtype(indices, "indices", "int")
    if attrs.mode not in TAKE_MODES:
        raise TypeCheckError(
            f"take mode must be one of {', '.join(TAKE_MODES)}, got {attrs.mode!r}"
        )
    if attrs.axis is None:  # take from the flattened data
        return TensorType(indices.shape, data.dtype)
    axis = normalize_axis(attrs.axis, data.ndim)
    batch = attrs.batch_dims + indices.ndim if attrs.batch_dims < 0 else attrs.batch_dims
    if not 0 <= batch <= min(axis, indices.ndim):
        raise TypeCheckError(
            f"batch_dims {attrs.batch_dims} must lie in [0, {min(axis, indices.ndim)}] for axis "
            f"{axis} and indices of rank {indices.ndim}"
        )
    for d in range(batch):
        check_dims_equal(
            data.shape[d],
            indices.shape[d],
            f"batch dimension {d} differs: data has shape {shape_str(data.shape)}, indices "
            f"have shape {shape_str(indices.shape)}",
        )
    shape = (*data.shape[:axis], *indices.shape[batch:], *data.shape[axis + 1 :])
    return TensorType(shape, data.dtype)


def _take_index(
    shape: tuple[int, ...], idx: np.ndarray, attrs: TakeAttrs
) -> tuple[tuple[int, ...], tuple[slice | np.ndarray, ...]]:
    """The shape take reads from (flattened when axis is None) and its numpy index."""
    axis, batch = attrs.axis, attrs.batch_dims
    if axis is None:
        shape, axis, batch = (int(np.prod(shape, dtype=np.int64)),), 0, 0
    axis = axis + len(shape) if axis < 0 else axis
    batch = batch + idx.ndim if batch < 0 else batch
    n = shape[axis]
    if n == 0 and idx.size:
        raise EvalError(f"take from axis {axis} of size 0")
    if attrs.mode == "clip":
        idx = np.clip(idx, 0, n - 1)
    elif attrs.mode == "wrap":
        idx = np.mod(idx, n)
    elif idx.size and (idx.min() < 0 or idx.max() >= n):
        raise EvalError(f"take with mode fast: an index is outside [0, {n}) on axis {axis}")
    if batch == 0:
        return shape, (*(slice(None),) * axis, idx)
    # Index the leading axis+1 dimensions with arrays broadcasting to (batch, between, idx).
    grid_ndim = axis + idx.ndim - batch
    index: list[slice | np.ndarray] = []
    for d in range(axis):
        grid = [1] * grid_ndim
        grid[d] = shape[d]
        index.append(np.arange(shape[d]).reshape(grid))
    index.append(idx.reshape(idx.shape[:batch] + (1,) * (axis - batch) + idx.shape[batch:]))
    return shape, tuple(index)


def _take(arrays: list[np.ndarray], attrs: TakeAttrs) -> np.ndarray:
    x, idx = np.asarray(arrays[0]), np.asarray(arrays[1]).astype(np.int64)
    shape, index = _take_index(x.shape, idx, attrs)
    return x.reshape(shape)[index]


def _take_grad_rule(c: Call, g: Expr) -> list[Expr | None]:
    data, indices = c.args
    return [call("take_grad", g, data, indices, **dict(c.attrs)), None]


def _take_geometry(
    data_shape: tuple[int, ...], indices_ndim: int, attrs: TakeAttrs
) -> tuple[tuple[int, ...], int, int]:
    """The shape take reads from (flattened when axis is None), its axis and batch_dims."""
    axis, batch = attrs.axis, attrs.batch_dims
    if axis is None:
        return (math.prod(data_shape),), 0, 0
    axis = axis + len(data_shape) if axis < 0 else axis
    batch = batch + indices_ndim if batch < 0 else batch
    return data_shape, axis, batch


def _take_source(x: Tensor, shape: tuple[int, ...]) -> Callable[..., LExpr]:
    """Read ``x`` as the shape take indexes (its own, or flattened)."""
    if shape == x.shape:
        return x
    return lambda *i: x(*oplib.reshape_indices(x.shape, shape, i))


def _take_position(o: Indices, idx: Tensor, axis: int, batch: int) -> LExpr:
    """The raw index (int64) that picks output element ``o``."""
    return oplib.convert(idx(*o[:batch], *o[axis:axis + idx.ndim - batch]), INDEX)


def _take_fix(k: LExpr, n: int, mode: str) -> LExpr:
    """An index brought into [0, n) as the mode says (fast: checked separately, clamped to
    keep the access provably in bounds)."""
    return k % n if mode == "wrap" else oplib.clamp(k, 0, n - 1)


def _in_range(k: LExpr, n: int) -> LExpr:
    return Binary("and", Binary("ge", k, Const(0)), Binary("lt", k, Const(n)))


def _take_lower(inputs: list[Tensor], attrs: TakeAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    x, idx = inputs
    shape, axis, batch = _take_geometry(x.shape, idx.ndim, attrs)
    n = shape[axis]
    if n == 0 and math.prod(idx.shape) > 0:
        return oplib.fail(out.static_shape, out.dtype, f"take from axis {axis} of size 0")
    if 0 in out.static_shape:
        return compute(out.static_shape, out.dtype,
                       lambda *i: oplib.dtype_const(0, out.dtype))
    src = _take_source(x, shape)
    after = axis + idx.ndim - batch

    def read(o: Indices, k: LExpr) -> LExpr:
        return src(*o[:axis], k, *o[after:])

    if attrs.mode != "fast":
        return compute(out.static_shape, out.dtype,
                       lambda *o: read(o, _take_fix(_take_position(o, idx, axis, batch), n,
                                                    attrs.mode)))

    def element(o: Indices, write: WriteFn) -> Stmt:
        k = LVar("k")
        message = f"take with mode fast: an index is outside [0, {n}) on axis {axis}"
        return LetStmt(k, _take_position(o, idx, axis, batch),
                       Seq((Check(_in_range(k, n), message),
                            write(o, read(o, oplib.clamp(k, 0, n - 1))))))

    return oplib.elementwise_extern(out.static_shape, out.dtype, element)


def _take_grad_lower(inputs: list[Tensor], attrs: TakeAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    # A scatter: out_grad added, in row-major order as numpy's add.at, into a zeroed local
    # buffer shaped as take reads the data; then written out.
    g, x, idx = inputs
    shape, axis, batch = _take_geometry(x.shape, idx.ndim, attrs)
    n = shape[axis]
    if n == 0 and math.prod(idx.shape) > 0:
        return oplib.fail(out.static_shape, out.dtype, f"take from axis {axis} of size 0")
    after = axis + idx.ndim - batch
    zero = oplib.dtype_const(0, g.dtype)

    def emit(write: WriteFn) -> Stmt:
        acc = Buffer("acc", shape, g.dtype, "local")

        def scatter(o: Indices) -> Stmt:
            k = LVar("k")
            at = (*o[:axis], _take_fix(k, n, attrs.mode), *o[after:])
            add: Stmt = Store(acc, at, Binary("add", Load(acc, at), g(*o)))
            if attrs.mode == "fast":
                message = f"take with mode fast: an index is outside [0, {n}) on axis {axis}"
                add = Seq((Check(_in_range(k, n), message), add))
            return LetStmt(k, _take_position(o, idx, axis, batch), add)

        def result(p: Indices) -> Stmt:
            flat = oplib.reshape_indices(shape, x.shape, p)
            return write(p, Load(acc, flat))

        stmts = [loop_nest(shape, lambda i: Store(acc, i, zero))]
        if n > 0:
            stmts.append(loop_nest(g.shape, scatter, NestSchedule(None, None)))
        stmts.append(loop_nest(x.shape, result))
        return Allocate(acc, Seq(tuple(stmts)))

    return extern(out.static_shape, out.dtype, emit)


take = register(
    "take",
    inputs=("data", "indices"),
    attrs_type=TakeAttrs,
    attrs=(
        Attr("batch_dims", 0, kind="int", doc="leading dimensions shared by data and indices"),
        Attr("axis", None, kind="int", optional=True, doc="the axis to index; None flattens"),
        Attr("mode", "clip", kind="str", doc="out-of-range indices: clip, wrap or fast"),
    ),
    relation=_take_relation,
    compute=_take,
    pattern=OpPattern.INJECTIVE,
    doc="Elements of data picked by integer indices along an axis.",
    gradient=_take_grad_rule,
    lower=_take_lower,
)

def _take_grad_relation(arg_types: Sequence[Type], attrs: TakeAttrs) -> Type | None:
    args = tensor_args(arg_types, ("out_grad", "data", "indices"))
    if args is None:
        return None
    out_grad, data, indices = args
    taken = _take_relation([data, indices], attrs)
    assert isinstance(taken, TensorType)
    _same_shape(out_grad, taken, "out_grad", "the result of take")
    require_dtype(out_grad, "out_grad", "float")
    return TensorType(data.shape, out_grad.dtype)


def _take_grad(arrays: list[np.ndarray], attrs: TakeAttrs) -> np.ndarray:
    g, x, idx = np.asarray(arrays[0]), np.asarray(arrays[1]), np.asarray(arrays[2])
    shape, index = _take_index(x.shape, idx.astype(np.int64), attrs)
    out = np.zeros(shape, g.dtype)
    # Indices may repeat: their adjoints add up. (numpy's stub for ufunc.at leaves out the
    # slices in the index, which it accepts.)
    np.add.at(out, index, g)  # type: ignore[arg-type]
    return out.reshape(x.shape)


take_grad = register(
    "take_grad",
    inputs=("out_grad", "data", "indices"),
    attrs_type=TakeAttrs,
    attrs=(
        Attr("batch_dims", 0, kind="int", doc="as in take"),
        Attr("axis", None, kind="int", optional=True, doc="as in take"),
        Attr("mode", "clip", kind="str", doc="as in take"),
    ),
    relation=_take_grad_relation,
    compute=_take_grad,
    pattern=OpPattern.OPAQUE,
    doc="The adjoint of take: out_grad added into zeros shaped like data at the taken places.",
    gradient=lambda c, g: [call("take", g, c.args[2], **dict(c.attrs)), None, None],
    lower=_take_grad_lower,
)


def _same_shape(a: TensorType, b: TensorType, a_name: str, b_name: str) -> None:
    if a.ndim != b.ndim:
        raise TypeCheckError(
            f"{a_name} has shape {shape_str(a.shape)} but {b_name} has shape {shape_str(b.shape)}"
        )
    for x, y in zip(a.shape, b.shape, strict=True):
        check_dims_equal(
            x,
            y,
            f"{a_name} has shape {shape_str(a.shape)} but {b_name} has shape {shape_str(b.shape)}",
        )


# An end at or beyond this means "to the end of the dimension" whatever its size.
_BIG = 2**31 - 1


class StridedSliceAttrs(Attrs):
    __slots__ = ()
    begin: tuple[int, ...]
    end: tuple[int, ...]
    strides: tuple[int, ...] | None
    slice_mode: str
    axes: tuple[int, ...] | None


def _slice_plan(attrs: StridedSliceAttrs, ndim: int) -> list[tuple[int, int, int, int]]:
    """(axis, begin, end, stride) for each sliced axis, end in Relay's "end" form."""
    begin, end = list(attrs.begin), list(attrs.end)
    strides = list(attrs.strides or ())
    axes = list(attrs.axes) if attrs.axes is not None else list(range(len(begin)))
    if attrs.slice_mode not in ("end", "size"):
        raise TypeCheckError(f"slice_mode must be 'end' or 'size', got {attrs.slice_mode!r}")
    if len(begin) != len(axes) or len(end) != len(axes) or len(strides) > len(axes):
        raise TypeCheckError(
            f"strided_slice: begin {begin}, end {end} and strides {strides} must give one "
            f"value per sliced axis ({len(axes)})"
        )
    if len(axes) > ndim:
        raise TypeCheckError(f"strided_slice of {len(axes)} axes on a tensor of rank {ndim}")
    strides += [1] * (len(axes) - len(strides))
    plan = []
    for a, b, e, s in zip(axes, begin, end, strides, strict=True):
        axis = normalize_axis(a, ndim)
        if attrs.slice_mode == "size":
            s = 1
            if e < 0:  # a size of -1: everything from begin on
                e = _BIG
            elif b < 0 and b + e >= 0:  # a negative begin whose window reaches the end
                e = _BIG
            else:
                e = b + e
        if s == 0:
            raise TypeCheckError(f"strided_slice stride for axis {axis} must not be 0")
        plan.append((axis, b, e, s))
    return plan


def _sliced_dim(dim: Dim, b: int, e: int, s: int) -> Dim:
    if isinstance(dim, int):
        return len(range(*slice(b, e, s).indices(dim)))
    if s == 1 and b == 0 and e >= _BIG:
        return dim  # the whole dimension, whatever its size
    return ANY


def _strided_slice_relation(arg_types: Sequence[Type], attrs: StridedSliceAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    shape = list(data.shape)
    for axis, b, e, s in _slice_plan(attrs, data.ndim):
        shape[axis] = _sliced_dim(data.shape[axis], b, e, s)
    return TensorType(tuple(shape), data.dtype)


def _slice_index(attrs: StridedSliceAttrs, ndim: int) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    for axis, b, e, s in _slice_plan(attrs, ndim):
        index[axis] = slice(b, e, s)
    return tuple(index)


def _strided_slice(arrays: list[np.ndarray], attrs: StridedSliceAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    return x[_slice_index(attrs, x.ndim)]


def _strided_slice_grad_rule(c: Call, g: Expr) -> list[Expr | None]:
    return [call("strided_slice_grad", g, c.args[0], **dict(c.attrs))]


def _slice_ranges(
    attrs: StridedSliceAttrs, shape: tuple[int, ...]
) -> dict[int, tuple[int, int, int]]:
    """(start, step, length) of each sliced axis, as Python's slicing resolves them."""
    out = {}
    for axis, b, e, s in _slice_plan(attrs, len(shape)):
        start, stop, step = slice(b, e, s).indices(shape[axis])
        out[axis] = (start, step, len(range(start, stop, step)))
    return out


@oplib.zeros_if_empty
def _strided_slice_lower(inputs: list[Tensor], attrs: StridedSliceAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    ranges = _slice_ranges(attrs, x.shape)

    def element(*i: LExpr) -> LExpr:
        idx = list(i)
        for axis, (start, step, _) in ranges.items():
            idx[axis] = i[axis] * step + start
        return x(*idx)

    return compute(out.static_shape, out.dtype, element)


@oplib.zeros_if_empty
def _strided_slice_grad_lower(inputs: list[Tensor], attrs: StridedSliceAttrs, out: Type) -> Tensor:
    # Each element of the result is out_grad's element that the slice took from there, or 0.
    g, x = inputs
    ranges = _slice_ranges(attrs, x.shape)
    zero = oplib.dtype_const(0, g.dtype)
    if any(n == 0 for _, _, n in ranges.values()):
        return compute(x.shape, g.dtype, lambda *i: zero)

    def element(*p: LExpr) -> LExpr:
        # Along a sliced axis, element p came from slice position q = (p - start) / step when
        # that is a whole number in [0, n).
        idx: list[LExpr] = list(p)
        spans: list[tuple[int, int] | None] = [None] * len(p)
        exact = []
        for axis, (start, step, _) in ranges.items():
            s, last = abs(step), x.shape[axis] - 1
            if step > 0:
                d, lo, hi = p[axis] - start, -start, last - start
            else:
                d, lo, hi = Const(start) - p[axis], start - last, start
            idx[axis], spans[axis] = d // s, (lo // s, hi // s)
            if s != 1:
                exact.append(Binary("eq", d % s, Const(0)))
        return oplib.guarded_read(g, idx, spans, zero, exact)

    return compute(x.shape, g.dtype, element)


strided_slice = register(
    "strided_slice",
    inputs=("data",),
    attrs_type=StridedSliceAttrs,
    attrs=(
        Attr("begin", kind="ints", doc="first index of each sliced axis"),
        Attr("end", kind="ints", doc="end (exclusive) of each sliced axis, or its size"),
        Attr("strides", None, kind="ints", optional=True, doc="step of each axis (default 1)"),
        Attr("slice_mode", "end", kind="str", doc="'end': end is an index; 'size': a length"),
        Attr("axes", None, kind="ints", optional=True, doc="the axes sliced (default 0, 1, ..)"),
    ),
    relation=_strided_slice_relation,
    compute=_strided_slice,
    pattern=OpPattern.INJECTIVE,
    doc="A strided window of a tensor, with Python slicing rules per axis.",
    gradient=_strided_slice_grad_rule,
    lower=_strided_slice_lower,
)



def _strided_slice_grad_relation(
    arg_types: Sequence[Type], attrs: StridedSliceAttrs
) -> Type | None:
    args = tensor_args(arg_types, ("out_grad", "data"))
    if args is None:
        return None
    out_grad, data = args
    sliced = _strided_slice_relation([data], attrs)
    assert isinstance(sliced, TensorType)
    _same_shape(out_grad, sliced, "out_grad", "the slice of data")
    require_dtype(out_grad, "out_grad", "float")
    return TensorType(data.shape, out_grad.dtype)


def _strided_slice_grad(arrays: list[np.ndarray], attrs: StridedSliceAttrs) -> np.ndarray:
    g, x = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = np.zeros(x.shape, g.dtype)
    out[_slice_index(attrs, x.ndim)] = g  # a slice never reads an element twice
    return out


strided_slice_grad = register(
    "strided_slice_grad",
    inputs=("out_grad", "data"),
    attrs_type=StridedSliceAttrs,
    attrs=strided_slice.attrs,
    relation=_strided_slice_grad_relation,
    compute=_strided_slice_grad,
    pattern=OpPattern.INJECTIVE,
    doc="The adjoint of strided_slice: out_grad placed in zeros shaped like data.",
    gradient=lambda c, g: [call("strided_slice", g, **dict(c.attrs)), None],
    lower=_strided_slice_grad_lower,
)

# --- broadcast_to, tile -------------------------------------------------------------------


class BroadcastToAttrs(Attrs):
    __slots__ = ()
    shape: tuple[int, ...]


def _broadcast_to_relation(arg_types: Sequence[Type], attrs: BroadcastToAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    target = tuple(attrs.shape)
    offset = len(target) - data.ndim
    if offset < 0:
        raise TypeCheckError(
            f"cannot broadcast shape {shape_str(data.shape)} to the shorter {shape_str(target)}"
        )
    for i, d in enumerate(data.shape):
        if isinstance(d, int) and d != 1 and d != target[offset + i]:
            raise TypeCheckError(
                f"cannot broadcast shape {shape_str(data.shape)} to {shape_str(target)}: "
                f"dimension {i} is {d}, which is neither 1 nor {target[offset + i]}"
            )
    return TensorType(target, data.dtype)


def _broadcast_lower(inputs: list[Tensor], attrs: BroadcastToAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    x = inputs[0]
    shape = tuple(out.static_shape)
    return compute(shape, x.dtype, lambda *i: x(*broadcast_indices(x.shape, shape, i)))


broadcast_to = register(
    "broadcast_to",
    inputs=("data",),
    attrs_type=BroadcastToAttrs,
    attrs=(Attr("shape", kind="ints", doc="the target shape"),),
    relation=_broadcast_to_relation,
    compute=lambda arrays, attrs: np.array(np.broadcast_to(arrays[0], attrs.shape)),
    pattern=OpPattern.BROADCAST,
    doc="A tensor repeated along size-1 and new leading axes to a given shape.",
    gradient=lambda c, g: [call("collapse_sum_like", g, c.args[0])],
    lower=_broadcast_lower,
)


class TileAttrs(Attrs):
    __slots__ = ()
    reps: tuple[int, ...]


def _tile_relation(arg_types: Sequence[Type], attrs: TileAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    reps = tuple(attrs.reps)
    if any(r < 0 for r in reps):
        raise TypeCheckError(f"tile reps {list(reps)} must not be negative")
    ndim = max(data.ndim, len(reps))
    shape = (1,) * (ndim - data.ndim) + tuple(data.shape)
    reps = (1,) * (ndim - len(reps)) + reps
    out: list[Dim] = []
    for d, r in zip(shape, reps, strict=True):
        out.append(d * r if isinstance(d, int) else (d if r == 1 else ANY))
    return TensorType(tuple(out), data.dtype)


def _tile_grad(c: Call, g: Expr) -> list[Expr | None]:
    # Split each axis of the adjoint into (repetition, original size) and sum the repetitions.
    x = c.args[0]
    shape = gh.static_shape(x, "tile")
    reps = tuple(TileAttrs.view(c.attrs).reps)
    ndim = max(len(shape), len(reps))
    padded = (1,) * (ndim - len(shape)) + shape
    reps = (1,) * (ndim - len(reps)) + reps
    split_shape = [n for r, d in zip(reps, padded, strict=True) for n in (r, d)]
    parts = call("reshape", g, newshape=split_shape)
    summed = call("sum", parts, axis=list(range(0, 2 * ndim, 2)))
    return [call("reshape", summed, newshape=list(shape))]


@oplib.zeros_if_empty
def _tile_lower(inputs: list[Tensor], attrs: TileAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    (x,) = inputs
    offset = out.ndim - x.ndim

    def element(*i: LExpr) -> LExpr:
        # size 0 never happens in a loop that runs: the result is empty then
        return x(*(i[offset + k] % d if d > 0 else Const(0) for k, d in enumerate(x.shape)))

    return compute(out.static_shape, out.dtype, element)


tile = register(
    "tile",
    inputs=("data",),
    attrs_type=TileAttrs,
    attrs=(Attr("reps", kind="ints", doc="repetitions along each (right-aligned) axis"),),
    relation=_tile_relation,
    compute=lambda arrays, attrs: np.tile(arrays[0], attrs.reps),
    pattern=OpPattern.INJECTIVE,
    doc="A tensor repeated whole along each axis.",
    gradient=_tile_grad,
    lower=_tile_lower,
)



# --- the *_like operators: a shape taken from another tensor (Relay's, for gradients) -----


def _check_broadcasts(small: TensorType, big: TensorType, small_name: str, big_name: str) -> None:
    """``small`` must broadcast to exactly the shape of ``big``."""
    if small.ndim > big.ndim:
        raise TypeCheckError(
            f"{small_name} of shape {shape_str(small.shape)} has more dimensions than "
            f"{big_name} of shape {shape_str(big.shape)}"
        )
    merged = broadcast_shape(small.shape, big.shape, (small_name, big_name))
    for i, (m, b) in enumerate(zip(merged, big.shape, strict=True)):
        if isinstance(m, int) and isinstance(b, int) and m != b:
            raise TypeCheckError(
                f"{small_name} of shape {shape_str(small.shape)} does not broadcast to "
                f"{big_name} of shape {shape_str(big.shape)} (dimension {i})"
            )


def _collapse_sum_like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "collapse_type"))
    if args is None:
        return None
    data, like = args
    _check_broadcasts(like, data, "collapse_type", "data")
    return TensorType(like.shape, data.dtype)


def _collapse_sum(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, shape = np.asarray(arrays[0]), np.shape(arrays[1])
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1
    )
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype).reshape(shape)


def _collapse_sum_lower(inputs: list[Tensor], attrs: Attrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    x, like = inputs
    lead = x.ndim - like.ndim
    axes = list(range(lead)) + [lead + k for k, d in enumerate(like.shape)
                                if d == 1 and x.shape[lead + k] != 1]

    def body(o: Indices, r: Indices) -> LExpr:
        idx: list[LExpr] = [Const(0)] * x.ndim
        for k in range(like.ndim):
            idx[lead + k] = o[k] if x.shape[lead + k] == like.shape[k] else Const(0)
        for a, v in zip(axes, r):
            idx[a] = v
        return x(*idx)

    return reduce(out.static_shape, out.dtype, [x.shape[a] for a in axes], "add",
                  body, oplib.dtype_const(0, x.dtype))


collapse_sum_like = register(
    "collapse_sum_like",
    inputs=("data", "collapse_type"),
    relation=_collapse_sum_like_relation,
    compute=_collapse_sum,
    pattern=OpPattern.COMM_REDUCE,
    doc="data summed over the axes along which collapse_type broadcasts to it.",
    gradient=lambda c, g: [call("broadcast_to_like", g, c.args[0]), None],
    lower=_collapse_sum_lower,
)


def _broadcast_to_like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "broadcast_type"))
    if args is None:
        return None
    data, like = args
    _check_broadcasts(data, like, "data", "broadcast_type")
    return TensorType(like.shape, data.dtype)


broadcast_to_like = register(
    "broadcast_to_like",
    inputs=("data", "broadcast_type"),
    relation=_broadcast_to_like_relation,
    compute=lambda arrays, attrs: np.array(np.broadcast_to(arrays[0], np.shape(arrays[1]))),
    pattern=OpPattern.BROADCAST,
    doc="data broadcast to the shape of broadcast_type.",
    gradient=lambda c, g: [call("collapse_sum_like", g, c.args[0]), None],
    lower=_broadcast_lower,
)


def _reshape_like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "shape_like"))
    if args is None:
        return None
    data, like = args
    if (data.is_static and like.is_static
            and math.prod(data.static_shape) != math.prod(like.static_shape)):
        raise TypeCheckError(
            f"cannot reshape data of shape {shape_str(data.shape)} to the shape "
            f"{shape_str(like.shape)} of shape_like: the numbers of elements differ"
        )
    return TensorType(like.shape, data.dtype)


reshape_like = register(
    "reshape_like",
    inputs=("data", "shape_like"),
    relation=_reshape_like_relation,
    compute=lambda arrays, attrs: np.reshape(arrays[0], np.shape(arrays[1])),
    pattern=OpPattern.INJECTIVE,
    doc="data with the shape of shape_like (the same number of elements).",
    gradient=lambda c, g: [reshape_to(g, c.args[0]), None],
    lower=_lower_as_reshape,
)


# fmt: off
__all__ = [
    "broadcast_to", "broadcast_to_like", "collapse_sum_like", "concatenate", "expand_dims",
    "reshape", "reshape_like", "split", "squeeze", "stack", "strided_slice",
    "strided_slice_grad", "take", "take_grad", "tile", "transpose",
]
# fmt: on
