"""The indexed dataflow graph of a function and its post-dominator tree (used by FuseOps).

Relay's fusion works on the *dataflow* fragment of a program: operator calls, tuples and
projections, connected by the values they pass. `IndexedForwardGraph` numbers the nodes of
one function children-first and records, for each node, the nodes that consume its value
and the fusion pattern of each such edge. Everything else — variables, lets, ifs, matches,
references, function bodies, calls of closures — is a boundary: a node whose value is used
by a boundary is marked ``extern_ref`` and never fuses into anything after it.

`PostDominatorTree` gives each node its *immediate post-dominator*: the nearest node that
every path from it to the function's result goes through. Because the graph is acyclic and
numbered topologically, one sweep from the last node to the first computes it, as the least
common ancestor (in the tree built so far) of the node's consumers. Along the way it
combines the edge patterns met, which tells fusion how the value reaches its post-dominator
(only elementwise, or through broadcasts, reductions, ...).
"""

from __future__ import annotations

from kiln.errors import InternalError
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
)
from kiln.ir.traverse import children, post_order
from kiln.ir.ty import TensorType, TupleType
from kiln.op import registry
from kiln.op.dyn import runs_on_host
from kiln.op.registry import OpPattern

# Scalar constants of these dtypes are inlined into fused functions; others become arguments.
_SIMPLE_CONST_DTYPES = frozenset({"int32", "int64", "float32", "float64", "bool"})


def is_primitive_function(e: Expr) -> bool:
    """True for a fused kernel, ``fn (..., Primitive=1) { ... }``."""
    return isinstance(e, Function) and bool(e.attrs.get("Primitive", 0))


def is_simple_scalar(e: Expr) -> bool:
    """A scalar constant that kernels hold inline rather than take as a parameter."""
    return isinstance(e, Constant) and e.data.ndim == 0 and e.dtype in _SIMPLE_CONST_DTYPES


def dataflow_children(e: Expr) -> tuple[Expr, ...]:
    """The children of ``e`` that are graph nodes: operators and primitive bodies excluded."""
    if isinstance(e, Call) and isinstance(e.op, Op):
        return e.args
    if is_primitive_function(e):
        return ()
    return children(e)


class GraphNode:
    """One expression of the graph: its index, pattern, consumers, and whether it escapes."""

    __slots__ = ("expr", "index", "pattern", "extern_ref", "outputs")

    def __init__(self, expr: Expr, index: int) -> None:
        self.expr = expr
        self.index = index
        self.pattern = OpPattern.OPAQUE
        self.extern_ref = False
        self.outputs: list[tuple[GraphNode, OpPattern]] = []  # (consumer, edge pattern)

    def __repr__(self) -> str:
        outs = ", ".join(str(n.index) for n, _ in self.outputs)
        ext = " extern" if self.extern_ref else ""
        kind = type(self.expr).__name__
        return f"<node {self.index} {kind} {self.pattern.name}{ext} -> [{outs}]>"


def _shape(e: Expr) -> tuple[object, ...] | None:
    t = e.checked_type_
    return t.shape if isinstance(t, TensorType) else None


def _checked(e: Expr) -> object:
    if e.checked_type_ is None:
        raise InternalError(f"fusion needs a type-checked program; a {type(e).__name__} has none")
    return e.checked_type_


class IndexedForwardGraph:
    """The dataflow graph of an expression, nodes in topological (post-DFS) order."""

    def __init__(self, root: Expr) -> None:
        self.nodes: list[GraphNode] = []
        self.node_of: dict[int, GraphNode] = {}  # id(expr) -> node
        for e in post_order(root, kids=dataflow_children):
            node = GraphNode(e, len(self.nodes))
            self.nodes.append(node)
            self.node_of[id(e)] = node
        self.node_of[id(root)].extern_ref = True
        for node in self.nodes:
            self._connect(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, e: Expr) -> GraphNode:
        return self.node_of[id(e)]

    def _edge(self, child: Expr, parent: GraphNode | None, pattern: OpPattern) -> None:
        """Record that ``parent`` consumes ``child``; None marks ``child`` as escaping."""
        node = self.node_of.get(id(child))
        if node is None:
            return  # an operator in callee position: not a value
        if parent is None:
            node.extern_ref = True
        else:
            node.outputs.append((parent, pattern))

    def _connect(self, node: GraphNode) -> None:
        e = node.expr
        match e:
            case Call(op=Op(name=name)):
                pattern = registry.get(name, e.span).pattern
                if runs_on_host(e):  # the VM runs it (kiln/op/dyn.py): fuses with nothing
                    pattern = OpPattern.OPAQUE
                node.pattern = pattern
                out_shape = _shape(e)
                for arg in e.args:
                    edge = pattern
                    # A broadcast whose argument already has the result's shape is elementwise.
                    if edge == OpPattern.BROADCAST and out_shape is not None:
                        if _shape(arg) == out_shape:
                            edge = OpPattern.ELEMWISE
                    self._edge(arg, node, edge)
            case Call():
                # Calls of closures, globals, constructors, kernels: opaque consumers.
                for kid in children(e):
                    self._edge(kid, node, OpPattern.OPAQUE)
            case Tuple():
                node.pattern = OpPattern.TUPLE
                for f in e.fields:
                    if isinstance(_checked(f), TensorType):
                        self._edge(f, node, OpPattern.INJECTIVE)
                    else:
                        self._edge(f, None, OpPattern.OPAQUE)
            case TupleGetItem():
                ty = _checked(e.tuple_value)
                if isinstance(ty, TupleType) and all(
                    isinstance(t, TensorType) for t in ty.fields
                ):
                    node.pattern = OpPattern.INJECTIVE
                    self._edge(e.tuple_value, node, OpPattern.INJECTIVE)
                else:
                    self._edge(e.tuple_value, None, OpPattern.OPAQUE)
            case Constant():
                node.pattern = OpPattern.ELEMWISE if is_simple_scalar(e) else OpPattern.OPAQUE
            case Function():
                for p in e.params:
                    self._edge(p, None, OpPattern.OPAQUE)
                for kid in dataflow_children(e):
                    self._edge(kid, None, OpPattern.OPAQUE)
            case Let() | If() | Match() | RefCreate() | RefRead() | RefWrite():
                # Control flow, bindings and effects: fusion does not cross them.
                for kid in children(e):
                    self._edge(kid, None, OpPattern.OPAQUE)
            case _:
                pass  # variables, globals, constructors: opaque leaves


class PostDominatorTree:
    """Immediate post-dominators of a graph's nodes, by index.

    ``parent[i]`` is the immediate post-dominator of node ``i`` (-1 when the node escapes or
    its paths only meet at the function's result); ``pattern[i]`` is the most general edge
    pattern on the way there; ``depth[i]`` is the node's depth in the tree.
    """

    def __init__(self, graph: IndexedForwardGraph) -> None:
        n = len(graph.nodes)
        self.parent = [-1] * n
        self.depth = [0] * n
        self.pattern = [OpPattern.OPAQUE] * n
        for i in reversed(range(n)):
            node = graph.nodes[i]
            if node.extern_ref or not node.outputs:
                self.depth[i] = 1
                continue
            pattern = OpPattern.ELEMWISE
            parent = -1
            for k, (out, edge) in enumerate(node.outputs):
                if out.index <= i:
                    raise InternalError("the dataflow graph is not in topological order")
                if k == 0:
                    parent = out.index
                else:
                    parent, pattern = self._lca(parent, out.index, pattern)
                pattern = max(pattern, edge)
            self.parent[i] = parent
            self.depth[i] = self.depth[parent] + 1 if parent >= 0 else 1
            self.pattern[i] = pattern

    def _lca(self, a: int, b: int, pattern: OpPattern) -> tuple[int, OpPattern]:
        """The least common ancestor of two nodes, and ``pattern`` combined along both walks."""
        parent, depth, pat = self.parent, self.depth, self.pattern
        while a != b:
            if a < 0 or b < 0:
                return -1, pattern
            if depth[a] < depth[b]:
                pattern = max(pattern, pat[b])
                b = parent[b]
            elif depth[b] < depth[a]:
                pattern = max(pattern, pat[a])
                a = parent[a]
            else:
                pattern = max(pattern, pat[a], pat[b])
                a, b = parent[a], parent[b]
        return a, pattern
