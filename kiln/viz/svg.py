"""The picture of a `DataflowGraph` as SVG text, written by hand (no graphviz).

Each node is a rounded box with two lines — what computes the value (an operator name, an input's
name, ``constant``) and its type — and a ``<title>`` that viewers show on hover. A fused group
(one call of a ``Primitive=1`` function) is one dashed box, labelled with the operators it fuses,
holding its operator nodes stacked in evaluation order; the layout places the group as a whole,
so groups never overlap other nodes, and edges run between groups and nodes (edges inside a group
are implied by the order). Edges are polylines with arrowheads, one per pair of connected boxes.

Elements carry classes and ``data-`` attributes so that scripts and tests can find them:
``<g class="node">`` (a node outside any group), ``<g class="group">`` holding
``<g class="member">`` (its operators), ``<path class="edge" data-from data-to>`` (box indices).
All text is escaped.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from kiln.viz.dataflow import DataflowGraph
from kiln.viz.layout import Layout, layout

CHAR_WIDTH = 7.0  # of the 12px monospace font
NODE_HEIGHT = 36.0
MEMBER_HEIGHT = 32.0
GROUP_HEAD = 20.0  # the group's label above its operators
GROUP_PAD = 6.0
MAX_LABEL = 48

_FILL = {
    "input": "#dbeafe", "output": "#dcfce7", "constant": "#f3f4f6", "op": "#ffffff",
    "tuple": "#fef9c3", "get": "#fef9c3", "other": "#fde68a",
}

_STYLE = """
  text { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
  .node rect, .member rect { stroke: #374151; stroke-width: 1; }
  .detail { fill: #6b7280; font-size: 10px; }
  .edge { fill: none; stroke: #6b7280; stroke-width: 1; marker-end: url(#arrow); }
  .group rect { fill: #eef2ff; stroke: #6366f1; stroke-width: 1.2; stroke-dasharray: 5 3; }
  .group > text { fill: #4338ca; font-size: 10px; }
"""


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 3] + "..."


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def node_width(label: str, detail: str) -> float:
    return max(len(_short(label)), len(_short(detail)), 4) * CHAR_WIDTH + 16


def _units(graph: DataflowGraph) -> tuple[list[list[int]], list[int | None]]:
    """What the layout places: each node outside a group alone, each group as one box."""
    units: list[list[int]] = []
    group_of_unit: list[int | None] = []
    unit_of_group: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.group is None:
            units.append([i])
            group_of_unit.append(None)
        elif node.group in unit_of_group:
            units[unit_of_group[node.group]].append(i)
        else:
            unit_of_group[node.group] = len(units)
            units.append([i])
            group_of_unit.append(node.group)
    return units, group_of_unit


def render_svg(graph: DataflowGraph, title: str = "") -> str:
    """SVG text of ``graph``, laid out by `kiln.viz.layout`."""
    units, group_of_unit = _units(graph)
    unit_of = [0] * len(graph.nodes)
    for k, members in enumerate(units):
        for i in members:
            unit_of[i] = k
    widths, heights = [], []
    for members, g in zip(units, group_of_unit):
        if g is None:
            node = graph.nodes[members[0]]
            widths.append(node_width(node.label, node.detail))
            heights.append(NODE_HEIGHT)
        else:
            label = graph.groups[g - 1].label
            widths.append(max([node_width(graph.nodes[i].label, graph.nodes[i].detail)
                               for i in members] + [len(_short(label)) * 6.0]) + 2 * GROUP_PAD)
            heights.append(GROUP_HEAD + len(members) * (MEMBER_HEIGHT + 4) + GROUP_PAD - 4)
    edges = list(dict.fromkeys((unit_of[u], unit_of[v]) for u, v in graph.edges
                               if unit_of[u] != unit_of[v]))
    lay = layout(widths, heights, edges)
    return _svg(graph, units, group_of_unit, edges, lay, title)


def _svg(graph: DataflowGraph, units: list[list[int]], group_of_unit: list[int | None],
         edges: list[tuple[int, int]], lay: Layout, title: str) -> str:
    w, h = lay.total_width, lay.total_height
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(w)}" height="{_f(h)}" '
        f'viewBox="0 0 {_f(w)} {_f(h)}">',
        f"<title>{escape(title)}</title>" if title else "",
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
        "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"
        "<path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#6b7280\"/></marker></defs>",
        f"<style>{_STYLE}</style>",
        f'<rect width="{_f(w)}" height="{_f(h)}" fill="#ffffff"/>',
    ]
    for (u, v), points in zip(edges, lay.edges):
        d = " ".join(f"{'M' if i == 0 else 'L'} {_f(px)} {_f(py)}"
                     for i, (px, py) in enumerate(points))
        out.append(f'<path class="edge" data-from="{u}" data-to="{v}" d="{d}"/>')
    for k, (members, g) in enumerate(zip(units, group_of_unit)):
        left, top = lay.x[k] - lay.width[k] / 2, lay.y[k]
        if g is None:
            out.append(_node(graph, members[0], "node", left, top, lay.width[k], NODE_HEIGHT))
            continue
        group = graph.groups[g - 1]
        out.append(
            f'<g class="group" data-id="{k}" data-group="{g}" '
            f'data-ops={quoteattr(" ".join(group.ops))}>'
            f"<title>{escape(group.label)}</title>"
            f'<rect x="{_f(left)}" y="{_f(top)}" width="{_f(lay.width[k])}" '
            f'height="{_f(lay.height[k])}" rx="6"/>'
            f'<text x="{_f(left + GROUP_PAD)}" y="{_f(top + 13)}">{escape(_short(group.label))}'
            "</text>")
        y = top + GROUP_HEAD
        for i in members:
            out.append(_node(graph, i, "member", left + GROUP_PAD, y,
                             lay.width[k] - 2 * GROUP_PAD, MEMBER_HEIGHT))
            y += MEMBER_HEIGHT + 4
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(line for line in out if line) + "\n"


def _node(graph: DataflowGraph, i: int, cls: str, left: float, top: float, width: float,
          height: float) -> str:
    node = graph.nodes[i]
    tip = node.title or (f"{node.label}: {node.detail}" if node.detail else node.label)
    mid = left + width / 2
    return (f'<g class="{cls}" data-node="{i}" data-kind="{node.kind}">'
            f"<title>{escape(tip)}</title>"
            f'<rect x="{_f(left)}" y="{_f(top)}" width="{_f(width)}" height="{_f(height)}" '
            f'rx="4" fill="{_FILL.get(node.kind, "#ffffff")}"/>'
            f'<text x="{_f(mid)}" y="{_f(top + height / 2 - 3)}" text-anchor="middle">'
            f"{escape(_short(node.label))}</text>"
            f'<text class="detail" x="{_f(mid)}" y="{_f(top + height / 2 + 10)}" '
            f'text-anchor="middle">{escape(_short(node.detail))}</text></g>')
