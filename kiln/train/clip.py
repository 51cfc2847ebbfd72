"""Gradient clipping by global norm, as ``torch.nn.utils.clip_grad_norm_``, in kiln IR.

The norm of all gradients together is the 2-norm of their 2-norms; every gradient is scaled
by ``min(max_norm / (norm + 1e-6), 1)``, torch's formula (1e-6 keeps a zero norm finite).
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.errors import Error
from kiln.ir.expr import Expr, const
from kiln.op import minimum, sqrt, sum_


def check_max_norm(max_norm: object) -> float | None:
    """``max_norm`` as a float (None: no clipping); a `kiln.Error` unless it is above 0."""
    if max_norm is None:
        return None
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise Error(f"clip_grad_norm must be a number above 0 (or None), got {max_norm!r}")
    return float(max_norm)


def global_norm(grads: Sequence[Expr]) -> Expr:
    """The 2-norm of every element of ``grads`` together (a float32 scalar)."""
    total: Expr | None = None
    for g in grads:
        s = sum_(g * g)
        total = s if total is None else total + s
    if total is None:
        raise Error("nothing to clip: the step has no gradients")
    return sqrt(total)


def clip_by_global_norm(grads: Sequence[Expr], norm: Expr, max_norm: float) -> list[Expr]:
    """``grads`` scaled so that their global ``norm`` is at most ``max_norm``."""
    coef = minimum(const(max_norm) / (norm + const(1e-6)), const(1.0))
    return [g * coef for g in grads]
