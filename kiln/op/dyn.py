"""Operators whose result's shape is data: ``shape_of`` and Relay's ``dyn.*`` family.

``dyn.reshape(%x, %newshape)`` takes its shape as a tensor computed by the program — from
``shape_of`` of another tensor, sliced, gathered, concatenated and multiplied like any int64
tensor — so a model exported with a dynamic batch or sequence axis keeps its shape arithmetic
as IR instead of constants frozen at import time. The relation knows the result's rank (the
length of the shape tensor, which is static) but not its dimensions (``?``), unless the shape
is a constant, when it is exact.

Such an operator *runs on the host* (``host=True``): fusion leaves it alone, the SSA program
holds it as a ``host`` instruction, and the VM runs its numpy compute on the actual arrays —
a shape tensor is a few integers, and a reshape or broadcast is a view or one copy — checking
every size against ``KILN_MAX_ALLOC_BYTES`` before anything is allocated. The kernels after
it have symbolic shapes and are compiled for the shapes they meet (`kernel_dyn`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import ANY, TensorType, Type
from kiln.op.common import require_dtype, tensor_arg
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpDef, OpPattern, register
from kiln.op.shape import (
    StridedSliceAttrs,
    _strided_slice,
    _strided_slice_relation,
    infer_reshape,
)

# The dyn.* builders are this module's reshape, broadcast_to, full, zeros, ones and
# strided_slice (kiln.op.dyn.reshape(x, shape)); shape_of and argwhere are also kiln.op's.
__all__ = ["argwhere", "shape_of"]


def shape_values(value: np.ndarray, what: str) -> tuple[int, ...]:
    """The integers of a 1-D shape tensor, each a valid dimension (≥ -1 allowed by the caller's
    own rules is not checked here); a `kiln.Error` naming ``what`` otherwise."""
    a = np.asarray(value)
    if a.ndim != 1 or not dtype_of(str(a.dtype)).is_integer:
        raise Error(f"{what} must be a 1-D integer tensor, got {a.dtype}{list(a.shape)}")
    return tuple(int(v) for v in a)


def checked_shape(op: str, shape: Sequence[int], dtype: str) -> tuple[int, ...]:
    """``shape`` when a tensor of it may be allocated: no negative dimension, no more bytes
    than `kiln.ssa.memory.alloc_limit` allows."""
    from kiln.ssa.memory import check_alloc

    check_alloc(op, "the result", shape, dtype)
    return tuple(shape)


def _shape_arg(t: Type, what: str) -> TensorType | None:
    s = tensor_arg(t, what)
    if s is None:
        return None
    require_dtype(s, what, "int")
    if s.ndim != 1 or not isinstance(s.shape[0], int):
        raise TypeCheckError(f"{what} must be a 1-D integer tensor of static length, not {s}")
    return s


def _known(values: Sequence[np.ndarray | None] | None, i: int) -> tuple[int, ...] | None:
    """The value of argument ``i`` when it is a constant."""
    if values is None or values[i] is None:
        return None
    return shape_values(np.asarray(values[i]), "the shape")


# --- shape_of ------------------------------------------------------------------------------


class ShapeOfAttrs(Attrs):
    __slots__ = ()
    dtype: str


def _shape_of_relation(arg_types: Sequence[Type], attrs: ShapeOfAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    if not dtype_of(attrs.dtype).is_integer:
        raise TypeCheckError(f"shape_of's dtype must be an integer type, not {attrs.dtype}")
    return TensorType((data.ndim,), attrs.dtype)


shape_of = register(
    "shape_of",
    inputs=("data",),
    attrs_type=ShapeOfAttrs,
    attrs=(Attr("dtype", "int32", kind="dtype", doc="the dtype of the result"),),
    relation=_shape_of_relation,
    compute=lambda arrays, attrs: np.array(np.shape(arrays[0]), attrs.dtype),
    pattern=OpPattern.OPAQUE,
    doc="The shape of a tensor, as a 1-D tensor (one element per dimension).",
    differentiable=False,
    host=True,
)


# --- dyn.reshape ---------------------------------------------------------------------------


class DynReshapeAttrs(Attrs):
    __slots__ = ()
    allowzero: int


def _dyn_reshape_relation(arg_types: Sequence[Type], attrs: DynReshapeAttrs,
                          values: Sequence[np.ndarray | None]) -> Type | None:
    data, shape = tensor_arg(arg_types[0], "data"), _shape_arg(arg_types[1], "newshape")
    if data is None or shape is None:
        return None
    known = _known(values, 1)
    if known is not None:
        return TensorType(tuple(infer_reshape(data.shape, known, attrs.allowzero)), data.dtype)
    return TensorType((ANY,) * shape.static_shape[0], data.dtype)


def _dyn_reshape(arrays: list[np.ndarray], attrs: DynReshapeAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    codes = shape_values(arrays[1], "dyn.reshape's newshape")
    try:
        dims = infer_reshape(x.shape, codes, attrs.allowzero)
    except TypeCheckError as e:
        raise Error(f"dyn.reshape of {x.dtype}{list(x.shape)}: {e.message}") from None
    shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]  # x's shape is static
    if int(np.prod(shape, dtype=object)) != x.size:
        raise Error(f"dyn.reshape: cannot reshape {x.dtype}{list(x.shape)} ({x.size} "
                    f"elements) to {list(shape)}")
    return x.reshape(shape)


def _dyn_reshape_grad(c: Call, g: Expr) -> list[Expr | None]:
    return [reshape(g, shape_of(c.args[0], dtype="int64")), None]


reshape = register(
    "dyn.reshape",
    inputs=("data", "newshape"),
    attrs_type=DynReshapeAttrs,
    attrs=(Attr("allowzero", 0, kind="int", doc="1: a 0 in newshape is a size, not a copy"),),
    relation=_dyn_reshape_relation,
    compute=_dyn_reshape,
    pattern=OpPattern.OPAQUE,
    doc="reshape with the new shape (0 copies, -1 infers, -2..-4 as in Relay) as a tensor.",
    needs_values=True,
    gradient=_dyn_reshape_grad,
    host=True,
)


# --- dyn.broadcast_to, dyn.full, dyn.zeros, dyn.ones ----------------------------------------


def _shaped_relation(dtype_of_result: str, shape_t: Type,
                     values: Sequence[np.ndarray | None] | None, index: int) -> Type | None:
    shape = _shape_arg(shape_t, "shape")
    if shape is None:
        return None
    known = _known(values, index)
    if known is not None:
        if any(d < 0 for d in known):
            raise TypeCheckError(f"shape {list(known)} has a negative dimension")
        return TensorType(known, dtype_of_result)
    return TensorType((ANY,) * shape.static_shape[0], dtype_of_result)


def _broadcast_relation(arg_types: Sequence[Type], attrs: Attrs,
                        values: Sequence[np.ndarray | None]) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    return _shaped_relation(data.dtype, arg_types[1], values, 1)


def _broadcast(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    shape = checked_shape("dyn.broadcast_to", shape_values(arrays[1], "dyn.broadcast_to's shape"),
                          str(x.dtype))
    if x.shape == shape:
        return x  # nothing to broadcast: no copy
    try:
        return np.broadcast_to(x, shape).copy()
    except ValueError:
        raise Error(f"dyn.broadcast_to: {x.dtype}{list(x.shape)} does not broadcast to "
                    f"{list(shape)}") from None


broadcast_to = register(
    "dyn.broadcast_to",
    inputs=("data", "shape"),
    relation=_broadcast_relation,
    compute=_broadcast,
    pattern=OpPattern.OPAQUE,
    doc="broadcast_to with the shape as a tensor.",
    needs_values=True,
    gradient=lambda c, g: [call("collapse_sum_like", g, c.args[0]), None],
    host=True,
)


class DynFullAttrs(Attrs):
    __slots__ = ()
    dtype: str


def _full_relation(arg_types: Sequence[Type], attrs: DynFullAttrs,
                   values: Sequence[np.ndarray | None]) -> Type | None:
    fill = tensor_arg(arg_types[0], "fill_value")
    if fill is None:
        return None
    if fill.ndim != 0:
        raise TypeCheckError(f"fill_value must be a scalar, not {fill}")
    return _shaped_relation(attrs.dtype or fill.dtype, arg_types[1], values, 1)


def _full(arrays: list[np.ndarray], attrs: DynFullAttrs) -> np.ndarray:
    fill = np.asarray(arrays[0])
    dtype = attrs.dtype or str(fill.dtype)
    shape = checked_shape("dyn.full", shape_values(arrays[1], "dyn.full's shape"), dtype)
    return np.full(shape, fill, dtype)


full = register(
    "dyn.full",
    inputs=("fill_value", "shape"),
    attrs_type=DynFullAttrs,
    attrs=(Attr("dtype", "", kind="dtype", doc="the result's dtype ('' : fill_value's)"),),
    relation=_full_relation,
    compute=_full,
    pattern=OpPattern.OPAQUE,
    doc="A tensor of the shape given as a tensor, every element fill_value.",
    needs_values=True,
    differentiable=False,
    host=True,
)


def _filled(name: str, value: int) -> OpDef:
    def relation(arg_types: Sequence[Type], attrs: DynFullAttrs,
                 values: Sequence[np.ndarray | None]) -> Type | None:
        return _shaped_relation(attrs.dtype, arg_types[0], values, 0)

    def compute(arrays: list[np.ndarray], attrs: DynFullAttrs) -> np.ndarray:
        shape = checked_shape(name, shape_values(arrays[0], f"{name}'s shape"), attrs.dtype)
        return np.full(shape, value, attrs.dtype)

    return register(
        name,
        inputs=("shape",),
        attrs_type=DynFullAttrs,
        attrs=(Attr("dtype", "float32", kind="dtype", doc="the result's dtype"),),
        relation=relation,
        compute=compute,
        pattern=OpPattern.OPAQUE,
        doc=f"A tensor of {value}s of the shape given as a tensor.",
        needs_values=True,
        differentiable=False,
        host=True,
    )


zeros = _filled("dyn.zeros", 0)
ones = _filled("dyn.ones", 1)


# --- dyn.strided_slice -----------------------------------------------------------------------


class DynSliceAttrs(Attrs):
    __slots__ = ()
    slice_mode: str


def _dyn_slice_relation(arg_types: Sequence[Type], attrs: DynSliceAttrs,
                        values: Sequence[np.ndarray | None]) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    parts = [_shape_arg(t, n) for t, n in zip(arg_types[1:], ("begin", "end", "strides"))]
    if data is None or any(p is None for p in parts):
        return None
    lengths = {p.static_shape[0] for p in parts if p is not None}
    if len(lengths) != 1 or lengths.pop() > data.ndim:
        raise TypeCheckError(f"begin, end and strides must have one value per sliced axis (at "
                             f"most {data.ndim}), not {[str(p) for p in parts]}")
    if attrs.slice_mode not in ("end", "size"):
        raise TypeCheckError(f"slice_mode must be 'end' or 'size', got {attrs.slice_mode!r}")
    known = [_known(values, i) for i in (1, 2, 3)]
    if all(k is not None for k in known):  # constants: strided_slice's own relation
        begin, end, strides = known
        return _strided_slice_relation([data], _static_slice(begin, end, strides, attrs))
    return TensorType((ANY,) * data.ndim, data.dtype)


def _static_slice(begin: Sequence[int] | None, end: Sequence[int] | None,
                  strides: Sequence[int] | None, attrs: DynSliceAttrs) -> StridedSliceAttrs:
    if strides is not None and 0 in strides:
        raise Error("dyn.strided_slice: a stride is 0")
    return StridedSliceAttrs({"begin": tuple(begin or ()), "end": tuple(end or ()),
                              "strides": tuple(strides or ()), "slice_mode": attrs.slice_mode,
                              "axes": None})


def _dyn_slice(arrays: list[np.ndarray], attrs: DynSliceAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    begin, end, strides = (shape_values(a, f"dyn.strided_slice's {n}")
                           for a, n in zip(arrays[1:], ("begin", "end", "strides")))
    static = _static_slice(begin, end, strides, attrs)
    try:
        return np.ascontiguousarray(_strided_slice([x], static))
    except TypeCheckError as e:
        raise Error(f"dyn.strided_slice of {x.dtype}{list(x.shape)}: {e.message}") from None


strided_slice = register(
    "dyn.strided_slice",
    inputs=("data", "begin", "end", "strides"),
    attrs_type=DynSliceAttrs,
    attrs=(Attr("slice_mode", "end", kind="str", doc="'end' or 'size', as strided_slice's"),),
    relation=_dyn_slice_relation,
    compute=_dyn_slice,
    pattern=OpPattern.OPAQUE,
    doc="strided_slice with begin, end and strides as tensors (the leading axes).",
    needs_values=True,
    differentiable=False,
    host=True,
)


# --- argwhere ---------------------------------------------------------------------------------


def _argwhere_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    cond = tensor_arg(arg_types[0], "condition")
    if cond is None:
        return None
    return TensorType((ANY, cond.ndim), "int32")


def _argwhere(arrays: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    cond = np.asarray(arrays[0])
    return np.argwhere(cond).astype(np.int32)  # (count, ndim), also for a scalar


argwhere = register(
    "argwhere",
    inputs=("condition",),
    relation=_argwhere_relation,
    compute=_argwhere,
    pattern=OpPattern.OPAQUE,
    doc="The indices of the nonzero elements, one row (of ndim int32s) per element, in order.",
    differentiable=False,
    host=True,
)


def runs_on_host(c: Call) -> bool:
    """Whether the call runs on the host (the VM runs its compute) rather than as a kernel:
    an operator of data-dependent shape (``host=True``), or one whose relation needs its
    arguments' values (arange) that are not all constants here, so only the values say how
    big its result is."""
    from kiln.ir.expr import Constant, Op
    from kiln.op.registry import lookup

    if not isinstance(c.op, Op):
        return False
    opdef = lookup(c.op.name)
    if opdef is None:
        return False
    if opdef.host:
        return True
    if opdef.needs_values and not all(isinstance(a, Constant) for a in c.args):
        t = c.checked_type_
        return isinstance(t, TensorType) and not t.is_static
    return False
