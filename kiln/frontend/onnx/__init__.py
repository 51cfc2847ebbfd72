"""The ONNX importer: ``from_onnx(model) -> (IRModule, params)``.

    mod, params = kiln.frontend.onnx.from_onnx("resnet18.onnx")
    y = kiln.interpret(mod, x, params=params)

Each ONNX operator is converted by an entry of a versioned table (`table.py`), one file per
family: ``ops_math.py`` (elementwise), ``ops_trig.py`` (inverse trigonometry), ``ops_bits.py``
(bit shifts and bitwise logic), ``ops_tensor.py`` (shapes and layouts), ``ops_index.py``
(slices, gathers, scatters, padding), ``ops_nn.py`` (convolution, pooling, matrix products),
``ops_norm.py`` (normalizations, softmax), ``ops_reduce.py`` (reductions), ``ops_control.py``
(If, Loop, Scan), ``ops_resize.py`` (Resize, Upsample), ``ops_gridsample.py``, ``ops_rnn.py``
(RNN, GRU, LSTM), ``ops_quant.py`` (quantization), ``ops_dft.py``, ``ops_einsum.py`` and
``ops_training.py`` (optimizer steps); `converters.py` loads them all. Operators that ONNX
defines by a function body and that the table lacks are converted through that body
(`functions.py`). `summary.py` describes a model without converting it (``kiln show``);
`conformance.py` runs the ONNX backend node tests. `limits.py` bounds the work and memory a
model may cost while it is imported (hostile files), configurable by ``limits=`` and
``KILN_MAX_*`` environment variables.

The ``onnx`` package is imported on first use, not by ``import kiln``: the functions here
import the modules that do the work when called, and the other names load on first access.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from kiln.frontend.onnx.limits import Limits
    from kiln.ir.module import IRModule

# name -> the module that defines it, loaded on first access (PEP 562).
_LAZY = {
    "ImportedModel": "model",
    "Limits": "limits",
    "import_model": "model",
    "load_model": "model",
    "MAX_OPSET": "table",
    "MIN_OPSET": "table",
    "converter": "table",
    "supported_operators": "table",
}


def from_onnx(model: Any, *, params_as: str = "params",
              shapes: Mapping[str, Sequence[Any]] | None = None,
              constants: Mapping[str, Any] | None = None,
              check: bool = True,
              limits: Limits | Mapping[str, Any] | None = None
              ) -> tuple[IRModule, dict[str, np.ndarray]]:
    """An ONNX model (a path, bytes or an onnx.ModelProto) as a kiln module and its weights.

    Imports onnx on the first call; the arguments are those of
    `kiln.frontend.onnx.model.from_onnx`, which documents them.
    """
    from kiln.frontend.onnx.model import from_onnx as convert

    return convert(model, params_as=params_as, shapes=shapes, constants=constants, check=check,
                   limits=limits)


def summary(model: Any) -> str:
    """A model's inputs, outputs, operators (with counts), parameter count and types, as text."""
    from kiln.frontend.onnx.summary import summary as describe

    return describe(model)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"kiln.frontend.onnx.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'kiln.frontend.onnx' has no attribute {name!r}")


__all__ = ["MAX_OPSET", "MIN_OPSET", "ImportedModel", "Limits", "converter", "from_onnx",
           "import_model", "load_model", "summary", "supported_operators"]
