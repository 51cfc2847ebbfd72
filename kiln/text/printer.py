"""Printer for Relay's text format (provisional: types only; the full printer replaces this)."""

from __future__ import annotations

from kiln.ir.ty import (
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
)


def type_text(ty: Type) -> str:
    """A type in the text format: ``Tensor[(1, 784), float32]``, ``fn (A) -> A``, ..."""
    match ty:
        case TensorType(shape=shape, dtype=dtype):
            if not shape:
                return dtype
            dims = ", ".join(str(d) for d in shape)
            if len(shape) == 1:
                dims += ","
            return f"Tensor[({dims}), {dtype}]"
        case TupleType(fields=fields):
            inner = ", ".join(type_text(f) for f in fields)
            return f"({inner},)" if len(fields) == 1 else f"({inner})"
        case FuncType(arg_types=args, ret_type=ret, type_params=tps):
            params = "[" + ", ".join(t.name for t in tps) + "]" if tps else ""
            return f"fn {params}({', '.join(type_text(a) for a in args)}) -> {type_text(ret)}"
        case TypeVar(name=name) | GlobalTypeVar(name=name):
            return name
        case TypeCall(func=func, args=args):
            if not args:
                return func.name
            return f"{func.name}[{', '.join(type_text(a) for a in args)}]"
        case RefType(value=value):
            return f"ref({type_text(value)})"
        case IncompleteType():
            return "_"
    return f"<{type(ty).__name__}>"


def astext(obj: object, show_types: bool | None = None) -> str:
    """Placeholder until the full printer lands."""
    return repr(obj)
