"""Helpers shared by the type relations of the operator families.

A relation receives its argument types fully resolved, but possibly still containing
`IncompleteType` where inference knows nothing yet: then it returns None and is asked again.
A relation that finds the arguments wrong raises `TypeCheckError` with a plain message; the
solver adds the operator's name and the source location of the call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import Error, TypeCheckError
from kiln.ir.dtype import dtype_of
from kiln.ir.ty import ANY, AnyDim, Dim, IncompleteType, SymDim, TensorType, Type, type_children


def shape_str(shape: Sequence[Dim]) -> str:
    """``(1, 784)``, ``(n, ?)``, ``()`` — shapes as the text format writes them."""
    inner = ", ".join(str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def is_known(t: Type) -> bool:
    """True when ``t`` contains no IncompleteType (so a relation may inspect it)."""
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, IncompleteType):
            return False
        stack.extend(type_children(x))
    return True


def tensor_arg(t: Type, what: str) -> TensorType | None:
    """``t`` as a tensor type; None if not yet known; a TypeCheckError if not a tensor."""
    if isinstance(t, IncompleteType):
        return None
    if not isinstance(t, TensorType):
        raise TypeCheckError(f"{what} must be a tensor, but has type {t}")
    return t


def tensor_args(arg_types: Sequence[Type], names: Sequence[str]) -> list[TensorType] | None:
    """All arguments as tensor types, or None while any is unknown."""
    out = []
    for t, name in zip(arg_types, names, strict=False):
        tt = tensor_arg(t, name)
        if tt is None:
            return None
        out.append(tt)
    return out


def same_dtype(tensors: Sequence[TensorType], names: Sequence[str]) -> str:
    """The common dtype of the arguments; a TypeCheckError naming both if they differ."""
    first = tensors[0]
    for t, name in zip(tensors[1:], names[1:], strict=False):
        if t.dtype != first.dtype:
            raise TypeCheckError(
                f"{names[0]} has dtype {first.dtype} but {name} has dtype {t.dtype}; "
                "they must be the same (kiln does not convert implicitly; use cast)"
            )
    return first.dtype


def dims_may_equal(a: Dim, b: Dim) -> bool:
    """False only when two dimensions are certainly different."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, SymDim) and isinstance(b, SymDim):
        return True  # different names may still be equal at run time
    return True


def unify_dim(a: Dim, b: Dim) -> Dim:
    """The more precise of two dimensions that must be equal (callers check they may be)."""
    if isinstance(a, AnyDim):
        return b
    if isinstance(b, AnyDim):
        return a
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a if a == b else ANY


def broadcast_shape(
    a: Sequence[Dim], b: Sequence[Dim], names: tuple[str, str] = ("lhs", "rhs")
) -> tuple[Dim, ...]:
    """Numpy broadcasting of two shapes; a TypeCheckError naming the dimension if they clash."""
    ndim = max(len(a), len(b))
    pa = (1,) * (ndim - len(a)) + tuple(a)
    pb = (1,) * (ndim - len(b)) + tuple(b)
    out: list[Dim] = []
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif isinstance(x, int) and isinstance(y, int):
            if x != y:
                raise TypeCheckError(
                    f"cannot broadcast {names[0]} of shape {shape_str(a)} with {names[1]} of "
                    f"shape {shape_str(b)}: dimension {i} of the result is {x} in one and {y} "
                    "in the other (each must be equal, or 1)"
                )
            out.append(x)
        elif x == y:
            out.append(x)
        elif isinstance(x, int):
            out.append(x)  # y is symbolic or unknown; it must be x (or 1) at run time
        elif isinstance(y, int):
            out.append(y)
        else:
            out.append(ANY)
    return tuple(out)


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """A possibly negative axis as an index in ``range(ndim)``; a TypeCheckError if out of range."""
    if not -ndim <= axis < ndim:
        raise TypeCheckError(f"{what} {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def dim_product(dims: Sequence[Dim]) -> Dim:
    """The product of dimensions: an int when all are known, else unknown (``?``)."""
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return ANY
        out *= d
    return out


# --- helpers added for the operator families ----------------------------------------------


def check_dims_equal(a: Dim, b: Dim, message: str) -> None:
    """Raise a TypeCheckError with ``message`` when two dimensions are certainly different."""
    if not dims_may_equal(a, b):
        raise TypeCheckError(message)


def require_dtype(t: TensorType, what: str, kind: str) -> None:
    """Check a tensor's dtype is of a kind: "float", "numeric" (int or float), "bool" or "any"."""
    d = dtype_of(t.dtype)
    ok = {
        "float": d.is_float,
        "numeric": d.is_float or d.is_integer,
        "int": d.is_integer,
        "bool": d.is_bool,
        "any": True,
    }[kind]
    if not ok:
        wanted = {
            "float": "a floating-point dtype (float16, float32 or float64)",
            "numeric": "a numeric dtype (an integer or floating-point type, not bool)",
            "int": "an integer dtype",
            "bool": "dtype bool",
        }[kind]
        raise TypeCheckError(f"{what} must have {wanted}, but has dtype {t.dtype}")


def require_rank(t: TensorType, what: str, rank: int) -> None:
    """Check a tensor has exactly ``rank`` dimensions."""
    if t.ndim != rank:
        raise TypeCheckError(
            f"{what} must have rank {rank}, but has shape {shape_str(t.shape)} (rank {t.ndim})"
        )


def pair(value: int | Sequence[int], where: str) -> tuple[int, int]:
    """An `Attr` convert: one int or two ints as a pair (strides, dilation, kernel sizes)."""
    v = (value,) if isinstance(value, int) else tuple(value)
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2:
        raise Error(f"{where} must be one or two integers, got {value!r}")
    return (int(v[0]), int(v[1]))


def padding4(value: int | Sequence[int], where: str) -> tuple[int, int, int, int]:
    """An `Attr` convert: 2-D padding of 1, 2 or 4 ints as (top, left, bottom, right).

    One number pads every side; two are (top, left), repeated for (bottom, right).
    """
    v = (value,) if isinstance(value, int) else tuple(value)
    if len(v) == 1:
        v = v * 4
    elif len(v) == 2:
        v = v + v
    if len(v) != 4:
        raise Error(f"{where} must be 1, 2 or 4 integers, got {value!r}")
    if any(p < 0 for p in v):
        raise Error(f"{where} must not be negative, got {value!r}")
    return (int(v[0]), int(v[1]), int(v[2]), int(v[3]))


def as_array(value: object, dtype: str) -> np.ndarray:
    """``value`` as an ndarray of exactly ``dtype`` (numpy returns scalars from 0-d arithmetic)."""
    return np.asarray(value).astype(dtype, copy=False)


def trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (C's ``/``); the caller rules out division by 0."""
    q = np.floor_divide(a, b)
    # floor and truncation differ when the remainder is nonzero and the signs differ
    inexact = np.remainder(a, b) != 0
    opposite = (np.asarray(a) < 0) != (np.asarray(b) < 0)
    return q + (inexact & opposite).astype(q.dtype)


def windows_2d(
    x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilation: tuple[int, int]
) -> np.ndarray:
    """A view of every (dilated, strided) kernel window over the last two axes of ``x``.

    For ``x`` of shape (..., H, W) the result has shape (..., OH, OW, kh, kw), where
    OH = (H - ((kh - 1) * dh + 1)) // sh + 1 and likewise OW. No data is copied.
    """
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilation
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=(-2, -1))
    return view[..., ::sh, ::sw, ::dh, ::dw]


def window_out_size(
    size: Dim, pad: int, kernel: int, dilation: int, stride: int, ceil_mode: bool = False
) -> Dim:
    """Output size of a sliding window along one axis (TVM's formula; ``?`` when unknown)."""
    if not isinstance(size, int):
        return ANY
    span = (kernel - 1) * dilation + 1
    room = size + pad - span
    if room < 0:
        raise TypeCheckError(
            f"the window spans {span} elements (kernel {kernel}, dilation {dilation}) but the "
            f"padded input has only {size + pad}"
        )
    return (room + (stride - 1 if ceil_mode else 0)) // stride + 1


def check_window_attrs(
    kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int]
) -> None:
    """Kernel sizes, strides and dilations must be positive."""
    for name, values in (("kernel size", kernel), ("strides", strides), ("dilation", dilation)):
        if any(v <= 0 for v in values):
            raise TypeCheckError(f"{name} must be positive, got {list(values)}")
