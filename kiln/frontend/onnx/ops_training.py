"""Converters of ONNX's optimizer steps (domain ``ai.onnx.preview.training``): Adagrad,
Momentum and Adam, as the elementwise formulas of the ONNX specification.

Each takes the learning rate R and the step count T (scalars), then n tensors to optimize,
their gradients and their optimizer states, and returns the updated tensors and states.
Where a formula depends on whether T > 0 (Momentum's first step, Adam's bias correction),
the choice is a ``where`` on T, so that T may be a run-time input.
"""

from __future__ import annotations

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast, const_like
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Expr

DOMAIN = "ai.onnx.preview.training"


def _groups(ctx: NodeContext, states: int) -> tuple[Expr, Expr, int]:
    """(R, T as the data's dtype, n) for inputs R, T, then (2 + states) groups of n."""
    rest = len(ctx.inputs) - 2
    if rest <= 0 or rest % (2 + states):
        raise ctx.error(f"{ctx.op_type} takes R, T, then {2 + states} groups of tensors of "
                        f"the same count; it has {len(ctx.inputs)} inputs")
    dtype = ctx.dtype(2)
    return (op.reshape(cast(ctx.x(0), dtype), newshape=[]),
            op.reshape(cast(ctx.x(1), dtype), newshape=[]), rest // (2 + states))


def _regularized(ctx: NodeContext, x: Expr, g: Expr, dtype: str) -> Expr:
    return op.add(op.multiply(const_like(float(ctx.attr("norm_coefficient", 0.0)), dtype), x),
                  g)


@converter("Adagrad", since=1, domain=DOMAIN)
def adagrad(ctx: NodeContext) -> list[Expr]:
    r, t, n = _groups(ctx, 1)
    dtype = ctx.dtype(2)
    c = lambda v: const_like(v, dtype)  # noqa: E731
    rate = op.divide(r, op.add(c(1.0), op.multiply(t, c(ctx.attr("decay_factor", 0.0)))))
    xs, hs = [], []
    for i in range(n):
        x, g, h = ctx.x(2 + i), ctx.x(2 + n + i), ctx.x(2 + 2 * n + i)
        g = _regularized(ctx, x, g, dtype)
        h_new = op.add(h, op.multiply(g, g))
        scale = op.add(op.sqrt(h_new), c(ctx.attr("epsilon", 1e-6)))
        xs.append(op.subtract(x, op.divide(op.multiply(rate, g), scale)))
        hs.append(h_new)
    return [*xs, *hs]


@converter("Momentum", since=1, domain=DOMAIN)
def momentum(ctx: NodeContext) -> list[Expr]:
    r, t, n = _groups(ctx, 1)
    dtype = ctx.dtype(2)
    c = lambda v: const_like(v, dtype)  # noqa: E731
    alpha, beta = c(ctx.need_attr("alpha")), ctx.need_attr("beta")
    mode = ctx.need_attr("mode")
    ctx.need_attr("norm_coefficient")  # required by Momentum's schema
    if mode not in ("standard", "nesterov"):
        raise ctx.error(f"mode must be 'standard' or 'nesterov', not {mode!r}")
    beta_t = op.where(op.greater(t, c(0.0)), c(beta), c(1.0))  # 1 at the first step
    xs, vs = [], []
    for i in range(n):
        x, g, v = ctx.x(2 + i), ctx.x(2 + n + i), ctx.x(2 + 2 * n + i)
        g = _regularized(ctx, x, g, dtype)
        v_new = op.add(op.multiply(alpha, v), op.multiply(beta_t, g))
        step = v_new if mode == "standard" else op.add(g, op.multiply(alpha, v_new))
        xs.append(op.subtract(x, op.multiply(r, step)))
        vs.append(v_new)
    return [*xs, *vs]


@converter("Adam", since=1, domain=DOMAIN)
def adam(ctx: NodeContext) -> list[Expr]:
    r, t, n = _groups(ctx, 2)
    dtype = ctx.dtype(2)
    c = lambda v: const_like(v, dtype)  # noqa: E731
    alpha, beta = float(ctx.attr("alpha", 0.9)), float(ctx.attr("beta", 0.999))
    corrected = op.divide(op.multiply(r, op.sqrt(op.subtract(c(1.0), op.power(c(beta), t)))),
                          op.subtract(c(1.0), op.power(c(alpha), t)))
    rate = op.where(op.greater(t, c(0.0)), corrected, r)  # bias correction after step 0
    post = c(1.0 - float(ctx.attr("norm_coefficient_post", 0.0)))
    xs, vs, hs = [], [], []
    for i in range(n):
        x, g = ctx.x(2 + i), ctx.x(2 + n + i)
        v, h = ctx.x(2 + 2 * n + i), ctx.x(2 + 3 * n + i)
        g = _regularized(ctx, x, g, dtype)
        v_new = op.add(op.multiply(c(alpha), v), op.multiply(c(1.0 - alpha), g))
        h_new = op.add(op.multiply(c(beta), h), op.multiply(c(1.0 - beta), op.multiply(g, g)))
        scale = op.add(op.sqrt(h_new), c(ctx.attr("epsilon", 1e-6)))
        x_new = op.subtract(x, op.multiply(rate, op.divide(v_new, scale)))
        xs.append(op.multiply(post, x_new))
        vs.append(v_new)
        hs.append(h_new)
    return [*xs, *vs, *hs]
