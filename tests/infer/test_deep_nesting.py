"""Inference does work linear in how deeply a program nests (closures in closures, lets, tuples).

The unifier counts the types its occurs check and `resolve` visit (``Unifier.steps``); a quadratic
walk (re-resolving every enclosing function's type at each level) shows as a count growing 16-fold
from depth 500 to 2000, a linear one about 4-fold. A count, not a clock: shared machines are noisy.
"""

from __future__ import annotations

import pytest

import kiln
from kiln.infer import infer as infer_module
from kiln.infer.unify import Unifier

T = "Tensor[(1), float32]"


def closures_returning_closures(n: int) -> str:
    body = f"%x{n - 1}"
    for i in reversed(range(n)):
        body = f"fn (%x{i}: {T}) {{ {body} }}"
    return f"def @main(%a: {T}) {{ {body} }}"


def applied_closures(n: int) -> str:
    body = f"add(%x{n - 1}, %a)"
    for i in reversed(range(n)):  # unannotated: each parameter's type comes from its call
        body = f"(fn (%x{i}) {{ {body} }})(%a)"
    return f"def @main(%a: {T}) {{ {body} }}"


def let_bound_closures(n: int) -> str:
    body = f"add(%x{n - 1}, %a)"
    for i in reversed(range(n)):
        body = f"let %f{i} = fn (%x{i}: {T}) {{ {body} }}; %f{i}(%a)"
    return f"def @main(%a: {T}) {{ {body} }}"


def nested_let_values(n: int) -> str:
    body = "%a"
    for i in reversed(range(n)):
        body = f"(let %v{i} = {body}; add(%v{i}, %a))"
    return f"def @main(%a: {T}) {{ {body} }}"


def nested_tuples(n: int) -> str:
    value = "%a"
    for _ in range(n):
        value = f"({value},)"
    return f"def @main(%a: {T}) {{ let %t = {value}; %t{'.0' * n} }}"


def nested_ifs(n: int) -> str:
    body = "%a"
    for _ in range(n):
        body = f"if (%c) {{ {body} }} else {{ add(%a, %a) }}"
    return f"def @main(%a: {T}, %c: bool) {{ {body} }}"


SHAPES = [closures_returning_closures, applied_closures, let_bound_closures, nested_let_values,
          nested_tuples, nested_ifs]


def inference_steps(src: str, monkeypatch: pytest.MonkeyPatch) -> int:
    unifiers: list[Unifier] = []

    class Counted(Unifier):
        def __init__(self) -> None:
            super().__init__()
            unifiers.append(self)

    mod = kiln.parse(src)
    with monkeypatch.context() as m:
        m.setattr(infer_module, "Unifier", Counted)
        kiln.infer_types(mod)
    return sum(u.steps for u in unifiers)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
def test_inference_work_is_linear_in_depth(shape, monkeypatch: pytest.MonkeyPatch) -> None:
    small = inference_steps(shape(500), monkeypatch)
    large = inference_steps(shape(2000), monkeypatch)
    assert large < 6 * max(small, 1), (small, large)


def test_shared_tuple_types_are_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # %t40's type is a tree of 2**40 leaves but a DAG of 40 nodes: the occurs check binding
    # each let's variable must not walk the tree.
    lets = "".join(f"let %t{i + 1} = (%t{i}, %t{i}); " for i in range(40))
    steps = inference_steps(f"def @main(%t0: {T}) {{ {lets}%t40 }}", monkeypatch)
    assert steps < 10_000


def test_deep_closures_get_their_types() -> None:
    mod = kiln.infer_types(kiln.parse(closures_returning_closures(3000)))
    t = mod["main"].checked_type.ret_type
    for _ in range(3000):
        assert isinstance(t, kiln.FuncType)
        t = t.ret_type
    assert t == kiln.TensorType((1,), "float32")


def test_a_type_that_would_contain_itself_is_still_refused() -> None:
    with pytest.raises(kiln.TypeCheckError, match="contain itself"):
        kiln.infer_types(kiln.parse("def @main(%f) { %f(%f) }"))
