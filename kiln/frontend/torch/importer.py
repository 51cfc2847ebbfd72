"""From a torch.nn.Module to kiln: torch.export, decomposition to core ATen when some operator
needs it (`decompose.py`), then the FX graph walked node by node through the converter table
(`registry.py`), each node's kiln value kept in an environment.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from kiln.errors import Error, InternalError, TypeCheckError

# Importing the families fills the converter table.
from kiln.frontend.torch import (  # noqa: F401
    activation,
    attention,
    composite,
    conv,
    creation,
    elementwise,
    emulated,
    indexing,
    linear,
    norm,
    reduce,
    rnn,
    scatter,
    shape,
    sort,
)
from kiln.frontend.torch.decompose import (
    CHECKS,
    converter_name,
    decompose,
    graph_nodes,
    is_structural,
)
from kiln.frontend.torch.norm import KEY_TYPE
from kiln.frontend.torch.registry import CONVERTERS, AtenCall, Missing, kiln_dtype
from kiln.frontend.torch.sizes import Sources, add_sources
from kiln.infer import infer_types
from kiln.ir import (
    Constant,
    Expr,
    Function,
    If,
    IRModule,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    const,
)
from kiln.ir.attrs import Attrs
from kiln.ir.traverse import free_vars
from kiln.op import reshape
from kiln.runtime.named_io import INPUT_NAMES, OUTPUT_NAMES

_TORCH_DIR = os.path.dirname(torch.__file__)
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # kiln/
# Operators that only a module in training mode exports (batch statistics, random dropout).
_TRAINING_ONLY = re.compile(r"batch_norm|dropout|bernoulli|rand")
_PARAMS_AS = ("params", "constants")


def from_torch(model: Any, example_inputs: Any = None, *, params_as: str = "params",
               dynamic_shapes: Any = None) -> tuple[IRModule, dict[str, np.ndarray]]:
    """`kiln.frontend.from_torch` once torch is known to be there (see its docstring)."""
    if params_as not in _PARAMS_AS:
        raise Error(f"params_as must be 'params' or 'constants', not {params_as!r}")
    exported = _export(model, example_inputs, dynamic_shapes)
    symbols = _symbol_names(exported, model, example_inputs, dynamic_shapes)
    training = isinstance(model, torch.nn.Module) and model.training
    return _Importer(decompose(exported), params_as, symbols, training).run()


def _export(model: Any, example_inputs: Any, dynamic_shapes: Any) -> ExportedProgram:
    if isinstance(model, ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise Error(f"from_torch takes a torch.nn.Module or an ExportedProgram, not "
                    f"{type(model).__name__}")
    if example_inputs is None:
        raise Error("from_torch needs example inputs: from_torch(model, (x,))")
    args = _as_args(example_inputs)
    try:
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch's own errors, from tracing the user's code
        text = str(e).strip()
        first = text.splitlines()[0] if text else ""
        raise Error(f"torch.export could not export {type(model).__name__}"
                    f"{_user_frame(text)}: {type(e).__name__}: {first}") from e


def _user_frame(text: str) -> str:
    """`` (at model.py:12: `if x.sum() > 0:`)``: the last frame of the user's code that a torch
    error message quotes, if any."""
    frames = re.findall(r'File "([^"]+)", line (\d+)[^\n]*\n[ \t]*([^\n]*)', text)
    mine = [f for f in frames if not f[0].startswith(_TORCH_DIR) and not f[0].startswith(_KILN_DIR)]
    if not mine:
        return ""
    file, line, code = mine[-1]
    code = code.split("  #")[0].strip()
    return f" (at {os.path.basename(file)}:{line}{f': `{code}`' if code else ''})"


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise Error(f"example inputs must be a tuple of tensors, not "
                    f"{type(example_inputs).__name__}")
    return example_inputs


def _symbol_names(exported: ExportedProgram, model: Any, example_inputs: Any,
                  dynamic_shapes: Any) -> dict[str, str]:
    """torch's symbol for each dynamic dimension (``s17``) → the name of its ``Dim``."""
    if dynamic_shapes is None or isinstance(model, ExportedProgram):
        return {}
    args = _as_args(example_inputs)
    specs: Any = dynamic_shapes
    if isinstance(specs, Mapping):
        names = list(inspect.signature(model.forward).parameters)[: len(args)]
        specs = [specs.get(name) for name in names]
    user = set(exported.graph_signature.user_inputs)
    nodes = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name in user]
    found: dict[str, str] = {}
    for node, spec in zip(nodes, specs):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(spec, (Mapping, list, tuple)):
            continue
        for axis, dim in (spec.items() if isinstance(spec, Mapping) else enumerate(spec)):
            name = getattr(dim, "__name__", None)
            if not isinstance(name, str) or not name.isidentifier() or axis >= val.ndim:
                continue
            size = val.shape[axis]
            if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                found.setdefault(str(size.node.expr), name)
    return found


def _where(node: torch.fx.Node) -> str:
    """How an error names a node: ``node %addmm (aten.addmm.default, at model.py:12)``."""
    place = _source_line(node)
    module = ""
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, kind = list(stack.values())[-1]
        name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
        module = f", in {path or 'the model'} ({name})"
    return f"node %{node.name} ({node.target}{module}{place})"


def _place(node: torch.fx.Node) -> str:
    """`` (in layer1.0.bn1, at model.py:12)``: the submodule and the line that made a node."""
    stack = node.meta.get("nn_module_stack")
    path = list(stack.values())[-1][0] if stack else ""
    parts = [f"in {path}"] if path else []
    line = _source_line(node)
    if line:
        parts.append(line.removeprefix(", "))
    return f" ({', '.join(parts)})" if parts else ""


def _source_line(node: torch.fx.Node) -> str:
    """``, at file.py:12`` for the innermost frame of the user's own code that made a node."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    mine = [(f, line) for f, line in frames
            if not f.startswith(_TORCH_DIR) and not f.startswith(_KILN_DIR)]
    if not mine:
        return ""
    file, line = mine[-1]
    return f", at {os.path.basename(file)}:{line}"


def _identifier(name: str) -> str:
    name = re.sub(r"\W", "_", name)
    return name if name and not name[0].isdigit() else f"p_{name}"


class _Importer:
    """Walks one exported graph in order, keeping each node's kiln value."""

    def __init__(self, exported: ExportedProgram, params_as: str, symbols: dict[str, str],
                 training: bool) -> None:
        self.ep = exported
        self.params_as = params_as
        self.symbols = symbols
        self.sources: Sources = {}  # torch's size symbol -> (input, axis) it is the size of
        self.training = training
        self.env: dict[torch.fx.Node, Any] = {}
        self.types: dict[int, TensorType] = {}  # id of a node's kiln expression → its type
        self.sizes: dict[int, tuple[Any, ...]] = {}  # ... → its sizes as torch has them
        self.inputs: list[Var] = []
        self.weights: list[Var] = []
        self.params: dict[str, np.ndarray] = {}
        self.names: set[str] = set()
        self.input_names: list[str] = []  # the placeholders' names, one per input
        self.output_names: list[str] | None = None  # the keys of a dict the model returns

    def run(self) -> tuple[IRModule, dict[str, np.ndarray]]:
        self._check_supported()
        body: Expr | None = None
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "get_attr":
                self.env[node] = getattr(self.ep.graph_module, str(node.target))
            elif node.op == "output":
                body = self._output(node)
        assert body is not None, "an exported graph always has an output node"
        # The model's names where kiln's differ (kiln/runtime/named_io.py): an executable
        # takes and gives values by them.
        io_names: dict[str, object] = {}
        if any(v.name_hint != n for v, n in zip(self.inputs, self.input_names)):
            io_names[INPUT_NAMES] = self.input_names
        if self.output_names is not None:
            io_names[OUTPUT_NAMES] = self.output_names
        # Dropout keys of a model in training mode (kiln/frontend/torch/norm.py): parameters
        # after the weights, not among the params (kiln.train.Step fills them each step).
        known = {id(v) for v in (*self.inputs, *self.weights)}
        keys = [v for v in free_vars(body) if id(v) not in known]
        for v in keys:
            if v.type_annotation != KEY_TYPE:
                raise InternalError(f"the imported program uses %{v.name_hint}, which is "
                                    "neither an input, a weight nor a dropout key")
        fn = Function((*self.inputs, *self.weights, *keys), body, attrs=Attrs(io_names))
        try:
            mod = infer_types(IRModule.from_expr(fn))
        except TypeCheckError as e:
            raise InternalError(f"the imported program does not type-check: {e.message}") from e
        return mod, self.params

    # --- checks -----------------------------------------------------------------------------

    def _check_supported(self) -> None:
        """One error listing every operator kiln cannot convert, with the nodes using it."""
        missing: dict[str, list[torch.fx.Node]] = {}
        for node in graph_nodes(self.ep.graph_module):
            if node.op != "call_function" or is_structural(node):
                continue
            if converter_name(node) is None:
                missing.setdefault(str(node.target), []).append(node)
        if not missing:
            return
        lines = []
        for name, nodes in missing.items():
            shown = ", ".join(f"%{n.name}{_place(n)}" for n in nodes[:5])
            more = f" and {len(nodes) - 5} more" if len(nodes) > 5 else ""
            lines.append(f"  {name}: {'node' if len(nodes) == 1 else 'nodes'} {shown}{more}")
        hint = ""
        if self.training and any(_TRAINING_ONLY.search(name) for name in missing):
            hint = ("\n(the model is in training mode: call model.eval() before importing it "
                    "for inference)")
        count = f"{len(missing)} ATen operator{'s' if len(missing) > 1 else ''}"
        raise Error(f"the model uses {count} kiln cannot import:\n" + "\n".join(lines) + hint)

    # --- nodes ------------------------------------------------------------------------------

    def _placeholder(self, node: torch.fx.Node) -> None:
        spec = self._input_spec(node.name)
        val = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            if isinstance(val, torch.Tensor):
                v = Var(self._unique(_identifier(node.name)), self._type(val, node))
                add_sources(self.sources, v, val.shape)
                self.inputs.append(v)
                self.input_names.append(node.name)
                self._bind(node, v, val)
            else:
                self.env[node] = val  # torch.export specialized a non-tensor input
            return
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise Error(f"{_where(node)}: kiln cannot import a {spec.kind.name.lower()} input")
        if not node.users:
            return  # e.g. BatchNorm's num_batches_tracked
        if not isinstance(val, torch.Tensor):
            raise InternalError(f"{_where(node)}: the exported program records no tensor for "
                                "this weight")
        tensor = (self.ep.constants[spec.target] if spec.kind == InputKind.CONSTANT_TENSOR
                  or spec.target not in self.ep.state_dict else self.ep.state_dict[spec.target])
        array = self._array(tensor, node)
        if self.params_as == "constants" or spec.kind == InputKind.CONSTANT_TENSOR:
            # A tensor made in forward (torch.tensor([...])) is part of the program, not a weight.
            self._bind(node, const(array), val)
            return
        v = Var(self._unique(_identifier(spec.target)), self._type(val, node))
        self.weights.append(v)
        self.params[v.name_hint] = array
        self._bind(node, v, val)

    def _input_spec(self, name: str) -> Any:
        for spec in self.ep.graph_signature.input_specs:
            if getattr(spec.arg, "name", None) == name:
                return spec
        raise InternalError(f"placeholder %{name} is not in the exported program's signature")

    def _call(self, node: torch.fx.Node) -> None:
        if node.target is operator.getitem:
            self._getitem(node)
            return
        if node.target is torch.ops.higher_order.cond:
            self._cond(node)
            return
        if str(node.target) in CHECKS:
            return
        val = node.meta.get("val")
        if not isinstance(val, (torch.Tensor, tuple, list)):
            self.env[node] = val  # size arithmetic: the value torch recorded (int or SymInt)
            return
        where = _where(node)
        call = AtenCall(node, where, self.types, self.sizes, self.symbols, self.sources)
        args = self._arguments(node, call)
        try:
            result = CONVERTERS[converter_name(node) or str(node.target)](call, *args)
        except Error as e:
            if e.message.startswith(where):
                raise
            raise Error(f"{where}: {e.message}") from e
        except Exception as e:  # a converter that breaks on an input it should handle
            raise InternalError(f"{where}: the converter failed with {type(e).__name__}: {e}") \
                from e
        if isinstance(result, (list, tuple)):
            vals = val if isinstance(val, (tuple, list)) else [val]
            for r, v in zip(result, vals):
                if isinstance(r, Expr) and isinstance(v, torch.Tensor):
                    self._record(r, v, node)
            self.env[node] = list(result)
        else:
            self._bind(node, result, val[0] if isinstance(val, (tuple, list)) else val)

    def _getitem(self, node: torch.fx.Node) -> None:
        source, index = node.args
        if not isinstance(source, torch.fx.Node):
            raise InternalError(f"{_where(node)}: getitem of {source!r}, not of a node")
        value = self.env[source][index]
        if isinstance(value, Missing) and node.users:
            raise Error(f"{_where(source)}: the model uses its {value.what}, which kiln does not "
                        f"compute (through %{node.name})")
        self.env[node] = value

    def _cond(self, node: torch.fx.Node) -> None:
        """``torch.cond(pred, true_fn, false_fn, operands)``: an ``if`` whose branches are the
        two subgraphs, converted with their placeholders bound to the operands."""
        pred, true_graph, false_graph, operands = node.args[:4]
        where = _where(node)
        if not isinstance(operands, (tuple, list)) or not isinstance(true_graph, torch.fx.Node) \
                or not isinstance(false_graph, torch.fx.Node):
            raise InternalError(f"{where}: torch.cond's arguments are {node.args!r}")
        cond = self.env[pred] if isinstance(pred, torch.fx.Node) else pred
        values = [self.env[a] if isinstance(a, torch.fx.Node) else a for a in operands]
        branches = [self._branch(self.env[true_graph], values, where),
                    self._branch(self.env[false_graph], values, where)]
        if isinstance(cond, bool):  # torch.export kept a condition it knew
            self.env[node] = branches[0 if cond else 1]
            return
        if not isinstance(cond, Expr):
            raise Error(f"{where}: the condition {cond!r} is not a tensor")
        t = self.types.get(id(cond))
        if t is None or t.dtype != "bool" or any(d != 1 for d in t.shape):
            raise Error(f"{where}: torch.cond needs a one-element bool condition, not {t}")
        if t.shape:
            cond = reshape(cond, newshape=[])
        chosen = If(cond, Tuple(tuple(branches[0])), Tuple(tuple(branches[1])))
        vals = node.meta.get("val")
        results: list[Expr] = []
        for i, v in enumerate(vals if isinstance(vals, (tuple, list)) else [vals]):
            item = TupleGetItem(chosen, i)
            if isinstance(v, torch.Tensor):
                self._record(item, v, node)
            results.append(item)
        self.env[node] = results

    def _branch(self, graph_module: Any, operands: list[Any], where: str) -> list[Expr]:
        """The results of one branch of a ``torch.cond``: its nodes converted in order."""
        if not isinstance(graph_module, torch.fx.GraphModule):
            raise InternalError(f"{where}: a branch of torch.cond is {graph_module!r}")
        inputs = iter(operands)
        for n in graph_module.graph.nodes:
            if n.op == "placeholder":
                value = next(inputs)
                self.env[n] = value
                val = n.meta.get("val")
                if isinstance(value, Expr) and isinstance(val, torch.Tensor):
                    self._record(value, val, n)
            elif n.op == "call_function":
                self._call(n)
            elif n.op == "get_attr":
                self.env[n] = getattr(graph_module, str(n.target))
            elif n.op == "output":
                outs = n.args[0]
                return [self._output_value(v) for v in
                        (outs if isinstance(outs, (tuple, list)) else [outs])]
        raise InternalError(f"{where}: a branch of torch.cond has no output")

    def _arguments(self, node: torch.fx.Node, call: AtenCall) -> list[Any]:
        """The node's arguments in schema order, defaults filled in, as converters take them."""
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            raw = list(node.args) + list(node.kwargs.values())
        else:
            raw = []
            for i, a in enumerate(schema.arguments):
                if i < len(node.args):
                    raw.append(node.args[i])
                elif a.name in node.kwargs:
                    raw.append(node.kwargs[a.name])
                else:
                    raw.append(a.default_value if a.has_default_value() else None)
        return [self._argument(a, call) for a in raw]

    def _argument(self, a: Any, call: AtenCall) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return [self._argument(x, call) for x in a]
        if isinstance(a, torch.dtype):
            name = kiln_dtype(a)
            if name is None:
                raise call.error(f"kiln has no dtype {str(a).removeprefix('torch.')}")
            return name
        return a

    def _output(self, node: torch.fx.Node) -> Expr:
        values = node.args[0]
        if not isinstance(values, (tuple, list)):
            raise InternalError(f"{_where(node)}: the output node holds {values!r}, not a sequence")
        specs = self.ep.graph_signature.output_specs
        kept = [self._output_value(v) for v, spec in zip(values, specs)
                if spec.kind == OutputKind.USER_OUTPUT]
        spec = self.ep.call_spec.out_spec
        if spec is None or spec.num_leaves != len(kept):
            return kept[0] if len(kept) == 1 else Tuple(tuple(kept))
        keys = spec.context if spec.type is dict else None
        if isinstance(keys, list) and len(keys) > 1 and all(isinstance(k, str) for k in keys):
            self.output_names = list(keys)  # a dict of outputs: a tuple of its values
        return _as_tuples(pytree.tree_unflatten(kept, spec))

    def _output_value(self, v: Any) -> Expr:
        value = self.env[v] if isinstance(v, torch.fx.Node) else v
        if isinstance(value, Expr):
            return value
        if isinstance(value, (bool, int, float)):
            return const(value)
        raise Error(f"the model returns {value!r}, which kiln cannot return")

    # --- helpers ----------------------------------------------------------------------------

    def _bind(self, node: torch.fx.Node, expr: Expr, val: torch.Tensor) -> None:
        self._record(expr, val, node)
        self.env[node] = expr

    def _record(self, expr: Expr, val: torch.Tensor, node: torch.fx.Node) -> None:
        self.types[id(expr)] = self._type(val, node)
        self.sizes[id(expr)] = tuple(val.shape)

    def _type(self, val: torch.Tensor, node: torch.fx.Node) -> TensorType:
        return AtenCall(node, _where(node), self.types, self.sizes, self.symbols, self.sources) \
            .type_of_value(val)

    def _array(self, tensor: torch.Tensor, node: torch.fx.Node) -> np.ndarray:
        if kiln_dtype(tensor.dtype) is None:
            raise Error(f"{_where(node)}: kiln has no dtype "
                        f"{str(tensor.dtype).removeprefix('torch.')}")
        return tensor.detach().cpu().contiguous().numpy().copy()

    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name


def _as_tuples(value: Any) -> Expr:
    """A model's (nested) outputs as kiln values: tuples, lists and dicts become tuples."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return Tuple(tuple(_as_tuples(v) for v in value))
    if isinstance(value, Constant):
        return value
    return const(value)
