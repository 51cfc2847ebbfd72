"""Shape-changing nn operators: nn.pad and nn.batch_flatten."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Call, Expr, const
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor, compute
from kiln.loops.ir import Binary, Select
from kiln.loops.ir import Expr as LExpr
from kiln.op import grad_helpers as gh
from kiln.op.common import dim_product, shape_str, tensor_arg
from kiln.op.grad_helpers import call, reshape_to
from kiln.op.registry import Attr, OpPattern, register

PAD_MODES = ("constant", "edge", "reflect")


def _pad_width(value: object, where: str) -> tuple[tuple[int, int], ...]:
    """An `Attr` convert: one (before, after) pair of non-negative ints per dimension."""
    if not isinstance(value, tuple):
        value = (value,)  # reported below as not a pair
    pairs = []
    for p in value:
        if (
            not isinstance(p, tuple)
            or len(p) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
        ):
            raise Error(
                f"{where} must be (before, after) pairs of non-negative integers, got {value!r}"
            )
        pairs.append(p)
    return tuple(pairs)


class PadAttrs(Attrs):
    __slots__ = ()
    pad_width: tuple[tuple[int, int], ...]
    pad_mode: str


def _pad_relation(arg_types: Sequence[Type], attrs: PadAttrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    value = tensor_arg(arg_types[1], "pad_value")
    if data is None or value is None:
        return None
    if value.ndim != 0:
        raise TypeCheckError(f"pad_value must be a scalar, but has shape {shape_str(value.shape)}")
    widths = attrs.pad_width
    if len(widths) != data.ndim:
        raise TypeCheckError(
            f"pad_width gives {len(widths)} (before, after) pairs but data of shape "
            f"{shape_str(data.shape)} has {data.ndim} dimensions"
        )
    if attrs.pad_mode not in PAD_MODES:
        raise TypeCheckError(
            f"pad_mode must be one of {', '.join(PAD_MODES)}, got {attrs.pad_mode!r}"
        )
    shape: list[Dim] = []
    for axis, (d, (before, after)) in enumerate(zip(data.shape, widths, strict=True)):
        if isinstance(d, int) and max(before, after) > 0:
            # edge copies the border element; reflect mirrors without repeating it
            limit = {"constant": None, "edge": 1, "reflect": max(before, after) + 1}[attrs.pad_mode]
            if limit is not None and d < limit:
                raise TypeCheckError(
                    f"{attrs.pad_mode} padding of ({before}, {after}) needs dimension {axis} of "
                    f"data of shape {shape_str(data.shape)} to be at least {limit}"
                )
        if isinstance(d, int):
            shape.append(d + before + after)
        else:
            shape.append(d if before == after == 0 else ANY)
    return TensorType(tuple(shape), data.dtype)


def _pad(arrays: list[np.ndarray], attrs: PadAttrs) -> np.ndarray:
    x = np.asarray(arrays[0])
    if attrs.pad_mode == "constant":
        with np.errstate(invalid="ignore"):
            fill = np.asarray(arrays[1]).astype(x.dtype)
        return np.pad(x, attrs.pad_width, constant_values=fill)
    # The relation admits only PAD_MODES, which are numpy's names for them.
    mode = cast(Literal["edge", "reflect"], attrs.pad_mode)
    return np.pad(x, attrs.pad_width, mode=mode)


def _pad_grad(c: Call, g: Expr) -> list[Expr | None]:
    data, value = c.args
    attrs = PadAttrs.view(c.attrs)
    widths, mode = attrs.pad_width, attrs.pad_mode
    if mode == "constant":
        # The data's adjoint is the middle of g; the pad value's, the sum of the rest.
        ends = [-after if after else 2**31 - 1 for _, after in widths]
        middle = call("strided_slice", g, begin=[b for b, _ in widths], end=ends)
        dvalue = None
        if dtype_of(gh.dtype(value)).is_float:
            rest = call("sum", g) - call("sum", middle)
            if gh.dtype(value) != gh.dtype(data):
                rest = call("cast", rest, dtype=gh.dtype(value))
            dvalue = rest
        return [middle, dvalue]
    # edge and reflect copy data's own elements outward, one axis after another (as numpy
    # pads): undo the axes last to first, adding each copied border back where it came from.
    shape = gh.static_shape(data, "nn.pad")
    for axis in reversed(range(len(shape))):
        before, after = widths[axis]
        if before == after == 0:
            continue
        g = _unpad_axis(g, data, axis, before, after, mode)
    return [g, None]


def _unpad_axis(g: Expr, data: Expr, axis: int, before: int, after: int, mode: str) -> Expr:
    """The adjoint of padding one axis of ``data`` in edge or reflect mode."""
    n = gh.static_shape(data, "nn.pad")[axis]

    def part(start: int, stop: int, step: int = 1) -> Expr:
        return call("strided_slice", g, begin=[start], end=[stop], strides=[step], axes=[axis])

    def place(e: Expr, at: int, length: int) -> Expr:
        """``e`` (``length`` long on the axis) put at offset ``at`` of a zero axis of ``n``."""
        widths = [(0, 0)] * gh.tensor_type(data).ndim
        widths[axis] = (at, n - at - length)
        return call("nn.pad", e, scalar_zero, pad_width=widths)

    scalar_zero = gh.scalar(0, gh.dtype(data))
    out = part(before, before + n)
    if mode == "edge":
        if before:
            out = out + place(call("sum", part(0, before), axis=[axis], keepdims=True), 0, 1)
        if after:
            edge = call("sum", part(before + n, before + n + after), axis=[axis], keepdims=True)
            out = out + place(edge, n - 1, 1)
        return out
    # reflect: g[before - k] came from data[k], and g[before + n - 1 + k] from data[n - 1 - k]
    if before:
        out = out + place(part(before - 1, -(2**31), -1), 1, before)
    if after:
        tail = part(before + n + after - 1, before + n - 1, -1)
        out = out + place(tail, n - 1 - after, after)
    return out


def _edge(j: LExpr, n: int, before: int, after: int) -> LExpr:
    """Index ``j`` (from -before to n - 1 + after) clamped to the border element."""
    if before:
        j = Binary("max", j, oplib.as_index(0))
    if after:
        j = Binary("min", j, oplib.as_index(n - 1))
    return j


def _reflect(j: LExpr, n: int, before: int, after: int) -> LExpr:
    """Index ``j`` mirrored at the borders without repeating them (numpy's reflect); the
    relation ensures one reflection suffices. Clamped too, for the verifier."""
    if before:
        j = Select(Binary("lt", j, oplib.as_index(0)), Binary("sub", oplib.as_index(0), j), j)
    if after:
        j = Select(Binary("gt", j, oplib.as_index(n - 1)),
                   Binary("sub", oplib.as_index(2 * (n - 1)), j), j)
    return _edge(j, n, before, after)


@oplib.zeros_if_empty
def _pad_lower(inputs: list[Tensor], attrs: PadAttrs, out_type: Type) -> Tensor:
    out = oplib.out_tensor_type(out_type)
    x, value = inputs
    widths = attrs.pad_width

    def shifted(i: tuple[LExpr, ...]) -> list[LExpr]:
        return [Binary("sub", j, oplib.as_index(b)) if b else j
                for j, (b, _) in zip(i, widths)]

    if attrs.pad_mode == "constant":
        fill = oplib.convert(value(), x.dtype)
        spans = [(-b, n + a - 1) for (b, a), n in zip(widths, x.shape)]

        def element(*i: LExpr) -> LExpr:
            return oplib.guarded_read(x, shifted(i), spans, fill)
    else:
        fix = _edge if attrs.pad_mode == "edge" else _reflect

        def element(*i: LExpr) -> LExpr:
            return x(*(fix(j, n, b, a)
                       for j, n, (b, a) in zip(shifted(i), x.shape, widths)))

    return compute(out.static_shape, out.dtype, element)


_pad_op = register(
    "nn.pad",
    inputs=("data", "pad_value"),
    attrs_type=PadAttrs,
    attrs=(
        Attr("pad_width", kind="any", convert=_pad_width, doc="(before, after) for each dimension"),
        Attr("pad_mode", "constant", kind="str", doc="constant, edge or reflect"),
    ),
    relation=_pad_relation,
    compute=_pad,
    pattern=OpPattern.INJECTIVE,
    doc="data padded on each side of each axis (pad_value is converted to data's dtype).",
    gradient=_pad_grad,
    lower=_pad_lower,
)


def pad(
    data: object, pad_width: object, pad_value: object = 0.0, pad_mode: str = "constant"
) -> Call:
    """``nn.pad(data, pad_width, pad_value=0.0, pad_mode="constant")`` as Relay's Python API."""
    if not isinstance(pad_value, Expr):
        pad_value = const(pad_value)
    return _pad_op(data, pad_value, pad_width=pad_width, pad_mode=pad_mode)


def _batch_flatten_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type | None:
    data = tensor_arg(arg_types[0], "data")
    if data is None:
        return None
    if data.ndim == 0:
        raise TypeCheckError("batch_flatten needs a tensor of rank >= 1, but data is a scalar")
    rest = data.shape[1:]
    flat = rest[0] if len(rest) == 1 else dim_product(rest)
    return TensorType((data.shape[0], flat), data.dtype)


batch_flatten = register(
    "nn.batch_flatten",
    inputs=("data",),
    relation=_batch_flatten_relation,
    compute=lambda arrays, attrs: np.reshape(
        arrays[0], (np.shape(arrays[0])[0], int(np.prod(np.shape(arrays[0])[1:])))
    ),
    pattern=OpPattern.INJECTIVE,
    doc="Each item of the batch flattened: shape (N, d1 * d2 * ...).",
    gradient=lambda c, g: [reshape_to(g, c.args[0])],
    lower=lambda inputs, attrs, out: compute(
        out.shape, out.dtype,
        lambda *i: inputs[0](*oplib.reshape_indices(inputs[0].shape, out.shape, i))),
)

__all__ = ["batch_flatten", "pad"]
