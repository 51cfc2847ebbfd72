"""annotate: which conv2d / dense calls of a float model run in int8 (Relay's first step).

The model is first brought to the form the rewrite reads: weights bound as constants, batch
norms folded into the convolutions (simplify-inference, fold-constant, fold-scale-axis), pure
dataflow (graph normal form). A *layer* is then

    relu?(bias?(nn.conv2d | nn.dense (x, W)))      W a constant, the bias a constant per channel

and the annotation lists the layers chosen, the tensors calibration must observe (each
layer's input and output) and, for every candidate left in float, why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.ir.expr import Call, Constant, Expr, Function, Op, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order
from kiln.ir.ty import TensorType
from kiln.transform.bind_params import bind_params
from kiln.transform.pass_manager import PassContext, Sequential, get_pass

log = logging.getLogger("kiln.quant")

LAYER_OPS = ("nn.conv2d", "nn.dense")
BIAS_OPS = ("add", "nn.bias_add")
# Passes that fold batch norm and scales into the weights and leave pure dataflow.
PREPARE = ("infer-type", "to-graph-normal-form", "simplify-inference", "fold-constant",
           "simplify-expr", "fold-scale-axis", "fold-constant", "dead-code-elimination",
           "infer-type")


@dataclass(frozen=True, eq=False)
class Layer:
    """One conv2d / dense call with its constant weight, and the bias and relu after it."""

    index: int
    name: str
    call: Call
    weight: np.ndarray
    bias: Call | None = None
    bias_value: np.ndarray | None = None  # one value per output channel
    relu: Call | None = None
    biases: tuple[Call, ...] = ()  # every bias op folded into ``bias_value`` (``bias`` last)

    @property
    def inner(self) -> tuple[Expr, ...]:
        """The layer's nodes before its end."""
        return tuple(e for e in (self.call, *self.biases) if e is not self.end)

    @property
    def op(self) -> str:
        """"nn.conv2d" or "nn.dense"."""
        assert isinstance(self.call.op, Op)
        return self.call.op.name

    @property
    def data(self) -> Expr:
        """The layer's float input."""
        return self.call.args[0]

    @property
    def end(self) -> Expr:
        """The last node of the layer: its relu, else its bias, else the call."""
        return self.relu if self.relu is not None else self.bias if self.bias is not None \
            else self.call


@dataclass(frozen=True, eq=False)
class Annotation:
    """The prepared float module, its quantized layers, and the tensors to calibrate."""

    module: IRModule
    layers: tuple[Layer, ...]
    observed: tuple[Expr, ...]  # distinct tensors: every layer's data and end
    left_float: tuple[tuple[str, str], ...] = field(default=())  # (layer name, why)

    def slot(self, e: Expr) -> int:
        """The index of an observed tensor in ``observed``."""
        for i, o in enumerate(self.observed):
            if o is e:
                return i
        raise Error(f"{e!r} is not a tensor this annotation observes")


Skip = Iterable[int | str] | Callable[[Layer], bool] | None


def prepare(mod: IRModule, params: Mapping[str, Any] | None = None) -> IRModule:
    """Bind ``params`` and fold batch norms and scales into the weights (pure dataflow)."""
    if not isinstance(mod, IRModule):
        raise Error(f"kiln.quantize takes an IRModule, not {type(mod).__name__}")
    if params:
        mod = bind_params(mod, params)
    seq = Sequential([get_pass(n) for n in PREPARE], name="quantize-prepare")
    return PassContext(opt_level=3).run_pass(seq, mod)


def _names(mod: IRModule) -> list[str | None]:
    """The weight parameter's name of each conv2d / dense of @main, in post order."""
    out: list[str | None] = []
    for node in post_order(mod["main"].body):
        if isinstance(node, Call) and isinstance(node.op, Op) and node.op.name in LAYER_OPS:
            w = node.args[1] if len(node.args) > 1 else None
            out.append(w.name_hint if isinstance(w, Var) else None)
    return out


def _per_channel(c: Constant, channels: int, ndim: int, bias_op: str,
                 axis: int) -> np.ndarray | None:
    """The bias as one value per output channel (axis 1), or None if it is not one."""
    v = np.asarray(c.data)
    if v.dtype != np.float32:
        return None
    if bias_op == "nn.bias_add":
        return v.reshape(-1) if v.size == channels and axis % ndim == 1 else None
    # add: broadcast of (C,), (C,1,1), (1,C,1,1) against the (N, C, ...) output
    trailing = ndim - 2
    if v.ndim <= ndim and v.size == channels and v.ndim >= 1 + trailing and \
            v.shape[v.ndim - 1 - trailing] == channels:
        return v.reshape(-1)
    return None


def _opname(c: Call) -> str:
    return c.op.name if isinstance(c.op, Op) else ""


def _why_not(call: Call) -> str | None:
    """Why this conv2d / dense cannot be quantized, or None when it can."""
    w = call.args[1]
    x_t = call.args[0].checked_type
    if not isinstance(w, Constant):
        return "its weight is not a constant (bind it through params)"
    if not isinstance(x_t, TensorType) or x_t.dtype != "float32" or \
            np.asarray(w.data).dtype != np.float32:
        return "it is not float32"
    if call.attrs.get("out_dtype", "") not in ("", "float32"):
        return f"its out_dtype is {call.attrs['out_dtype']}"
    if _opname(call) == "nn.conv2d":
        if call.attrs["data_layout"] != "NCHW" or call.attrs["kernel_layout"] != "OIHW":
            return "its layout is not NCHW/OIHW"
    elif x_t.ndim != 2:
        return "its data is not 2-D"
    return None


def _skip_check(skip: Skip, layers: list[Layer]) -> Callable[[Layer], bool]:
    if skip is None:
        return lambda _layer: False
    if callable(skip):
        return skip
    items = list(skip)
    names = {lay.name for lay in layers}
    alias: dict[str, str] = {}
    for lay in layers:
        bare = lay.name.removeprefix("p_")  # torch.export names parameters p_<key>
        for a in (bare, bare.removesuffix("_weight")):
            alias.setdefault(a, lay.name)
    chosen: set[str | int] = set()
    for s in items:
        if isinstance(s, bool) or not isinstance(s, (int, str)):
            raise Error(f"skip takes layer names, indices or a predicate, not {s!r}")
        if isinstance(s, int):
            if not -len(layers) <= s < len(layers):
                raise Error(f"skip: there is no layer {s}; the model has {len(layers)} "
                            f"(0 to {len(layers) - 1})")
            chosen.add(s % len(layers))
        elif s in names:
            chosen.add(s)
        elif s.replace(".", "_") in alias:
            chosen.add(alias[s.replace(".", "_")])
        else:
            raise Error(f"skip: no layer is named {s!r}; the layers are "
                        f"{', '.join(sorted(names)) or 'none'}")
    return lambda lay: lay.index in chosen or lay.name in chosen


def annotate(mod: IRModule, params: Mapping[str, Any] | None = None, *, skip: Skip = None,
             skip_first: bool = False, skip_last: bool = False) -> Annotation:
    """Choose the conv2d / dense layers to quantize; ``skip`` names, indices or a predicate
    on `Layer` of the ones to leave in float, ``skip_first`` / ``skip_last`` the first conv2d
    and the last dense."""
    names = _names(mod) if isinstance(mod, IRModule) and "main" in mod else []
    prepared = prepare(mod, params)
    body = prepared["main"].body
    order = post_order(body)
    users: dict[int, list[Expr]] = {}
    for node in order:
        for kid in children(node):
            users.setdefault(id(kid), []).append(node)
    users.setdefault(id(body), []).append(body)  # the result is used by the caller

    calls = [n for n in order if isinstance(n, Call) and isinstance(n.op, Op)
             and n.op.name in LAYER_OPS]
    use_names = len(calls) == len(names)
    candidates: list[Layer] = []
    left: list[tuple[str, str]] = []
    for i, c in enumerate(calls):
        opname = _opname(c)
        short = "conv2d" if opname == "nn.conv2d" else "dense"
        name = (names[i] if use_names and names[i] else None) or f"{short}_{i}"
        why = _why_not(c)
        if why is not None:
            left.append((f"{name} ({opname})", why))
            continue
        w = c.args[1]
        assert isinstance(w, Constant)  # _why_not checked it
        weight = np.asarray(w.data)
        out_t = c.checked_type
        assert isinstance(out_t, TensorType)
        bias: Call | None = None
        bias_value: np.ndarray | None = None
        relu: Call | None = None
        end: Expr = c
        biases: list[Call] = []
        while True:  # a conv's own bias, then a folded batch norm's shift: one bias
            after = users.get(id(end), [])
            b = after[0] if len(after) == 1 else None
            if not (isinstance(b, Call) and _opname(b) in BIAS_OPS and b.args[0] is end
                    and isinstance(b.args[1], Constant)):
                break
            axis = b.attrs.get("axis", 1)
            bv = _per_channel(b.args[1], weight.shape[0], out_t.ndim, _opname(b),
                              axis if isinstance(axis, int) else 1)
            if bv is None:
                break
            bias_value = bv if bias_value is None else bias_value + bv
            biases.append(b)
            bias, end = b, b
        after = users.get(id(end), [])
        r = after[0] if len(after) == 1 else None
        if isinstance(r, Call) and _opname(r) == "nn.relu":
            relu = r
        candidates.append(Layer(len(candidates), name, c, weight, bias, bias_value, relu,
                                tuple(biases)))

    convs = [lay for lay in candidates if lay.op == "nn.conv2d"]
    denses = [lay for lay in candidates if lay.op == "nn.dense"]
    skipped = _skip_check(skip, candidates)
    chosen: list[Layer] = []
    for lay in candidates:
        if skipped(lay):
            left.append((lay.name, "skipped"))
        elif skip_first and convs and lay is convs[0]:
            left.append((lay.name, "skip_first: the first conv2d stays float"))
        elif skip_last and denses and lay is denses[-1]:
            left.append((lay.name, "skip_last: the last dense stays float"))
        else:
            chosen.append(lay)
    for name, why in left:
        if why != "skipped" and not why.startswith("skip_"):
            log.warning("kiln.quantize: %s stays float32: %s", name, why)
    if not chosen:
        reasons = "; ".join(f"{n}: {w}" for n, w in left) or "it has no nn.conv2d or nn.dense"
        raise Error(f"kiln.quantize: nothing in this model can be quantized, it stays float "
                    f"({reasons})")
    observed: list[Expr] = []
    seen: set[int] = set()
    for lay in chosen:
        for e in (lay.data, lay.end):
            if id(e) not in seen:
                seen.add(id(e))
                observed.append(e)
    return Annotation(prepared, tuple(chosen), tuple(observed), tuple(left))


def observing(ann: Annotation) -> Function:
    """@main of the annotated module returning also every observed tensor (calibration's)."""
    from kiln.ir.expr import Tuple

    main = ann.module["main"]
    return Function(main.params, Tuple((main.body, *ann.observed)))
