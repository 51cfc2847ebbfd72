"""A layered drawing of a directed acyclic graph (the Sugiyama scheme, kept simple).

1. **Layers** by longest path from the sources, top to bottom; then each source (an input or a
   constant) moves down to just above its first consumer, so a weight is drawn beside the
   operator that reads it rather than at the top of a deep picture.
2. **Dummy nodes** on every layer an edge crosses, so long edges bend around nodes and take part
   in the ordering.
3. **Order** within each layer by the barycenter heuristic: a few sweeps down (each node at the
   mean position of its predecessors) and up (of its successors).
4. **Coordinates**: sweeps down, up and down again move each node toward the mean x of its
   neighbours in the layer above (below) — operators before dummy nodes before weights, which
   keeps the main path of a deep network straight — by Sugiyama's priority method: in order of
   priority, each node moves as far as the nodes placed before it allow, pushing the rest aside.
5. **Edges** are polylines from the bottom of the producer to the top of the consumer, running
   straight down through each row they cross at their dummy node's place.

Everything is loops over lists: thousands of nodes, and chains thousands deep, cost no stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.errors import InternalError

LAYER_GAP = 44.0  # vertical space between layers, for the edges
NODE_GAP = 18.0  # horizontal space between neighbouring nodes
DUMMY_WIDTH = 4.0
MARGIN = 24.0
SWEEPS = 4


@dataclass
class Layout:
    """Node boxes (centre x, top y, width, height), edge polylines, and the picture's size."""

    x: list[float]
    y: list[float]
    width: list[float]
    height: list[float]
    edges: list[list[tuple[float, float]]]
    total_width: float
    total_height: float
    layers: list[int]


def _topological(n: int, succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    indegree = [len(p) for p in pred]
    ready = [v for v in range(n) if indegree[v] == 0]
    ready.reverse()
    order: list[int] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for s in reversed(succ[v]):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if len(order) != n:
        raise InternalError("the graph to lay out has a cycle")
    return order


def _layers(n: int, order: list[int], succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    layer = [0] * n
    for v in order:
        for p in pred[v]:
            layer[v] = max(layer[v], layer[p] + 1)
    for v in order:  # sources down to just above their first consumer
        if not pred[v] and succ[v]:
            layer[v] = max(0, min(layer[s] for s in succ[v]) - 1)
    lowest = min(layer, default=0)  # the top layer may have emptied
    return [r - lowest for r in layer]


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _anchors(near: list[int], beyond: list[list[int]], real: int) -> list[int]:
    """The neighbours a node aligns with: operators first, then dummy nodes, then any.

    Nodes numbered ``real`` and above are dummies; a neighbour with no neighbours ``beyond``
    it is a dead end (a weight beside an operator). Were weights counted, each operator would
    be pulled toward its weights; were dummies, each residual connection would pull the main
    path toward the skip edge — and a deep network would drift sideways layer after layer.
    """
    inner = [u for u in near if beyond[u]]
    operators = [u for u in inner if u < real]
    return operators or inner or near


def _place(row: list[int], want: dict[int, float], x: list[float], width: list[float],
           priority: list[float]) -> None:
    """Move one layer's nodes toward ``want``, keeping their order and never overlapping.

    Sugiyama's priority method: nodes in order of priority each move as far toward what they
    want as the nodes already placed allow, pushing the others aside. An operator on the main
    path outranks a dummy node, which outranks a weight, so the main path stays straight.
    """
    k = len(row)
    xs = [x[v] for v in row]
    half = [width[v] / 2 for v in row]
    fixed = [False] * k
    by_priority = sorted(range(k), key=lambda i: -priority[row[i]])
    if k > 400:  # wide rows: pack left to right instead (quadratic otherwise)
        by_priority = by_priority[:1]
    for i in by_priority:
        target = want[row[i]]
        if target > xs[i]:
            room, need = float("inf"), half[i]
            for j in range(i + 1, k):
                if fixed[j]:
                    room = xs[j] - half[j] - NODE_GAP - need
                    break
                need += 2 * half[j] + NODE_GAP
            xs[i] = max(xs[i], min(target, room))
            for j in range(i + 1, k):
                edge = xs[j - 1] + half[j - 1] + NODE_GAP + half[j]
                if xs[j] >= edge:
                    break
                xs[j] = edge
        elif target < xs[i]:
            room, need = float("-inf"), half[i]
            for j in range(i - 1, -1, -1):
                if fixed[j]:
                    room = xs[j] + half[j] + NODE_GAP + need
                    break
                need += 2 * half[j] + NODE_GAP
            xs[i] = min(xs[i], max(target, room))
            for j in range(i - 1, -1, -1):
                edge = xs[j + 1] - half[j + 1] - NODE_GAP - half[j]
                if xs[j] <= edge:
                    break
                xs[j] = edge
        fixed[i] = True
    for v, value in zip(row, xs):
        x[v] = value


def layout(widths: Sequence[float], heights: Sequence[float],
           edges: Sequence[tuple[int, int]]) -> Layout:
    """Lay out nodes ``0..n-1`` of the given sizes; ``edges`` run from producer to consumer."""
    n = len(widths)
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        succ[u].append(v)
        pred[v].append(u)
    order = _topological(n, succ, pred)
    layer = _layers(n, order, succ, pred)

    # Dummy nodes: every edge becomes a chain through the layers it crosses.
    width = list(widths)
    height = list(heights)
    rank = list(layer)
    up: list[list[int]] = [[] for _ in range(n)]  # neighbours one layer up / down
    down: list[list[int]] = [[] for _ in range(n)]
    chains: list[list[int]] = []
    for u, v in edges:
        chain = [u]
        for r in range(layer[u] + 1, layer[v]):
            width.append(DUMMY_WIDTH)
            height.append(0.0)
            rank.append(r)
            up.append([])
            down.append([])
            chain.append(len(width) - 1)
        chain.append(v)
        for a, b in zip(chain, chain[1:]):
            down[a].append(b)
            up[b].append(a)
        chains.append(chain)
    total = len(width)
    depth = max(rank, default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(depth)]
    position = {v: i for i, v in enumerate(order)}
    for v in sorted(range(total), key=lambda v: position.get(v, total + v)):
        rows[rank[v]].append(v)

    # Barycenter ordering.
    pos = [0.0] * total
    for row in rows:
        for i, v in enumerate(row):
            pos[v] = float(i)
    for _ in range(SWEEPS):
        for sweep_rows, neighbours in ((rows[1:], up), (list(reversed(rows[:-1])), down)):
            for row in sweep_rows:
                # Ties put weights and inputs after the operators: beside them, to the right.
                keys = {v: (_mean([pos[u] for u in neighbours[v]], pos[v]),
                            v < n and not pred[v]) for v in row}
                row.sort(key=lambda v: keys[v])
                for i, v in enumerate(row):
                    pos[v] = float(i)

    # Coordinates: an even spread first, then pulled toward the neighbours above and below.
    priority = [float(len(up[v]) + len(down[v])) if v < n else 0.5 for v in range(total)]
    for v in range(n):
        if not pred[v]:  # weights and inputs give way to everything
            priority[v] = 0.0
    x = [0.0] * total
    for row in rows:
        left = 0.0
        for v in row:
            x[v] = left + width[v] / 2
            left += width[v] + NODE_GAP
    for sweep_rows, neighbours in ((rows[1:], up), (list(reversed(rows[:-1])), down),
                                   (rows[1:], up)):
        for row in sweep_rows:
            want = {v: _mean([x[u] for u in _anchors(neighbours[v], neighbours, n)], x[v])
                    for v in row}
            _place(row, want, x, width, priority)
    min_x = min((x[v] - width[v] / 2 for v in range(total)), default=0.0)
    max_x = max((x[v] + width[v] / 2 for v in range(total)), default=0.0)
    for v in range(total):
        x[v] += MARGIN - min_x
    row_height = [max((height[v] for v in row), default=0.0) for row in rows]
    top = [0.0] * depth
    y_now = MARGIN
    for r in range(depth):
        top[r] = y_now
        y_now += row_height[r] + LAYER_GAP
    y = [top[rank[v]] + (row_height[rank[v]] - height[v]) / 2 for v in range(total)]

    paths = []
    for chain in chains:
        u, v = chain[0], chain[-1]
        points = [(x[u], y[u] + height[u])]
        for d in chain[1:-1]:  # straight down through the rows it crosses, beside their boxes
            points += [(x[d], top[rank[d]]), (x[d], top[rank[d]] + row_height[rank[d]])]
        points.append((x[v], y[v]))
        paths.append(points)
    return Layout(x[:n], y[:n], list(widths), list(heights), paths,
                  max_x - min_x + 2 * MARGIN, y_now - LAYER_GAP + MARGIN, layer)
