"""A `Scene` as SVG text, written by hand (no graphviz).

Each node is a rounded box of text lines — what computes the value (an operator name, an input's
name), its type, the weights it reads, and on request its attributes and origin — with a
``<title>`` that viewers show on hover. A fused group (one call of a ``Primitive=1`` function) is
a dashed box labelled with the operators it fuses, around its operators and the edges between
them. Wires are polylines; the last wire of each edge, the one that reaches its consumer, has an
arrowhead.

Elements carry classes and ``data-`` attributes so that scripts and tests can find them:
``<g class="node">`` (a node outside any group), ``<g class="group">`` holding
``<g class="member">`` (its operators), ``<path class="edge" data-from data-to>`` (the last wire
of the edge between those nodes) and ``<path class="wire">`` (trunks and the wires between
groups, shared by several edges). All text is escaped.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from kiln.viz.scene import LINE_HEIGHT, Scene, short

_FILL = {
    "input": "#dbeafe", "output": "#dcfce7", "constant": "#f3f4f6", "weight": "#f3f4f6",
    "op": "#ffffff", "tuple": "#fef9c3", "get": "#fef9c3", "other": "#fde68a",
    "block": "#fce7f3",
}

_STYLE = """
  text { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
  .node rect, .member rect { stroke: #374151; stroke-width: 1; }
  .detail { fill: #6b7280; font-size: 10px; }
  .edge, .wire { fill: none; stroke: #6b7280; stroke-width: 1; }
  .edge { marker-end: url(#arrow); }
  .group > rect { fill: #eef2ff; stroke: #6366f1; stroke-width: 1.2; stroke-dasharray: 5 3; }
  .group > text { fill: #4338ca; font-size: 10px; }
"""


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _path(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'} {_f(px)} {_f(py)}"
                    for i, (px, py) in enumerate(points))


def render_svg(scene: Scene, title: str = "") -> str:
    """SVG text of ``scene`` (see `kiln.viz.scene.build_scene`)."""
    graph = scene.graph
    w, h = scene.width, scene.height
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
    last = {route[-1]: edge for edge, route in scene.routes.items()}
    for g, box in scene.groups.items():
        group = graph.groups[g - 1]
        out.append(
            f'<g class="group" data-group="{g}" data-ops={quoteattr(" ".join(group.ops))}>'
            f"<title>{escape(group.label)}</title>"
            f'<rect x="{_f(box.x)}" y="{_f(box.y)}" width="{_f(box.w)}" height="{_f(box.h)}" '
            f'rx="6"/><text x="{_f(box.x + 8)}" y="{_f(box.y + 13)}">'
            f"{escape(short(group.label))}</text>")
        out += [_node(scene, i, "member") for i, node in enumerate(graph.nodes)
                if node.group == g]
        out.append("</g>")
    out += [_node(scene, i, "node") for i, node in enumerate(graph.nodes) if node.group is None]
    for k, points in enumerate(scene.wires):
        if k in last:
            u, v = last[k]
            out.append(f'<path class="edge" data-from="{u}" data-to="{v}" d="{_path(points)}"/>')
        else:
            out.append(f'<path class="wire" d="{_path(points)}"/>')
    out.append("</svg>")
    return "\n".join(line for line in out if line) + "\n"


def _node(scene: Scene, i: int, cls: str) -> str:
    node, box, lines = scene.graph.nodes[i], scene.boxes[i], scene.text[i]
    tip = node.title or "\n".join(lines)
    mid = box.x + box.w / 2
    top = box.y + box.h / 2 - len(lines) * LINE_HEIGHT / 2
    texts = []
    for k, line in enumerate(lines):
        cls_attr = ' class="detail"' if k else ""
        texts.append(f'<text{cls_attr} x="{_f(mid)}" y="{_f(top + k * LINE_HEIGHT + 11)}" '
                     f'text-anchor="middle">{escape(short(line))}</text>')
    return (f'<g class="{cls}" data-node="{i}" data-kind="{node.kind}">'
            f"<title>{escape(tip)}</title>"
            f'<rect x="{_f(box.x)}" y="{_f(box.y)}" width="{_f(box.w)}" height="{_f(box.h)}" '
            f'rx="4" fill="{_FILL.get(node.kind, "#ffffff")}"/>' + "".join(texts) + "</g>")
