"""A layered drawing of a directed acyclic graph (the Sugiyama scheme, kept simple).

1. **Layers** by longest path from the sources, top to bottom; then, from the bottom up, each
   node moves down toward its first consumer while that shortens the wires (a weight is drawn
   beside the operator that reads it, not at the top of a deep picture). Nodes in ``top`` stay
   on the first layer and nodes in ``bottom`` go to the last (the ports of a fused group).
2. **Trunks**: the edges leaving one node (one port of it) share one chain of dummy nodes, down
   to the layer above its last consumer; each consumer branches off the trunk one layer above
   it. A value read by every operator of a deep chain costs one dummy node per layer, not one
   per layer per reader: the picture, and the time to make it, grow linearly. (One chain per
   edge, Sugiyama's own scheme, made a 10,000-operator chain reading one input need 50 million
   dummy nodes.)
3. **Order** within each layer by the barycenter heuristic: a few sweeps down (each node at the
   mean position of its predecessors) and up (of its successors).
4. **Coordinates**: sweeps down, up and down again move each node toward the mean x of its
   neighbours in the layer above (below) — operators before dummy nodes before weights, which
   keeps the main path of a deep network straight — by Sugiyama's priority method: in order of
   priority, each node moves as far as the nodes placed before it allow, pushing the rest aside.
5. **Wires** are polylines: a trunk from the bottom of its node straight down through each row
   it crosses at its dummy node's place, and one branch per edge from the trunk (or from the
   node, for a consumer on the next layer) to the top of the consumer.

Everything is loops over lists: thousands of nodes, and chains thousands deep, cost no stack.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kiln.errors import InternalError

LAYER_GAP = 44.0  # vertical space between layers, for the edges
NODE_GAP = 18.0  # horizontal space between neighbouring nodes
DUMMY_WIDTH = 4.0
MARGIN = 24.0
SWEEPS = 4

Point = tuple[float, float]


@dataclass
class Layout:
    """Node boxes (centre x, top y, width, height), wires, and the picture's size.

    ``wires`` are polylines; ``routes[i]`` lists the wires edge ``i`` follows, in order: its
    first wire starts at the edge's tail (the bottom of its producer, at its port), each next
    wire starts on the one before it (a branch leaves a trunk at one of its points), and the
    last ends at the edge's head (the top of its consumer). Trunks are shared between routes.
    """

    x: list[float]
    y: list[float]
    width: list[float]
    height: list[float]
    wires: list[list[Point]]
    routes: list[list[int]]
    total_width: float
    total_height: float
    layers: list[int]

    @property
    def edges(self) -> list[list[Point]]:
        """Each edge's whole polyline (long for long edges: for tests and small pictures)."""
        out = []
        for route in self.routes:
            points = list(self.wires[route[0]])
            for w in route[1:]:
                start = self.wires[w][0]
                points = points[:points.index(start) + 1] + self.wires[w][1:]
            out.append(points)
        return out


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


def _layers(n: int, order: list[int], succ: list[list[int]], pred: list[list[int]],
            top: Collection[int], bottom: Collection[int]) -> list[int]:
    layer = [0] * n
    for v in order:
        for p in pred[v]:
            layer[v] = max(layer[v], layer[p] + 1)
    if bottom:
        last = max((layer[v] for v in range(n) if v not in bottom), default=-1) + 1
        for v in bottom:
            layer[v] = max(layer[v], last)
    # Move nodes down, consumers first. With trunks, the wires leaving node p cost
    # deepest[p] - layer[p] dummy nodes; moving v down to L saves L - layer[v] of its own and
    # costs each producer p whose trunk would have to grow past deepest[p]. Ties move (a
    # shared input's trunk grows once, for all the nodes that follow).
    deepest = [max((layer[s] for s in succ[v]), default=layer[v]) for v in range(n)]
    for v in reversed(order):
        if not succ[v] or v in top or v in bottom:
            continue
        hi = min(layer[s] for s in succ[v]) - 1
        if hi <= layer[v]:
            continue
        reach = sorted({deepest[p] for p in pred[v]}) if pred[v] else []
        to = hi if len(reach) < 2 else min(hi, reach[1])
        if to > layer[v]:
            layer[v] = to
            for p in pred[v]:
                deepest[p] = max(deepest[p], to)
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
           edges: Sequence[tuple[int, int]], *, tails: Sequence[float] | None = None,
           heads: Sequence[float] | None = None, top: Collection[int] = (),
           bottom: Collection[int] = (), layer_gap: float = LAYER_GAP,
           margin: float = MARGIN) -> Layout:
    """Lay out nodes ``0..n-1`` of the given sizes; ``edges`` run from producer to consumer.

    ``tails[i]`` and ``heads[i]`` place edge ``i``'s ends off the centres of its boxes (ports);
    edges from one node that leave at the same place share a trunk. Sources in ``top`` stay on
    the first layer, sinks in ``bottom`` go to the last.
    """
    n = len(widths)
    tail = list(tails) if tails is not None else [0.0] * len(edges)
    head = list(heads) if heads is not None else [0.0] * len(edges)
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        succ[u].append(v)
        pred[v].append(u)
    order = _topological(n, succ, pred)
    layer = _layers(n, order, succ, pred, set(top), set(bottom))

    # Trunks: the edges leaving one port of a node share a chain of dummy nodes.
    width = list(widths)
    height = list(heights)
    rank = list(layer)
    up: list[list[int]] = [[] for _ in range(n)]  # neighbours one layer up / down
    down: list[list[int]] = [[] for _ in range(n)]
    by_port: dict[tuple[int, float], list[int]] = {}
    for i, (u, _) in enumerate(edges):
        by_port.setdefault((u, tail[i]), []).append(i)
    trunks: dict[tuple[int, float], list[int]] = {}
    attach = [0] * len(edges)  # the node each edge's last hop leaves: its producer or a dummy
    for (u, port), mine in by_port.items():
        deep = max(layer[edges[i][1]] for i in mine)
        chain = [u]
        for r in range(layer[u] + 1, deep):
            width.append(DUMMY_WIDTH)
            height.append(0.0)
            rank.append(r)
            up.append([chain[-1]])
            down.append([])
            down[chain[-1]].append(len(width) - 1)
            chain.append(len(width) - 1)
        trunks[(u, port)] = chain
        for i in mine:
            v = edges[i][1]
            a = chain[layer[v] - layer[u] - 1]
            attach[i] = a
            down[a].append(v)
            up[v].append(a)
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
    # The picture spans the boxes and the ports on them (a port may stick out of a box).
    lefts = [x[v] - width[v] / 2 for v in range(total)]
    rights = [x[v] + width[v] / 2 for v in range(total)]
    for i, (u, v) in enumerate(edges):
        lefts += [x[u] + tail[i], x[v] + head[i]]
        rights += [x[u] + tail[i], x[v] + head[i]]
    min_x, max_x = min(lefts, default=0.0), max(rights, default=0.0)
    for v in range(total):
        x[v] += margin - min_x
    row_height = [max((height[v] for v in row), default=0.0) for row in rows]
    row_top = [0.0] * depth
    y_now = margin
    for r in range(depth):
        row_top[r] = y_now
        y_now += row_height[r] + layer_gap
    y = [row_top[rank[v]] + (row_height[rank[v]] - height[v]) / 2 for v in range(total)]

    wires: list[list[Point]] = []
    trunk_wire: dict[tuple[int, float], int] = {}
    for (u, port), chain in trunks.items():
        if len(chain) > 1:  # straight down through the rows it crosses, beside their boxes
            points = [(x[u] + port, y[u] + height[u])]
            for d in chain[1:]:
                points += [(x[d], row_top[rank[d]]), (x[d], row_top[rank[d]] + row_height[rank[d]])]
            trunk_wire[(u, port)] = len(wires)
            wires.append(points)
    routes: list[list[int]] = []
    for i, (u, v) in enumerate(edges):
        a = attach[i]
        end = (x[v] + head[i], y[v])
        if a == u:
            wires.append([(x[u] + tail[i], y[u] + height[u]), end])
            routes.append([len(wires) - 1])
        else:
            wires.append([(x[a], row_top[rank[a]] + row_height[rank[a]]), end])
            routes.append([trunk_wire[(u, tail[i])], len(wires) - 1])
    return Layout(x[:n], y[:n], list(widths), list(heights), wires, routes,
                  max_x - min_x + 2 * margin, y_now - layer_gap + margin, layer)
