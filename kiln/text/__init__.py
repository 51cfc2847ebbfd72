"""Relay's text format: parser, printer and diagnostics."""

from kiln.text.parser import parse, parse_expr, parse_type
from kiln.text.printer import astext, type_text

__all__ = ["astext", "parse", "parse_expr", "parse_type", "type_text"]
