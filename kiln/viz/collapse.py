"""Collapsing a block of operators — one ONNX LSTM, GRU or attention node, or a fused group —
into one box.

An ONNX LSTM becomes some seventy kiln operators, spread over a dozen fused groups; the picture
of a model with three of them is mostly LSTM internals. `collapse` merges the nodes that share
a key into one: the key is the ONNX node an operator came from (`origin.py`), or, for a program
with no ONNX origins, its fused group. The merged box is labelled with what it stands for (the
ONNX operator, or the group's label), says how many operators it holds, and reads and feeds what
its members did. A merge that would make a cycle (a value leaving the block and coming back,
which CSE can cause) is left undone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from kiln.viz.dataflow import DataflowGraph, Group, Node
from kiln.viz.origin import Origins


@dataclass
class Block:
    """What one collapsed box shows."""

    label: str
    name: str = ""
    lines: Sequence[str] = ()
    attrs: Sequence[str] = ()


def _acyclic(n: int, edges: list[tuple[int, int]], of: list[int]) -> set[int]:
    """The merged nodes (indices into the quotient) left unordered: on or after a cycle."""
    succ: dict[int, list[int]] = {}
    indegree = [0] * n
    for u, v in edges:
        a, b = of[u], of[v]
        if a != b:
            succ.setdefault(a, []).append(b)
            indegree[b] += 1
    ready = [v for v in range(n) if indegree[v] == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for s in succ.get(v, ()):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    return set() if done == n else {v for v in range(n) if indegree[v] > 0}


def collapse(graph: DataflowGraph, key: Sequence[Hashable | None],
             blocks: dict[Hashable, Block]) -> DataflowGraph:
    """``graph`` with the nodes that share a key (two or more of them) merged into one box,
    described by ``blocks[key]``; nodes whose key is None are left alone."""
    count: dict[Hashable, int] = {}
    for k in key:
        if k is not None:
            count[k] = count.get(k, 0) + 1
    keys = [k if k is not None and count[k] > 1 else None for k in key]
    while True:  # undo the merges that close a cycle, until none does
        of, first = [0] * len(keys), {}
        m = 0
        for i, k in enumerate(keys):
            if k is None or k not in first:
                if k is not None:
                    first[k] = m
                of[i] = m
                m += 1
            else:
                of[i] = first[k]
        stuck = _acyclic(m, graph.edges, of)
        bad = {keys[i] for i in range(len(keys)) if of[i] in stuck and keys[i] is not None}
        if not bad:
            break
        keys = [None if k in bad else k for k in keys]
    members: dict[int, list[int]] = {}
    for i, q in enumerate(of):
        members.setdefault(q, []).append(i)
    leaves = [False] * len(keys)
    for u, v in graph.edges:
        if of[u] != of[v]:
            leaves[u] = True
    size: dict[int | None, int] = {}
    for node in graph.nodes:
        size[node.group] = size.get(node.group, 0) + 1
    nodes: list[Node] = []
    for q in range(m):
        mine = members[q]
        k = keys[mine[0]]
        if k is None:
            node = graph.nodes[mine[0]]
            alone = key[mine[0]]
            if isinstance(alone, tuple) and alone[0] == "group" and count.get(alone) == 1:
                node = replace(node, group=None)  # a fused group of one operator: itself
            nodes.append(node)
            continue
        block = blocks[k]
        outs = [graph.nodes[i].detail for i in mine if leaves[i]] or [graph.nodes[mine[-1]].detail]
        detail = outs[0] if len(outs) == 1 else f"{outs[0]}, +{len(outs) - 1} more"
        # Inside the group its members shared, if that group keeps other nodes.
        groups = {graph.nodes[i].group for i in mine}
        if len(groups) == 1 and len(mine) == size.get(next(iter(groups)), 0):
            groups = {None}  # the whole group
        total = sum(graph.nodes[i].members for i in mine)
        ops = sorted({graph.nodes[i].label for i in mine})
        title = f"{block.label}: {total} operators ({', '.join(ops)})"
        nodes.append(Node(block.label, detail, "block", groups.pop() if len(groups) == 1 else None,
                          title=title, lines=[*block.lines, f"{total} kiln operators"],
                          attrs=list(block.attrs), name=block.name, members=total))
    out = graph.renumbered(nodes, list(of))
    # A group some of whose operators went into a block is labelled by those left.
    left: dict[int, list[str]] = {}
    for node in out.nodes:
        if node.group is not None:
            left.setdefault(node.group, []).append(node.label)
    out.groups = [Group(f"fused: {' + '.join(dict.fromkeys(left[g]))}" if g in left
                        else grp.label, left.get(g, []))
                  for g, grp in enumerate(graph.groups, 1)]
    return out


def blocks_to_collapse(graph: DataflowGraph, origins: Origins | None,
                       what: Sequence[str] = ()) -> tuple[list[Hashable | None],
                                                          dict[Hashable, Block]]:
    """The keys and blocks `collapse` takes. With ONNX origins: every ONNX node that became
    several operators, or only those whose type is in ``what`` (``LSTM``), or all the nodes
    under a name scope in ``what`` (``/encoder/layer.0/attention``, one block for the scope).
    Without: each fused group (``what`` must then be empty)."""
    keys: list[Hashable | None] = [None] * len(graph.nodes)
    blocks: dict[Hashable, Block] = {}
    if origins is None:
        for i, node in enumerate(graph.nodes):
            if node.group is not None and node.kind == "op":
                keys[i] = ("group", node.group)
                blocks[keys[i]] = Block(graph.groups[node.group - 1].label)
        return keys, blocks
    scopes = [w.rstrip("/") for w in what if "/" in w]
    types = {w for w in what if "/" not in w}
    for i, node in enumerate(graph.nodes):
        k = origins.of(node.span)
        if k is None or node.kind != "op":
            continue
        onnx_node = origins.nodes[k]
        scope = next((s for s in scopes if onnx_node.name == s
                      or onnx_node.name.startswith(s + "/")), None)
        if scope is not None:
            keys[i] = ("scope", scope)
            blocks[keys[i]] = Block(scope.rsplit("/", 1)[-1] or scope, name=scope)
        elif not what or onnx_node.op_type in types:
            keys[i] = ("onnx", k)
            name = f"{onnx_node.name} ({onnx_node.op_type})" if onnx_node.name else ""
            blocks[keys[i]] = Block(onnx_node.op_type, name, onnx_node.weights, onnx_node.attrs)
    _adopt(graph, keys)
    return keys, blocks


def _adopt(graph: DataflowGraph, keys: list[Hashable | None]) -> None:
    """Tuples and projections made of one block's values belong to it (an LSTM's steps pass
    their state through tuples; left out, they would make the block a cycle)."""
    for i, node in enumerate(graph.nodes):  # in topological order: inputs come first
        if node.kind in ("tuple", "get") and node.inputs and keys[i] is None:
            mine = {keys[u] for u in node.inputs}
            if len(mine) == 1:
                keys[i] = mine.pop()
