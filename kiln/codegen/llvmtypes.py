"""LLVM types, constants and declarations for loop-IR dtypes (shared by the emit stage).

``bool`` is ``i1`` in registers and one byte in memory; signed and unsigned integers are
``iN`` (each operation chooses the signedness); ``float16/32/64`` are ``half/float/double``;
a value with ``lanes > 1`` is an LLVM vector of those.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kiln.ir.dtype import dtype_of

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

_SCALAR: dict[str, ir.Type] = {
    "bool": I1, "int8": I8, "int16": ir.IntType(16), "int32": I32, "int64": I64,
    "uint8": I8, "uint16": ir.IntType(16), "uint32": I32, "uint64": I64,
    "float16": ir.HalfType(), "float32": ir.FloatType(), "float64": ir.DoubleType(),
}


def kind(dtype: str) -> str:
    """``bool``, ``sint``, ``uint`` or ``float``: how operations treat the dtype."""
    d = dtype_of(dtype)
    if d.is_bool:
        return "bool"
    if d.is_float:
        return "float"
    return "uint" if d.is_uint else "sint"


def value_type(dtype: str, lanes: int = 1) -> ir.Type:
    """The LLVM type of a value of ``dtype`` in registers."""
    t = _SCALAR[dtype]
    return t if lanes == 1 else ir.VectorType(t, lanes)


def memory_type(dtype: str, lanes: int = 1) -> ir.Type:
    """The LLVM type of ``dtype`` in memory (bool is a byte)."""
    t = I8 if dtype == "bool" else _SCALAR[dtype]
    return t if lanes == 1 else ir.VectorType(t, lanes)


def itemsize(dtype: str) -> int:
    """Bytes per element in memory (bool is one byte)."""
    return dtype_of(dtype).itemsize


def bits(dtype: str) -> int:
    """Bits per element in memory (bool is eight)."""
    return dtype_of(dtype).bits


def lanes_of(t: ir.Type) -> int:
    return t.count if isinstance(t, ir.VectorType) else 1


def mangle(t: ir.Type) -> str:
    """The overload suffix of an intrinsic for type ``t`` (``f32``, ``v8f32``, ``i64``)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    return {"half": "f16", "float": "f32", "double": "f64"}[str(t)]


def constant(dtype: str, value: int | float | bool, lanes: int = 1) -> ir.Constant:
    """An LLVM constant of ``dtype`` (splat over ``lanes``)."""
    t = _SCALAR[dtype]
    d = dtype_of(dtype)
    v: int | float
    if d.is_bool:
        v = int(bool(value))
    elif d.is_float:
        v = float(np.asarray(value, dtype=dtype))  # rounded to the dtype, as LLVM requires
    else:
        v = int(value) & ((1 << d.bits) - 1)
    c = ir.Constant(t, v)
    return c if lanes == 1 else ir.Constant(ir.VectorType(t, lanes), [c] * lanes)


def like(t: ir.Type, value: float) -> ir.Constant:
    """A constant of LLVM type ``t`` (a scalar, or a vector splat)."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [like(t.element, value)] * t.count)
    if isinstance(t, ir.IntType):
        return ir.Constant(t, int(value) & ((1 << t.width) - 1))
    return ir.Constant(t, float(value))


def with_element(t: ir.Type, element: ir.Type) -> ir.Type:
    """``t``'s shape (scalar or vector) with another element type."""
    return ir.VectorType(element, t.count) if isinstance(t, ir.VectorType) else element


def splat(b: ir.IRBuilder, v: ir.Value, lanes: int) -> ir.Value:
    """A vector of ``lanes`` copies of the scalar ``v``."""
    vt = ir.VectorType(v.type, lanes)
    if isinstance(v, ir.Constant):
        return ir.Constant(vt, [v] * lanes)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


class ModuleContext:
    """Declarations shared by the functions of one LLVM module (intrinsics, libc, libm)."""

    def __init__(self, module: ir.Module, features: frozenset[str] = frozenset()) -> None:
        self.module = module
        # the Target's features, for instructions only some CPUs have (codegen/dot_product.py)
        self.features = features
        self._decls: dict[str, ir.Function] = {}

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """A function declared once per module (an intrinsic or a C function)."""
        fn = self._decls.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
            self._decls[name] = fn
        return fn

    def intrinsic(self, name: str, t: ir.Type, nargs: int = 1) -> ir.Function:
        """``llvm.<name>.<t>`` taking ``nargs`` operands of type ``t`` and returning ``t``."""
        return self.declare(f"llvm.{name}.{mangle(t)}", t, [t] * nargs)

    def call(self, b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
        """Call the intrinsic ``llvm.<name>`` overloaded on its first operand's type."""
        return b.call(self.intrinsic(name, args[0].type, len(args)), list(args))
