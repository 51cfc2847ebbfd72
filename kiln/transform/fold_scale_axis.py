"""fold-scale-axis: fold a constant per-channel scale into convolution and dense weights.

Scaling one channel of a linear operator's output (or input) is the same as scaling the
weights that produce (or read) it, and weights are usually constants, so the multiply
disappears once `fold-constant` runs (TVM's FoldScaleAxis; batch-norm folding after
`simplify-inference`). What is handled, with ``s`` a constant that varies only along the
channel axis (a scalar, ``(C,)`` for dense, ``(C, 1, 1)`` or ``(1, C, 1, 1)`` for conv2d):

- a scale after the operator (TVM's "backward" direction), through at most three of
  ``nn.bias_add`` on the channel axis, ``add`` and ``nn.relu`` (relu only for ``s >= 0``)::

      conv2d(x, W) * s                 -> conv2d(x, W * s[c, None, None, None])
      bias_add(conv2d(x, W), b) * s    -> bias_add(conv2d(x, W * s'), b * s)
      relu(dense(x, W) + b) * s        -> relu(dense(x, W * s[:, None]) + b * s)

  Each operator on the way must have no other use (else it would be computed twice);
- a scale before the operator (TVM's "forward" direction), on its input channels::

      conv2d(x * s, W)  -> conv2d(x, W * s'')    (any groups; zero padding commutes)
      dense(x * s, W)   -> dense(x, W * s[None, :])

conv2d must be NCHW/OIHW without an ``out_dtype`` of its own. The weight scaling is left as
a ``multiply`` of the weight and a constant, for `fold-constant` to fold.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.expr import Call, Constant, Expr, Op, const
from kiln.ir.module import IRModule
from kiln.op import add, multiply
from kiln.op.common import normalize_axis
from kiln.op.nn import bias_add
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable

MAX_CHAIN = 3  # bias_add / add / relu between the operator and the scale


def channel_vector(scale: np.ndarray, ndim: int, axis: int, channels: int) -> np.ndarray | None:
    """The per-channel factors of a constant that varies only along ``axis`` of a rank-``ndim``
    result with ``channels`` channels, or None if it varies along another axis (or broadcasts
    the result to a larger shape)."""
    if scale.ndim > ndim:
        return None
    shape = (1,) * (ndim - scale.ndim) + scale.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(scale.reshape(-1), (channels,))


def _plain_conv(call: Call) -> bool:
    a = call.attrs
    return (a.data_layout == "NCHW" and a.kernel_layout == "OIHW"
            and a.out_layout in ("", "NCHW") and a.out_dtype == "")


def _op_call(e: Expr, *names: str) -> Call | None:
    """``e`` when it is a call of one of the operators ``names``."""
    if isinstance(e, Call) and isinstance(e.op, Op) and e.op.name in names:
        return e
    return None


def _int_attr(call: Call, name: str) -> int:
    value = call.attrs[name]
    assert isinstance(value, int)  # the operator's schema makes it an int
    return value


def fold_after(y: Expr, s: Constant, root: Expr, ctx: RewriteContext) -> Expr | None:
    """(conv2d|dense)(x, W) [bias_add|add|relu]* * s -> the same with W scaled per channel."""
    chain: list[Call] = []
    node = ctx.value_of(y)
    producer = _op_call(node, "nn.conv2d", "nn.dense")
    while producer is None:
        if len(chain) == MAX_CHAIN or ctx.uses(node) != 1:
            return None
        link = _op_call(node, "nn.relu", "nn.bias_add", "add")
        if link is None:
            return None
        chain.append(link)
        node = ctx.value_of(link.args[0])
        producer = _op_call(node, "nn.conv2d", "nn.dense")
    if not ctx.same_type(y, root):
        return None  # s would broadcast y to a larger shape
    out, wt = ctx.tensor_type(producer), ctx.tensor_type(producer.args[1])
    if ctx.uses(producer) != 1 or out is None or wt is None or not wt.is_static:
        return None
    if out.dtype != s.dtype or wt.dtype != s.dtype:
        return None  # a result wider than the weights (out_dtype): keep the multiply
    w = wt.static_shape
    weight_shape: tuple[int, ...]
    if _op_call(producer, "nn.conv2d") is not None:
        if not _plain_conv(producer):
            return None
        axis, weight_shape = 1, (w[0], 1, 1, 1)
    else:
        axis, weight_shape = out.ndim - 1, (w[0], 1)
    vec = channel_vector(s.data, out.ndim, axis, w[0])
    if vec is None:
        return None
    weight = multiply(producer.args[1], const(vec.reshape(weight_shape)))
    new: Expr = Call(producer.op, (producer.args[0], weight), producer.attrs, span=producer.span)
    for op in reversed(chain):
        assert isinstance(op.op, Op)  # every link of the chain is an operator call
        match op.op.name:
            case "nn.relu":
                if not np.all(vec >= 0):
                    return None  # relu(y) * s == relu(y * s) only for s >= 0
                new = Call(op.op, (new,), op.attrs, span=op.span)
            case "nn.bias_add":
                if normalize_axis(_int_attr(op, "axis"), out.ndim) != axis:
                    return None
                made = bias_add(new, multiply(op.args[1], const(vec)), axis=op.attrs.axis)
                new = Call(made.op, made.args, made.attrs, span=op.span)
            case "add":
                if not ctx.same_type(op, op.args[0]):
                    return None  # the addend broadcasts the sum to a larger shape
                made = add(new, multiply(op.args[1], s))
                new = Call(made.op, made.args, made.attrs, span=op.span)
    return new


def fold_before_conv(x: Expr, s: Constant, w: Expr, conv: Call,
                     ctx: RewriteContext) -> Expr | None:
    """conv2d(x * s, W) -> conv2d(x, W * s'), s' holding s[c] at every tap reading channel c."""
    wshape, xt = ctx.static_shape(w), ctx.tensor_type(x)
    if wshape is None or xt is None or xt.ndim != 4 or not _plain_conv(conv):
        return None
    groups = _int_attr(conv, "groups")
    out_channels, per_group = wshape[0], wshape[1]
    vec = channel_vector(s.data, 4, 1, per_group * groups)
    if vec is None or s.dtype != xt.dtype:
        return None
    if groups == 1:
        factors = vec.reshape(1, per_group, 1, 1)
    else:  # output channel o of group g reads input channels g*per_group ... (g+1)*per_group-1
        rows = np.repeat(vec.reshape(groups, per_group), out_channels // groups, axis=0)
        factors = rows[:, :, None, None]
    return Call(conv.op, (x, multiply(w, const(factors))), conv.attrs, span=conv.span)


def fold_before_dense(x: Expr, s: Constant, w: Expr, dense: Call,
                      ctx: RewriteContext) -> Expr | None:
    """dense(x * s, W) -> dense(x, W * s[None, :])."""
    wshape, xt = ctx.static_shape(w), ctx.tensor_type(x)
    if wshape is None or xt is None or s.dtype != xt.dtype:
        return None
    vec = channel_vector(s.data, xt.ndim, xt.ndim - 1, wshape[1])
    if vec is None:
        return None
    return Call(dense.op, (x, multiply(w, const(vec[None, :]))), dense.attrs, span=dense.span)


x, y, w, s = Pat.var("x"), Pat.var("y"), Pat.var("w"), Pat.const("s")


RULES = RewriteTable([
    (y * s, fold_after),                                                # conv(x, W)*s
    (s * y, fold_after),                                                # s*conv(x, W)
    (Pat.op("nn.conv2d", x * s, w, name="conv"), fold_before_conv),    # conv(x*s, W)
    (Pat.op("nn.conv2d", s * x, w, name="conv"), fold_before_conv),    # conv(s*x, W)
    (Pat.op("nn.dense", x * s, w, name="dense"), fold_before_dense),   # dense(x*s, W)
    (Pat.op("nn.dense", s * x, w, name="dense"), fold_before_dense),   # dense(s*x, W)
])


@module_pass("fold-scale-axis", opt_level=3)
def FoldScaleAxis(mod: IRModule, ctx: PassContext) -> IRModule:
    """Fold constant per-channel scales into conv2d and dense weights."""
    return RULES.apply_to_module(mod, ctx)
