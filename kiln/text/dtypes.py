"""Dtype names as TVM's text format spells them, read into kiln's canonical names.

TVM reads a dtype with ``String2DLDataType``: a kind (``int``, ``uint``, ``float``) followed
by an optional width that defaults to 32, or ``bool``. So ``int`` is int32, ``uint`` uint32,
``float`` float32, and ``uint1`` is TVM's own spelling of bool (a one-bit unsigned integer).
The parser accepts these in tensor types, scalar types and dtype attributes; the printer
always writes the canonical names.
"""

from __future__ import annotations

from kiln.ir.ty import DTYPES

# TVM spellings with no width, or TVM's name of bool, and what they mean.
TVM_SHORTHANDS = {
    "int": "int32",
    "uint": "uint32",
    "float": "float32",
    "uint1": "bool",
}


def canonical_dtype(name: str) -> str | None:
    """kiln's name for a dtype written as TVM's text writes it, or None if it names none."""
    if name in DTYPES:
        return name
    return TVM_SHORTHANDS.get(name)
