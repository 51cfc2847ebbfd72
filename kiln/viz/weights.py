"""Weights drawn inside the operators that read them, with their logical shapes.

A weight — a constant, or a parameter of ``@main`` named as a weight — read only by operators is
not a box of its own: each operator that reads it gets a line ``weight float32[64, 3, 7, 7]``,
the argument's name and the weight's type. After ``alter-layout`` a conv2d or dense weight is a
constant in the GEMM's panel layout (`kiln.op.nn.packed`), and after ``convert-layout`` a
conv2d weight is in channel blocks (``OIHW16i16o``), whose shape says nothing to a reader
(``float32[1, 11, 576, 6]``): the line shows the shape it stands for, recovered from the packed
call's attributes and its data's type, as the packed operators' type relations do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kiln.ir.expr import Call
from kiln.ir.ty import Dim, TensorType
from kiln.op.nn.conv import Conv2DAttrs
from kiln.op.nn.packed import DensePackedAttrs
from kiln.op.registry import lookup
from kiln.viz.dataflow import DataflowGraph, Node, type_label


def _data_shape(call: Call) -> tuple[Dim, ...] | None:
    ty = call.args[0].checked_type_
    return tuple(ty.shape) if isinstance(ty, TensorType) else None


def _conv2d_weight(call: Call, packed: TensorType) -> TensorType | None:
    """The OIHW weight of ``nn.conv2d_packed`` or ``nn.conv2d_winograd`` (channels, in
    channels per group, kh, kw)."""
    data, attrs = _data_shape(call), Conv2DAttrs.view(call.attrs)
    channels, kernel, groups = attrs.channels, attrs.kernel_size, attrs.groups
    if data is None or len(data) not in (4, 5) or channels is None or kernel is None:
        return None
    c = data[1]
    if len(data) == 5:  # NCHW[b]c (a Winograd convolution convert-layout made)
        c = c * data[4] if isinstance(c, int) and isinstance(data[4], int) else c
    per_group = c // groups if isinstance(c, int) and groups else c
    return TensorType((channels, per_group, kernel[0], kernel[1]), packed.dtype)


def _blocked_conv_weight(call: Call, packed: TensorType) -> TensorType | None:
    """The OIHW weight of ``nn.contrib_conv2d_NCHWc``, unblocked from its kernel layout
    (``OIHW16i16o``; channels the convert-layout pass padded included)."""
    from kiln.op.layout import logical_shape, parse_layout

    layout = parse_layout(Conv2DAttrs.view(call.attrs).kernel_layout)
    if len(packed.shape) != len(layout.axes):
        return None
    sizes = logical_shape(packed.shape, layout)
    return TensorType(tuple(sizes[a] for a in "OIHW"), packed.dtype)


def _dense_weight(call: Call, packed: TensorType) -> TensorType | None:
    """The (units, K) weight of ``nn.dense_packed``."""
    data, units = _data_shape(call), DensePackedAttrs.view(call.attrs).units
    if not data or units is None:
        return None
    return TensorType((units, data[-1]), packed.dtype)


# (operator, argument) -> the logical type of the packed weight it reads there.
_PACKED: dict[tuple[str, int], Callable[[Call, TensorType], TensorType | None]] = {
    ("nn.conv2d_packed", 1): _conv2d_weight,
    ("nn.conv2d_winograd", 1): _conv2d_weight,
    ("nn.contrib_conv2d_NCHWc", 1): _blocked_conv_weight,
    ("nn.dense_packed", 1): _dense_weight,
}


def weight_line(consumer: Node, k: int, weight: Node) -> str:
    """The line drawn inside ``consumer`` for the weight it reads as argument ``k``."""
    opdef = lookup(consumer.label)
    arg = opdef.inputs[k] if opdef is not None and k < len(opdef.inputs) else f"arg {k}"
    detail = weight.detail
    call = consumer.call
    if call is not None and (consumer.label, k) in _PACKED:
        packed = call.args[k].checked_type_
        if isinstance(packed, TensorType):
            logical = _PACKED[(consumer.label, k)](call, packed)
            detail = type_label(logical) if logical is not None else detail
    return f"{arg} {detail}"


def fold_weights(graph: DataflowGraph) -> DataflowGraph:
    """``graph`` with each weight read only by operators drawn inside them instead."""
    consumers: list[list[int]] = [[] for _ in graph.nodes]
    for u, v in graph.edges:
        consumers[u].append(v)
    folded = [n.kind in ("constant", "weight") and bool(consumers[i])
              and all(graph.nodes[c].kind == "op" for c in consumers[i])
              for i, n in enumerate(graph.nodes)]
    nodes: list[Node] = []
    new: list[int | None] = []
    for i, node in enumerate(graph.nodes):
        if folded[i]:
            new.append(None)
            continue
        lines = list(node.lines)
        tips = []
        for k, u in enumerate(node.inputs):
            if folded[u]:
                lines.append(weight_line(node, k, graph.nodes[u]))
                w = graph.nodes[u]
                tips.append(f"{lines[-1]} ({w.label}: {w.detail})")
        title = node.title
        if tips:
            title = "\n".join([title or f"{node.label}: {node.detail}", *tips])
        new.append(len(nodes))
        nodes.append(replace(node, lines=lines, title=title))
    return graph.renumbered(nodes, new)
