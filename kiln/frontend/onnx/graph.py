"""Converting an ONNX graph: nodes in dependency order, each through its converter.

The result is a chain of ``let`` bindings, one per node output, named after the ONNX value
(``let %conv1_out = nn.conv2d(...)``). A node whose inputs are all known at import time is
evaluated at once with the reference interpreter (shape computations, ``Constant`` nodes), so
that operators whose attributes come from tensors in ONNX (Reshape's shape, Slice's starts)
get static attributes in kiln. Outputs larger than `FOLD_LIMIT` elements are left to run time.

Every node output's type is checked against the import limits (`limits.py`: a rank numpy has,
at most ``max_tensor_elements`` elements), and every node converted counts against
``max_repeated_nodes`` when it is a subgraph's, converted again (an unrolled loop), so that a
small hostile file cannot make the import run for ever.

Subgraphs (the branches of ``If``, the bodies of ``Loop`` and ``Scan``) are converted by a
child importer that sees the values of the enclosing graphs.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
import onnx

from kiln.errors import Error, EvalError, InternalError
from kiln.eval import interpret
from kiln.frontend.onnx.context import NodeContext, Value, describe_node, in_context, type_of
from kiln.frontend.onnx.functions import convert_function_call, function_body
from kiln.frontend.onnx.limits import Budget, Limits, check_shape
from kiln.frontend.onnx.table import lookup, normalize_domain
from kiln.infer import infer_types
from kiln.ir.expr import Constant, Expr, Let, Tuple, TupleGetItem, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order
from kiln.ir.ty import TensorType, TupleType, Type

FOLD_LIMIT = 1 << 20  # elements: larger results computed from constants are left to run time

# Operators never evaluated at import time: their results differ from run to run.
_NOT_FOLDED = frozenset(["RandomNormal", "RandomNormalLike", "RandomUniform",
                         "RandomUniformLike", "Multinomial", "Bernoulli"])


class Names:
    """kiln identifiers for ONNX names: valid, unique, and mapped back for messages."""

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.onnx_name: dict[str, str] = {}
        # base -> the next suffix to try: names are never released, so the ones below it are
        # taken (an unrolled loop asks for the same name thousands of times).
        self._next: dict[str, int] = {}

    def fresh(self, onnx_name: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", onnx_name) or "v"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "v" + base
        name, k = base, self._next.get(base, 1)
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self._next[base] = k
        self.taken.add(name)
        self.onnx_name[name] = onnx_name
        return name


def subgraph_free_names(graph: onnx.GraphProto) -> set[str]:
    """The names a graph (with its nested subgraphs) reads from enclosing scopes."""
    free: set[str] = set()
    stack = [(graph, frozenset[str]())]
    while stack:
        g, outer_defined = stack.pop()
        defined = set(outer_defined)
        defined.update(i.name for i in g.input)
        defined.update(t.name for t in g.initializer)
        defined.update(t.name for t in g.sparse_initializer)
        for n in g.node:
            defined.update(o for o in n.output if o)
        for n in g.node:
            free.update(i for i in n.input if i and i not in defined)
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    stack.append((sub, frozenset(defined)))
        free.update(o.name for o in g.output if o.name not in defined)
    return free


def node_dependencies(node: onnx.NodeProto) -> list[str]:
    """The values a node reads: its inputs and what its subgraphs take from outside."""
    deps = [i for i in node.input if i]
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            deps.extend(sorted(subgraph_free_names(sub)))
    return deps


class GraphImporter:
    """Converts the nodes of one graph into let bindings over an environment of `Value`s."""

    def __init__(self, opsets: dict[str, int], names: Names,
                 outer: GraphImporter | None = None, budget: Budget | None = None) -> None:
        self.opsets = opsets
        self.names = names
        self.outer = outer
        # One budget per import, shared with the subgraphs' and function bodies' importers.
        if budget is None:
            budget = outer.budget if outer is not None else Budget(Limits.from_env())
        self.budget: Budget = budget
        self.env: dict[str, Value] = {}
        self.bindings: list[tuple[Var, Expr]] = []

    # --- the environment ---------------------------------------------------------------------

    def lookup(self, name: str) -> Value | None:
        scope: GraphImporter | None = self
        while scope is not None:
            v = scope.env.get(name)
            if v is not None:
                return v
            scope = scope.outer
        return None

    @property
    def limits(self) -> Limits:
        return self.budget.limits

    def define(self, name: str, value: Value) -> None:
        self.env[name] = value

    def bind(self, onnx_name: str, e: Expr, where: str, foldable: bool,
             inputs: Sequence[Value | None] = ()) -> Value:
        """Give a node's output a value: a constant when it can be computed now, else a let."""
        for v in inputs:
            if v is not None and v.expr is e:
                return v  # the output is an input (Identity, a no-op Reshape)
        ty = type_of(e, where)
        self.check_type(ty, where, f"output {onnx_name!r}")
        if isinstance(e, Constant):
            return Value(e, ty, e.data)
        if isinstance(e, Var):
            return Value(e, ty)
        if foldable and _small_tensor(ty) and self._fits_folding(e):
            try:
                array = np.asarray(interpret(IRModule.from_expr(e)))
            except (EvalError, MemoryError):
                array = None  # it fails at run time too (or needs it); leave it there
            if array is not None:
                c = Constant(array)
                return Value(c, ty, c.data)
        var = Var(self.names.fresh(onnx_name), ty)
        self.bindings.append((var, e))
        return Value(var, ty)

    def check_type(self, ty: Type, where: str, what: str) -> None:
        """A kiln.Error when a value of type ``ty`` (a tensor, or a tuple of them) exceeds the
        import limits."""
        stack: list[tuple[Type, str]] = [(ty, what)]
        while stack:
            t, name = stack.pop()
            if isinstance(t, TensorType):
                check_shape(where, t.shape, name, self.limits)
            elif isinstance(t, TupleType):
                stack.extend((f, f"{name}, field {k}") for k, f in enumerate(t.fields))

    def _fits_folding(self, e: Expr) -> bool:
        """Whether every tensor computed on the way to ``e`` is small enough to compute now
        (a small result may come from a large intermediate, as a one-hot mask)."""
        try:
            typed = infer_types(e)
        except Error:
            return False
        limit = self.limits.max_elements
        for sub in post_order(typed):
            t = sub.checked_type_
            if isinstance(t, TensorType) and t.is_static and math.prod(t.static_shape) > limit:
                return False
        return True

    # --- nodes -------------------------------------------------------------------------------

    def order(self, nodes: Sequence[onnx.NodeProto]) -> list[int]:
        """The nodes in dependency order (the given order where it allows); errors for inputs
        that nothing produces and for cycles, naming the nodes."""
        producer: dict[str, int] = {}
        for k, n in enumerate(nodes):
            for o in n.output:
                if not o:
                    continue
                if o in producer:
                    first = describe_node(nodes[producer[o]], producer[o])
                    raise Error(f"{describe_node(n, k)} and {first} both produce {o!r}")
                if self.lookup(o) is not None:
                    raise Error(f"{describe_node(n, k)} produces {o!r}, which is already a "
                                "graph input or initializer")
                producer[o] = k
        deps: list[set[int]] = []
        users: list[list[int]] = [[] for _ in nodes]
        for k, n in enumerate(nodes):
            mine: set[int] = set()
            for name in node_dependencies(n):
                if name in producer:
                    if producer[name] == k:
                        raise Error(f"{describe_node(n, k)} reads its own output {name!r}")
                    mine.add(producer[name])
                elif self.lookup(name) is None:
                    raise Error(f"{describe_node(n, k)} reads {name!r}, which is never produced "
                                "(it is not a graph input, an initializer, or the output of "
                                "any node)")
            deps.append(mine)
            for d in mine:
                users[d].append(k)
        waiting = [len(d) for d in deps]
        ready = [k for k in range(len(nodes)) if waiting[k] == 0]
        heapq.heapify(ready)
        out: list[int] = []
        while ready:
            k = heapq.heappop(ready)
            out.append(k)
            for u in users[k]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, u)
        if len(out) < len(nodes):
            raise Error(_cycle_message(nodes, deps, set(out)))
        return out

    def convert_nodes(self, nodes: Sequence[onnx.NodeProto]) -> None:
        for k in self.order(nodes):
            self.convert_node(nodes[k], k)

    def convert_node(self, node: onnx.NodeProto, index: int) -> None:
        where = describe_node(node, index)
        domain = normalize_domain(node.domain)
        opset = self.opsets.get(domain, 0)
        conv = lookup(domain, node.op_type, opset)
        if self.outer is not None:  # a subgraph's node: converted once per use of the graph
            self.budget.count_subgraph_node(node, where)
        inputs: list[Value | None] = [self.lookup(n) if n else None for n in node.input]
        if conv is None:
            body = function_body(node, opset, inputs)
            if body is None:
                raise Error(f"{where}: kiln has no converter for {node.op_type} at opset {opset}")
            outs = convert_function_call(self, node, body, inputs, where)
            for name, v in zip(node.output, outs):
                if name:
                    if v is None:
                        raise Error(f"{where}: its function body does not compute {name!r}")
                    self.define(name, v)
            return
        present = [v for v in inputs if v is not None]
        foldable = (node.op_type not in _NOT_FOLDED and all(v.foldable for v in present)
                    and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                for a in node.attribute))
        if foldable:
            inputs = [None if v is None else _folded(v) for v in inputs]
        ctx = NodeContext(node, index, inputs, opset, self)
        try:
            result = conv.fn(ctx)
        except Error as err:
            if err.message.startswith(where):
                raise
            raise in_context(err, where) from None
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError,
                OverflowError, AttributeError, AssertionError) as exc:
            raise Error(f"{where}: cannot convert it: {type(exc).__name__}: {exc}") from None
        except MemoryError as exc:
            raise Error(f"{where}: converting it needs more memory than there is ({exc}); a "
                        "size in the model is probably far larger than intended") from None
        except RecursionError:
            raise Error(f"{where}: its subgraphs are nested too deeply for kiln to convert") \
                from None
        self.bind_outputs(node, result, where, foldable, inputs)

    def bind_outputs(self, node: onnx.NodeProto, result: object, where: str,
                     foldable: bool, inputs: Sequence[Value | None]) -> None:
        outputs: list[Expr | None]
        if isinstance(result, Expr):
            ty = type_of(result, where)
            if isinstance(ty, TupleType) and len(node.output) > 1:
                tup = self.bind(_first_name(node), result, where, False).expr
                outputs = [TupleGetItem(tup, k) for k in range(len(ty.fields))]
            else:
                outputs = [result]
        elif isinstance(result, Iterable):
            outputs = list(result)
        else:
            raise InternalError(f"{where}: the converter returned {result!r}, not expressions")
        for k, name in enumerate(node.output):
            if not name:
                continue
            e = outputs[k] if k < len(outputs) else None
            if e is None:
                raise Error(f"{where}: kiln does not compute its output {k} ({name!r})")
            self.define(name, self.bind(name, e, where, foldable, inputs))

    # --- results -----------------------------------------------------------------------------

    def finish(self, results: Iterable[str], where: str, as_tuple: bool = False) -> Expr:
        """The let chain ending in the named values (one, or a tuple of several)."""
        exprs = []
        for name in results:
            v = self.lookup(name) if name else None
            if v is None:
                raise Error(f"{where}: output {name!r} is never produced")
            exprs.append(v.expr)
        body: Expr = exprs[0] if len(exprs) == 1 and not as_tuple else Tuple(tuple(exprs))
        for var, value in reversed(self.bindings):
            body = Let(var, value, body)
        return body


def _folded(v: Value) -> Value:
    """A foldable value as a constant expression (foldable: its array is known)."""
    assert v.const is not None
    return Value(Constant(v.const), v.type, v.const)


def _first_name(node: onnx.NodeProto) -> str:
    return next((o for o in node.output if o), node.op_type)


def _small_tensor(ty: object) -> bool:
    if not isinstance(ty, TensorType) or not ty.is_static:
        return False
    return math.prod(ty.static_shape) <= FOLD_LIMIT


def _cycle_message(nodes: Sequence[onnx.NodeProto], deps: list[set[int]], done: set[int]) -> str:
    """Name the nodes of one cycle among those that could not be ordered."""
    left = [k for k in range(len(nodes)) if k not in done]
    # Every node left waits on another node left: walk back until a node repeats.
    seen: dict[int, int] = {}
    path: list[int] = []
    k = left[0]
    while k not in seen:
        seen[k] = len(path)
        path.append(k)
        k = next(d for d in sorted(deps[k]) if d not in done)
    cycle = path[seen[k]:]
    cycle.reverse()  # producers first
    names = " -> ".join(describe_node(nodes[j], j) for j in [*cycle, cycle[0]])
    return f"the graph has a cycle: {names}"
