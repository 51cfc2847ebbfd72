"""fuse-ops: group operator calls into fused kernels (Relay's FuseOps).

Each group of operators that can run as one loop nest becomes a primitive function,
``fn (%p0: T0, %p1: T1, Primitive=1) -> R { ... }``, called in place of the operators it
holds; every remaining operator call is wrapped alone, so that after this pass each kernel
the backend compiles is one primitive function. Fewer, larger kernels mean fewer passes over
memory and fewer intermediate buffers.

Which operators may share a kernel is Relay's algorithm: build the dataflow graph of each
function (`kiln.transform.dominators`), compute its post-dominator tree, and let a node join
the group of its immediate post-dominator when every path between them satisfies a rule
(`FUSE_OPS_RULES`, a table indexed by the node's pattern kind). The rules run in four
phases, so that complex operators (conv2d, dense) absorb their elementwise epilogues before
injective operators are grouped. Lets, ifs, matches, references and closures are
boundaries: run ``to-graph-normal-form`` first to fuse across let-bound values. A group never
holds more than ``max_depth`` nodes (TVM's ``relay.FuseOps.max_depth``, default 256; here
``FuseOps(max_depth=...)`` or the ``fuse-ops.max_depth`` key of `PassContext.config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.errors import Error, InternalError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Constant, Expr, Function, Op, Tuple, TupleGetItem, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, with_children
from kiln.op.dyn import runs_on_host
from kiln.op.registry import OpPattern
from kiln.text._gc import gc_paused
from kiln.transform.dominators import (
    IndexedForwardGraph,
    PostDominatorTree,
    dataflow_children,
    is_primitive_function,
    is_simple_scalar,
)
from kiln.transform.pass_manager import (
    ModulePass,
    Pass,
    PassContext,
    PassInfo,
    register_pass,
    typed,
)

ELEMWISE, BROADCAST, INJECTIVE = OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE
COMM_REDUCE, OUT_ELEMWISE_FUSABLE = OpPattern.COMM_REDUCE, OpPattern.OUT_ELEMWISE_FUSABLE
TUPLE, OPAQUE = OpPattern.TUPLE, OpPattern.OPAQUE

DEFAULT_MAX_DEPTH = 256
MAX_DEPTH_KEY = "fuse-ops.max_depth"


@dataclass(frozen=True)
class FusionRule:
    """When a node's group may join the group of its immediate post-dominator (the sink).

    ``kinds``: the node's pattern; ``relation``: the combined pattern of the edges by which
    its value reaches the sink; ``path``: the pattern of every group strictly between them;
    ``sink``: the sink's group pattern. ``into_fused_tuple``: the sink is a tuple already
    fused into an injective consumer (phase 2). ``anchors``: only groups anchored by a call
    of one of these operators (None: any).
    """

    name: str
    phases: frozenset[int]
    kinds: frozenset[OpPattern]
    relation: Callable[[OpPattern], bool]
    path: Callable[[OpPattern], bool]
    sink: Callable[[OpPattern], bool]
    into_fused_tuple: bool = False
    anchors: frozenset[str] | None = None
    # ... or the sink is a call of one of these operators whose weight (second argument) is
    # the node's value itself (the comment above `FUSE_OPS_RULES`)
    into_weight_of: frozenset[str] = frozenset()
    # only nodes this accepts (None: any), and only sinks in a group anchored by one of these
    node: Callable[[Expr], bool] | None = None
    sink_anchors: frozenset[str] | None = None


def _any(p: OpPattern) -> bool:
    return True


def _at_most(bound: OpPattern) -> Callable[[OpPattern], bool]:
    return lambda p: p <= bound


def _scalar_take(e: Expr) -> bool:
    """A ``take`` of one index (a 0-d index): a contiguous slab of its data."""
    if not (isinstance(e, Call) and isinstance(e.op, Op) and e.op.name == "take"):
        return False
    index = e.args[1].checked_type_
    return index is not None and getattr(index, "ndim", None) == 0


# Relay's phases: 0 lets conv2d/dense absorb elementwise consumers before 1 groups injective
# operators; 2 pulls the fields of a tuple into the kernel that the tuple already joined.
# Beyond Relay, an injective op computing a conv2d's weight (the flipped, channel-swapped
# kernel of a data adjoint: take, transpose) joins the convolution, which reads its weight
# once per call into packed panels anyway (kiln/loops/conv_kernels.py): ResNet-18's training
# step ran those transposes as kernels of their own, 6-8 ms of 400 at batch 8.
# Phase 3: a take of one index (a recurrent loop's step of its input projection, xw[i])
# joins the dense that adds it in its epilogue, so that each thread reads its share of the
# row where the projection left it; taken by a kernel of its own, the caller had just
# written the whole row, and the other thread read its half from the caller's core on
# every step: the 32-step LSTM loop of benchmarks/peers.py 261-268 -> 239-242 µs a call
# back to back, 0.89-0.93 of its time in peers.py's pattern (2 threads, Emerald Rapids VM);
# its ONNX import, which unrolls the loop and takes every row before the first step, 1.00.
FUSE_OPS_RULES: tuple[FusionRule, ...] = (
    FusionRule(
        "conv2d/dense/pooling absorb the elementwise ops after them",
        phases=frozenset({0}),
        kinds=frozenset({OUT_ELEMWISE_FUSABLE}),
        relation=lambda p: p == ELEMWISE,
        path=_at_most(BROADCAST),
        sink=_at_most(BROADCAST),
    ),
    FusionRule(
        "elementwise ops join the injective op, reduction or kernel after them",
        phases=frozenset({0, 1}),
        kinds=frozenset({ELEMWISE, BROADCAST}),
        relation=lambda p: p <= INJECTIVE or p == COMM_REDUCE,
        path=_at_most(INJECTIVE),
        sink=lambda p: p not in (TUPLE, OPAQUE),
    ),
    FusionRule(
        "injective ops and tuples join the injective op after them, or the conv2d whose "
        "weight they compute",
        phases=frozenset({1}),
        kinds=frozenset({INJECTIVE, TUPLE}),
        relation=_any,
        path=_at_most(INJECTIVE),
        sink=_at_most(INJECTIVE),
        into_weight_of=frozenset({"nn.conv2d"}),
    ),
    FusionRule(
        "a take at one index joins the matrix product whose epilogue reads it",
        phases=frozenset({3}),
        kinds=frozenset({INJECTIVE}),
        relation=_at_most(BROADCAST),
        path=_at_most(BROADCAST),
        sink=lambda p: p == OUT_ELEMWISE_FUSABLE,
        node=_scalar_take,
        sink_anchors=frozenset({"nn.dense", "nn.dense_packed", "nn.batch_matmul"}),
    ),
    FusionRule(
        "a tuple's fields join the kernel that the tuple joined",
        phases=frozenset({2}),
        kinds=frozenset({ELEMWISE, BROADCAST, INJECTIVE}),
        relation=_any,
        path=_at_most(INJECTIVE),
        sink=_at_most(INJECTIVE),
        into_fused_tuple=True,
    ),
)


class Partition:
    """Groups of graph nodes as a union-find forest, grown by `run` under a rule table."""

    def __init__(self, graph: IndexedForwardGraph, max_depth: int) -> None:
        self.graph = graph
        self.max_depth = max_depth
        n = len(graph.nodes)
        self.up = list(range(n))  # union-find parent; a root is its own parent
        self.pattern = [node.pattern for node in graph.nodes]  # meaningful at roots
        self.size = [1] * n
        self.anchor = [
            i if node.pattern == OUT_ELEMWISE_FUSABLE else -1 for i, node in enumerate(graph.nodes)
        ]

    def find(self, i: int) -> int:
        up = self.up
        root = i
        while up[root] != root:
            root = up[root]
        while up[i] != root:
            up[i], i = root, up[i]
        return root

    def anchor_op(self, i: int) -> str | None:
        """The operator anchoring ``i``'s group (conv2d, dense, ...), if any."""
        a = self.anchor[self.find(i)]
        if a < 0:
            return None
        e = self.graph.nodes[a].expr
        return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None

    def run(self, tree: PostDominatorTree, rules: tuple[FusionRule, ...]) -> None:
        table = {(ph, k): r for r in rules for ph in r.phases for k in r.kinds}
        phases = sorted({ph for r in rules for ph in r.phases})
        for phase in phases:
            for i in range(len(self.graph.nodes)):
                sink = tree.parent[i]
                rule = table.get((phase, self.pattern[i]))
                if sink < 0 or rule is None:
                    continue
                if rule.into_fused_tuple:
                    root = self.find(sink)
                    if self.pattern[root] == TUPLE:
                        continue
                    if self.pattern[sink] != TUPLE or self.pattern[root] > INJECTIVE:
                        continue
                else:
                    if self.find(i) == self.find(sink) or self.pattern[sink] == TUPLE:
                        continue
                    if not rule.relation(tree.pattern[i]):
                        continue
                if rule.anchors is not None and self.anchor_op(i) not in rule.anchors:
                    continue
                if rule.node is not None and not rule.node(self.graph.nodes[i].expr):
                    continue
                if rule.sink_anchors is not None and self.anchor_op(sink) not in rule.sink_anchors:
                    continue
                if self._too_big(i, sink) or not self._check_path(i, sink, rule):
                    continue
                self._commit(i, sink)

    def _between(self, src: int, sink: int) -> list[int]:
        """``src`` and every node on a path from it to ``sink`` (exclusive), at most max_depth."""
        nodes = self.graph.nodes
        seen = {src}
        stack = [src]
        while stack and len(seen) <= self.max_depth:
            for out, _ in nodes[stack.pop()].outputs:
                j = out.index
                if j != sink and j not in seen:
                    seen.add(j)
                    stack.append(j)
        return list(seen)

    def _too_big(self, src: int, sink: int) -> bool:
        """Whether the group made by fusing ``src`` into ``sink`` would exceed max_depth."""
        between = self._between(src, sink)
        if len(between) + 1 > self.max_depth:
            return True
        roots = {self.find(sink)} | {self.find(j) for j in between}
        return sum(self.size[r] for r in roots) > self.max_depth

    def _check_path(self, src: int, sink: int, rule: FusionRule) -> bool:
        nodes, pattern = self.graph.nodes, self.pattern
        seen: set[int] = set()
        stack = [out.index for out, _ in nodes[src].outputs]
        while stack:
            j = stack.pop()
            if j in seen:
                continue
            seen.add(j)
            kind = pattern[self.find(j)]
            if j == sink:
                if not rule.sink(kind) and not self._computes_weight(src, sink, rule):
                    return False
                continue
            if not rule.path(kind):
                return False
            stack.extend(out.index for out, _ in nodes[j].outputs)
        return True

    def _computes_weight(self, src: int, sink: int, rule: FusionRule) -> bool:
        """Whether ``src``'s value is the weight of ``sink`` (a call of one of the rule's
        ``into_weight_of`` operators), and the sink is its only consumer and reads it nowhere
        else."""
        nodes = self.graph.nodes
        call_ = nodes[sink].expr
        if not (isinstance(call_, Call) and isinstance(call_.op, Op)
                and call_.op.name in rule.into_weight_of and len(call_.args) > 1):
            return False
        return call_.args[1] is nodes[src].expr and [o.index for o, _ in nodes[src].outputs] \
            == [sink] and all(a is not nodes[src].expr for a in call_.args[:1])

    def _commit(self, src: int, sink: int) -> None:
        for j in self._between(src, sink):
            self._merge(j, sink)

    def _merge(self, child: int, target: int) -> None:
        c, t = self.find(child), self.find(target)
        if c == t:
            return
        self.up[c] = t
        self.size[t] += self.size[c]
        if self.anchor[c] >= 0:
            if self.anchor[t] >= 0 or min(self.pattern[c], self.pattern[t]) > BROADCAST:
                raise InternalError("fusion tried to merge two complex operator groups")
            self.anchor[t] = self.anchor[c]
            self.pattern[t] = max(self.pattern[c], self.pattern[t])


class _Kernel:
    """The parameters of one fused function, one per value that flows into the group.

    A scalar constant from outside the group is copied in rather than passed.
    """

    def __init__(self, graph: IndexedForwardGraph, root_of: list[int], root: int) -> None:
        # Parameters in the order a left-to-right walk from the group's root meets them.
        self.inputs: list[Expr] = []
        self.input_params: list[Var] = []  # the parameter of each input
        self.params: dict[int, Expr] = {}
        seen: set[int] = set()
        stack = [graph.nodes[root].expr]
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            if root_of[graph.node(e).index] != root and is_simple_scalar(e):
                self.params[id(e)] = e
            elif root_of[graph.node(e).index] != root:
                if e.checked_type_ is None:
                    raise InternalError("an argument of a fused function has no checked type")
                param = Var(f"p{len(self.inputs)}", e.checked_type_)
                self.params[id(e)] = param
                self.inputs.append(e)
                self.input_params.append(param)
            else:
                stack.extend(reversed(dataflow_children(e)))


def _member(e: Expr, kids: list[Expr]) -> Expr:
    """A node of a fused function rebuilt over its new children."""
    match e:
        case Call():
            return Call(e.op, tuple(kids), e.attrs, span=e.span)
        case Tuple():
            return Tuple(tuple(kids), span=e.span)
        case TupleGetItem():
            return TupleGetItem(kids[0], e.index, span=e.span)
        case Constant():
            return e
    raise InternalError(f"a {type(e).__name__} cannot be part of a fused function")


def fuse_function(
    fn: Function,
    rules: tuple[FusionRule, ...] = FUSE_OPS_RULES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    wrap: Callable[[Partition, int], bool] | None = None,
) -> Function:
    """``fn`` (type-checked) with its operator groups made into primitive function calls.

    ``wrap(partition, root)`` chooses which groups holding an operator call become
    functions (default: all of them).
    """
    graph = IndexedForwardGraph(fn)
    part = Partition(graph, max_depth)
    if rules:
        part.run(PostDominatorTree(graph), rules)
    nodes = graph.nodes
    root_of = [part.find(i) for i in range(len(nodes))]
    with_call = {root_of[n.index] for n in nodes
                 if isinstance(n.expr, Call) and isinstance(n.expr.op, Op)
                 and not runs_on_host(n.expr)}  # the VM runs those itself
    wrapped = {r: _Kernel(graph, root_of, r) for r in with_call if wrap is None or wrap(part, r)}

    outer: dict[int, Expr] = {}  # id(expr) -> its replacement outside any fused function
    inner: dict[int, Expr] = {}  # id(expr) -> its copy inside its fused function

    def value(kid: Expr) -> Expr:
        if isinstance(kid, Op):
            return kid
        new = outer.get(id(kid))
        if new is None:
            raise InternalError("a value inside a fused function is used outside it")
        return new

    for node in nodes:
        e, root = node.expr, root_of[node.index]
        kernel = wrapped.get(root)
        if kernel is None:
            if is_primitive_function(e):
                outer[id(e)] = e
            else:
                outer[id(e)] = with_children(e, [value(k) for k in children(e)])
            continue
        kids = []
        for k in dataflow_children(e):
            param = kernel.params.get(id(k))
            kids.append(param if param is not None else inner[id(k)])
        inner[id(e)] = _member(e, kids)
        if node.index == root:
            func = Function(tuple(kernel.input_params), inner[id(e)], e.checked_type_,
                            attrs=Attrs(Primitive=1), span=e.span)
            outer[id(e)] = Call(func, tuple(value(i) for i in kernel.inputs), span=e.span)
    new = outer[id(fn)]
    assert isinstance(new, Function)
    return new


def resolve_max_depth(max_depth: int | None, ctx: PassContext) -> int:
    """``max_depth`` if given, else the context's ``fuse-ops.max_depth``, else 256."""
    depth = max_depth
    if depth is None:
        depth = ctx.config.get(MAX_DEPTH_KEY, DEFAULT_MAX_DEPTH)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise Error(f"fuse-ops: max_depth must be a positive integer, got {depth!r}")
    return depth


def fuse_module(mod: IRModule, rules: tuple[FusionRule, ...], max_depth: int,
                wrap: Callable[[Partition, int], bool] | None = None) -> IRModule:
    """Every non-primitive global function of ``mod`` fused (``mod`` itself is not changed)."""
    mod = typed(mod)
    with gc_paused():  # many small objects and no cycles: the collector only costs time
        funcs = {
            gv: fn if is_primitive_function(fn) else fuse_function(fn, rules, max_depth, wrap)
            for gv, fn in mod.functions.items()
        }
    return IRModule(funcs, mod.type_definitions)


_INFO = PassInfo("fuse-ops", 1, doc="Group operator calls into primitive functions (kernels).")


def FuseOps(max_depth: int | None = None, fuse_opt_level: int = -1) -> Pass:
    """Relay's operator fusion; ``fuse_opt_level`` 0 wraps every operator alone (-1: ctx)."""
    if max_depth is not None:
        resolve_max_depth(max_depth, PassContext())

    def run(mod: IRModule, ctx: PassContext) -> IRModule:
        level = ctx.opt_level if fuse_opt_level < 0 else fuse_opt_level
        rules = FUSE_OPS_RULES if level > 0 else ()
        return fuse_module(mod, rules, resolve_max_depth(max_depth, ctx))

    return ModulePass(_INFO, run)


register_pass("fuse-ops", FuseOps)


# --- counting kernels -----------------------------------------------------------------------


@dataclass(frozen=True)
class FusionStats:
    """Primitive functions in a module, and operator calls inside and outside them."""

    primitive_functions: int
    calls_inside: int
    calls_outside: int


def fusion_stats(mod: IRModule | Expr) -> FusionStats:
    """Count the distinct primitive functions and operator calls of a module or expression."""
    roots = list(mod.functions.values()) if isinstance(mod, IRModule) else [mod]
    prims = calls_inside = calls_outside = 0
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(r, False) for r in roots]
    while stack:
        e, inside = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if is_primitive_function(e):
            prims += 1
            inside = True
        elif isinstance(e, Call) and isinstance(e.op, Op):
            if inside:
                calls_inside += 1
            else:
                calls_outside += 1
        stack.extend((k, inside) for k in children(e) if id(k) not in seen)
    return FusionStats(prims, calls_inside, calls_outside)
