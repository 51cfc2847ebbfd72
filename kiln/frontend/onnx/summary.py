"""A text summary of an ONNX model, without converting it (what ``kiln show model.onnx`` prints).

It reads the model's declarations only: graph inputs and outputs with their element types and
shapes (symbolic dimensions by name), the operators with their counts (subgraphs included)
and whether kiln converts each at the model's opset, the number of weights and their element
types, and the opsets imported. A file that is not ONNX is a `kiln.Error`, as for `from_onnx`.
"""

from __future__ import annotations

import math
import sys
import types
from collections import Counter
from typing import Any

import onnx

from kiln.frontend.onnx.context import DTYPES, elem_type_name
from kiln.frontend.onnx.functions import has_function
from kiln.frontend.onnx.model import all_graphs, load_model, model_opsets
from kiln.frontend.onnx.table import lookup, normalize_domain


def _dtype(elem_type: int) -> str:
    """kiln's name for an element type (float32), or ONNX's for one kiln lacks (BFLOAT16)."""
    return DTYPES.get(elem_type) or elem_type_name(elem_type)


def _dims(info: onnx.ValueInfoProto) -> str:
    t = info.type
    if not t.HasField("tensor_type"):
        return t.WhichOneof("value") or "no type"
    tt = t.tensor_type
    dtype = _dtype(tt.elem_type)
    if not tt.HasField("shape"):
        return f"{dtype}[unknown shape]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tt.shape.dim]
    return f"{dtype}[{', '.join(dims)}]"


def _count(t: onnx.TensorProto) -> int:
    return math.prod(t.dims)  # exact: a hostile file's dimensions may overflow int64's product


def summary(model: Any) -> str:
    """A model's inputs, outputs, operators (with counts), parameter count and types, as text."""
    proto = load_model(model)
    graph = proto.graph
    opsets = model_opsets(proto)
    init_names = {t.name for t in graph.initializer}
    lines = []
    producer = " ".join(x for x in (proto.producer_name, proto.producer_version) if x)
    lines.append(f"ONNX model {graph.name!r}" + (f" (from {producer})" if producer else ""))
    lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(opsets.items())))
    inputs = [i for i in graph.input if i.name not in init_names]
    lines.append(f"inputs ({len(inputs)}):")
    lines.extend(f"  {i.name}: {_dims(i)}" for i in inputs)
    lines.append(f"outputs ({len(graph.output)}):")
    lines.extend(f"  {o.name}: {_dims(o)}" for o in graph.output)
    ops: Counter[tuple[str, str]] = Counter()
    for g in all_graphs(graph):
        for n in g.node:
            ops[(normalize_domain(n.domain), n.op_type)] += 1
    lines.append(f"operators ({sum(ops.values())} nodes, {len(ops)} kinds):")
    for (domain, op_type), count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        opset = opsets.get(domain)
        known = opset is not None and (lookup(domain, op_type, opset) is not None
                                       or has_function(op_type, domain, opset))
        name = f"{domain}.{op_type}" if domain else op_type
        lines.append(f"  {name:32} {count:6}" + ("" if known else "   (kiln cannot convert it)"))
    weights = list(graph.initializer)
    total = sum(_count(t) for t in weights)
    by_type = Counter(_dtype(t.data_type) for t in weights)
    types = ", ".join(f"{n} {d}" for d, n in sorted(by_type.items()))
    lines.append(f"parameters: {total:,} in {len(weights)} initializers"
                 + (f" ({types})" if types else ""))
    return "\n".join(lines) + "\n"


class _CallableModule(types.ModuleType):
    """This module, callable as its `summary` function.

    Importing the submodule ``kiln.frontend.onnx.summary`` rebinds the package attribute of
    that name from the function to the module (Python's import system does so after loading
    it); being callable, the module keeps ``kiln.frontend.onnx.summary(model)`` working.
    """

    def __call__(self, model: Any) -> str:
        return summary(model)


sys.modules[__name__].__class__ = _CallableModule
