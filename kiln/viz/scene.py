"""The geometry of a picture: where each box, group outline and wire of a `DataflowGraph` goes.

Each node is a box of text lines: what computes it, its type, the weights drawn inside it
(`weights.py`), and on request its attributes and where it came from. A fused group is laid out
on its own first, as a small graph of its operators with ports: one at its top for each value it
reads from outside, one at its bottom for each value it gives out. Then the whole picture is
laid out with each group as one box, the edges leaving and entering groups at their ports. So
groups never overlap other boxes, the edges inside a group are drawn like any other, and each
edge of the graph is a route of wires: from its producer (through the producer's group to its
bottom port), between the boxes, then into the consumer's group from its top port.

`Scene` is what `svg.py` writes and what the tests check (boxes apart, inside the canvas, each
route starting on its producer and ending on its consumer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.viz.dataflow import DataflowGraph, Node
from kiln.viz.layout import DUMMY_WIDTH, Layout, Point, layout

CHAR_WIDTH = 7.0  # of the 12px monospace font
LINE_HEIGHT = 14.0
BOX_PAD = 8.0  # above and below the text of a box
GROUP_HEAD = 20.0  # the group's label above its operators
GROUP_PAD = 8.0
GROUP_LAYER_GAP = 28.0
MAX_LINE = 48


@dataclass
class DrawOptions:
    """What the boxes show beyond the operator, its type and its weights."""

    attrs: bool = False  # non-default attributes: strides=[2, 2], padding=[3, 3, 3, 3]
    names: bool = False  # where each node came from: its ONNX node, or file and line


@dataclass
class Box:
    """A rectangle: left, top, width, height."""

    x: float
    y: float
    w: float
    h: float


@dataclass
class Scene:
    """Boxes (one per node), group outlines, wires, and each edge's route through the wires.

    ``routes[(u, v)]`` lists the wires edge u -> v follows, in order (see `Layout`); the last
    one ends on v and is the one drawn with an arrowhead.
    """

    graph: DataflowGraph
    text: list[list[str]]  # each node's lines
    boxes: list[Box]
    groups: dict[int, Box]
    wires: list[list[Point]] = field(default_factory=list)
    routes: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    width: float = 0.0
    height: float = 0.0


def short(text: str) -> str:
    """A line cut to `MAX_LINE` characters."""
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 3] + "..."


def node_lines(node: Node, options: DrawOptions) -> list[str]:
    """The lines of a node's box, top to bottom."""
    lines = [node.label, node.detail, *node.lines]
    if options.attrs:
        lines += node.attrs
    if options.names and node.name:
        lines.append(node.name)
    return [line for line in lines if line] or [node.kind]


def box_size(lines: list[str]) -> tuple[float, float]:
    return (max(max(len(short(t)) for t in lines), 4) * CHAR_WIDTH + 16,
            len(lines) * LINE_HEIGHT + 2 * BOX_PAD)


@dataclass
class _Group:
    """One group laid out alone: members, ports, its inner layout, its size."""

    members: list[int]
    ins: dict[int, int]  # outside producer -> its port (a node of the inner layout)
    outs: dict[int, int]  # member read outside -> its port
    inner: list[tuple[int, int]]  # inner layout edges
    lay: Layout
    width: float
    height: float
    offset: float = 0.0  # of the inner layout in the box, when the label is wider


def _lay_out_group(members: list[int], graph: DataflowGraph, group: int, label: str,
                   sizes: list[tuple[float, float]], reads: list[list[int]],
                   readers: list[list[int]]) -> _Group:
    local = {m: i for i, m in enumerate(members)}
    widths = [sizes[m][0] for m in members]
    heights = [sizes[m][1] for m in members]
    ins: dict[int, int] = {}
    outs: dict[int, int] = {}
    edges: list[tuple[int, int]] = []
    for m in members:
        for p in reads[m]:
            if p in local:
                edges.append((local[p], local[m]))
                continue
            if p not in ins:
                ins[p] = len(widths)
                widths.append(DUMMY_WIDTH)
                heights.append(0.0)
            edges.append((ins[p], local[m]))
        if any(graph.nodes[c].group != group for c in readers[m]):
            outs[m] = len(widths)
            widths.append(DUMMY_WIDTH)
            heights.append(0.0)
            edges.append((local[m], outs[m]))
    lay = layout(widths, heights, edges, top=list(ins.values()), bottom=list(outs.values()),
                 layer_gap=GROUP_LAYER_GAP, margin=GROUP_PAD)
    head = len(short(label)) * 6.0 + 2 * GROUP_PAD
    width = max(lay.total_width, head)
    return _Group(members, ins, outs, edges, lay, width, GROUP_HEAD + lay.total_height,
                  (width - lay.total_width) / 2)


def build_scene(graph: DataflowGraph, options: DrawOptions | None = None) -> Scene:
    """Lay out ``graph``: every node's box, every group's outline, every edge's wires."""
    options = options or DrawOptions()
    n = len(graph.nodes)
    text = [node_lines(node, options) for node in graph.nodes]
    sizes = [box_size(t) for t in text]
    reads: list[list[int]] = [[] for _ in range(n)]
    readers: list[list[int]] = [[] for _ in range(n)]
    for u, v in graph.edges:
        reads[v].append(u)
        readers[u].append(v)

    # Units: what the outer layout places (a node outside any group, or a whole group).
    unit_of = [0] * n
    unit_group: list[int | None] = []
    first: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        g = node.group
        if g is None:
            unit_of[i] = len(unit_group)
            unit_group.append(None)
        else:
            if g not in first:
                first[g] = len(unit_group)
                unit_group.append(g)
                members[g] = []
            unit_of[i] = first[g]
            members[g].append(i)
    laid = {g: _lay_out_group(ms, graph, g, graph.groups[g - 1].label, sizes, reads, readers)
            for g, ms in members.items()}
    widths = [0.0] * len(unit_group)
    heights = [0.0] * len(unit_group)
    for i in range(n):
        if graph.nodes[i].group is None:
            widths[unit_of[i]], heights[unit_of[i]] = sizes[i]
    for g, grp in laid.items():
        widths[first[g]], heights[first[g]] = grp.width, grp.height

    def port_dx(g: int, port: int) -> float:
        grp = laid[g]
        return grp.offset + grp.lay.x[port] - grp.width / 2

    # Outer edges, one per (producer unit, its port, consumer unit, its port).
    outer: dict[tuple[int, float, int, float], int] = {}
    outer_edges: list[tuple[int, int]] = []
    tails: list[float] = []
    heads: list[float] = []
    edge_outer: dict[tuple[int, int], int] = {}
    for u, v in graph.edges:
        gu, gv = graph.nodes[u].group, graph.nodes[v].group
        if gu is not None and gu == gv:
            continue
        tail = port_dx(gu, laid[gu].outs[u]) if gu is not None else 0.0
        head = port_dx(gv, laid[gv].ins[u]) if gv is not None else 0.0
        key = (unit_of[u], tail, unit_of[v], head)
        if key not in outer:
            outer[key] = len(outer_edges)
            outer_edges.append((unit_of[u], unit_of[v]))
            tails.append(tail)
            heads.append(head)
        edge_outer[(u, v)] = outer[key]
    lay = layout(widths, heights, outer_edges, tails=tails, heads=heads)

    boxes = [Box(0.0, 0.0, 0.0, 0.0) for _ in range(n)]
    for i in range(n):
        if graph.nodes[i].group is None:
            k = unit_of[i]
            boxes[i] = Box(lay.x[k] - lay.width[k] / 2, lay.y[k], lay.width[k], lay.height[k])
    scene = Scene(graph, text, boxes, {}, list(lay.wires), {}, lay.total_width,
                  lay.total_height)
    # Each group's inner wires, moved to where its box is; connectors from its ports to its
    # outline (an outer wire ends at the outline, at the port's x).
    inner_route: dict[tuple[int, int], list[int]] = {}
    in_wire: dict[tuple[int, int], int] = {}  # (group, outside producer) -> connector
    out_wire: dict[tuple[int, int], int] = {}  # (group, member) -> connector
    for g, grp in laid.items():
        k = first[g]
        left, top = lay.x[k] - lay.width[k] / 2, lay.y[k]
        scene.groups[g] = Box(left, top, grp.width, grp.height)
        ox, oy = left + grp.offset, top + GROUP_HEAD
        base = len(scene.wires)
        scene.wires += [[(ox + px, oy + py) for px, py in w] for w in grp.lay.wires]
        for local, m in enumerate(grp.members):
            il = grp.lay
            boxes[m] = Box(ox + il.x[local] - il.width[local] / 2, oy + il.y[local],
                           il.width[local], il.height[local])
        back = {port: p for p, port in grp.ins.items()}
        for e, (a, b) in enumerate(grp.inner):
            wires = [base + w for w in grp.lay.routes[e]]
            if a in back:  # from an in-port to a member
                inner_route[(back[a], grp.members[b])] = wires
            elif b < len(grp.members):
                inner_route[(grp.members[a], grp.members[b])] = wires
            else:  # from a member to its out-port
                inner_route[(grp.members[a], -1)] = wires
        for p, port in grp.ins.items():
            x = lay.x[k] + port_dx(g, port)
            in_wire[(g, p)] = len(scene.wires)
            scene.wires.append([(x, top), (x, oy + grp.lay.y[port])])
        for m, port in grp.outs.items():
            x = lay.x[k] + port_dx(g, port)
            out_wire[(g, m)] = len(scene.wires)
            scene.wires.append([(x, oy + grp.lay.y[port]), (x, top + grp.height)])
    for u, v in graph.edges:
        gu, gv = graph.nodes[u].group, graph.nodes[v].group
        if gu is not None and gu == gv:
            scene.routes[(u, v)] = inner_route[(u, v)]
            continue
        route: list[int] = []
        if gu is not None:
            route += inner_route[(u, -1)] + [out_wire[(gu, u)]]
        route += lay.routes[edge_outer[(u, v)]]
        if gv is not None:
            route += [in_wire[(gv, u)]] + inner_route[(u, v)]
        scene.routes[(u, v)] = route
    return scene
