"""Frontends: programs from outside kiln's text format.

``script`` (staged Python, `kiln/frontend/script.py`): ``@kiln.script`` turns a Python function
with ``kiln.Tensor[shape, dtype]`` annotations into a typed kiln Function.
"""

from kiln.frontend.script import ScriptFunction, Tensor, script
from kiln.frontend.script_values import ScriptError

__all__ = ["ScriptError", "ScriptFunction", "Tensor", "script"]
