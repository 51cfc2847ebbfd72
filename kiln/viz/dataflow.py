"""A module's ``@main`` as a dataflow graph to draw: operator nodes, value edges, fused groups.

Each node is one value: a parameter of ``@main`` (an input, or a weight when it is named in
``weights``), a constant, an operator call, a tuple, a projection that cannot be seen through, or
an output of ``@main`` (one per field of a result tuple). An operator node keeps its call, for
its attributes and the logical shapes of its weights (`weights.py`), and the call's source span,
which says where it came from (`origin.py`).

Let-bound variables are transparent: an edge runs from the node that computes the value to each
node that uses it. A call of a fused function (``Primitive=1``, what ``fuse-ops``
makes) is opened up: its operator nodes are drawn, each marked with the group of that call, and
the picture outlines each group. Anything else — an ``if``, a ``match``, a closure, a call of a
global function — is one opaque node fed by the variables it uses.

The walk keeps its own stack: programs are thousands of let bindings deep.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TypeGuard

from kiln.errors import Error, Span
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import free_vars
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.op.registry import lookup
from kiln.text.printer import type_text


@dataclass
class Node:
    """One value in the picture: ``label`` (what computes it) and ``detail`` (its type).

    ``inputs`` are the nodes it reads, in argument order; ``lines`` what is drawn inside it
    below its type (its weights); ``attrs`` its non-default attributes and ``name`` where it
    came from, drawn on request.
    """

    label: str
    detail: str
    kind: str  # "input", "weight", "constant", "op", "tuple", "get", "output" or "other"
    group: int | None = None
    title: str = ""
    inputs: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    attrs: list[str] = field(default_factory=list)
    name: str = ""
    call: Call | None = None
    span: Span | None = None
    members: int = 1  # the operators it stands for (more when it is collapsed)


@dataclass
class Group:
    """One call of a fused function: the operators it runs, in order."""

    label: str
    ops: list[str] = field(default_factory=list)


@dataclass
class DataflowGraph:
    """Nodes, edges (producer index, consumer index) and fused groups of one function."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)

    def add(self, node: Node, inputs: list[int]) -> int:
        node.inputs = list(inputs)
        self.nodes.append(node)
        index = len(self.nodes) - 1
        self.edges.extend((i, index) for i in inputs)
        return index

    def renumbered(self, nodes: list[Node], new: list[int | None]) -> DataflowGraph:
        """A graph of ``nodes`` where old node ``i`` is ``new[i]`` (None: gone); each node's
        inputs are renumbered, and edges into a node from itself or twice are dropped."""
        out = DataflowGraph(groups=self.groups)
        for node in nodes:
            inputs = [new[i] for i in node.inputs]
            out.nodes.append(node)
            node.inputs = [i for i in inputs if i is not None]
        seen: set[tuple[int, int]] = set()
        for u, v in self.edges:
            a, b = new[u], new[v]
            if a is not None and b is not None and a != b and (a, b) not in seen:
                seen.add((a, b))
                out.edges.append((a, b))
        return out


def type_label(ty: Type | None) -> str:
    """``float32[1, 64, 56, 56]``, ``(float32[2], int32[])``; empty when not known."""
    if isinstance(ty, TensorType):
        return f"{ty.dtype}[{', '.join(str(d) for d in ty.shape)}]"
    if isinstance(ty, TupleType):
        inner = ", ".join(type_label(f) for f in ty.fields[:4])
        return f"({inner}{', ...' if len(ty.fields) > 4 else ''})"
    return "" if ty is None else type_text(ty)


def _is_primitive(op: Expr) -> TypeGuard[Function]:
    return isinstance(op, Function) and bool(op.attrs.get("Primitive", 0))


def _op_label(op: Expr) -> str:
    match op:
        case Op(name=name):
            return name
        case GlobalVar(name=name):
            return f"@{name}"
        case Var(name_hint=name):
            return f"%{name}"
    return "call"


def attr_text(value: object) -> str:
    """An attribute's value as the picture shows it: ``[2, 2]``, ``NCHW``, ``0.5``."""
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _attrs(call: Call) -> list[str]:
    opdef = lookup(call.op.name) if isinstance(call.op, Op) else None
    if opdef is None:
        return []
    return [f"{k}={attr_text(v)}" for k, v in opdef.non_default_attrs(call.attrs).items()]


def _constant_detail(c: Constant) -> str:
    """A scalar constant's value, else the type of the constant."""
    if c.data.size == 1 and c.data.ndim == 0:
        return f"{c.data.item():g} ({c.data.dtype.name})"
    return type_label(c.checked_type_ or c.tensor_type)


_OPAQUE_LABELS = {If: "if", Match: "match", Function: "fn"}


class _Builder:
    """The iterative walk: a stack of (expression, stage, scope) tasks, results by scope."""

    def __init__(self) -> None:
        self.graph = DataflowGraph()
        self.value: dict[tuple[int, int], int] = {}  # (scope, id(expr)) -> node
        self.env: dict[tuple[int, int], int] = {}  # (scope, id(var)) -> node
        self.tuples: dict[int, list[int]] = {}  # tuple node -> its field nodes
        self.scopes: dict[int, int] = {0: 0}  # scope -> its enclosing scope (0: @main)
        self.calls: dict[tuple[int, int], int] = {}  # a fused call -> the scope of its body

    def find(self, scope: int, v: Var) -> int | None:
        s: int | None = scope
        while s is not None:
            node = self.env.get((s, id(v)))
            if node is not None:
                return node
            s = None if s == 0 else self.scopes[s]
        return None

    def lookup(self, scope: int, v: Var) -> int:
        node = self.find(scope, v)
        if node is not None:
            return node
        node = self.graph.add(Node(f"%{v.name_hint}", type_label(v.checked_type_ or
                                                                v.type_annotation), "input"), [])
        self.env[(0, id(v))] = node
        return node

    def walk(self, root: Expr, scope: int) -> int:
        stack: list[tuple[Expr, int, int]] = [(root, 0, scope)]
        while stack:
            e, stage, sc = stack.pop()
            key = (sc, id(e))
            if stage == 0 and key in self.value:
                continue
            group = sc if sc else None
            if isinstance(e, Let):
                if stage == 0:
                    stack += [(e, 1, sc), (e.value, 0, sc)]
                elif stage == 1:
                    self.env[(sc, id(e.var))] = self.value[(sc, id(e.value))]
                    stack += [(e, 2, sc), (e.body, 0, sc)]
                else:
                    self.value[key] = self.value[(sc, id(e.body))]
            elif isinstance(e, Var):
                self.value[key] = self.lookup(sc, e)
            elif isinstance(e, Constant):
                self.value[key] = self.graph.add(
                    Node("constant", _constant_detail(e), "constant", group), [])
            elif isinstance(e, Call) and _is_primitive(e.op):
                fn = e.op
                if stage == 0:
                    stack.append((e, 1, sc))
                    stack += [(a, 0, sc) for a in reversed(e.args)]
                elif stage == 1:
                    inner = len(self.graph.groups) + 1
                    self.graph.groups.append(Group(f"fused #{inner}"))
                    self.scopes[inner] = sc
                    self.calls[key] = inner
                    for p, a in zip(fn.params, e.args):
                        self.env[(inner, id(p))] = self.value[(sc, id(a))]
                    stack += [(e, 2, sc), (fn.body, 0, inner)]
                else:
                    inner = self.calls[key]
                    self.value[key] = self.value[(inner, id(fn.body))]
            elif isinstance(e, Call | Tuple):
                kids = list(e.args) if isinstance(e, Call) else list(e.fields)
                if stage == 0:
                    stack.append((e, 1, sc))
                    stack += [(k, 0, sc) for k in reversed(kids)]
                    continue
                inputs = [self.value[(sc, id(k))] for k in kids]
                ty = type_label(e.checked_type_)
                if isinstance(e, Tuple):
                    node = self.graph.add(Node("tuple", ty, "tuple", group), inputs)
                    self.tuples[node] = inputs
                else:
                    if not isinstance(e.op, Op):  # a closure or global: its callee feeds it
                        if isinstance(e.op, Var):
                            inputs.insert(0, self.lookup(sc, e.op))
                    label = _op_label(e.op)
                    node = self.graph.add(Node(label, ty, "op", group, call=e,
                                               attrs=_attrs(e), span=e.span), inputs)
                    if group is not None:
                        self.graph.groups[group - 1].ops.append(label)
                self.value[key] = node
            elif isinstance(e, TupleGetItem):
                if stage == 0:
                    stack += [(e, 1, sc), (e.tuple_value, 0, sc)]
                    continue
                source = self.value[(sc, id(e.tuple_value))]
                fields = self.tuples.get(source)
                if fields is not None and e.index < len(fields):
                    self.value[key] = fields[e.index]
                else:
                    self.value[key] = self.graph.add(
                        Node(f".{e.index}", type_label(e.checked_type_), "get", group), [source])
            else:
                label = _OPAQUE_LABELS.get(type(e), type(e).__name__.lower())
                # Variables bound outside it; a recursive function's own name is not one yet.
                found = (self.find(sc, v) for v in free_vars(e))
                used = list(dict.fromkeys(n for n in found if n is not None))
                self.value[key] = self.graph.add(
                    Node(label, type_label(e.checked_type_), "other", group), used)
        return self.value[(scope, id(root))]


def dataflow_graph(mod: IRModule, name: str = "main",
                   weights: Collection[str] = ()) -> DataflowGraph:
    """The dataflow graph of ``mod``'s function ``name`` (type-check the module first for
    shapes on the nodes); its parameters named in ``weights`` are weights, not inputs."""
    if name not in mod:
        raise Error(f"the module has no function @{name} to draw")
    fn = mod[name]
    b = _Builder()
    for p in fn.params:
        ty = p.checked_type_ or p.type_annotation
        kind = "weight" if p.name_hint in weights else "input"
        b.env[(0, id(p))] = b.graph.add(Node(f"%{p.name_hint}", type_label(ty), kind), [])
    tail = fn.body
    while isinstance(tail, Let):  # the let chain of @main, so that its result tuple shows
        b.env[(0, id(tail.var))] = b.walk(tail.value, 0)
        tail = tail.body
    results = list(tail.fields) if isinstance(tail, Tuple) else [tail]
    for i, r in enumerate(results):
        node = b.walk(r, 0)
        label = "output" if len(results) == 1 else f"output {i}"
        b.graph.add(Node(label, b.graph.nodes[node].detail, "output"), [node])
    for g in b.graph.groups:
        g.label = "fused: " + " + ".join(dict.fromkeys(g.ops)) if g.ops else g.label
    return b.graph
