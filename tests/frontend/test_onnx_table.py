"""The converter table against ONNX's operator schemas.

Each entry's ``since`` must be a version at which ONNX itself changed the operator (a
converter from a version that does not exist would hide which ONNX change it handles), and
every operator in the table must be one ONNX defines.
"""

from __future__ import annotations

import onnx.defs

from kiln.frontend.onnx.converters import ops_math  # noqa: F401 - fills the table
from kiln.frontend.onnx.table import all_converters, lookup


def schema_versions() -> dict[tuple[str, str], set[int]]:
    versions: dict[tuple[str, str], set[int]] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        domain = "" if s.domain in ("", "ai.onnx") else s.domain
        versions.setdefault((domain, s.name), set()).add(int(s.since_version))
    return versions


def test_every_entry_starts_at_an_onnx_version():
    known = schema_versions()
    wrong = []
    for row in all_converters():
        if row.domain == "com.microsoft":  # ONNX Runtime's contrib operators: not onnx's,
            assert row.since == 1, row.name  # all at version 1 (kiln/frontend/onnx/ops_quant.py)
            continue
        since = known.get((row.domain, row.op_type))
        if since is None:
            wrong.append(f"{row.name}: ONNX defines no operator {row.op_type!r}")
        elif row.since not in since:
            wrong.append(f"{row.name}: ONNX changed {row.op_type} at {sorted(since)}")
    assert not wrong, "\n".join(wrong)


def test_lookup_picks_the_latest_entry_at_or_below_the_opset():
    assert lookup("", "Squeeze", 12).since < 13 <= lookup("", "Squeeze", 13).since
    assert lookup("", "Resize", 10).since == 10
    assert lookup("", "Resize", 19).since == 11
    assert lookup("", "NoSuchOperator", 17) is None
