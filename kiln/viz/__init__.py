"""Pictures of kiln programs: a dataflow graph of ``@main`` (`dataflow.py`), laid out in layers
(`layout.py`) and written as SVG (`svg.py`), with fused groups outlined. No graphviz needed.

    svg = kiln.viz.graph_svg(kiln.optimize(mod, params=params))
"""

from __future__ import annotations

from kiln.infer import infer_types
from kiln.ir.module import IRModule
from kiln.viz.dataflow import DataflowGraph, Group, Node, dataflow_graph
from kiln.viz.layout import Layout, layout
from kiln.viz.svg import render_svg


def graph_svg(mod: IRModule, name: str = "main", title: str = "") -> str:
    """SVG text picturing function ``name`` of ``mod`` (type-checked first, for shapes)."""
    return render_svg(dataflow_graph(infer_types(mod), name), title or f"@{name}")


__all__ = ["DataflowGraph", "Group", "Layout", "Node", "dataflow_graph", "graph_svg", "layout",
           "render_svg"]
