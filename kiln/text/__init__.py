"""Relay's text format: parser, printer and diagnostics."""
