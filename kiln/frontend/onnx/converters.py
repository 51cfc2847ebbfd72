"""Loads the converter table: importing this module registers every family's converters.

`model.py` imports it so that a lookup never sees a half-filled table; the package's
``__init__`` does not, so that ``import kiln`` does not import ``onnx`` (the first call to
``from_onnx`` does).
"""

from kiln.frontend.onnx import (  # noqa: F401 - each module registers its converters
    ops_bits,
    ops_control,
    ops_dft,
    ops_einsum,
    ops_gridsample,
    ops_index,
    ops_math,
    ops_nn,
    ops_norm,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_rnn,
    ops_tensor,
    ops_training,
    ops_trig,
)
