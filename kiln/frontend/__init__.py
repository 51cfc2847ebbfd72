"""Frontends: programs from outside kiln's text format.

``script`` (staged Python, `kiln/frontend/script.py`): ``@kiln.script`` turns a Python function
with ``kiln.Tensor[shape, dtype]`` annotations into a typed kiln Function.

``from_torch`` (`kiln/frontend/torch/`): a ``torch.nn.Module`` through ``torch.export`` to a
kiln module and its weights; torch is imported on the first call only.
"""

from kiln.frontend.onnx import from_onnx
from kiln.frontend.script import ScriptFunction, Tensor, script
from kiln.frontend.script_values import ScriptError
from kiln.frontend.torch import from_torch

__all__ = ["ScriptError", "ScriptFunction", "Tensor", "from_onnx", "from_torch", "script"]
