"""ONNX functions: operators defined by a body of other operators.

Two kinds reach the importer:

- *model-local* functions (``model.functions``), which are inlined before conversion
  (``onnx.inliner``);
- operators of the standard that ONNX itself defines as a function (``Celu``,
  ``MeanVarianceNormalization``, ``Attention``, ``SoftmaxCrossEntropyLoss``, ...). When the
  converter table has no entry for such an operator at the model's opset, the node is replaced
  by the function body ONNX gives for it — for *context-dependent* functions, the body ONNX
  builds for the node's attributes and input types — and the body's nodes are converted in
  its place. The table's own entries come first: they give kiln's operators directly
  (``nn.layer_norm`` rather than thirty small steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import onnx
import onnx.defs
import onnx.inliner

from kiln.errors import Error
from kiln.frontend.onnx.context import ONNX_TYPES, Value, in_context
from kiln.frontend.onnx.table import normalize_domain
from kiln.ir.ty import AnyDim, SymDim, TensorType

if TYPE_CHECKING:
    from kiln.frontend.onnx.graph import GraphImporter


def expand_functions(model: onnx.ModelProto, opsets: dict[str, int]) -> onnx.ModelProto:
    """The model with its model-local functions inlined."""
    if not model.functions:
        return model
    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - the inliner's own errors
        raise Error(f"cannot inline the model's local functions: {exc}") from None


class _FunctionSchema(Protocol):
    """The function bodies of an `onnx.defs.OpSchema`.

    onnx's C++ extension has these members (onnx 1.23: ``get_*`` return the serialized
    FunctionProto), but its type stub does not declare them.
    """

    @property
    def has_function(self) -> bool: ...
    @property
    def has_context_dependent_function(self) -> bool: ...
    @property
    def function_opset_versions(self) -> list[int]: ...
    @property
    def context_dependent_function_opset_versions(self) -> list[int]: ...
    def get_function_with_opset_version(self, version: int, /) -> bytes: ...
    def get_context_dependent_function_with_opset_version(
            self, version: int, node: bytes, input_types: Sequence[bytes], /) -> bytes: ...


def _functions(schema: onnx.defs.OpSchema) -> _FunctionSchema:
    # Every OpSchema has these members at run time; only the stub lacks them (see above).
    return cast(_FunctionSchema, schema)


def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - SchemaError: no such operator at that opset
        return None


def has_function(op_type: str, domain: str, opset: int) -> bool:
    """Whether ONNX defines the operator, at this opset, by a function body."""
    schema = _schema(op_type, domain, opset)
    if schema is None:
        return False
    functions = _functions(schema)
    return functions.has_function or functions.has_context_dependent_function


def _pick(versions: list[int], opset: int) -> int:
    below = [v for v in versions if v <= opset]
    return max(below) if below else min(versions)


def _type_proto(ty: object) -> onnx.TypeProto:
    assert isinstance(ty, TensorType)
    dims: list[int | str | None] = []
    for d in ty.shape:
        dims.append(d.name if isinstance(d, SymDim) else None if isinstance(d, AnyDim) else d)
    return onnx.helper.make_tensor_type_proto(ONNX_TYPES[ty.dtype], dims)


def function_body(node: onnx.NodeProto, opset: int,
                  inputs: list[Value | None]) -> onnx.FunctionProto | None:
    """The body ONNX defines for a node's operator (None when it defines none)."""
    domain = normalize_domain(node.domain)
    found = _schema(node.op_type, domain, opset)
    if found is None:
        return None
    schema = _functions(found)
    body = onnx.FunctionProto()
    if schema.has_context_dependent_function:
        version = _pick(list(schema.context_dependent_function_opset_versions), opset)
        types = [(_type_proto(v.type) if v is not None else onnx.TypeProto()).SerializeToString()
                 for v in inputs]
        try:
            data = schema.get_context_dependent_function_with_opset_version(
                version, node.SerializeToString(), types)
        except Exception as exc:  # noqa: BLE001 - ONNX refuses this node's attributes or types
            raise Error(f"ONNX cannot expand {node.op_type} into its function body: "
                        f"{exc}") from None
        body.ParseFromString(data)
    elif schema.has_function:
        version = _pick(list(schema.function_opset_versions), opset)
        data = schema.get_function_with_opset_version(version)
        if isinstance(data, bytes):
            body.ParseFromString(data)
        else:
            body.CopyFrom(data)
    else:
        return None
    return body if body.node else None


def _resolve_attributes(n: onnx.NodeProto, caller: onnx.NodeProto,
                        defaults: dict[str, onnx.AttributeProto]) -> None:
    """Replace the body's references to the caller's attributes (``ref_attr_name``)."""
    given = {a.name: a for a in caller.attribute}
    kept = []
    for a in n.attribute:
        if a.ref_attr_name:
            source = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if source is None:
                continue  # not given and no default: the body's operator default applies
            b = onnx.AttributeProto()
            b.CopyFrom(source)
            b.name = a.name
            kept.append(b)
        else:
            kept.append(a)
    del n.attribute[:]
    n.attribute.extend(kept)


def _rename_subgraphs(n: onnx.NodeProto, outer: Callable[[str], str], caller: onnx.NodeProto,
                      defaults: dict[str, onnx.AttributeProto]) -> None:
    """In the subgraphs of a body node (If's branches, Scan's body), rename the values read
    from the body as the body's own were renamed, and resolve the caller's attributes there."""
    stack: list[tuple[onnx.GraphProto, frozenset[str]]] = []
    for a in n.attribute:
        stack.extend((g, frozenset()) for g in _graphs(a))
    while stack:
        g, enclosing = stack.pop()
        local = set(enclosing)
        local.update(i.name for i in g.input)
        local.update(t.name for t in g.initializer)
        local.update(o for m in g.node for o in m.output if o)
        for m in g.node:
            for i, name in enumerate(m.input):
                if name and name not in local:
                    m.input[i] = outer(name)
            _resolve_attributes(m, caller, defaults)
            for a in m.attribute:
                stack.extend((sub, frozenset(local)) for sub in _graphs(a))
        for o in g.output:
            if o.name not in local:
                o.name = outer(o.name)


def _graphs(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    return list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []


def convert_function_call(importer: GraphImporter, node: onnx.NodeProto, body: onnx.FunctionProto,
                          inputs: list[Value | None], where: str) -> list[Value | None]:
    """Convert the nodes of ``body`` for ``node``; the values of the node's outputs."""
    from kiln.frontend.onnx.graph import GraphImporter

    opsets = {normalize_domain(o.domain): int(o.version) for o in body.opset_import}
    for d, version in importer.opsets.items():
        opsets.setdefault(d, version)
    child = GraphImporter(opsets, importer.names, budget=importer.budget)
    child.bindings = importer.bindings  # one let chain
    prefix = next((o for o in node.output if o), node.op_type) + "__"
    rename: dict[str, str] = {}
    for k, name in enumerate(body.input):
        v = inputs[k] if k < len(inputs) else None
        if v is not None:
            child.define(name, v)
            rename[name] = name
        else:
            rename[name] = ""  # an optional input the node leaves out
    defaults = {a.name: a for a in body.attribute_proto}
    schema = _schema(node.op_type, normalize_domain(node.domain), importer.opsets.get(
        normalize_domain(node.domain), 0))
    if schema is not None:
        for name, a in schema.attributes.items():
            if name not in defaults and a.default_value.type:
                defaults[name] = a.default_value
    nodes = []
    for n in body.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for i, name in enumerate(m.input):
            m.input[i] = rename.get(name, prefix + name) if name else ""
        for i, name in enumerate(m.output):
            m.output[i] = prefix + name if name else ""
        _resolve_attributes(m, node, defaults)
        _rename_subgraphs(m, lambda name: rename.get(name, prefix + name), node, defaults)
        nodes.append(m)
    try:
        child.convert_nodes(nodes)
    except Error as err:
        raise in_context(err, f"{where}, in the function body ONNX defines for it") from None
    out: list[Value | None] = []
    for name in body.output:
        out.append(child.lookup(rename.get(name, prefix + name)))
    return out
