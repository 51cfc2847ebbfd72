"""Frontends: programs from outside kiln's text format.

``script`` (staged Python, `kiln/frontend/script.py`): ``@kiln.script`` turns a Python function
with ``kiln.Tensor[shape, dtype]`` annotations into a typed kiln Function.

``from_onnx`` (`kiln/frontend/onnx/`): an ONNX model (path, bytes or ModelProto) to a kiln
module and its weights; onnx is imported on the first call only.
"""

from kiln.frontend.onnx import from_onnx
from kiln.frontend.script import ScriptFunction, Tensor, script
from kiln.frontend.script_values import ScriptError

__all__ = ["ScriptError", "ScriptFunction", "Tensor", "from_onnx", "script"]
