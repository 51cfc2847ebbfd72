"""Writing a picture to a file in the format its extension names: SVG, or PNG and PDF through
cairosvg (an optional dependency: ``pip install 'kiln[graph]'``, which needs the system's
cairo library). An extension kiln cannot write is refused, never written as SVG by another name.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kiln.errors import Error

FORMATS = (".svg", ".png", ".pdf")
_CONVERTERS = {".png": "svg2png", ".pdf": "svg2pdf"}
INSTALL = "pip install 'kiln[graph]' (cairosvg; it needs the cairo library, e.g. libcairo2)"


def converter_error(suffix: str) -> str | None:
    """Why ``suffix`` cannot be written here (cairosvg missing), or None when it can."""
    if suffix not in _CONVERTERS:
        return None
    try:
        importlib.import_module("cairosvg")
    except (ImportError, OSError) as exc:  # OSError: cairosvg found, the cairo library not
        return (f"writing {suffix[1:].upper()} needs cairosvg, which cannot be loaded here "
                f"({exc}); install it with {INSTALL}, or write .svg")
    return None


def check_output(path: str) -> str:
    """The format of ``path`` by its extension; a kiln.Error when kiln cannot write it."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        got = f"{suffix!r}" if suffix else "no extension"
        raise Error(f"{path}: kiln graph writes {', '.join(FORMATS)} files, not {got}")
    why = converter_error(suffix)
    if why is not None:
        raise Error(f"{path}: {why}")
    return suffix


def export(svg: str, path: str) -> None:
    """Write the picture ``svg`` to ``path`` in the format its extension names."""
    suffix = check_output(path)
    try:
        if suffix == ".svg":
            Path(path).write_text(svg, encoding="utf-8")
            return
        cairosvg = importlib.import_module("cairosvg")
        data = getattr(cairosvg, _CONVERTERS[suffix])(bytestring=svg.encode("utf-8"))
        Path(path).write_bytes(data)
    except OSError as exc:
        raise Error(f"cannot write {path}: {exc.strerror or exc}") from None
