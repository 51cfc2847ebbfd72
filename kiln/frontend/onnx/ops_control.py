"""Converters of ONNX's control flow: If, Loop and Scan.

``If`` becomes kiln's ``if`` (or just the branch taken, when the condition is known at import
time). ``Loop`` and ``Scan`` become local tail-recursive functions, as kiln writes loops:

    let %loop = fn (%i: int64, %cond: bool, %state..., %scan_acc...) {
      if (%i < %trip_count && %cond) {
        let %r = <the body>;
        %loop(%i + 1, %r.0, %r.1 ..., concatenate((%scan_acc, expand_dims(%r.k, 0)), 0) ...)
      } else { (%state..., %scan_acc...) }
    };

A loop-carried value whose shape changes between iterations gets unknown (``?``) dimensions.
A ``Loop`` whose body needs the iteration number at import time (a Slice at ``i``) is unrolled
instead, when the trip count is known and at most `UNROLL_LIMIT`.
"""

from __future__ import annotations

import numpy as np
import onnx

from kiln import op
from kiln.errors import Error
from kiln.frontend.onnx.context import NeedsConstant, NodeContext, Value, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Call, Constant, Expr, Function, If, Let, Tuple, TupleGetItem, Var
from kiln.ir.ty import ANY, TensorType, TupleType, Type

UNROLL_LIMIT = 256


def _child(ctx: NodeContext, graph: onnx.GraphProto, inputs: list[Value], inline: bool):
    """An importer for a subgraph whose inputs are bound to ``inputs``."""
    from kiln.frontend.onnx.context import tensor_to_array
    from kiln.frontend.onnx.graph import GraphImporter

    parent = ctx.graph
    child = GraphImporter(parent.opsets, parent.names, outer=parent)
    if inline:
        child.bindings = parent.bindings
    if len(graph.input) != len(inputs):
        raise ctx.error(f"its subgraph {graph.name!r} takes {len(graph.input)} inputs, but the "
                        f"node gives it {len(inputs)}")
    for info, v in zip(graph.input, inputs):
        child.define(info.name, v)
    for t in graph.initializer:
        c = Constant(tensor_to_array(t, f"initializer {t.name!r}"))
        child.define(t.name, Value(c, c.tensor_type, c.data))
    try:
        child.convert_nodes(graph.node)
    except NeedsConstant:
        raise
    except Error as err:
        raise ctx.error(f"in its subgraph {graph.name!r}: {err.message}") from None
    return child


def inline_graph(ctx: NodeContext, graph: onnx.GraphProto, inputs: list[Value]) -> list[Value]:
    """Convert a subgraph in place (its bindings join the enclosing chain); its outputs."""
    child = _child(ctx, graph, inputs, inline=True)
    out = []
    for o in graph.output:
        v = child.lookup(o.name)
        if v is None:
            raise ctx.error(f"its subgraph {graph.name!r} never produces {o.name!r}")
        out.append(v)
    return out


def graph_expr(ctx: NodeContext, graph: onnx.GraphProto, inputs: list[Value],
               as_tuple: bool) -> tuple[Expr, list[Type]]:
    """A subgraph as an expression (its own let chain) and the types of its outputs."""
    child = _child(ctx, graph, inputs, inline=False)
    names = [o.name for o in graph.output]
    e = child.finish(names, f"{ctx.where}: subgraph {graph.name!r}", as_tuple=as_tuple)
    types = []
    for n in names:
        v = child.lookup(n)
        assert v is not None
        types.append(v.type)
    return e, types


def _scalar(x: Expr) -> Expr:
    return op.reshape(x, newshape=[])


# --- If ------------------------------------------------------------------------------------


@converter("If", since=1)
def if_(ctx: NodeContext) -> Expr | list[Expr]:
    then_g, else_g = ctx.subgraph("then_branch"), ctx.subgraph("else_branch")
    known = ctx.const(0)
    if known is not None:
        taken = then_g if bool(np.asarray(known).reshape(-1)[0]) else else_g
        return [v.expr for v in inline_graph(ctx, taken, [])]
    several = ctx.num_outputs > 1
    then_e, _ = graph_expr(ctx, then_g, [], several)
    else_e, _ = graph_expr(ctx, else_g, [], several)
    return If(_scalar(ctx.x(0)), then_e, else_e)


# --- Loop ----------------------------------------------------------------------------------


def _widen(t: Type, other: Type) -> Type:
    """A type covering both (dimensions that differ become ``?``)."""
    if isinstance(t, TensorType) and isinstance(other, TensorType) and t.ndim == other.ndim:
        return TensorType(tuple(a if a == b else ANY for a, b in zip(t.shape, other.shape)),
                          t.dtype)
    return t


def _typed_var(ctx: NodeContext, name: str, t: Type) -> Value:
    return Value(Var(ctx.graph.names.fresh(name), t), t)


def _var(v: Value) -> Var:
    """The variable of a value made by `_typed_var` (a function's parameter)."""
    assert isinstance(v.expr, Var)
    return v.expr


def _tensor_type(ctx: NodeContext, t: Type, what: str) -> TensorType:
    if not isinstance(t, TensorType):
        raise ctx.error(f"{what} must be a tensor, not {t}")
    return t


def _append(acc: Expr, item: Expr, reverse: bool = False) -> Expr:
    row = op.expand_dims(item, axis=0)
    return op.concatenate([row, acc] if reverse else [acc, row], axis=0)


def _empty_acc(t: TensorType) -> Expr:
    if not t.is_static:
        raise Error("a scan output of unknown element shape")
    return Constant(np.zeros((0, *t.static_shape), dtype=t.dtype))


@converter("Loop", since=1)
def loop(ctx: NodeContext) -> list[Expr]:
    body = ctx.subgraph("body")
    n_state = len(ctx.inputs) - 2
    try:
        return _loop_recursive(ctx, body, n_state)
    except NeedsConstant:
        trip = ctx.int_scalar(0, "trip count") if ctx.const(0) is not None else None
        if trip is None or trip > UNROLL_LIMIT:
            raise
        return _loop_unrolled(ctx, body, n_state, trip)


def _loop_recursive(ctx: NodeContext, body: onnx.GraphProto, n_state: int) -> list[Expr]:
    where = ctx.where
    state_types: list[Type] = [ctx.value(2 + k).type for k in range(n_state)]
    for _attempt in range(3):
        i = _typed_var(ctx, "i", TensorType((), "int64"))
        c = _typed_var(ctx, "cond", TensorType((), "bool"))
        states = [_typed_var(ctx, f"state{k}", t) for k, t in enumerate(state_types)]
        body_e, out_types = graph_expr(ctx, body, [i, c, *states], as_tuple=True)
        if len(out_types) < 1 + n_state:
            raise ctx.error("the loop body has fewer outputs than loop-carried values")
        widened = [_widen(t, o) for t, o in zip(state_types, out_types[1:1 + n_state])]
        if widened == state_types:
            break
        state_types = widened
    else:
        raise ctx.error("the loop-carried values change type from one iteration to the next")
    scan_types = [_tensor_type(ctx, t, "a scan output") for t in out_types[1 + n_state:]]
    accs = [_typed_var(ctx, f"scan{k}", TensorType((ANY, *t.shape), t.dtype))
            for k, t in enumerate(scan_types)]
    result_type = TupleType(tuple([*state_types, *(a.type for a in accs)]))
    fvar = Var(ctx.graph.names.fresh("loop"), None)
    params = tuple(_var(v) for v in (i, c, *states, *accs))
    r = Var(ctx.graph.names.fresh("body_out"), None)
    one = const_like(1, "int64")
    again = Call(fvar, (
        op.add(i.expr, one), _scalar(TupleGetItem(r, 0)),
        *(TupleGetItem(r, 1 + k) for k in range(n_state)),
        *(_append(a.expr, TupleGetItem(r, 1 + n_state + k)) for k, a in enumerate(accs))))
    go: Expr = c.expr
    trip_count = ctx.x(0) if ctx.has(0) else None
    if trip_count is not None:
        go = op.logical_and(op.less(i.expr, _scalar(op.cast(trip_count, dtype="int64"))), go)
    stop = Tuple(tuple(params[2:]))
    fn = Function(params, If(go, Let(r, body_e, again), stop), ret_type=result_type)
    cond0 = _scalar(ctx.x(1)) if ctx.has(1) else Constant(np.asarray(True))
    inits = [ctx.x(2 + k) for k in range(n_state)]
    start = Call(fvar, (Constant(np.asarray(0, "int64")), cond0, *inits,
                        *(_empty_acc(t) for t in scan_types)))
    del where
    out = ctx.let(Let(fvar, fn, start), "loop_out")
    return [TupleGetItem(out, k) for k in range(n_state + len(accs))]


def _loop_unrolled(ctx: NodeContext, body: onnx.GraphProto, n_state: int,
                   trip: int) -> list[Expr]:
    states = [ctx.value(2 + k) for k in range(n_state)]
    cond = ctx.const(1) if ctx.has(1) else np.asarray(True)
    if cond is None:
        raise ctx.error("kiln unrolls this loop (its body needs the iteration number at import "
                        "time), but its condition is only known at run time")
    scans: list[list[Expr]] = []
    for step in range(trip):
        if not bool(np.asarray(cond).reshape(-1)[0]):
            break
        i = Value(Constant(np.asarray(step, "int64")), TensorType((), "int64"),
                  np.asarray(step, "int64"))
        cv = Value(Constant(np.asarray(True)), TensorType((), "bool"), np.asarray(True))
        outs = inline_graph(ctx, body, [i, cv, *states])
        cond = outs[0].const
        if cond is None:
            raise ctx.error("kiln unrolls this loop, but its condition is computed at run time")
        states = outs[1:1 + n_state]
        if not scans:
            scans = [[] for _ in outs[1 + n_state:]]
        for k, v in enumerate(outs[1 + n_state:]):
            scans[k].append(v.expr)
    n_scan = len(body.output) - 1 - n_state
    if n_scan and not scans:
        raise ctx.error("an unrolled loop that runs no iteration has scan outputs of unknown "
                        "shape")
    return [*(s.expr for s in states), *(op.stack(items, axis=0) for items in scans)]


# --- Scan ----------------------------------------------------------------------------------


@converter("Scan", since=9)
def scan(ctx: NodeContext) -> list[Expr]:
    m = ctx.need_attr("num_scan_inputs")
    n_state = len(ctx.inputs) - m
    in_dirs = list(ctx.attr("scan_input_directions", [0] * m))
    return _scan(ctx, [ctx.value(k) for k in range(n_state)],
                 [ctx.value(n_state + k) for k in range(m)],
                 list(ctx.attr("scan_input_axes", [0] * m)), in_dirs)


@converter("Scan", since=8)
def scan_8(ctx: NodeContext) -> list[Expr]:
    """Scan-8 scans axis 1 of inputs with a leading batch axis: one Scan-9 per batch entry
    (the batch size must be static), stacked; ``sequence_lens`` must be the full length."""
    m = ctx.need_attr("num_scan_inputs")
    n_state = len(ctx.inputs) - 1 - m
    if n_state < 0:
        raise ctx.error(f"it has {len(ctx.inputs)} inputs, fewer than 1 + num_scan_inputs")
    states = [ctx.value(1 + k) for k in range(n_state)]
    seqs = [ctx.value(1 + n_state + k) for k in range(m)]
    batch = ctx.shape(1 + n_state)[0]
    steps = ctx.shape(1 + n_state)[1]
    ctx.check_unroll(batch, "the batch size (kiln converts Scan-8's body once per batch entry)")
    if ctx.has(0):
        lens = ctx.ints(0, "sequence_lens")
        if any(n != steps for n in lens):
            raise ctx.error(f"sequence_lens {lens} differ from the scanned length {steps}; "
                            "kiln imports Scan-8 over whole sequences only")
    in_dirs = list(ctx.attr("directions", [0] * m))
    per_batch: list[list[Expr]] = []
    for b in range(batch):
        row = const_like(b, "int64")
        pick = [Value(op.take(v.expr, row, axis=0), TensorType(t.shape[1:], t.dtype))
                for v in [*states, *seqs]
                for t in [_tensor_type(ctx, v.type, "a Scan-8 input")]]
        outs = _scan(ctx, pick[:n_state], pick[n_state:], [0] * m, in_dirs)
        per_batch.append([ctx.let(e, "scan_batch") for e in outs])
    return [op.stack([outs[k] for outs in per_batch], axis=0)
            for k in range(len(per_batch[0]))] if per_batch else []


def _scan(ctx: NodeContext, state_values: list[Value], seqs: list[Value], in_axes: list[int],
          in_dirs: list[int]) -> list[Expr]:
    """Scan-9 and later: ``seqs`` scanned along ``in_axes``, carrying ``state_values``."""
    body = ctx.subgraph("body")
    n_state = len(state_values)
    seq_types = [_tensor_type(ctx, s.type, "a scanned input") for s in seqs]
    axes = [a % len(t.shape) for a, t in zip(in_axes, seq_types)]
    lengths = {t.shape[a] for t, a in zip(seq_types, axes)}
    length = next(iter(lengths)) if len(lengths) == 1 else None
    if not isinstance(length, int):
        raise ctx.error("the scanned axes must have one static length, not "
                        f"{sorted(map(str, lengths))}")
    steps = length
    state_types = [v.type for v in state_values]
    i = _typed_var(ctx, "i", TensorType((), "int64"))
    states = [_typed_var(ctx, f"state{k}", t) for k, t in enumerate(state_types)]
    slices = []
    for s, st, a, d in zip(seqs, seq_types, axes, in_dirs):
        index = op.subtract(const_like(steps - 1, "int64"), i.expr) if d else i.expr
        item = op.take(s.expr, index, axis=a, mode="clip")
        slices.append(Value(item, TensorType(tuple(x for j, x in enumerate(st.shape) if j != a),
                                             st.dtype)))
    body_e, out_types = graph_expr(ctx, body, [*states, *slices], as_tuple=True)
    for t, o in zip(state_types, out_types[:n_state]):
        if t != o:
            raise ctx.error(f"a scan state changes type from {t} to {o}")
    scan_types = [_tensor_type(ctx, t, "a scan output") for t in out_types[n_state:]]
    out_dirs = list(ctx.attr("scan_output_directions", [0] * len(scan_types)))
    out_axes = list(ctx.attr("scan_output_axes", [0] * len(scan_types)))
    accs = [_typed_var(ctx, f"scan{k}", TensorType((ANY, *t.shape), t.dtype))
            for k, t in enumerate(scan_types)]
    result_type = TupleType(tuple([*state_types, *(a.type for a in accs)]))
    fvar = Var(ctx.graph.names.fresh("scan"), None)
    r = Var(ctx.graph.names.fresh("body_out"), None)
    params = tuple(_var(v) for v in (i, *states, *accs))
    again = Call(fvar, (
        op.add(i.expr, const_like(1, "int64")),
        *(TupleGetItem(r, k) for k in range(n_state)),
        *(_append(a.expr, TupleGetItem(r, n_state + k), bool(out_dirs[k]))
          for k, a in enumerate(accs))))
    go = op.less(i.expr, const_like(steps, "int64"))
    fn = Function(params, If(go, Let(r, body_e, again), Tuple(tuple(params[1:]))),
                  ret_type=result_type)
    start = Call(fvar, (Constant(np.asarray(0, "int64")), *(v.expr for v in state_values),
                        *(_empty_acc(t) for t in scan_types)))
    out = ctx.let(Let(fvar, fn, start), "scan_out")
    results: list[Expr] = [TupleGetItem(out, k) for k in range(n_state)]
    for k, t in enumerate(scan_types):
        acc = op.reshape(TupleGetItem(out, n_state + k), newshape=[steps, *t.shape])
        axis = out_axes[k] % (len(t.shape) + 1)
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(t.shape) + 1))
            acc = op.transpose(acc, axes=perm)
        results.append(acc)
    return results
