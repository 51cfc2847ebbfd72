"""Numeric literals of the text format: reading ``-42i64``/``1e-05f``/``3f16`` and writing them.

A literal is an optional run of minus signs (an odd count negates), digits with an optional
fraction and exponent, and a suffix: ``i``, ``i8``, ``i16``, ``i32``, ``i64`` for integers, ``f``,
``f16``, ``f32``, ``f64`` for floats. Without a suffix, an integer is int32 (int64 when it does
not fit) and a number with a fraction or an exponent is float32. ``inff`` and ``nanf`` (with
the float suffixes) name the special values, as TVM's lexer reads them.

Floats are written with the fewest digits that read back to the same bits; the reader goes
through Python's correctly rounded float and then numpy's rounding to the narrower type, and
the writer checks each literal against exactly that path, so a literal always reads back
bit for bit (a value that would not is left to the metadata section).
"""

from __future__ import annotations

import math
import re

import numpy as np

_LITERAL = re.compile(r"(-*)([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|inf|nan)(.*)", re.DOTALL)
_INT_SUFFIX = {"": "int32", "i": "int32", "i8": "int8", "i16": "int16", "i32": "int32",
               "i64": "int64"}
_FLOAT_SUFFIX = {"f": "float32", "f16": "float16", "f32": "float32", "f64": "float64"}
_INT_RANGE = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_FLOAT_TYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
# The smallest magnitudes that round to infinity: the largest finite value plus half an ulp.
_OVERFLOW = {"float16": 65520.0, "float32": (2.0 - 2.0**-24) * 2.0**127}


class LiteralError(ValueError):
    """A malformed or out-of-range literal (the parser adds the location)."""


def read_number(text: str, as_attr: bool = False) -> tuple[str, int | float]:
    """The dtype and value of a literal: ``("int64", -42)`` for ``-42i64``.

    ``as_attr`` reads an attribute value, whose floats are doubles whatever the suffix.
    """
    m = _LITERAL.fullmatch(text)
    if m is None:
        raise LiteralError(f"invalid number `{text}`")
    minuses, body, suffix = m.groups()
    negative = len(minuses) % 2 == 1
    is_float = body in ("inf", "nan") or "." in body or "e" in body or "E" in body
    if suffix in _FLOAT_SUFFIX:
        dtype = _FLOAT_SUFFIX[suffix]
        is_float = True
    elif suffix in _INT_SUFFIX:
        if is_float and suffix:
            raise LiteralError(f"`{text}` has a fraction or an exponent but an integer suffix")
        dtype = "float32" if is_float else _INT_SUFFIX[suffix]
    else:
        raise LiteralError(
            f"invalid suffix `{suffix}` in number `{text}` "
            "(suffixes: i, i8, i16, i32, i64, f, f16, f32, f64)"
        )
    if body in ("inf", "nan") and not suffix:
        raise LiteralError(f"invalid number `{text}`")
    if is_float:
        value = float(body)
        if negative:
            value = -value
        if math.isinf(value) and body != "inf":
            raise LiteralError(f"`{text}` is out of range for {dtype}")
        if dtype != "float64" and not as_attr and not math.isinf(value) and (
            abs(value) >= _OVERFLOW[dtype]
        ):
            raise LiteralError(f"`{text}` is out of range for {dtype}")
        return dtype, value
    if len(body) > 30:
        raise LiteralError(f"`{text}` is out of range for {dtype}")
    value = int(body)
    if negative:
        value = -value
    low, high = _INT_RANGE[dtype]
    if not low <= value <= high:
        if suffix or not _INT_RANGE["int64"][0] <= value <= _INT_RANGE["int64"][1]:
            raise LiteralError(f"`{text}` is out of range for {'int64' if not suffix else dtype}")
        dtype = "int64"
    return dtype, value


def scalar_array(dtype: str, value: int | float | bool) -> np.ndarray:
    """A 0-d array of ``dtype`` holding ``value`` (floats rounded as the reader rounds).

    The value must be in range for ``dtype`` (`read_number` checks that).
    """
    if dtype in _FLOAT_TYPES:
        return np.array(_FLOAT_TYPES[dtype](value))
    return np.array(value, dtype=dtype)


def read_attr_number(text: str) -> int | float:
    """A literal as an attribute value: a Python int, or a Python float (a double, unrounded)."""
    return read_number(text, as_attr=True)[1]


_SUFFIX_OF = {"int32": "", "int64": "i64", "int16": "i16", "int8": "i8",
              "float32": "f", "float16": "f16", "float64": "f64"}


def _shortest(value: np.floating) -> str:
    a = abs(float(value))
    if a == 0.0 or 1e-4 <= a < 1e16:
        return np.format_float_positional(value, unique=True, trim="-")
    return np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)


_written: dict[tuple[str, bytes], str | None] = {}


def write_scalar(array: np.ndarray) -> str | None:
    """The literal of a 0-d array, or None when it has none (uint dtypes, nan, inf, ...)."""
    key = (array.dtype.char, array.tobytes())
    if key in _written:
        return _written[key]
    text = _write_scalar(array)
    if len(_written) < 4096:
        _written[key] = text
    return text


def _write_scalar(array: np.ndarray) -> str | None:
    dtype = array.dtype.name
    value = array.item()
    if dtype == "bool":
        return "True" if value else "False"
    if dtype not in _SUFFIX_OF:
        return None
    if dtype in _INT_RANGE:
        return f"{value}{_SUFFIX_OF[dtype]}"
    scalar = array[()]
    assert isinstance(scalar, np.floating)  # the dtypes left are float16, float32 and float64
    if not np.isfinite(scalar):
        return None
    text = _shortest(scalar) + _SUFFIX_OF[dtype]
    back = scalar_array(dtype, read_number(text)[1])
    if back.tobytes() != array.tobytes():
        return None
    return text


def write_attr_float(value: float) -> str:
    """A float attribute: the shortest decimal that reads back to the same double, then `f`."""
    if math.isnan(value):
        return "nanf"
    if math.isinf(value):
        return "inff" if value > 0 else "-inff"
    text = repr(value)
    if text.endswith(".0"):
        text = text[:-2]
    return text + "f"
