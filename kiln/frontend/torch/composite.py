"""Composite ATen operators of torch.export's first graph, converted without decomposing it.

``torch.export.export`` gives a graph of composite operators (``aten.conv2d``,
``aten.batch_norm``, ``aten.flatten``, ``aten.max_pool2d``, ``aten.to``, ...). Decomposing it to
core ATen retraces the whole program, one to several seconds even for a small model, so the
importer converts the graph as exported when every operator in it has a converter (see
`decompose.py`). The converters here map each composite onto the converter
of the core operator it decomposes into: the two graphs give the same kiln program.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from kiln.frontend.torch import conv, elementwise, norm, reduce
from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.frontend.torch.shape import split_at_run_time, split_tensor
from kiln.ir import Expr, TensorType, const
from kiln.op import clip, nn


@converter("aten.conv2d.default", "aten.conv1d.default")
def conv_nd(n: AtenCall, x: Expr, weight: Expr, bias: Expr | None = None,
            stride: Sequence[int] = (1,), padding: Any = (0,), dilation: Sequence[int] = (1,),
            groups: int = 1) -> Expr:
    spatial = n.rank(x) - 2
    return conv.convolution(n, x, weight, bias, _n(stride, spatial), _n(padding, spatial),
                            _n(dilation, spatial), False, [0] * spatial, groups)


@converter("aten.conv_transpose2d.input", "aten.conv_transpose1d.default")
def conv_transpose_nd(n: AtenCall, x: Expr, weight: Expr, bias: Expr | None = None,
                      stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                      output_padding: Sequence[int] = (0,), groups: int = 1,
                      dilation: Sequence[int] = (1,)) -> Expr:
    spatial = n.rank(x) - 2
    return conv.convolution(n, x, weight, bias, _n(stride, spatial), _n(padding, spatial),
                            _n(dilation, spatial), True, _n(output_padding, spatial), groups)


def _n(v: int | Sequence[int], count: int) -> list[int]:
    vals = [v] if isinstance(v, int) else list(v)
    return vals * count if len(vals) == 1 else vals


@converter("aten.conv2d.padding", "aten.conv1d.padding")
def conv_nd_padding(n: AtenCall, x: Expr, weight: Expr, bias: Expr | None = None,
                    stride: Sequence[int] = (1,), padding: str = "valid",
                    dilation: Sequence[int] = (1,), groups: int = 1) -> Expr:
    """``padding="same"`` or ``"valid"``. "same" pads ``d·(k-1)`` in all, half before; an odd
    total puts the extra element after, padded separately (the convolution pads evenly)."""
    spatial = n.rank(x) - 2
    if padding == "valid":
        return conv_nd(n, x, weight, bias, stride, [0] * spatial, dilation, groups)
    kernel = n.static_shape(weight, "convolution with padding='same'")[2:]
    totals = [d * (k - 1) for d, k in zip(_n(dilation, spatial), kernel)]
    if any(t % 2 for t in totals):
        widths = [[0, 0], [0, 0], *([0, t % 2] for t in totals)]
        shape = n.static_shape(x, "convolution with padding='same' and an even kernel")
        padded = tuple(d + b + e for d, (b, e) in zip(shape, widths))
        dtype = n.dtype(x)
        x = n.note(nn.pad(x, pad_width=widths, pad_value=const(0.0, dtype)),
                   TensorType(padded, dtype))
    return conv_nd(n, x, weight, bias, stride, [t // 2 for t in totals], dilation, groups)


@converter("aten.batch_norm.default")
def batch_norm(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None,
               mean: Expr | None, var: Expr | None, training: bool, momentum: float,
               eps: float, _cudnn: bool = True) -> Expr:
    if training or mean is None or var is None:
        raise n.error("batch norm in training mode normalizes with the batch's statistics; "
                      "call model.eval() before importing")
    return norm.batch_norm(n, x, weight, bias, mean, var, momentum, eps)[0]


@converter("aten.instance_norm.default")
def instance_norm(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None,
                  mean: Expr | None, var: Expr | None, use_input_stats: bool, momentum: float,
                  eps: float, _cudnn: bool = True) -> Expr:
    if use_input_stats or mean is None or var is None:  # each sample's own statistics
        return norm.normalize(n, x, list(range(2, n.rank(x))), weight, bias, eps)
    return norm.batch_norm(n, x, weight, bias, mean, var, momentum, eps)[0]


@converter("aten.group_norm.default")
def group_norm(n: AtenCall, x: Expr, groups: int, weight: Expr | None = None,
               bias: Expr | None = None, eps: float = 1e-5, _cudnn: bool = True) -> Expr:
    shape = n.static_shape(x, "group_norm")
    rest = prod(shape[2:])
    out = norm.group_norm(n, x, weight, bias, shape[0], shape[1], rest, groups, eps)
    return out[0]


@converter("aten.max_pool2d.default")
def max_pool2d(n: AtenCall, x: Expr, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
               ceil_mode: bool = False) -> Expr:
    return conv.max_pool2d(n, x, kernel, stride, padding, dilation, ceil_mode)[0]


@converter("aten.flatten.using_ints")
def flatten(n: AtenCall, x: Expr, start: int = 0, end: int = -1) -> Expr:
    return n.reshape(x, n.out_sizes)


@converter("aten.unflatten.int")
def unflatten(n: AtenCall, x: Expr, dim: int, sizes: Sequence[int]) -> Expr:
    return n.reshape(x, n.out_sizes)


@converter("aten.chunk.default")
def chunk(n: AtenCall, x: Expr, chunks: int, dim: int = 0) -> list[Expr]:
    ax = axis(dim, n.rank(x), n)
    size = n.sizes(x)[ax]
    if not isinstance(size, int):  # the pieces' sizes as torch traced them
        return split_at_run_time(n, x, ax)
    return split_tensor(n, x, -(-size // chunks), dim)  # torch's chunk size, rounded up


@converter("aten.to.dtype", "aten.to.dtype_layout", "aten.type_as.default")
def to(n: AtenCall, x: Expr, *_: object) -> Expr:
    return elementwise.to_copy(n, x)


@converter("aten.relu6.default")
def relu6(n: AtenCall, x: Expr) -> Expr:
    return clip(x, a_min=0.0, a_max=6.0)


@converter("aten.var.dim")
def var_dim(n: AtenCall, x: Expr, dim: Sequence[int] | None = None, unbiased: bool = True,
            keepdim: bool = False) -> Expr:
    return reduce.var(n, x, dim, 1.0 if unbiased else 0.0, keepdim)


@converter("aten.__and__.Tensor")
def and_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    return elementwise.logical_and_(n, a, b)


@converter("aten.__or__.Tensor")
def or_(n: AtenCall, a: Expr, b: Expr) -> Expr:
    return elementwise.logical_or_(n, a, b)

