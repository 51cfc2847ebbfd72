"""Where each operator of a picture came from: the ONNX node it was converted from.

The ONNX importer binds each node's outputs to ``let`` variables named after the ONNX values,
in node order (``kiln/frontend/onnx/graph.py``), and keeps the kiln name -> ONNX name map; it
does not mark the calls themselves. `onnx_origins` does, before anything else runs: every
operator call in the bindings of one ONNX node (its own results, and the helpers a converter
binds before them, as LSTM's steps) gets a source span whose file is the list of the model's
nodes, one per line, and whose line is that node's. Spans survive the passes (each rebuilt node
keeps its span), so after fusion each operator still says which ONNX node it implements: the
picture can name it (``--names``) and collapse all of one node's operators (an LSTM's 70) into
one box (``--collapse``). A call with any other span (Relay text) is named by its file and line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner

from kiln.errors import SourceFile, Span
from kiln.ir.expr import Call, Expr, Function, Let, Op
from kiln.ir.module import IRModule
from kiln.ir.traverse import rewrite
from kiln.viz.dataflow import DataflowGraph


@dataclass
class OnnxNode:
    """One ONNX node as a picture shows it: name, type, attributes and initializer inputs."""

    name: str
    op_type: str
    attrs: list[str] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)


@dataclass
class Origins:
    """The ONNX nodes the spans made by `onnx_origins` point at (line k: node k - 1)."""

    source: SourceFile
    nodes: list[OnnxNode]

    def of(self, span: Span | None) -> int | None:
        """The index of the ONNX node a span points at, or None."""
        if span is None or span.source is not self.source:
            return None
        return span.line - 1 if 1 <= span.line <= len(self.nodes) else None


def where(span: Span | None, origins: Origins | None) -> str:
    """A node's name: its ONNX node's (``conv1 (Conv)``), else its file and line, else ''."""
    k = origins.of(span) if origins is not None else None
    if origins is not None and k is not None:
        node = origins.nodes[k]
        return f"{node.name} ({node.op_type})" if node.name else node.op_type
    if span is not None and span.source is not None:
        return f"{Path(span.source.name).name}:{span.line}"
    return ""


def _onnx_attr(a: onnx.AttributeProto) -> str:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return f"{a.name}=<graph>"
    if a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS):
        return f"{a.name}=<tensor>"
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif isinstance(value, list):
        value = "[" + ", ".join(v.decode() if isinstance(v, bytes) else f"{v:g}"
                                if isinstance(v, float) else str(v) for v in value) + "]"
    elif isinstance(value, float):
        value = f"{value:g}"
    return f"{a.name}={value}"


def _input_names(node: onnx.NodeProto, opset: int) -> list[str]:
    """The schema's names of a node's inputs (X, W, B), where ONNX knows the operator."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except Exception:  # noqa: BLE001 - onnx.defs.SchemaError: a custom operator
        return []
    names = [i.name for i in schema.inputs]
    if names and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        names += [names[-1]] * max(0, len(node.input) - len(names))
    return names


def describe_nodes(graph: onnx.GraphProto, opset: int) -> list[OnnxNode]:
    """Each node of ``graph`` as the picture shows it."""
    init = {t.name: t for t in graph.initializer}
    out = []
    for node in graph.node:
        names = _input_names(node, opset)
        weights = []
        for k, i in enumerate(node.input):
            if i in init:
                t = init[i]
                dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
                shape = ", ".join(str(d) for d in t.dims)
                weights.append(f"{names[k] if k < len(names) else i} "
                               f"{np.dtype(dtype).name}[{shape}]")
        out.append(OnnxNode(node.name, node.op_type, [_onnx_attr(a) for a in node.attribute],
                            weights))
    return out


def onnx_origins(mod: IRModule, nodes: Sequence[onnx.NodeProto], onnx_names: Mapping[str, str],
                 described: list[OnnxNode], model_name: str) -> tuple[IRModule, Origins]:
    """``mod`` (as imported) with each operator call of ``@main`` marked with its ONNX node."""
    text = "\n".join(f"{d.name or '#' + str(k)} ({d.op_type})" for k, d in enumerate(described))
    origins = Origins(SourceFile(f"{model_name} (ONNX nodes)", text), described)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    main = mod["main"]
    lets: list[Let] = []
    e: Expr = main.body
    while isinstance(e, Let):
        lets.append(e)
        e = e.body
    node_of: dict[int, int] = {}  # let -> ONNX node
    pending: list[Let] = []
    for let in lets:
        pending.append(let)
        k = producer.get(onnx_names.get(let.var.name_hint, ""))
        if k is not None:
            for p in pending:
                node_of[id(p)] = k
            pending = []
    body = e
    for let in reversed(lets):
        value = let.value
        k = node_of.get(id(let))
        if k is not None:
            span = Span(origins.source, k + 1, 1, k + 1, 1)

            def mark(x: Expr, span: Span = span) -> Expr | None:
                if isinstance(x, Call) and isinstance(x.op, Op) and x.span is None:
                    return replace(x, span=span)
                return None

            value = rewrite(value, mark)
        body = Let(let.var, value, body, span=let.span)
    fn = Function(main.params, body, main.ret_type, main.type_params, main.attrs,
                  span=main.span)
    return mod.with_function("main", fn), origins


def name_nodes(graph: DataflowGraph, origins: Origins | None) -> DataflowGraph:
    """``graph`` with each operator named after where it came from (`where`)."""
    nodes = [replace(n, name=where(n.span, origins)) if n.span is not None else n
             for n in graph.nodes]
    return DataflowGraph(nodes, graph.edges, graph.groups)


def model_origins(mod: IRModule, proto: onnx.ModelProto, onnx_names: Mapping[str, str],
                  model_name: str) -> tuple[IRModule, Origins]:
    """`onnx_origins` for a model as `kiln.frontend.onnx.import_model` imported it."""
    if proto.functions:  # the importer converts the graph with its local functions inlined
        proto = onnx.inliner.inline_local_functions(proto)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    described = describe_nodes(proto.graph, opset)
    return onnx_origins(mod, proto.graph.node, onnx_names, described, model_name)
