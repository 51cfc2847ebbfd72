"""What staged Python expressions evaluate to, and the conversions between them.

A Python expression in a ``@kiln.script`` function stages either to a kiln `Expr` (a tensor
or tuple computed by the program) or to a `Static` Python value known while staging (a
number, a string, a module, an operator, a numpy array captured from a global). Statics
become constants where a tensor is needed; Python numbers then take the dtype of the tensor
beside them ("weak" typing, as JAX does), so ``x * 2`` keeps ``x``'s dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.errors import Error, ParseError, Span, TypeCheckError
from kiln.ir import Constant, Expr, Tuple, TupleType, Type
from kiln.ir.ty import FLOAT_DTYPES, AnyDim, SymDim, TensorType, type_children


class ScriptError(ParseError):
    """A Python construct that ``@kiln.script`` cannot stage, or a name it cannot resolve."""

    kind = "script error"


@dataclass(frozen=True, slots=True)
class Static:
    """A Python value known while staging."""

    value: object


Value = Expr | Static

NUMBERS = (bool, int, float, np.bool_, np.integer, np.floating)


def weak_dtype(value: object, like: Type | None) -> str | None:
    """The dtype a Python number takes beside a tensor of type ``like`` (None: its default)."""
    if not isinstance(like, TensorType) or isinstance(value, np.generic):
        return None
    d = like.dtype
    if isinstance(value, bool):
        return d if d == "bool" else None
    if isinstance(value, int):
        return d if d != "bool" else None
    if isinstance(value, float):
        return d if d in FLOAT_DTYPES else None
    return None


def to_expr(value: Value, span: Span, like: Type | None = None) -> Expr:
    """A value as an expression: statics become constants (numbers weakly typed by ``like``)."""
    if isinstance(value, Expr):
        return value
    v = value.value
    if isinstance(v, NUMBERS) or isinstance(v, np.ndarray):
        dtype = weak_dtype(v, like)
        try:
            if dtype is not None:
                array = np.asarray(v, dtype=dtype)
                if not np.array_equal(array, np.asarray(v)):
                    raise Error(f"{v!r} does not fit in {dtype}")
            elif isinstance(v, (bool, np.bool_)):
                array = np.asarray(v, dtype="bool")
            elif isinstance(v, int):
                array = np.asarray(v, dtype="int32" if -(2**31) <= v < 2**31 else "int64")
            elif isinstance(v, float):
                array = np.asarray(v, dtype="float32")
            else:
                array = np.asarray(v)
            return Constant(array, span=span)
        except (Error, OverflowError, TypeError, ValueError) as e:
            msg = e.message if isinstance(e, Error) else str(e)
            raise ScriptError(f"cannot use {v!r} as a tensor: {msg}", span) from None
    if isinstance(v, (tuple, list)):
        fields = like.fields if isinstance(like, TupleType) else (None,) * len(v)
        if len(fields) != len(v):
            fields = (None,) * len(v)
        return Tuple(tuple(to_expr(Static(x), span, t) for x, t in zip(v, fields)), span=span)
    raise ScriptError(
        f"cannot use {describe(v)} as a tensor: kiln scripts compute with tensors, tuples of "
        "tensors, Python numbers and numpy arrays", span)


def describe(v: object) -> str:
    """A short description of a Python value for messages."""
    if isinstance(v, type):
        return f"the class {v.__name__}"
    if callable(v):
        return f"the function {getattr(v, '__name__', repr(v))}"
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"the {type(v).__name__} {text}"


def compatible(expected: Type, found: Type) -> bool:
    """True when ``found`` fits ``expected``: equal up to symbolic and unknown dimensions."""
    stack = [(expected, found)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a.dtype != b.dtype or len(a.shape) != len(b.shape):
                return False
            for x, y in zip(a.shape, b.shape):
                if x != y and not isinstance(x, (SymDim, AnyDim)) and not isinstance(
                        y, (SymDim, AnyDim)):
                    return False
            continue
        if type(a) is not type(b):
            return False
        ka, kb = type_children(a), type_children(b)
        if isinstance(a, (TensorType, TupleType)) and len(ka) != len(kb):
            return False
        if not ka and a != b:
            return False
        stack.extend(zip(ka, kb))
    return True


def require_scalar(t: Type, dtypes: tuple[str, ...], what: str, span: Span) -> None:
    """A TypeCheckError unless ``t`` is a scalar of one of ``dtypes``."""
    if isinstance(t, TensorType) and t.shape == () and t.dtype in dtypes:
        return
    names = " or ".join(dtypes)
    raise TypeCheckError(f"{what} must be a {names} scalar, but it has type {t}", span)
