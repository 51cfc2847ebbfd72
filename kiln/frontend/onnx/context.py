"""What a converter sees: the values of an ONNX graph, and one node's inputs and attributes.

A `Value` is an ONNX tensor during import: the kiln expression that computes it (a parameter,
a let-bound variable or a constant), its kiln type, and — when it is known at import time
(initializers, `Constant` nodes, shapes of static tensors and what is computed from them) — its
array. Converters read constants through `NodeContext.const` so that static shapes stay
static: ``Reshape(x, shape)`` with a known ``shape`` becomes ``reshape(x, newshape=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from kiln.errors import Error
from kiln.frontend.onnx import limits as _limits
from kiln.infer import infer_types
from kiln.ir.expr import Constant, Expr
from kiln.ir.ty import TensorType, Type
from kiln.op import cast as op_cast

# ONNX element types kiln has a dtype for.
DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
}
ONNX_TYPES: dict[str, int] = {v: k for k, v in DTYPES.items()}


class UnsupportedDtype(Error):
    """An ONNX element type kiln has no dtype for (string, bfloat16, float8, complex...)."""


class RandomOutput(Error):
    """An operator whose result is a random draw that kiln does not make (training Dropout)."""


class NeedsConstant(Error):
    """A tensor that kiln needs at import time (a shape, axes) is computed at run time.

    ``value`` is the ONNX name of that tensor: when it is a graph input, binding it with
    ``from_onnx(..., constants={value: array})`` makes the model importable.
    """

    def __init__(self, message: str, value: str) -> None:
        super().__init__(message)
        self.value = value


def in_context(err: Error, prefix: str) -> Error:
    """``err`` with ``prefix`` before its message, keeping its class (and the tensor's name)."""
    message = f"{prefix}: {err.message}"
    if isinstance(err, NeedsConstant):
        return NeedsConstant(message, err.value)
    if isinstance(err, UnsupportedDtype):
        return UnsupportedDtype(message)
    if isinstance(err, RandomOutput):
        return RandomOutput(message)
    return Error(message)


def elem_type_name(elem_type: int) -> str:
    """The ONNX name of an element type (FLOAT, BFLOAT16, ...), or its number."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"element type {elem_type}"


def kiln_dtype(elem_type: int, what: str) -> str:
    """The kiln dtype of an ONNX element type; an `UnsupportedDtype` error naming ``what``."""
    dtype = DTYPES.get(elem_type)
    if dtype is None:
        raise UnsupportedDtype(
            f"{what} has ONNX element type {elem_type_name(elem_type)}, which kiln does not "
            f"support (kiln's dtypes: {', '.join(sorted(ONNX_TYPES))})")
    return dtype


def tensor_to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """An ONNX tensor (initializer, attribute) as a numpy array of a kiln dtype."""
    dtype = kiln_dtype(t.data_type, what)
    if t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data:
        raise Error(f"{what} keeps its data in an external file that was not loaded "
                    "(import the model from its path, next to its data files)")
    try:
        array = numpy_helper.to_array(t)
    except Exception as exc:  # noqa: BLE001 - malformed protobuf contents
        raise Error(f"{what} is malformed: {exc}") from None
    if array.dtype.name != dtype:
        array = array.astype(dtype)
    # (np.ascontiguousarray would make a 0-d array 1-d.)
    return array if array.flags.c_contiguous else array.copy(order="C")


def attribute_value(a: onnx.AttributeProto, what: str) -> Any:
    """An attribute as a Python value: int, float, str, array, graph, or a list of those."""
    kinds = onnx.AttributeProto
    match a.type:
        case kinds.INT:
            return int(a.i)
        case kinds.FLOAT:
            return float(a.f)
        case kinds.STRING:
            return a.s.decode("utf-8", errors="replace")
        case kinds.INTS:
            return [int(v) for v in a.ints]
        case kinds.FLOATS:
            return [float(v) for v in a.floats]
        case kinds.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in a.strings]
        case kinds.TENSOR:
            return tensor_to_array(a.t, f"{what} attribute {a.name!r}")
        case kinds.GRAPH:
            return a.g
        case kinds.GRAPHS:
            return list(a.graphs)
        case kinds.TENSORS:
            return [tensor_to_array(t, f"{what} attribute {a.name!r}") for t in a.tensors]
    kind = kinds.AttributeType.Name(a.type) if a.type in kinds.AttributeType.values() else a.type
    raise Error(f"{what}: attribute {a.name!r} has type {kind}, which kiln cannot read")


@dataclass
class Value:
    """An ONNX tensor during import: its expression, type, and array when known."""

    expr: Expr
    type: Type
    const: np.ndarray | None = None
    # An initializer kept as a parameter: known, but not folded into constants when large.
    weight: bool = False

    @property
    def foldable(self) -> bool:
        return self.const is not None and (not self.weight or self.const.size <= 64)


def describe_node(node: onnx.NodeProto, index: int) -> str:
    """How messages name a node: ``node 'conv1' (Conv)``, or by position when unnamed."""
    if node.name:
        return f"node {node.name!r} ({node.op_type})"
    outs = ", ".join(repr(o) for o in node.output if o)
    return f"{node.op_type} node #{index}" + (f" (output {outs})" if outs else "")


class NodeContext:
    """One node's view for its converter: inputs, their types and constants, attributes."""

    def __init__(self, node: onnx.NodeProto, index: int, inputs: list[Value | None],
                 opset: int, graph: Any) -> None:
        self.node = node
        self.index = index
        self.inputs = inputs
        self.opset = opset
        self.graph = graph  # the GraphImporter (for subgraphs)
        self.where = describe_node(node, index)
        self.attrs: dict[str, Any] = {}
        for a in node.attribute:
            self.attrs[a.name] = attribute_value(a, self.where)

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def output_used(self, k: int) -> bool:
        """Whether output ``k`` is named (ONNX leaves an optional output's name empty)."""
        return k < len(self.node.output) and bool(self.node.output[k])

    def error(self, message: str) -> Error:
        return Error(f"{self.where}: {message}")

    # --- import limits (limits.py) ----------------------------------------------------------

    @property
    def limits(self) -> _limits.Limits:
        return self.graph.limits if self.graph is not None else _limits.Limits.from_env()

    def check_elements(self, shape: Sequence[int], what: str) -> None:
        """An array of ``shape`` is about to be made now: within ``max_elements``."""
        _limits.check_elements(self.where, shape, what, self.limits)

    def check_shape(self, shape: Sequence[object], what: str) -> None:
        """A tensor of the converted model will have ``shape``: within the limits."""
        _limits.check_shape(self.where, shape, what, self.limits)

    def check_rank(self, rank: int, what: str) -> None:
        """A tensor of rank ``rank`` is about to be made: at most `limits.MAX_RANK`."""
        _limits.check_rank(self.where, rank, what)

    def check_unroll(self, n: int, what: str) -> None:
        """A Python loop of ``n`` steps is about to run: within ``max_unroll``."""
        _limits.check_unroll(self.where, n, what, self.limits)

    def check_scale(self, scale: float, what: str, shrink: bool = False) -> None:
        """A resize factor: positive, finite, within ``max_resize_scale``."""
        _limits.check_scale(self.where, scale, what, self.limits, shrink)

    # --- inputs ------------------------------------------------------------------------------

    def has(self, i: int) -> bool:
        """Whether input ``i`` is given (optional inputs may be missing or empty)."""
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int) -> Value:
        v = self.inputs[i] if i < len(self.inputs) else None
        if v is None:
            raise self.error(f"input {i} is required")
        return v

    def x(self, i: int) -> Expr:
        """The expression of input ``i``."""
        return self.value(i).expr

    def t(self, i: int) -> TensorType:
        ty = self.value(i).type
        if not isinstance(ty, TensorType):
            raise self.error(f"input {i} must be a tensor, not {ty}")
        return ty

    def dtype(self, i: int) -> str:
        return self.t(i).dtype

    def ndim(self, i: int) -> int:
        return self.t(i).ndim

    def shape(self, i: int) -> tuple[int, ...]:
        """The static shape of input ``i``; an error when a dimension is not a number."""
        shape = self.t(i).shape
        dims = tuple(d for d in shape if isinstance(d, int))
        if len(dims) != len(shape):
            raise self.error(f"{self.op_type} needs input {i} to have a static shape, but it "
                             f"has shape ({', '.join(str(d) for d in shape)})")
        return dims

    def const(self, i: int) -> np.ndarray | None:
        """The array of input ``i`` when known at import time (None otherwise, or missing)."""
        if not self.has(i):
            return None
        return self.value(i).const

    def need_const(self, i: int, what: str) -> np.ndarray:
        """The array of input ``i``, which must be known at import time."""
        c = self.const(i)
        if c is None:
            name = self.node.input[i] if i < len(self.node.input) else ""
            raise NeedsConstant(
                f"{self.where}: input {i} ({what}, {name!r}) must be known when the model is "
                "imported (an initializer, a Constant, or computed from them and static "
                "shapes); kiln needs it to fix the shape of the result. When it is a graph "
                "input, give its value with from_onnx(..., constants=...)", name)
        return c

    def ints(self, i: int, what: str) -> list[int]:
        """The values of input ``i``, known at import time, as int64 numbers."""
        array = np.asarray(self.need_const(i, what)).reshape(-1)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = array[~np.isfinite(array)][0]
            raise self.error(f"input {i} ({what}) holds {bad}, which is not an integer")
        values = [int(v) for v in array.tolist()]
        for k, v in enumerate(values):
            if not _INT64_MIN <= v <= _INT64_MAX:
                shown = f"{array[k]:.7g}" if array.dtype.kind == "f" else str(v)
                raise self.error(f"input {i} ({what}) holds {shown}, which is out of the "
                                 "range of int64")
        return values

    def int_scalar(self, i: int, what: str) -> int:
        """The one value of input ``i`` (a scalar or a 1-element tensor) as an int64 number."""
        values = self.ints(i, what)
        if not values:
            raise self.error(f"input {i} ({what}) is empty; it must hold one number")
        return values[0]

    # --- attributes --------------------------------------------------------------------------

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def need_attr(self, name: str) -> Any:
        if name not in self.attrs:
            raise self.error(f"attribute {name!r} is required")
        return self.attrs[name]

    # --- building ----------------------------------------------------------------------------

    def infer(self, e: Expr) -> Type:
        """The type of an expression a converter built (its leaves are typed variables)."""
        return type_of(e, self.where)

    def tensor_type(self, e: Expr) -> TensorType:
        ty = self.infer(e)
        assert isinstance(ty, TensorType)
        return ty

    def let(self, e: Expr, name: str) -> Expr:
        """Bind ``e`` to a variable of the graph's let chain (to share it between outputs)."""
        return self.graph.bind(name, e, self.where, False).expr

    def subgraph(self, name: str) -> onnx.GraphProto:
        g = self.attrs.get(name)
        if not isinstance(g, onnx.GraphProto):
            raise self.error(f"attribute {name!r} must be a graph")
        return g


def type_of(e: Expr, where: str) -> Type:
    """The checked type of an expression over typed variables and constants."""
    if isinstance(e, Constant):
        return e.tensor_type
    if e.checked_type_ is not None:
        return e.checked_type_
    try:
        return infer_types(e).checked_type
    except Error as err:
        raise Error(f"{where}: {err.kind}: {err.message}") from None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def const_like(value: float | int | bool | Sequence[Any] | np.ndarray, dtype: str) -> Constant:
    """A constant of a dtype (the converters' scalars and small tables).

    A value converted to a float dtype whose range it exceeds becomes +-inf, as ONNX Runtime's
    C++ cast makes it (an attribute's 1e300 for a float16 tensor); one that an integer dtype
    cannot hold (nan, inf, 1e30, -1 for uint8) is a kiln.Error naming the value and the dtype.
    """
    if np.dtype(dtype).kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            return Constant(np.asarray(value).astype(dtype, copy=False))
    try:
        return Constant(np.asarray(value, dtype=dtype))
    except (OverflowError, ValueError, TypeError):
        shown = value if np.ndim(value) == 0 else "a value"
        raise Error(f"{shown} cannot be represented as {dtype}") from None


def cast(x: Expr, dtype: str) -> Expr:
    """``x`` converted to ``dtype`` (no call when it already has it, for a constant)."""
    if isinstance(x, Constant) and x.dtype == dtype:
        return x
    return op_cast(x, dtype=dtype)


def unary_map(fn: Callable[[Expr], Expr]) -> Callable[[NodeContext], Expr]:
    """A converter applying ``fn`` to input 0."""
    return lambda ctx: fn(ctx.x(0))
