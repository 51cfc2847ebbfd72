"""simplify-inference: replace training-time normalization and dropout by inference arithmetic.

At inference ``nn.batch_norm`` normalizes with its moving statistics, so its output is
an affine map per channel: ``x * scale + shift`` with

    scale = gamma / sqrt(moving_var + epsilon)        (1 / sqrt(...) when scale=False)
    shift = beta - moving_mean * scale                 (- moving_mean * scale when center=False)

broadcast along ``axis`` (TVM's SimplifyInference). The per-channel vectors are expressions of
the batch_norm's operands; with constant statistics `fold-constant` turns them into constants,
and `fold-scale-axis` can then fold ``scale`` into the preceding convolution. The moving
statistics (fields 1 and 2) pass through unchanged. ``nn.dropout`` is the identity at
inference: field 0 becomes its input, field 1 (the mask) ``ones_like`` of it.

``nn.layer_norm`` is expanded into mean / variance arithmetic only when asked, since a
backend may implement it better whole::

    PassContext(config={"simplify-inference.expand_layer_norm": True})
"""

from __future__ import annotations

from kiln.ir.expr import Call, Expr, const
from kiln.ir.module import IRModule
from kiln.op import add, expand_dims, mean, multiply, negative, ones_like, rsqrt, subtract
from kiln.op.common import normalize_axis
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable

EXPAND_LAYER_NORM = "simplify-inference.expand_layer_norm"

x = Pat.var("x")
gamma, beta = Pat.var("gamma"), Pat.var("beta")
moving_mean, moving_var = Pat.var("moving_mean"), Pat.var("moving_var")
batch_norm = Pat.op("nn.batch_norm", x, gamma, beta, moving_mean, moving_var, name="bn")
dropout = Pat.op("nn.dropout", x)


def along(vector: Expr, axis: int, ndim: int) -> Expr:
    """A 1-D vector shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    trailing = ndim - 1 - axis
    return expand_dims(vector, axis=1, num_newaxis=trailing) if trailing > 0 else vector


def batch_norm_out(x: Expr, gamma: Expr, beta: Expr, moving_mean: Expr, moving_var: Expr,
                   bn: Call, ctx: RewriteContext) -> Expr | None:
    """batch_norm(x, ...).0 -> x * scale + shift, per channel."""
    t = ctx.tensor_type(x)
    if t is None or bn.attrs.get("training"):
        return None
    attrs = bn.attrs
    axis = normalize_axis(attrs.axis, t.ndim)  # type: ignore[arg-type]
    scale = rsqrt(add(moving_var, const(attrs.epsilon, t.dtype)))
    if attrs.scale:
        scale = multiply(scale, gamma)
    shift = multiply(negative(moving_mean), scale)
    if attrs.center:
        shift = add(shift, beta)
    scaled = multiply(x, along(scale, axis, t.ndim))
    out = add(scaled, along(shift, axis, t.ndim))
    # The batch norm's source position goes to the calls that replace it (messages, profiles).
    scaled = Call(scaled.op, scaled.args, scaled.attrs, span=bn.span)
    return Call(out.op, (scaled, out.args[1]), out.attrs, span=bn.span)


def layer_norm(x: Expr, gamma: Expr, beta: Expr, ln: Call, ctx: RewriteContext) -> Expr | None:
    """layer_norm(x) -> (x - mean) / sqrt(var + eps) * gamma + beta along its axis."""
    t = ctx.tensor_type(x)
    if t is None:
        return None
    attrs = ln.attrs
    axis = normalize_axis(attrs.axis, t.ndim)  # type: ignore[arg-type]
    centered = subtract(x, mean(x, axis=[axis], keepdims=True))
    variance = mean(multiply(centered, centered), axis=[axis], keepdims=True)
    out = multiply(centered, rsqrt(add(variance, const(attrs.epsilon, t.dtype))))
    if attrs.scale:
        out = multiply(out, along(gamma, axis, t.ndim))
    if attrs.center:
        out = add(out, along(beta, axis, t.ndim))
    return out


RULES = RewriteTable([
    (Pat.item(batch_norm, 0), batch_norm_out),           # bn(x).0 -> x*scale + shift
    # bn(..).1 -> moving_mean, bn(..).2 -> moving_var (in training mode they are updated)
    (Pat.item(batch_norm, 1), lambda moving_mean, bn: None if bn.attrs.get("training")
     else moving_mean),
    (Pat.item(batch_norm, 2), lambda moving_var, bn: None if bn.attrs.get("training")
     else moving_var),
    (Pat.item(dropout, 0), lambda x: x),                 # dropout(x).0 -> x
    (Pat.item(dropout, 1), lambda x: ones_like(x)),      # dropout(x).1 -> ones (the mask)
])

LAYER_NORM_RULES = RewriteTable([
    (Pat.op("nn.layer_norm", x, gamma, beta, name="ln"), layer_norm),
])


@module_pass("simplify-inference", opt_level=0)
def SimplifyInference(mod: IRModule, ctx: PassContext) -> IRModule:
    """Rewrite batch_norm to scale-and-shift and drop dropout (layer_norm when configured)."""
    rules = RULES + LAYER_NORM_RULES if ctx.config.get(EXPAND_LAYER_NORM, False) else RULES
    return rules.apply_to_module(mod, ctx)
