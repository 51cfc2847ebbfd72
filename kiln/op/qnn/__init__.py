"""Relay's quantized operators (the ``qnn.`` namespace): ``kiln.op.qnn.dense(x, w, ...)``.

Each takes its scales and zero points as tensor arguments (scalars, or vectors along a channel
axis), as in Relay, and has a numpy reference with exact integers and a canonical form of core
operators (`kiln.op.qnn.common`), which the ``qnn-canonicalize`` pass substitutes before
compilation. See docs/quantization.md.
"""

from kiln.op.qnn.binary import add, mul
from kiln.op.qnn.common import CANONICAL
from kiln.op.qnn.concat import concatenate
from kiln.op.qnn.conv import conv2d
from kiln.op.qnn.linear import batch_matmul, dense
from kiln.op.qnn.quantize import dequantize, quantize, requantize

__all__ = [
    "CANONICAL", "add", "batch_matmul", "concatenate", "conv2d", "dense", "dequantize", "mul",
    "quantize", "requantize",
]
