"""Neural-network operators (Relay's ``nn.`` namespace): ``kiln.op.nn.conv2d(x, w, ...)``."""

from kiln.op.nn.activation import leaky_relu, log_softmax, relu, softmax
from kiln.op.nn.conv import conv2d, conv2d_backward_weight, conv2d_transpose
from kiln.op.nn.conv_nchwc import contrib_conv2d_nchwc
from kiln.op.nn.dropout import dropout_train
from kiln.op.nn.int8_packed import conv2d_int8_packed, dense_int8_packed
from kiln.op.nn.int8_tiled import conv2d_int8_tiled, dense_int8_tiled
from kiln.op.nn.linear import batch_matmul, bias_add, dense
from kiln.op.nn.norm import batch_norm, dropout, layer_norm
from kiln.op.nn.packed import conv2d_packed, dense_packed
from kiln.op.nn.pool import (
    avg_pool2d,
    avg_pool2d_grad,
    global_avg_pool2d,
    global_max_pool2d,
    max_pool2d,
    max_pool2d_grad,
)
from kiln.op.nn.transform import batch_flatten, pad
from kiln.op.nn.winograd import conv2d_winograd

# fmt: off
__all__ = [
    "avg_pool2d", "avg_pool2d_grad", "batch_flatten", "batch_matmul", "batch_norm", "bias_add",
    "contrib_conv2d_nchwc",
    "conv2d", "conv2d_backward_weight", "conv2d_int8_packed", "conv2d_int8_tiled",
    "conv2d_packed", "conv2d_transpose", "conv2d_winograd",
    "dense",
    "dense_int8_packed", "dense_int8_tiled", "dense_packed", "dropout", "dropout_train",
    "global_avg_pool2d", "global_max_pool2d", "layer_norm", "leaky_relu", "log_softmax",
    "max_pool2d", "max_pool2d_grad", "pad", "relu", "softmax",
]
# fmt: on
