"""Gradient checks against central finite differences, computed in float64.

    check_grad(mod, [x, w])                        # kiln.grad of @main against differences
    numerical_gradient(f, [x, w], 1, seed)         # d<seed, f(x, w)>/dw by differences

The functions differentiated are plain Python callables on numpy arrays, so the same helpers
check operators (through their numpy references), programs (through the interpreter) and
anything else. Arrays are perturbed in float64; programs under test should be written in
float64 so that differences of 1e-6 are meaningful.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Fn = Callable[..., Any]


def _leaves(value: Any) -> list[np.ndarray]:
    """The arrays of a (nested) tuple of arrays, in order."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [np.asarray(value)]


def inner(value: Any, seed: Any) -> float:
    """The sum over matching arrays of ``seed * value``: the scalar being differentiated."""
    total = 0.0
    for v, s in zip(_leaves(value), _leaves(seed), strict=True):
        total += float(np.sum(np.asarray(v, np.float64) * np.asarray(s, np.float64)))
    return total


def numerical_gradient(
    f: Fn, args: Sequence[Any], index: int, seed: Any, eps: float = 1e-6
) -> np.ndarray:
    """The gradient of ``<seed, f(*args)>`` with respect to ``args[index]``, element by element."""
    args = list(args)
    x = np.array(args[index], dtype=np.float64)
    out = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        old = x[i]
        x[i] = old + eps
        args[index] = x.astype(np.asarray(args[index]).dtype)
        plus = inner(f(*args), seed)
        x[i] = old - eps
        args[index] = x.astype(np.asarray(args[index]).dtype)
        minus = inner(f(*args), seed)
        x[i] = old
        out[i] = (plus - minus) / (2 * eps)
    args[index] = x
    return out


def directional_derivative(
    f: Fn, args: Sequence[Any], directions: Sequence[np.ndarray | None], seed: Any,
    eps: float = 1e-6,
) -> float:
    """The derivative of ``<seed, f(*args)>`` along ``directions`` (None: that argument fixed)."""

    def moved(scale: float) -> list[Any]:
        return [
            a if d is None else (np.asarray(a, np.float64) + scale * d).astype(np.asarray(a).dtype)
            for a, d in zip(args, directions, strict=True)
        ]

    return (inner(f(*moved(eps)), seed) - inner(f(*moved(-eps)), seed)) / (2 * eps)


def random_like(value: Any, rng: np.random.Generator) -> Any:
    """Random normal arrays shaped and typed like ``value`` (a tuple for a tuple)."""
    if isinstance(value, (tuple, list)):
        return tuple(random_like(v, rng) for v in value)
    a = np.asarray(value)
    return rng.standard_normal(a.shape).astype(a.dtype)


def assert_close(
    actual: Any, expected: Any, rtol: float, atol: float, what: str = "gradient"
) -> None:
    """Arrays agree elementwise within ``atol + rtol * |expected|``; a message names ``what``."""
    for a, e in zip(_leaves(actual), _leaves(expected), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(e, np.float64), rtol=rtol, atol=atol,
            err_msg=what,
        )


def check_grad(
    mod: Any,
    args: Sequence[Any],
    *,
    wrt: Sequence[int] | None = None,
    of: int | None = None,
    mode: str = "higher_order",
    rtol: float = 1e-5,
    atol: float = 1e-7,
    eps: float = 1e-6,
    max_elements: int = 64,
    directions: int = 3,
    seed: int = 0,
) -> Any:
    """Check ``kiln.grad`` of ``@main`` of a module against central finite differences.

    The program is run by the reference interpreter at points around ``args``; a random seed
    (the adjoint of the output) is used, passed through ``seedable=True``. Arguments with at
    most ``max_elements`` elements are checked element by element, larger ones along
    ``directions`` random directions. Returns the gradients kiln computed.
    """
    import kiln
    from kiln.ad import grad

    typed = mod if mod.is_typed else kiln.infer_types(mod)
    fn = typed["main"]

    def f(*xs: Any) -> Any:
        out = kiln.interpret(typed, *xs)
        return out if of is None else out[of]

    rng = np.random.default_rng(seed)
    out_seed = random_like(f(*args), rng)
    g = grad(fn, mod=typed, mode=mode, wrt=wrt, of=of, keeping=(), seedable=True)
    gmod = kiln.IRModule.from_expr(g, typed)
    grads = kiln.interpret(gmod, *args, out_seed)
    indices = list(wrt) if wrt is not None else [
        i for i, p in enumerate(fn.params) if _is_float_type(p.checked_type)
    ]
    for i, gi in zip(indices, grads, strict=True):
        name = f"d/d%{fn.params[i].name_hint} ({mode})"
        size = np.asarray(args[i]).size
        if size <= max_elements:
            expected = numerical_gradient(f, args, i, out_seed, eps)
            assert_close(gi, expected, rtol, atol, name)
        else:
            for _ in range(directions):
                d = rng.standard_normal(np.shape(args[i]))
                dirs: list[np.ndarray | None] = [None] * len(args)
                dirs[i] = d
                expected_dd = directional_derivative(f, args, dirs, out_seed, eps)
                actual_dd = float(np.sum(np.asarray(gi, np.float64) * d))
                assert_close(actual_dd, expected_dd, rtol, atol * size, name + " along a direction")
    return grads


def _is_float_type(t: Any) -> bool:
    from kiln.ir.dtype import dtype_of
    from kiln.ir.ty import TensorType, TupleType

    if isinstance(t, TupleType):
        return bool(t.fields) and all(_is_float_type(f) for f in t.fields)
    return isinstance(t, TensorType) and dtype_of(t.dtype).is_float
