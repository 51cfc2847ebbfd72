"""The order in which inference checks a module's globals: callees before their callers.

A polymorphic global's type must be fully known before a caller instantiates it, so globals
are checked one strongly connected component of the call graph at a time, each component
after every component it calls (Tarjan's algorithm, which finds them in that order). Globals
that call each other share a component and are checked together.
"""

from __future__ import annotations

from kiln.ir.expr import GlobalVar
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order


def callees(mod: IRModule) -> dict[str, list[str]]:
    """For each global, the globals of ``mod`` its body refers to, in order of first use."""
    out: dict[str, list[str]] = {}
    for gv, fn in mod.functions.items():
        seen: dict[str, None] = {}
        for node in post_order(fn):
            if isinstance(node, GlobalVar) and node in mod.functions:
                seen.setdefault(node.name, None)
        out[gv.name] = list(seen)
    return out


def inference_order(mod: IRModule) -> list[list[str]]:
    """The globals of ``mod`` grouped into strongly connected components, callees first.

    Deterministic: components and their members follow the module's order where the call
    graph leaves a choice.
    """
    graph = callees(mod)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    position = {name: k for k, name in enumerate(graph)}
    for start in graph:
        if start in index:
            continue
        # Tarjan's algorithm on an explicit stack of (node, position in its callee list).
        work: list[tuple[str, int]] = [(start, 0)]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, i = work[-1]
            kids = graph[node]
            if i < len(kids):
                work[-1] = (node, i + 1)
                kid = kids[i]
                if kid not in index:
                    index[kid] = low[kid] = len(index)
                    stack.append(kid)
                    on_stack.add(kid)
                    work.append((kid, 0))
                elif kid in on_stack:
                    low[node] = min(low[node], index[kid])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(sorted(group, key=position.__getitem__))
    return groups
