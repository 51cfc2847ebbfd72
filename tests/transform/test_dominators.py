"""The indexed dataflow graph and post-dominator tree that operator fusion runs on."""

import time

import kiln
from kiln.op.registry import OpPattern
from kiln.transform.dominators import IndexedForwardGraph, PostDominatorTree

T = "Tensor[(4, 8), float32]"


def build(text: str) -> tuple[IndexedForwardGraph, PostDominatorTree, kiln.Function]:
    """The graph and post-dominator tree of @main, and @main (type-checked)."""
    fn = kiln.infer_types(kiln.parse(text))["main"]
    graph = IndexedForwardGraph(fn)
    return graph, PostDominatorTree(graph), fn


def node_of(graph: IndexedForwardGraph, op_name: str):
    """The one node calling ``op_name``."""
    found = [n for n in graph.nodes if isinstance(n.expr, kiln.Call)
             and isinstance(n.expr.op, kiln.Op) and n.expr.op.name == op_name]
    assert len(found) == 1, found
    return found[0]


def ipdom(graph, tree, op_name: str):
    parent = tree.parent[node_of(graph, op_name).index]
    return None if parent < 0 else graph.nodes[parent].expr


def test_nodes_are_in_topological_order_and_edges_point_forward():
    graph, _, fn = build(f"""
def @main(%x: {T}) {{
  %0 = add(%x, 1f);
  %1 = exp(%0);
  %2 = tanh(%0);
  multiply(%1, %2)
}}""")
    # %x, 1f, add, exp, tanh, multiply, and the function itself
    assert len(graph) == 7
    assert graph.nodes[-1].expr is fn and graph.nodes[-1].extern_ref
    for node in graph.nodes:
        assert all(out.index > node.index for out, _ in node.outputs)
    assert [out.expr.op.name for out, _ in node_of(graph, "add").outputs] == ["exp", "tanh"]


def test_diamond_post_dominator_and_edge_patterns():
    graph, tree, _ = build(f"""
def @main(%x: {T}, %b: Tensor[(8), float32]) {{
  %0 = add(%x, %b);
  %1 = exp(%0);
  %2 = tanh(%0);
  %3 = multiply(%1, %2);
  sum(%3, axis=[1])
}}""")
    add, mul = node_of(graph, "add"), node_of(graph, "multiply")
    assert ipdom(graph, tree, "add") is mul.expr
    assert tree.pattern[add.index] == OpPattern.ELEMWISE
    assert ipdom(graph, tree, "exp") is mul.expr
    assert ipdom(graph, tree, "multiply") is node_of(graph, "sum").expr
    assert tree.pattern[mul.index] == OpPattern.COMM_REDUCE
    # Broadcasting %b to the result's shape is a broadcast edge; %x, same shape, elementwise.
    x, b = add.expr.args
    assert graph.node(x).outputs == [(add, OpPattern.ELEMWISE)]
    assert graph.node(b).outputs == [(add, OpPattern.BROADCAST)]
    assert tree.depth[add.index] == tree.depth[mul.index] + 1


def test_the_most_general_pattern_on_the_way_is_kept():
    graph, tree, _ = build(f"""
def @main(%x: {T}) {{
  %0 = exp(%x);
  %1 = transpose(%0);
  %2 = transpose(%1);
  %3 = tanh(%0);
  add(%2, %3)
}}""")
    exp = node_of(graph, "exp")
    assert ipdom(graph, tree, "exp") is node_of(graph, "add").expr
    assert tree.pattern[exp.index] == OpPattern.INJECTIVE


def test_boundaries_make_values_escape():
    graph, tree, _ = build(f"""
def @main(%x: {T}, %c: bool) {{
  %0 = exp(%x);
  let %y = negative(%0);
  %1 = tanh(%y);
  if (%c) {{ %1 }} else {{ sigmoid(%0) }}
}}""")
    for name in ("negative", "tanh", "sigmoid"):
        assert node_of(graph, name).extern_ref
        assert ipdom(graph, tree, name) is None
    # exp feeds a let value and an if branch: two boundaries, no post-dominator.
    assert ipdom(graph, tree, "exp") is None


def test_tuples_and_projections():
    graph, tree, _ = build(f"""
def @main(%x: {T}) {{
  %0 = split(%x, indices_or_sections=2, axis=1);
  %1 = add(%0.0, %0.1);
  (%1, exp(%1))
}}""")
    split = node_of(graph, "split")
    assert graph.node(split.expr).pattern == OpPattern.INJECTIVE
    assert ipdom(graph, tree, "split") is node_of(graph, "add").expr
    result = graph.nodes[-2]  # the tuple, the last node before the function
    assert isinstance(result.expr, kiln.Tuple) and result.pattern == OpPattern.TUPLE
    assert result.extern_ref
    assert ipdom(graph, tree, "add") is result.expr
    assert tree.pattern[node_of(graph, "add").index] == OpPattern.INJECTIVE


def test_projection_of_a_tuple_holding_a_closure_is_opaque():
    graph, _, fn = build(f"""
def @main(%x: {T}) {{
  %0 = (fn (%y: {T}) {{ exp(%y) }}, %x);
  %0.1
}}""")
    tgi = fn.body
    assert graph.node(tgi).pattern == OpPattern.OPAQUE
    assert graph.node(tgi.tuple_value).extern_ref


def test_primitive_function_bodies_are_not_entered():
    graph, tree, _ = build(f"""
def @main(%x: {T}) {{
  %0 = fn (%p: {T}, Primitive=1) {{ exp(%p) }};
  tanh(%0(%x))
}}""")
    assert not any(isinstance(n.expr, kiln.Call) and isinstance(n.expr.op, kiln.Op)
                   and n.expr.op.name == "exp" for n in graph.nodes)
    call = node_of(graph, "tanh").expr.args[0]
    assert graph.node(call).pattern == OpPattern.OPAQUE
    assert ipdom(graph, tree, "tanh") is None


def test_closure_bodies_are_their_own_regions():
    graph, tree, _ = build(f"""
def @main(%x: {T}) {{
  %0 = exp(%x);
  let %f = fn (%y: {T}) {{ add(tanh(%y), %0) }};
  %f(%0)
}}""")
    # exp is used inside the closure and outside it: its paths never meet.
    assert ipdom(graph, tree, "exp") is None
    assert ipdom(graph, tree, "tanh") is node_of(graph, "add").expr
    assert node_of(graph, "add").extern_ref  # the closure's result


def test_scalar_constants_are_elementwise_and_tensors_opaque():
    x = kiln.var("x", shape=(2,))
    body = kiln.op.add(kiln.op.multiply(x, kiln.const(2.0)), kiln.const([1.0, 2.0]))
    fn = kiln.infer_types(kiln.IRModule.from_expr(kiln.Function([x], body)))["main"]
    graph = IndexedForwardGraph(fn)
    consts = [n for n in graph.nodes if isinstance(n.expr, kiln.Constant)]
    kinds = sorted((n.expr.data.ndim, n.pattern) for n in consts)
    assert kinds == [(0, OpPattern.ELEMWISE), (1, OpPattern.OPAQUE)]


def test_20000_node_graph():
    x = kiln.var("x", shape=(2,))
    h: kiln.Expr = x
    for i in range(20000):
        h = kiln.op.multiply(h, h) if i % 2 else kiln.op.subtract(h, kiln.op.nn.relu(h))
    fn = kiln.infer_types(kiln.IRModule.from_expr(kiln.Function([x], h)))["main"]
    start = time.perf_counter()
    graph = IndexedForwardGraph(fn)
    tree = PostDominatorTree(graph)
    elapsed = time.perf_counter() - start
    assert len(graph) == 30002  # x, 20,000 subtracts and multiplies, 10,000 relus, the function
    assert max(tree.depth) == 20001  # x, post-dominated by every step of the chain
    assert elapsed < 3.0
