"""kiln's operators: the registry and a builder for each operator (``kiln.op.nn.relu(x)``)."""

from kiln.op.registry import REQUIRED, Attr, OpDef, OpPattern, all_ops, get, lookup, register

__all__ = ["REQUIRED", "Attr", "OpDef", "OpPattern", "all_ops", "get", "lookup", "register"]
