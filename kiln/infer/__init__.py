"""Type inference: unification plus operator type relations (Relay's algorithm)."""

from kiln.infer.infer import infer_types

__all__ = ["infer_types"]
