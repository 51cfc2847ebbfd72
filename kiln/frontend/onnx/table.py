"""The converter table: ONNX operators, by domain and opset, to the functions that convert them.

STYLE.md principle 11 (TVM's ``_impl_vN``): each entry is one ONNX operator from one operator
version on, written

    @converter("Squeeze", since=13)      # axes moved from an attribute to an input in 13
    def squeeze_13(ctx: NodeContext) -> Expr: ...

A model importing opset N of a domain uses, for each operator, the entry with the largest
``since`` not above N: the versions between two entries only widened the types an operator
accepts, or added attributes whose defaults keep the older meaning. ``since`` is always a
version at which ONNX itself changed the operator (tests/frontend/test_onnx_table.py checks
this against ``onnx.defs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln.errors import InternalError

if TYPE_CHECKING:
    from kiln.frontend.onnx.context import NodeContext

DEFAULT_DOMAIN = ""
# The opsets of the default domain the table is written for. Older opsets work for the
# operators whose old versions have an entry (the `light` model zoo is opset 9).
MIN_OPSET = 11
MAX_OPSET = 28

ConvertFn = Callable[["NodeContext"], Any]


@dataclass(frozen=True)
class Converter:
    """One row of the table."""

    op_type: str
    domain: str
    since: int
    fn: ConvertFn

    @property
    def name(self) -> str:
        return f"{self.domain + '.' if self.domain else ''}{self.op_type}-{self.since}"


_TABLE: dict[tuple[str, str], list[Converter]] = {}


def converter(op_types: str | Sequence[str], since: int, domain: str = DEFAULT_DOMAIN
              ) -> Callable[[ConvertFn], ConvertFn]:
    """Register ``fn`` as the converter of ``op_types`` from operator version ``since`` on."""
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def register(fn: ConvertFn) -> ConvertFn:
        for op_type in names:
            rows = _TABLE.setdefault((domain, op_type), [])
            if any(r.since == since for r in rows):
                raise InternalError(f"ONNX converter {op_type}-{since} is registered twice")
            rows.append(Converter(op_type, domain, since, fn))
            rows.sort(key=lambda r: r.since)
        return fn

    return register


def normalize_domain(domain: str) -> str:
    """ONNX spells the default domain "" or "ai.onnx"."""
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def lookup(domain: str, op_type: str, opset: int) -> Converter | None:
    """The converter for an operator at an opset, or None when kiln has none."""
    rows = _TABLE.get((normalize_domain(domain), op_type), [])
    best = None
    for r in rows:
        if r.since <= opset:
            best = r
    return best


def versions(domain: str, op_type: str) -> list[int]:
    """The operator versions the table has an entry from (empty when it has none)."""
    return [r.since for r in _TABLE.get((normalize_domain(domain), op_type), [])]


def all_converters() -> list[Converter]:
    """Every row, sorted by domain, operator and version."""
    return [r for key in sorted(_TABLE) for r in _TABLE[key]]


def supported_operators(domain: str = DEFAULT_DOMAIN) -> list[str]:
    """The ONNX operators of a domain that kiln converts (at some opset)."""
    return sorted(op for d, op in _TABLE if d == normalize_domain(domain))
