"""The reference interpreter and its run-time values."""

from kiln.eval.interpreter import Interpreter, interpret
from kiln.eval.values import Closure, ConstructorValue, RefValue, adt_to_list

__all__ = ["Closure", "ConstructorValue", "Interpreter", "RefValue", "adt_to_list", "interpret"]
