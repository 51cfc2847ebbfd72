"""Learning-rate schedules: functions of the number of steps already taken (0 before the first
step) to a rate, as torch.optim.lr_scheduler computes them when stepped once per step.

A `kiln.train.Step` reads its optimizer's schedule before each step and passes the rate to the
compiled program as an input, so a schedule never recompiles anything.

    opt = kiln.train.SGD(lr=kiln.train.schedules.cosine(0.1, total_steps=1000))
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kiln.errors import Error

Schedule = Callable[[int], float]


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Error(f"{what} must be a positive integer, got {value!r}")
    return value


def _rate(value: object, what: str = "the learning rate") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise Error(f"{what} must be a number of at least 0, got {value!r}")
    return float(value)


def constant(lr: float) -> Schedule:
    """``lr`` at every step."""
    rate = _rate(lr)
    return lambda t: rate


def step(lr: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``lr * gamma ** (t // step_size)``: torch's ``StepLR``."""
    rate, size, g = _rate(lr), _positive_int(step_size, "step_size"), _rate(gamma, "gamma")
    return lambda t: rate * g ** (t // size)


def cosine(lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """From ``lr`` down to ``min_lr`` along half a cosine over ``total_steps`` steps, then
    ``min_lr``: torch's ``CosineAnnealingLR(T_max=total_steps, eta_min=min_lr)``."""
    rate, n, low = _rate(lr), _positive_int(total_steps, "total_steps"), _rate(min_lr, "min_lr")

    def at(t: int) -> float:
        return low + (rate - low) * (1 + math.cos(math.pi * min(t, n) / n)) / 2

    return at


def linear_warmup(then: float | Schedule, warmup_steps: int,
                  start_factor: float = 1.0 / 3) -> Schedule:
    """``then`` (a rate or a schedule) scaled by a factor rising linearly from
    ``start_factor`` to 1 over ``warmup_steps`` steps: torch's ``LinearLR(start_factor,
    total_iters=warmup_steps)``, chained with the schedule ``then`` stands for."""
    inner = then if callable(then) else constant(then)
    n = _positive_int(warmup_steps, "warmup_steps")
    start = _rate(start_factor, "start_factor")
    if not 0 < start <= 1:
        raise Error(f"start_factor must be above 0 and at most 1, got {start_factor!r}")

    def at(t: int) -> float:
        return inner(t) * (start + (1.0 - start) * min(t, n) / n)

    return at


__all__ = ["Schedule", "constant", "cosine", "linear_warmup", "step"]
