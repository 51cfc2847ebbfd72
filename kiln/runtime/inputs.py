"""Checking what a caller passes to an executable, before any native code sees it.

Every argument of the entry function is checked against its parameter's type: a tensor must
be an array of the declared dtype and shape (or a Python number or list that converts exactly:
kiln/eval/convert.py), with symbolic dimensions consistent across arguments; tuples, ADT values,
references and closures must be of the right kind. A mismatch is a `kiln.Error` naming the
parameter, what it expects and what it got. Arrays native code could not read directly —
non-contiguous, misaligned or of foreign byte order — are copied, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.eval.convert import exact_array
from kiln.eval.values import Closure, ConstructorValue, RefValue
from kiln.ir.adt import Constructor
from kiln.ir.ty import (
    DTYPES,
    FuncType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    substitute,
)
from kiln.ssa.ir import Program
from kiln.text.printer import type_text

_DTYPES = {name: np.dtype(name) for name in DTYPES}


def _where(what: object) -> str:
    """Where a value sits in an argument, as text: ``what`` is the argument's description,
    or a field of one as ``(parent, index, constructor or None)`` — tuples made for every
    field checked and rendered only for an error (an argument may be a tree of thousands of
    cells)."""
    parts: list[str] = []
    node = what
    while isinstance(node, tuple):
        parent, index, ctor = node
        parts.append(f", field {index}" + (f" of {ctor}" if ctor else ""))
        node = parent
    return str(node) + "".join(reversed(parts))


def _tensor(value: Any, ty: TensorType, where: object, dims: dict[str, int]) -> np.ndarray:
    what = _where(where)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype != _DTYPES[ty.dtype] and array.dtype.name != ty.dtype:
            raise Error(f"{what} expects {type_text(ty)}, but got an array of dtype "
                        f"{array.dtype.name} and shape {array.shape}")
    elif isinstance(value, (bool, int, float, list, tuple)):
        array = exact_array(value, ty.dtype, what, type_text(ty))
    else:
        raise Error(f"{what} expects {type_text(ty)}, but got a {type(value).__name__}")
    if array.ndim != len(ty.shape):
        raise Error(f"{what} expects {type_text(ty)}, but got an array of shape {array.shape}")
    for i, (d, n) in enumerate(zip(ty.shape, array.shape)):
        if type(d) is int and d != n:
            raise Error(f"{what} expects {type_text(ty)}, but got an array of shape "
                        f"{array.shape} (dimension {i} must be {d})")
        if isinstance(d, SymDim) and dims.setdefault(d.name, n) != n:
            raise Error(f"{what} expects {type_text(ty)}, but got an array of shape "
                        f"{array.shape}: dimension {d.name} is {dims[d.name]} in an earlier "
                        "argument")
    if not (array.flags.c_contiguous and array.flags.aligned and array.dtype.isnative):
        array = np.require(array, array.dtype.newbyteorder("="), requirements=["C", "A"])
    return array


def check_value(value: Any, ty: Type, what: object, dims: dict[str, int],
                program: Program | None = None) -> Any:
    """``value`` as the executor's value of type ``ty`` (tensors made native-ready).

    Tuples and ADT values are checked field by field (an explicit stack: a list argument
    may be thousands of cells long), and rebuilt only where a field had to be converted.
    Reference cells are shared state, so their contents are left as they are.
    """
    if not isinstance(ty, TensorType) and _ready_as_is(value, ty, program):
        return value
    results: list[Any] = []
    # per (ADT type, constructor): the constructor's field types, or None when it is unused
    fields_of: dict[tuple[int, str], list[Type] | None] = {}
    # ("check", value, type, what) or ("tuple", n, None, None) / ("adt", n, original, ctor)
    stack: list[tuple[Any, Any, Any, Any]] = [("check", value, ty, what)]
    while stack:
        kind, a, b, c = stack.pop()
        if kind == "tuple":
            fields = results[len(results) - a:] if a else []
            del results[len(results) - a:]
            results.append(tuple(fields))
            continue
        if kind == "adt":
            fields = results[len(results) - a:] if a else []
            del results[len(results) - a:]
            same = all(x is y for x, y in zip(fields, b.fields))
            results.append(b if same else ConstructorValue(b.constructor, tuple(fields)))
            continue
        v, t, w = a, b, c
        if isinstance(t, TensorType):
            results.append(_tensor(v, t, w, dims))
        elif isinstance(t, TupleType):
            if not isinstance(v, (tuple, list)) or len(v) != len(t.fields):
                raise Error(f"{_where(w)} expects a tuple of {len(t.fields)} field(s) of type "
                            f"{type_text(t)}, but got {_kind(v)}")
            stack.append(("tuple", len(t.fields), None, None))
            for i in range(len(v) - 1, -1, -1):
                stack.append(("check", v[i], t.fields[i], (w, i, None)))
        elif isinstance(t, TypeCall):
            if not isinstance(v, ConstructorValue) or v.constructor.belong_to != t.func:
                raise Error(f"{_where(w)} expects a value of type {type_text(t)}, built by its "
                            f"constructors, but got {_kind(v)}")
            name = v.name
            key2 = (id(t), name)
            if key2 not in fields_of:
                fields_of[key2] = _constructor_fields(program, t, name)
            types = fields_of[key2]
            if types is None or len(v.fields) != len(types):
                results.append(v)  # a constructor the program never uses: nothing reads it
                continue
            stack.append(("adt", len(types), v, None))
            vf = v.fields
            for i in range(len(types) - 1, -1, -1):
                stack.append(("check", vf[i], types[i], (w, i, name)))
        elif isinstance(t, RefType):
            if not isinstance(v, RefValue):
                raise Error(f"{_where(w)} expects a reference of type {type_text(t)}, but got "
                            f"{_kind(v)}")
            results.append(v)
        elif isinstance(t, FuncType):
            results.append(_function(v, t, _where(w)))
        else:
            results.append(v)  # a type variable: anything
    return results[0]


def _ready_as_is(value: Any, ty: Type, program: Program | None) -> bool:
    """Whether ``value`` (tuples, ADT values, references) is already exactly what the
    executor reads: every tensor in it an array of its static shape and dtype that native
    code reads in place. The common case, checked without rebuilding anything; anything
    else (a conversion, a symbolic dimension, a function, an error) is `check_value`'s."""
    fields_of: dict[tuple[int, str], list[Type] | None] = {}
    ready: dict[int, tuple[tuple[int, ...], np.dtype] | None] = {}
    stack: list[tuple[Any, Type]] = [(value, ty)]
    while stack:
        v, t = stack.pop()
        kind = type(t)
        if kind is TensorType:
            assert isinstance(t, TensorType)
            key = id(t)
            if key not in ready:
                ready[key] = (t.static_shape, _DTYPES[t.dtype]) if t.is_static else None
            fast = ready[key]
            if not (fast is not None and type(v) is np.ndarray and v.shape == fast[0]
                    and v.dtype == fast[1] and v.flags.c_contiguous and v.flags.aligned):
                return False
        elif kind is TypeCall:
            assert isinstance(t, TypeCall)
            if type(v) is not ConstructorValue:
                return False
            adt = v.constructor.belong_to
            if adt is not t.func and adt != t.func:
                return False
            key2 = (id(t), v.name)
            if key2 not in fields_of:
                fields_of[key2] = _constructor_fields(program, t, v.name)
            types = fields_of[key2]
            if types is None:
                continue  # a constructor the program never uses
            if len(v.fields) != len(types):
                return False
            stack.extend(zip(v.fields, types))
        elif kind is TupleType:
            assert isinstance(t, TupleType)
            if type(v) is not tuple or len(v) != len(t.fields):
                return False
            stack.extend(zip(v, t.fields))
        elif kind is RefType:
            if not isinstance(v, RefValue):
                return False
        else:
            return False
    return True


def _constructor_fields(program: Program | None, t: TypeCall, name: str) -> list[Type] | None:
    """The field types of constructor ``name`` in ADT type ``t`` (its parameters
    substituted), or None when ``program`` does not use the constructor."""
    ctor = program.constructors.get(name) if program is not None else None
    if program is None or ctor is None:
        return None
    params = program.adt_params.get(t.func.name, ())
    mapping: dict[Type, Type] = dict(zip(params, t.args))
    return [substitute(ft, mapping) if mapping else ft for ft in ctor.inputs]


def _function(value: Any, ty: FuncType, what: object) -> Any:
    from kiln.runtime.vm import VMClosure

    if isinstance(value, (Closure, Constructor)):
        raise Error(f"{what} expects a function of type {type_text(ty)}; pass a closure "
                    "this executable returned (interpreter closures cannot run here)")
    if not isinstance(value, VMClosure):
        raise Error(f"{what} expects a function of type {type_text(ty)}, but got "
                    f"{_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype.name} and shape {value.shape}"
    return f"a {type(value).__name__}"


def bind_arguments(names: Sequence[str], types: Sequence[Type], entry: str,
                   args: Sequence[Any], kwargs: Mapping[str, Any],
                   program: Program | None = None) -> list[Any]:
    """The entry function's arguments, checked, from positional and keyword arguments."""
    if len(args) > len(names):
        raise Error(f"@{entry} takes {len(names)} argument(s) ({', '.join(names)}), but "
                    f"{len(args)} were given")
    values = list(args)
    rest = dict(kwargs)
    for name in names[len(args):]:
        if name not in rest:
            missing = [n for n in names[len(args):] if n not in rest]
            raise Error(f"@{entry} needs argument(s) {', '.join('%' + m for m in missing)}")
        values.append(rest.pop(name))
    if rest:
        extra = sorted(rest)
        clash = [n for n in extra if n in names[: len(args)]]
        if clash:
            raise Error(f"%{clash[0]} of @{entry} is given both in order and by name")
        raise Error(f"@{entry} has no parameter named {', '.join(repr(n) for n in extra)}")
    dims: dict[str, int] = {}
    return [check_value(v, t, f"argument {i + 1} (%{n}) of @{entry}", dims, program)
            for i, (v, t, n) in enumerate(zip(values, types, names))]


Signature = tuple[tuple[tuple[int, ...], np.dtype], ...]


def static_signature(types: Sequence[Type]) -> Signature | None:
    """The (shape, dtype) of each parameter when all are tensors of static shape, else None."""
    out = []
    for t in types:
        if not isinstance(t, TensorType) or not t.is_static:
            return None
        out.append((t.static_shape, _DTYPES[t.dtype]))
    return tuple(out)


def quick_bind(signature: Signature, args: Sequence[Any]) -> list[Any] | None:
    """``args`` as they are when each is exactly what native code reads (an array of the
    parameter's shape and dtype, C-contiguous, aligned, native byte order); None otherwise,
    and `bind_arguments` then converts what it can and says what is wrong with the rest.

    The common case of an inference call, in about a microsecond.
    """
    if len(args) != len(signature):
        return None
    for a, (shape, dtype) in zip(args, signature):
        if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
            return None
        flags = a.flags
        if not (flags.c_contiguous and flags.aligned):
            return None
    return list(args)


def fresh_outputs(value: Any) -> Any:
    """A result made safe to hand out: read-only arrays (constants) are copied."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, tuple):
        out: list[Any] = []
        for v in value:
            out.append(fresh_outputs(v) if isinstance(v, (np.ndarray, tuple)) else v)
        return tuple(out)
    return value
