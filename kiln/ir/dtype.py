"""Element types as small values: ``dtype_of("uint8").is_integer`` instead of string prefixes.

The IR keeps dtypes as strings (``TensorType.dtype == "float32"``); this is how code asks
about one. A `DType` is a kind, a width in bits and a number of lanes: ``float32`` is
``DType("float", 32)``, ``int8x4`` is ``DType("int", 8, 4)``. ``bool`` is one byte per
element, as numpy and kiln's runtime store it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal, cast

from kiln.errors import Error

Kind = Literal["float", "int", "uint", "bool"]

_WIDTHS: dict[str, tuple[int, ...]] = {
    "float": (16, 32, 64),
    "int": (8, 16, 32, 64),
    "uint": (8, 16, 32, 64),
    "bool": (8,),
}
_SPELLING = re.compile(r"(float|uint|int|bool)([0-9]*)(?:x([0-9]+))?")


@dataclass(frozen=True, slots=True)
class DType:
    """An element type: ``kind`` (float, int, uint or bool), ``bits`` per lane, ``lanes``."""

    kind: Kind
    bits: int
    lanes: int = 1

    def __post_init__(self) -> None:
        if self.bits not in _WIDTHS.get(self.kind, ()) or self.lanes < 1:
            raise Error(f"no dtype of kind {self.kind!r} with {self.bits} bits and "
                        f"{self.lanes} lanes")

    @staticmethod
    def parse(s: str) -> DType:
        """The dtype a string names: ``float32``, ``uint8``, ``bool``, ``float32x8``."""
        m = _SPELLING.fullmatch(s)
        if m is None:
            raise Error(f"{s!r} is not a dtype (such as float32, int8, uint16 or bool)")
        kind, bits, lanes = m.group(1), m.group(2), m.group(3)
        width_given = bits != ""
        if width_given == (kind == "bool") or (lanes is not None and int(lanes) < 1):
            # bool has no width ("bool8" is not a dtype), the others need one ("int" is not)
            raise Error(f"{s!r} is not a dtype (such as float32, int8, uint16 or bool)")
        width = 8 if kind == "bool" else int(bits)
        if width not in _WIDTHS[kind]:
            raise Error(f"unsupported dtype {s!r}: {kind} comes in "
                        f"{', '.join(str(w) for w in _WIDTHS[kind])} bits")
        # _SPELLING admits only the four kinds.
        return DType(cast(Kind, kind), width, 1 if lanes is None else int(lanes))

    def __str__(self) -> str:
        name = "bool" if self.kind == "bool" else f"{self.kind}{self.bits}"
        return name if self.lanes == 1 else f"{name}x{self.lanes}"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """A signed integer."""
        return self.kind == "int"

    @property
    def is_uint(self) -> bool:
        return self.kind == "uint"

    @property
    def is_integer(self) -> bool:
        """A signed or unsigned integer (not bool)."""
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def itemsize(self) -> int:
        """Bytes per element, all lanes together."""
        return self.bits // 8 * self.lanes

    @property
    def element(self) -> DType:
        """The dtype of one lane."""
        return self if self.lanes == 1 else DType(self.kind, self.bits)


@functools.lru_cache(maxsize=256)
def _parse(s: str) -> DType:
    return DType.parse(s)


def dtype_of(s: str | DType) -> DType:
    """The `DType` of a dtype string (parsed once, then remembered); a `DType` as it is."""
    return s if isinstance(s, DType) else _parse(s)
