"""Which converter each node of an exported graph takes, and whether the graph must first be
decomposed to core ATen.

``torch.export.export`` gives composite operators (``aten.conv2d``, ``aten.batch_norm``) and
in-place ones (``aten.relu_`` of ``nn.ReLU(inplace=True)``). Decomposing to core ATen
(``ExportedProgram.run_decompositions``) removes both, but retraces the whole program: seconds
for a ResNet, minutes for a long unrolled LSTM. So the graph is converted as exported when every
node has a converter — an in-place node counts when it only overwrites a dead temporary, and is
then converted as its functional form — and decomposed otherwise, keeping the operators the
table converts directly.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram

from kiln.frontend.torch.registry import CONVERTERS

# Nodes that only check shapes at run time in torch; kiln's types have already checked them.
CHECKS = {
    "aten._assert_scalar.default",
    "aten._assert_tensor_metadata.default",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "aten._assert_async.msg",
}


def decompose(exported: ExportedProgram) -> ExportedProgram:
    """Core ATen, keeping the operators kiln converts; the graph as it is when it needs none.

    Decomposition retraces the whole program (seconds for a ResNet), so it runs only when some
    operator of the exported graph has no converter — it then also makes in-place operators
    functional.
    """
    if all(converter_name(node) is not None for node in graph_nodes(exported.graph_module)
           if node.op == "call_function" and not is_structural(node)):
        return exported
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if str(op) in CONVERTERS:
            table.pop(op)
    return exported.run_decompositions(table)


def graph_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes of a graph and of the branches of its ``torch.cond`` calls, nested or not."""
    nodes: list[torch.fx.Node] = []
    pending = [graph_module]
    while pending:
        module = pending.pop()
        for node in module.graph.nodes:
            nodes.append(node)
            if node.op == "get_attr":
                sub = getattr(module, str(node.target), None)
                if isinstance(sub, torch.fx.GraphModule):
                    pending.append(sub)
    return nodes


def is_structural(node: torch.fx.Node) -> bool:
    """Tuple projections, run-time checks and size arithmetic: no converter needed."""
    if node.target is operator.getitem or str(node.target) in CHECKS:
        return True
    return not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list))


def converter_name(node: torch.fx.Node) -> str | None:
    """The table entry that converts a node: its own overload's, or for an in-place operator
    (``aten.relu_.default``) that of the functional one when that is safe; None if none."""
    if node.target is torch.ops.higher_order.cond:
        return "cond"  # the importer converts its branches itself
    name = str(node.target)
    if name in CONVERTERS:
        return name
    parts = name.split(".")
    if len(parts) != 3 or not parts[1].endswith("_") or parts[1].endswith("__"):
        return None
    functional = f"{parts[0]}.{parts[1][:-1]}.{parts[2]}"
    if functional in CONVERTERS and _overwrites_only_a_dead_temporary(node):
        return functional
    return None


def _overwrites_only_a_dead_temporary(node: torch.fx.Node) -> bool:
    """Whether an in-place node overwrites its first argument, a fresh temporary (not an input,
    a weight or a view of another tensor) that nothing reads afterwards, directly or through a
    view: then computing a new value instead, as the functional operator does, gives the same
    program. (torch.export already makes later uses of the same Python tensor use the in-place
    node's result.)"""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments or not node.args:
        return False
    written = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
    if not written[0] or any(written[1:]):
        return False
    target = node.args[0]
    if not isinstance(target, torch.fx.Node) or target.op != "call_function":
        return False
    made_by = getattr(target.target, "_schema", None)
    if made_by is None or any(r.alias_info is not None for r in made_by.returns):
        return False  # a view, or the result of another in-place operator
    for user in target.users:
        if user is node:
            continue
        if node < user:  # fx nodes compare by their order in the graph
            return False  # read after it is overwritten
        used_by = getattr(user.target, "_schema", None)
        if used_by is None or any(r.alias_info is not None for r in used_by.returns):
            return False  # a view made before, which sees the new values when read after
    return True
