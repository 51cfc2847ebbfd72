"""Pictures of kiln programs: a dataflow graph of ``@main`` (`dataflow.py`), weights drawn
inside their operators (`weights.py`), blocks collapsed on request (`collapse.py`, with origins
from `origin.py`), laid out in layers (`layout.py`, `scene.py`) and written as SVG (`svg.py`),
PNG or PDF (`export.py`), with fused groups outlined. No graphviz needed.

    svg = kiln.viz.graph_svg(kiln.optimize(mod, params=params))
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kiln.errors import Error
from kiln.infer import infer_types
from kiln.ir.module import IRModule
from kiln.viz.collapse import Block, blocks_to_collapse, collapse
from kiln.viz.dataflow import DataflowGraph, Group, Node, dataflow_graph
from kiln.viz.layout import Layout, layout
from kiln.viz.origin import Origins, name_nodes, onnx_origins
from kiln.viz.scene import DrawOptions, Scene, build_scene
from kiln.viz.svg import render_svg
from kiln.viz.weights import fold_weights


def picture(mod: IRModule, name: str = "main", *, weights: Collection[str] = (),
            options: DrawOptions | None = None, origins: Origins | None = None,
            collapse_what: Sequence[str] | None = None) -> Scene:
    """The laid-out picture of function ``name`` of ``mod`` (type-checked first, for shapes).

    ``weights`` names parameters drawn inside their operators, like constants; ``origins``
    (from `onnx_origins`) names operators after their ONNX nodes; ``collapse_what`` (None: no
    collapsing) collapses blocks, as `blocks_to_collapse` says."""
    graph = name_nodes(fold_weights(dataflow_graph(infer_types(mod), name, weights)), origins)
    if collapse_what is not None:
        if origins is None and collapse_what:
            raise Error("collapsing by ONNX operator or name scope needs an ONNX model; a "
                        "Relay program collapses its fused groups (no names given)")
        keys, blocks = blocks_to_collapse(graph, origins, collapse_what)
        graph = collapse(graph, keys, blocks)
    return build_scene(graph, options)


def graph_svg(mod: IRModule, name: str = "main", title: str = "", *,
              weights: Collection[str] = (), options: DrawOptions | None = None,
              origins: Origins | None = None, collapse_what: Sequence[str] | None = None) -> str:
    """SVG text picturing function ``name`` of ``mod`` (the other arguments: `picture`'s)."""
    scene = picture(mod, name, weights=weights, options=options, origins=origins,
                    collapse_what=collapse_what)
    return render_svg(scene, title or f"@{name}")


__all__ = ["Block", "DataflowGraph", "DrawOptions", "Group", "Layout", "Node", "Origins",
           "Scene", "build_scene", "collapse", "dataflow_graph", "fold_weights", "graph_svg",
           "layout", "onnx_origins", "picture", "render_svg"]
