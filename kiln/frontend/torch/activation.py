"""Activation functions and softmax, each a kiln operator or a short composition of them.

    gelu(x)      = 0.5 · x · (1 + erf(x / √2))            (approximate="tanh": the tanh form)
    relu6(x)     = hardtanh(x, 0, 6) = clip(x, 0, 6)
    silu(x)      = x · sigmoid(x)
    hardswish(x) = x · clip(x + 3, 0, 6) / 6
"""

from __future__ import annotations

import math

from kiln.frontend.torch.registry import AtenCall, axis, converter
from kiln.ir import Expr
from kiln.op import (
    add,
    clip,
    divide,
    exp,
    greater,
    log,
    multiply,
    nn,
    sigmoid,
    subtract,
    tanh,
    where,
)
from kiln.op import erf as erf_


def _c(n: AtenCall, value: float) -> Expr:
    return n.tensor(value, n.out.dtype)


@converter("aten.relu.default")
def relu(n: AtenCall, x: Expr) -> Expr:
    return nn.relu(x)


@converter("aten.hardtanh.default")
def hardtanh(n: AtenCall, x: Expr, low: float = -1.0, high: float = 1.0) -> Expr:
    return clip(x, a_min=float(low), a_max=float(high))


@converter("aten.leaky_relu.default")
def leaky_relu(n: AtenCall, x: Expr, slope: float = 0.01) -> Expr:
    return nn.leaky_relu(x, alpha=float(slope))


@converter("aten.gelu.default")
def gelu(n: AtenCall, x: Expr, approximate: str = "none") -> Expr:
    if approximate == "none":
        return multiply(multiply(x, _c(n, 0.5)),
                        add(_c(n, 1.0), erf_(multiply(x, _c(n, 1.0 / math.sqrt(2.0))))))
    if approximate == "tanh":
        cube = multiply(multiply(x, x), x)
        inner = multiply(_c(n, math.sqrt(2.0 / math.pi)), add(x, multiply(_c(n, 0.044715), cube)))
        return multiply(multiply(x, _c(n, 0.5)), add(_c(n, 1.0), tanh(inner)))
    raise n.error(f"unknown gelu approximation {approximate!r}")


@converter("aten.silu.default")
def silu(n: AtenCall, x: Expr) -> Expr:
    return multiply(x, sigmoid(x))


@converter("aten.hardsigmoid.default")
def hardsigmoid(n: AtenCall, x: Expr) -> Expr:
    return divide(clip(add(x, _c(n, 3.0)), a_min=0.0, a_max=6.0), _c(n, 6.0))


@converter("aten.hardswish.default")
def hardswish(n: AtenCall, x: Expr) -> Expr:
    return multiply(x, hardsigmoid(n, x))


@converter("aten.elu.default")
def elu(n: AtenCall, x: Expr, alpha: float = 1.0, scale: float = 1.0,
        input_scale: float = 1.0) -> Expr:
    negative = multiply(_c(n, alpha), subtract(exp(multiply(x, _c(n, input_scale))), _c(n, 1.0)))
    return multiply(_c(n, scale), where(greater(x, _c(n, 0.0)), x, negative))


@converter("aten.softplus.default")
def softplus(n: AtenCall, x: Expr, beta: float = 1.0, threshold: float = 20.0) -> Expr:
    bx = multiply(x, _c(n, beta))
    soft = divide(log(add(exp(bx), _c(n, 1.0))), _c(n, beta))
    return where(greater(bx, _c(n, threshold)), x, soft)


@converter("aten.mish.default")
def mish(n: AtenCall, x: Expr) -> Expr:
    return multiply(x, tanh(softplus(n, x)))


@converter("aten._prelu_kernel.default")
def prelu(n: AtenCall, x: Expr, weight: Expr) -> Expr:
    # The weight is one value, or one per channel (axis 1) reshaped by torch to broadcast.
    return where(greater(x, _c(n, 0.0)), x, multiply(weight, x))


@converter("aten._softmax.default", "aten.softmax.int")
def softmax(n: AtenCall, x: Expr, dim: int, _half_to_float: object = None) -> Expr:
    ax = axis(dim, n.rank(x), n)
    return nn.softmax(n.tensor(x, n.out.dtype), axis=ax)


@converter("aten._log_softmax.default", "aten.log_softmax.int")
def log_softmax(n: AtenCall, x: Expr, dim: int, _half_to_float: object = None) -> Expr:
    ax = axis(dim, n.rank(x), n)
    return nn.log_softmax(n.tensor(x, n.out.dtype), axis=ax)
