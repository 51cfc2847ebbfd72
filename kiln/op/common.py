"""Helpers shared by the type relations of the operator families.

A relation receives its argument types fully resolved, but possibly still containing
`IncompleteType` where inference knows nothing yet: then it returns None and is asked again.
A relation that finds the arguments wrong raises `TypeCheckError` with a plain message; the
solver adds the operator's name and the source location of the call.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.errors import TypeCheckError
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
    for t, name in zip(arg_types, names):
        tt = tensor_arg(t, name)
        if tt is None:
            return None
        out.append(tt)
    return out


def same_dtype(tensors: Sequence[TensorType], names: Sequence[str]) -> str:
    """The common dtype of the arguments; a TypeCheckError naming both if they differ."""
    first = tensors[0]
    for t, name in zip(tensors[1:], names[1:]):
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
    for i, (x, y) in enumerate(zip(pa, pb)):
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
