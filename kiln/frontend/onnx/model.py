"""`from_onnx`: an ONNX model (a path, bytes or a ModelProto) to a kiln module and its weights.

The steps: read and parse the file; check that kiln converts every operator the model uses (one
error lists all that it does not); check the graph's structure (every input produced, no
cycles) and, with ``onnx.checker``, the rest of the ONNX rules; then convert: the graph's inputs
become ``@main``'s leading parameters in order, the initializers its remaining ones (or
constants), and the nodes a chain of let bindings ending in the graph's output (a tuple when
there are several). @main's attributes keep the graph's names where kiln's differ:
``output_names`` always, ``input_names`` when an input's name is not an identifier
(``input.1`` becomes ``%input_1``); executables take and give values by them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from kiln.errors import Error
from kiln.frontend.onnx import converters  # noqa: F401 - fills the converter table
from kiln.frontend.onnx.context import Value, kiln_dtype, tensor_to_array
from kiln.frontend.onnx.functions import expand_functions, has_function
from kiln.frontend.onnx.graph import GraphImporter, Names
from kiln.frontend.onnx.limits import Budget, LimitsLike, resolve
from kiln.frontend.onnx.table import (
    DEFAULT_DOMAIN,
    MAX_OPSET,
    lookup,
    normalize_domain,
)
from kiln.infer import infer_types
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Constant, Function, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import free_vars
from kiln.ir.ty import ANY, Dim, SymDim, TensorType
from kiln.runtime.named_io import INPUT_NAMES, OUTPUT_NAMES

ModelLike = str | os.PathLike | bytes | bytearray | onnx.ModelProto


@dataclass
class ImportedModel:
    """A converted model: the module, its weights, and how ONNX names map to kiln's."""

    module: IRModule
    params: dict[str, np.ndarray]
    inputs: list[str]  # the ONNX names of @main's leading parameters, in order
    outputs: list[str]
    opsets: dict[str, int]
    onnx_names: dict[str, str] = field(default_factory=dict)  # kiln name -> ONNX name


def load_model(model: ModelLike) -> onnx.ModelProto:
    """The ModelProto of a path, bytes or ModelProto; a kiln.Error for what is not ONNX."""
    if isinstance(model, onnx.ModelProto):
        return model
    where = "the model"
    base_dir: str | None = None
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        where, base_dir = str(path), str(path.parent)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise Error(f"cannot read {path}: {exc.strerror or exc}") from None
    else:
        raise Error(f"from_onnx takes a path, bytes or an onnx.ModelProto, not "
                    f"{type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise Error(f"{where} is not a valid ONNX model (truncated or not ONNX at all): "
                    f"{exc}") from None
    if not proto.HasField("graph") or not proto.graph.output:
        raise Error(f"{where} is not a valid ONNX model: it has no graph with outputs "
                    "(a truncated file, or not ONNX at all)")
    _check_text(proto, where)
    if base_dir is not None and _has_external_data(proto):
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
        except Exception as exc:  # noqa: BLE001 - missing or short data files
            raise Error(f"{where}: cannot load its external weight files: {exc}") from None
    return proto


def _check_text(proto: onnx.ModelProto, where: str) -> None:
    """ONNX's names are text; protobuf hands back bytes for a name that is not UTF-8."""
    def bad(texts: Any) -> str | None:
        return next((repr(t) for t in texts if isinstance(t, bytes)), None)

    found = bad(o.domain for o in proto.opset_import)
    for g in all_graphs(proto.graph) if found is None else []:
        values = [*g.input, *g.output, *g.value_info]
        found = bad([g.name, *(v.name for v in values), *(t.name for t in g.initializer),
                     *(d.dim_param for v in values if v.type.HasField("tensor_type")
                       for d in v.type.tensor_type.shape.dim)])
        for n in g.node:
            found = found or bad([n.name, n.op_type, n.domain, *n.input, *n.output,
                                  *(a.name for a in n.attribute)])
        if found:
            break
    if found is not None:
        raise Error(f"{where} is not a valid ONNX model: the name {found} is not UTF-8 text "
                    "(a damaged file?)")


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def model_opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The opset imported for each domain ("" is the default domain)."""
    opsets = {normalize_domain(o.domain): int(o.version) for o in model.opset_import}
    if DEFAULT_DOMAIN not in opsets and model.ir_version < 3:
        opsets[DEFAULT_DOMAIN] = 1  # before opset_import existed
    return opsets


def all_graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """A graph and every subgraph in it, outermost first."""
    out, stack = [], [graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
    return out


def unsupported_operators(model: onnx.ModelProto) -> list[str]:
    """One line per operator kiln cannot convert: domain, opset and the nodes using it."""
    opsets = model_opsets(model)
    missing: dict[tuple[str, str], list[str]] = {}
    for g in all_graphs(model.graph):
        for k, n in enumerate(g.node):
            domain = normalize_domain(n.domain)
            if domain in opsets and (lookup(domain, n.op_type, opsets[domain]) is not None
                                     or has_function(n.op_type, domain, opsets[domain])):
                continue
            missing.setdefault((domain, n.op_type), []).append(n.name or f"#{k}")
    lines = []
    for (domain, op), nodes in sorted(missing.items()):
        shown = ", ".join(repr(x) for x in nodes[:5]) + (" ..." if len(nodes) > 5 else "")
        where = f"domain {domain!r}" if domain else "the default domain"
        version = (f"opset {opsets[domain]}" if domain in opsets
                   else "a domain the model does not import")
        lines.append(f"{op} ({where}, {version}): {len(nodes)} node(s): {shown}")
    return lines


def check_opsets(model: onnx.ModelProto) -> dict[str, int]:
    opsets = model_opsets(model)
    default = opsets.get(DEFAULT_DOMAIN)
    if default is not None and default > MAX_OPSET:
        raise Error(f"the model imports opset {default} of the default ONNX domain; kiln "
                    f"converts opsets up to {MAX_OPSET}")
    return opsets


def check_model(model: onnx.ModelProto) -> None:
    """The ONNX checker's verdict as a kiln.Error (the structure was checked before)."""
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - ValidationError, and protobuf errors
        message = str(exc).strip().splitlines()
        raise Error(f"the ONNX checker rejects the model: {' '.join(message)[:500]}") from None


def input_type(info: onnx.ValueInfoProto, names: Names,
               shape: Sequence[Any] | None = None) -> TensorType:
    """The kiln type of a graph input: symbolic dims become `SymDim`s, unknown ones ``?``."""
    t = info.type
    if not t.HasField("tensor_type"):
        kind = (t.WhichOneof("value") or "no type").replace("_type", "")
        article = "an" if kind[0] in "aeiou" else "a"
        raise Error(f"graph input {info.name!r} is {article} {kind}; kiln imports tensor inputs "
                    "only")
    dtype = kiln_dtype(t.tensor_type.elem_type, f"graph input {info.name!r}")
    if shape is not None:
        return TensorType(tuple(shape), dtype)
    if not t.tensor_type.HasField("shape"):
        raise Error(f"graph input {info.name!r} has no shape; give one with "
                    f"from_onnx(..., shapes={{{info.name!r}: (...)}})")
    dims: list[Dim] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            if d.dim_value < 0:
                raise Error(f"graph input {info.name!r} has a negative dimension {d.dim_value}")
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(SymDim(_dim_name(d.dim_param)))
        else:
            dims.append(ANY)
    return TensorType(tuple(dims), dtype)


def _bound_input(name: str, value: Any, ty: TensorType) -> np.ndarray:
    """The value given for a graph input in ``constants=``, checked against its type."""
    array = np.asarray(value)
    if array.dtype.name != ty.dtype or array.ndim != len(ty.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(ty.shape, array.shape)):
        raise Error(f"constants= gives graph input {name!r} an array of dtype "
                    f"{array.dtype.name} and shape {array.shape}, but the input has type {ty}")
    return array


def _dim_name(param: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in param)
    return name if name and (name[0].isalpha() or name[0] == "_") else f"d_{name}"


def _declared_shape(info: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    tt = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tt is None or not tt.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim)


def import_model(model: ModelLike, *, params_as: str = "params",
                 shapes: Mapping[str, Sequence[Any]] | None = None,
                 constants: Mapping[str, Any] | None = None,
                 check: bool = True, limits: LimitsLike = None) -> ImportedModel:
    """Convert an ONNX model; see `from_onnx`. Also says how the names were mapped."""
    if params_as not in ("params", "constants"):
        raise Error(f"params_as must be 'params' or 'constants', not {params_as!r}")
    budget = Budget(resolve(limits))
    proto = load_model(model)
    opsets = check_opsets(proto)
    proto = expand_functions(proto, opsets)
    missing = unsupported_operators(proto)
    if missing:
        raise Error("kiln cannot convert these ONNX operators:\n  " + "\n  ".join(missing))
    graph = proto.graph
    names = Names()
    importer = GraphImporter(opsets, names, budget=budget)
    init_names = {t.name for t in graph.initializer}
    shapes = dict(shapes or {})
    constants = dict(constants or {})
    for what, given in (("shapes", shapes), ("constants", constants)):
        unknown = sorted(set(given) - {i.name for i in graph.input})
        if unknown:
            raise Error(f"{what}= names {', '.join(map(repr, unknown))}, which are not graph "
                        "inputs")
    inputs: list[Var] = []
    input_names: list[str] = []
    declared = {i.name: i for i in graph.input}
    for info in graph.input:
        if info.name in init_names:
            continue
        if not info.name or importer.lookup(info.name) is not None:
            raise Error(f"graph input {info.name!r} is declared twice or has no name")
        ty = input_type(info, names, shapes.get(info.name))
        importer.check_type(ty, f"graph input {info.name!r}", "the input")
        if info.name in constants:
            c = Constant(_bound_input(info.name, constants[info.name], ty))
            importer.define(info.name, Value(c, c.tensor_type, c.data))
            continue
        v = Var(names.fresh(info.name), ty)
        inputs.append(v)
        input_names.append(info.name)
        importer.define(info.name, Value(v, ty))
    weights: list[tuple[Var, np.ndarray]] = []
    for t in graph.initializer:
        array = tensor_to_array(t, f"initializer {t.name!r}")
        if t.name in declared:
            want = _declared_shape(declared[t.name])
            if want is not None and (len(want) != array.ndim or any(
                    w is not None and w != n for w, n in zip(want, array.shape))):
                shown = tuple("?" if w is None else w for w in want)
                raise Error(f"initializer {t.name!r} has shape {array.shape}, but the graph "
                            f"input of that name declares shape {shown}")
        if importer.lookup(t.name) is not None:
            raise Error(f"initializer {t.name!r} is defined twice")
        ty = TensorType(array.shape, array.dtype.name)
        if params_as == "constants":
            c = Constant(array)
            importer.define(t.name, Value(c, ty, c.data))
        else:
            v = Var(names.fresh(t.name), ty)
            weights.append((v, array))
            importer.define(t.name, Value(v, ty, array, weight=True))
    if graph.sparse_initializer:
        raise Error("the model has sparse initializers, which kiln does not import")
    importer.order(graph.node)  # structural errors first, naming the nodes
    if check:
        check_model(proto)
    importer.convert_nodes(graph.node)
    outputs = [o.name for o in graph.output]
    body = importer.finish(outputs, "the graph")
    used = set(free_vars(body))
    kept = [(v, a) for v, a in weights if v in used]
    # The graph's own names, which kiln identifiers cannot always keep (``input.1``): an
    # executable takes its inputs and gives its outputs by them (kiln/runtime/named_io.py).
    renamed = any(v.name_hint != n for v, n in zip(inputs, input_names))
    io_names = Attrs({INPUT_NAMES: input_names} if renamed else {}, **{OUTPUT_NAMES: outputs})
    fn = Function((*inputs, *(v for v, _ in kept)), body, attrs=io_names)
    try:
        mod = infer_types(IRModule.from_expr(fn))
    except Error as err:
        raise Error(f"the converted model does not type-check: {err.message}") from None
    return ImportedModel(mod, {v.name_hint: a for v, a in kept}, input_names, outputs, opsets,
                         dict(names.onnx_name))


def from_onnx(model: ModelLike, *, params_as: str = "params",
              shapes: Mapping[str, Sequence[Any]] | None = None,
              constants: Mapping[str, Any] | None = None,
              check: bool = True,
              limits: LimitsLike = None) -> tuple[IRModule, dict[str, np.ndarray]]:
    """An ONNX model (a path, bytes or an onnx.ModelProto) as a kiln module and its weights.

    The graph's inputs become @main's leading parameters, in order; its initializers the
    remaining ones, bound by name through ``params=`` (or, with ``params_as="constants"``,
    embedded as constants). ``shapes`` gives or overrides input shapes by ONNX name;
    ``constants`` fixes graph inputs to values (inputs that are shapes or axes, which kiln
    needs at import time), which then are not parameters. One graph output is the result;
    several are a tuple. ``check`` runs ``onnx.checker`` on the model. ``limits`` raises the
    import limits that protect against hostile files (a `limits.Limits`, or a dict such as
    ``{"max_unroll": 2**20}`` over the ``KILN_MAX_*`` environment variables; `limits.py`).
    """
    imported = import_model(model, params_as=params_as, shapes=shapes, constants=constants,
                            check=check, limits=limits)
    return imported.module, imported.params
