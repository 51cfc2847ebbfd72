"""lambda-lift does work near-linear in how deeply closures nest.

The work is counted, not timed (shared machines are noisy): the nodes listed by every post-order
walk the pass makes (`post_order`, and `rewrite`, `bound_vars` and `free_vars`, which walk with
it). Walking each nested function's whole body once per enclosing function shows as a count
growing 16-fold from depth 250 to 1000; a linear pass grows about 4-fold.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kiln
from kiln.ir import traverse
from kiln.transform import lambda_lift
from kiln.transform.lambda_lift import LambdaLift

T = "Tensor[(2), float32]"


def let_bound_closures(n: int) -> str:
    # Each closure is called with a value made from the enclosing closure's parameter.
    body = f"add(%x{n - 1}, %a)"
    for i in reversed(range(n)):
        arg = f"%a * %x{i - 1}" if i else "%a"
        body = f"let %f{i} = fn (%x{i}: {T}) {{ {body} }}; %f{i}({arg})"
    return f"def @main(%a: {T}) {{ {body} }}"


def applied_closures(n: int) -> str:
    body = f"add(%x{n - 1}, %a)"
    for i in reversed(range(n)):
        body = f"(fn (%x{i}: {T}) {{ {body} }})(%a)"
    return f"def @main(%a: {T}) {{ {body} }}"


def closures_returning_closures(n: int) -> str:
    body = f"add(%x{n - 1}, %a)"
    for i in reversed(range(n)):
        body = f"fn (%x{i}: {T}) {{ {body} }}"
    return f"def @main(%a: {T}) {{ {body} }}"


def escaping_closures(n: int) -> str:
    # Each closure captures %a and is passed as a value: a Closure=1 stub at every level.
    body = f"%y{n - 1} * %a"
    for i in reversed(range(n)):
        body = f"@apply(fn (%y{i}: {T}) {{ {body} }}, %a)"
    return f"""
def @apply(%f: fn ({T}) -> {T}, %v: {T}) -> {T} {{ %f(%v) }}
def @main(%a: {T}) {{ {body} }}
"""


SHAPES = [let_bound_closures, applied_closures, closures_returning_closures, escaping_closures]


def walked_nodes(src: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """The nodes lambda-lift's post-order walks list, on the typed program of ``src``."""
    mod = kiln.infer_types(kiln.parse(src))
    count = [0]
    walk = traverse.post_order

    def counted(*args: object, **kwargs: object) -> list[kiln.Expr]:
        order = walk(*args, **kwargs)  # type: ignore[arg-type]
        count[0] += len(order)
        return order

    with monkeypatch.context() as m:
        m.setattr(traverse, "post_order", counted)  # what rewrite, bound_vars, free_vars call
        m.setattr(lambda_lift, "post_order", counted)
        LambdaLift()(mod)
    return count[0]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
def test_lambda_lift_work_is_near_linear_in_depth(
    shape: Callable[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    small = walked_nodes(shape(250), monkeypatch)
    large = walked_nodes(shape(1000), monkeypatch)
    assert large < 6 * small, (small, large)


@pytest.mark.parametrize(("shape", "depth"), [
    (let_bound_closures, 1000),
    (applied_closures, 1000),
    (escaping_closures, 200),
], ids=lambda x: getattr(x, "__name__", str(x)))
def test_deeply_nested_closures_build_and_agree_with_the_interpreter(
    shape: Callable[[int], str], depth: int
) -> None:
    mod = kiln.parse(shape(depth))
    a = np.array([0.5, -1.25], "float32")
    expected = kiln.interpret(mod, a)
    got = kiln.build(mod)(a)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
