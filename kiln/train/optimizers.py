"""Optimizers as kiln functions: each update is Level-1 IR built with kiln.op, so it compiles
into the same program as the loss and its gradient (kiln/train/program.py).

An optimizer says which state it keeps per parameter (`slots`: zero-initialized tensors of the
parameter's shape) and builds the update of one parameter:

    new_param, new_state = opt.update(param, grad, state, lr, step)

``lr`` is the learning rate and ``step`` the 1-based number of this step, both float32 scalars
given when the program runs, so a schedule changes them without recompiling. The formulas are
torch.optim's (single-tensor forms): `SGD` as ``torch.optim.SGD`` (momentum, dampening,
Nesterov, L2 weight decay), `Adam` as ``torch.optim.Adam`` (bias correction, eps added to the
corrected square root, L2 weight decay added to the gradient) and `AdamW` as
``torch.optim.AdamW`` (decoupled weight decay: the parameter shrinks by ``lr * weight_decay``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.errors import Error
from kiln.ir.expr import Expr, const
from kiln.op import less_equal, power, sqrt, where

# A learning rate: a number, or a schedule (kiln/train/schedules.py: step number -> rate).
LearningRate = float | Callable[[int], float]


def _number(value: object, what: str, *, low: float = 0.0, high: float | None = None,
            high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Error(f"{what} must be a number, got {value!r}")
    v = float(value)
    if v != v or v < low or (high is not None and (v >= high if high_open else v > high)):
        bound = ("" if high is None else
                 f" and below {high}" if high_open else f" and at most {high}")
        raise Error(f"{what} must be at least {low}{bound}, got {value!r}")
    return v


def _rate(lr: object) -> LearningRate:
    if callable(lr):
        return lr  # type: ignore[return-value]
    return _number(lr, "the learning rate lr")


class Optimizer:
    """What every optimizer has: a learning rate (a number or a schedule) and its slots."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: LearningRate) -> None:
        self.lr = _rate(lr)

    def rate(self, step: int) -> float:
        """The learning rate of ``step`` (1-based)."""
        return float(self.lr(step)) if callable(self.lr) else float(self.lr)

    def update(self, param: Expr, grad: Expr, state: Sequence[Expr], lr: Expr,
               step: Expr) -> tuple[Expr, tuple[Expr, ...]]:
        """The new value of ``param`` and of its state, as expressions."""
        raise NotImplementedError


@dataclass(frozen=True)
class _SGDOptions:
    momentum: float
    dampening: float
    nesterov: bool
    weight_decay: float


class SGD(Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``."""

    def __init__(self, lr: LearningRate = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(lr)
        o = _SGDOptions(_number(momentum, "SGD momentum"), _number(dampening, "SGD dampening"),
                        bool(nesterov), _number(weight_decay, "SGD weight_decay"))
        if o.nesterov and (o.momentum <= 0 or o.dampening != 0):
            raise Error("SGD with nesterov=True needs a momentum above 0 and dampening 0 "
                        f"(got momentum={momentum}, dampening={dampening}), as torch.optim.SGD")
        self.options = o
        self.slots = ("momentum_buffer",) if o.momentum else ()

    def update(self, param: Expr, grad: Expr, state: Sequence[Expr], lr: Expr,
               step: Expr) -> tuple[Expr, tuple[Expr, ...]]:
        o = self.options
        g = grad
        if o.weight_decay:
            g = g + const(o.weight_decay) * param
        if not o.momentum:
            return param - lr * g, ()
        (buf,) = state
        if o.dampening:
            # torch starts the buffer at the first gradient itself (undampened); the buffer is
            # zero before step 1, so only the gradient's coefficient changes
            scale: Expr = where(less_equal(step, const(1.0)), const(1.0),
                                const(1.0 - o.dampening))
            new_buf = const(o.momentum) * buf + scale * g
        else:
            new_buf = const(o.momentum) * buf + g
        d = g + const(o.momentum) * new_buf if o.nesterov else new_buf
        return param - lr * d, (new_buf,)

    def __repr__(self) -> str:
        o = self.options
        return (f"SGD(lr={self.lr!r}, momentum={o.momentum}, dampening={o.dampening}, "
                f"weight_decay={o.weight_decay}, nesterov={o.nesterov})")


class Adam(Optimizer):
    """Adam, as ``torch.optim.Adam`` (``weight_decay`` is L2: added to the gradient)."""

    slots = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, lr: LearningRate = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise Error(f"{type(self).__name__} betas must be a pair of numbers, got {betas!r}")
        self.betas = (_number(betas[0], "beta1", high=1.0, high_open=True),
                      _number(betas[1], "beta2", high=1.0, high_open=True))
        self.eps = _number(eps, "eps")
        self.weight_decay = _number(weight_decay, "weight_decay")

    def update(self, param: Expr, grad: Expr, state: Sequence[Expr], lr: Expr,
               step: Expr) -> tuple[Expr, tuple[Expr, ...]]:
        b1, b2 = self.betas
        m, v = state
        g = grad
        p = param
        if self.weight_decay:
            if self.decoupled:
                p = p * (const(1.0) - lr * const(self.weight_decay))
            else:
                g = g + const(self.weight_decay) * param
        new_m = m + const(1.0 - b1) * (g - m)  # torch's lerp_
        new_v = const(b2) * v + const(1.0 - b2) * (g * g)
        correction1 = const(1.0) - power(const(b1), step)
        correction2 = const(1.0) - power(const(b2), step)
        denom = sqrt(new_v) / sqrt(correction2) + const(self.eps)
        return p - (lr / correction1) * (new_m / denom), (new_m, new_v)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lr={self.lr!r}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay})")


class AdamW(Adam):
    """AdamW, as ``torch.optim.AdamW``: weight decay decoupled from the gradient."""

    decoupled = True

    def __init__(self, lr: LearningRate = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(lr, betas, eps, weight_decay)


__all__ = ["SGD", "Adam", "AdamW", "LearningRate", "Optimizer"]
