"""DType against numpy's facts about the same dtypes."""

import numpy as np
import pytest

from kiln.errors import Error
from kiln.ir.dtype import DType, dtype_of
from kiln.ir.ty import DTYPES

_NUMPY_KIND = {"f": "float", "i": "int", "u": "uint", "b": "bool"}


@pytest.mark.parametrize("name", DTYPES)
def test_every_kiln_dtype_agrees_with_numpy(name: str) -> None:
    ref = np.dtype(name)
    d = DType.parse(name)
    assert d.kind == _NUMPY_KIND[ref.kind]
    assert d.itemsize == ref.itemsize
    assert d.lanes == 1
    assert d.is_float == (ref.kind == "f")
    assert d.is_int == (ref.kind == "i")
    assert d.is_uint == (ref.kind == "u")
    assert d.is_integer == np.issubdtype(ref, np.integer)
    assert d.is_bool == (ref == np.bool_)
    if ref.kind in "iu":
        assert d.bits == np.iinfo(ref).bits
    elif ref.kind == "f":
        assert d.bits == np.finfo(ref).bits
    assert str(d) == ref.name  # back to the same string


def test_lanes():
    d = DType.parse("float32x8")
    assert (d.kind, d.bits, d.lanes) == ("float", 32, 8)
    assert d.itemsize == 8 * np.dtype("float32").itemsize
    assert str(d) == "float32x8"
    assert d.element == DType.parse("float32")
    assert str(DType.parse("boolx4")) == "boolx4"


@pytest.mark.parametrize("bad", ["float", "int7", "uint128", "float8", "bool8", "complex64",
                                 "Float32", "float32x0", "", "int32 ", "bfloat16"])
def test_strings_that_are_not_dtypes(bad: str) -> None:
    with pytest.raises(Error):
        DType.parse(bad)


def test_invalid_values_cannot_be_made():
    with pytest.raises(Error):
        DType("float", 8)
    with pytest.raises(Error):
        DType("int", 32, 0)


def test_values_are_equal_hashable_and_cached():
    assert DType.parse("int16") == DType("int", 16)
    assert len({dtype_of("int16"), DType("int", 16)}) == 1
    assert dtype_of("uint8") is dtype_of("uint8")
    d = DType("uint", 8)
    assert dtype_of(d) is d
    with pytest.raises(AttributeError):
        d.bits = 16  # type: ignore[misc]
