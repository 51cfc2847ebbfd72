"""kiln.std: every prelude function through the interpreter and compiled, against Python.

Each case is a ``@main`` read with `kiln.std.with_prelude`: it builds small lists, trees and
nats, calls prelude functions, and returns a value that `py` turns into Python (lists, tuples,
ints); the oracle is the same computation written here in plain Python.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import kiln
import kiln.std
from kiln.text import type_text

# --- values ---------------------------------------------------------------------------------


def relay_list(items: list[Any], show: Callable[[Any], str] = str) -> str:
    """``[1, 2]`` as the Relay text ``Cons(1, Cons(2, Nil))``."""
    text = "Nil"
    for item in reversed(items):
        text = f"Cons({show(item)}, {text})"
    return text


def relay_nat(n: int) -> str:
    return "succ(" * n + "zero" + ")" * n


def relay_tree(tree: tuple[int, list]) -> str:
    value, children = tree
    return f"Rose({value}, {relay_list(children, relay_tree)})"


def py(v: Any) -> Any:
    """A result as Python: List -> list, nat -> int, Tree -> (value, children),
    Option -> None or its value, tuples -> tuples, scalars -> int/float/bool."""
    if isinstance(v, kiln.ConstructorValue):
        name = v.name
        if name in ("Nil", "Cons"):
            out = []
            while v.name == "Cons":
                out.append(py(v.fields[0]))
                v = v.fields[1]
            return out
        if name in ("zero", "succ"):
            n = 0
            while v.name == "succ":
                n, v = n + 1, v.fields[0]
            return n
        if name == "Rose":
            return (py(v.fields[0]), py(v.fields[1]))
        if name == "None":
            return None
        if name == "Some":
            return ("Some", py(v.fields[0]))
        raise AssertionError(f"unexpected constructor {name}")
    if isinstance(v, (tuple, list)):
        return tuple(py(f) for f in v)
    return np.asarray(v).item()


# --- the Python oracles -----------------------------------------------------------------------


def foldr(f: Callable[[Any, Any], Any], z: Any, xs: list[Any]) -> Any:
    return functools.reduce(lambda acc, x: f(x, acc), reversed(xs), z)


def foldr1(f: Callable[[Any, Any], Any], xs: list[Any]) -> Any:
    return foldr(f, xs[-1], xs[:-1])


def map_accumr(f: Callable, init: Any, xs: list[Any]) -> tuple[Any, list[Any]]:
    acc, outs = init, []
    for x in reversed(xs):
        acc, out = f(acc, x)
        outs.insert(0, out)
    return acc, outs


def map_accuml(f: Callable, init: Any, xs: list[Any]) -> tuple[Any, list[Any]]:
    # TVM's map_accuml: the outputs come out last element first
    acc, outs = init, []
    for x in xs:
        acc, out = f(acc, x)
        outs.insert(0, out)
    return acc, outs


def unfoldr(f: Callable[[Any], tuple[Any, Any] | None], seed: Any) -> list[Any]:
    out = []
    while (step := f(seed)) is not None:
        seed, value = step
        out.append(value)
    return out


def tmap(f: Callable[[Any], Any], tree: tuple[Any, list]) -> tuple[Any, list]:
    value, children = tree
    return (f(value), [tmap(f, c) for c in children])


def size(tree: tuple[Any, list]) -> int:
    return 1 + sum(size(c) for c in tree[1])


def iterate(f: Callable[[Any], Any], n: int) -> Callable[[Any], Any]:
    return lambda x: x if n == 0 else f(iterate(f, n - 1)(x))


def countdown(seed: int) -> tuple[int, int] | None:
    return None if seed <= 0 else (seed - 1, seed * 10)


XS = [3, -1, 4, 1, -5, 9, 2]
YS = [10, 20, 30]
TREE = (1, [(2, [(4, []), (5, [])]), (3, [(6, [(7, [])])])])
COUNTDOWN = """fn (%s: int32) -> Option[(int32, int32)] {
    if (%s <= 0) { None } else { Some((%s - 1, %s * 10)) }
  }"""


@dataclass(frozen=True)
class Case:
    """``@main``'s return type and body, and what Python says it returns."""

    result: str
    body: str
    expected: Any


CASES: dict[str, Case] = {
    "id": Case("int32", "@id(7)", 7),
    "compose": Case(
        "int32", "@compose(fn (%x: int32) -> int32 { %x * 2 }, "
        "fn (%x: int32) -> int32 { %x + 3 })(4)", (4 + 3) * 2),
    "flip": Case("int32", "@flip(fn (%a: int32, %b: int32) -> int32 { %a - %b })(10, 3)",
                 3 - 10),
    "hd": Case("int32", f"@hd({relay_list(XS)})", XS[0]),
    "tl": Case("List[int32]", f"@tl({relay_list(XS)})", XS[1:]),
    "nth": Case("(int32, int32)", f"(@nth({relay_list(XS)}, 0), @nth({relay_list(XS)}, 5))",
                (XS[0], XS[5])),
    "length": Case("(int32, int32)", f"(@length({relay_list(XS)}), @length(Nil))",
                   (len(XS), 0)),
    "update": Case("List[int32]", f"@update({relay_list(XS)}, 2, 100)",
                   XS[:2] + [100] + XS[3:]),
    "map": Case("List[int32]", f"@map(fn (%x: int32) -> int32 {{ %x * %x }}, {relay_list(XS)})",
                [x * x for x in XS]),
    "foldl": Case(
        "int32", f"@foldl(fn (%a: int32, %x: int32) -> int32 {{ %a * 2 - %x }}, 1, "
        f"{relay_list(XS)})", functools.reduce(lambda a, x: a * 2 - x, XS, 1)),
    "foldr": Case(
        "int32", f"@foldr(fn (%x: int32, %a: int32) -> int32 {{ %a * 2 - %x }}, 1, "
        f"{relay_list(XS)})", foldr(lambda x, a: a * 2 - x, 1, XS)),
    "foldr1": Case(
        "int32", f"@foldr1(fn (%x: int32, %y: int32) -> int32 {{ %x - %y }}, {relay_list(XS)})",
        foldr1(lambda x, y: x - y, XS)),
    "sum": Case("(int32, int32)", f"(@sum({relay_list(XS)}), @sum(Nil))", (sum(XS), 0)),
    "concat": Case("List[int32]", f"@concat({relay_list(XS)}, {relay_list(YS)})", XS + YS),
    "filter": Case("List[int32]", f"@filter(fn (%x: int32) -> bool {{ %x > 1 }}, "
                   f"{relay_list(XS)})", [x for x in XS if x > 1]),
    "zip": Case("(List[(int32, int32)], List[(int32, int32)])",
                f"(@zip({relay_list(XS)}, {relay_list(YS)}), "
                f"@zip({relay_list(YS)}, {relay_list(XS)}))",
                (list(zip(XS, YS, strict=False)), list(zip(YS, XS, strict=False)))),
    "rev": Case("List[int32]", f"@rev({relay_list(XS)})", XS[::-1]),
    "map_accumr": Case(
        "(int32, List[int32])",
        f"@map_accumr(fn (%a: int32, %x: int32) -> (int32, int32) {{ (%a + %x, %a * %x) }}, "
        f"1, {relay_list(XS)})",
        map_accumr(lambda a, x: (a + x, a * x), 1, XS)),
    "map_accuml": Case(
        "(int32, List[int32])",
        f"@map_accuml(fn (%a: int32, %x: int32) -> (int32, int32) {{ (%a + %x, %a * %x) }}, "
        f"1, {relay_list(XS)})",
        map_accuml(lambda a, x: (a + x, a * x), 1, XS)),
    "unfoldr": Case("List[int32]", f"@unfoldr({COUNTDOWN}, 4)", unfoldr(countdown, 4)),
    "unfoldl": Case("List[int32]", f"@unfoldl({COUNTDOWN}, 4)", unfoldr(countdown, 4)[::-1]),
    "tmap": Case("Tree[int32]", f"@tmap(fn (%v: int32) -> int32 {{ %v * 10 + 1 }}, "
                 f"{relay_tree(TREE)})", tmap(lambda v: v * 10 + 1, TREE)),
    "size": Case("(int32, int32)", f"(@size({relay_tree(TREE)}), @size(Rose(0, Nil)))",
                 (size(TREE), 1)),
    "iterate": Case(
        "(int32, int32)",
        "(@iterate(fn (%x: int32) -> int32 { %x * 2 + 1 }, 5)(1), "
        "@iterate(fn (%x: int32) -> int32 { %x * 2 + 1 }, 0)(1))",
        (iterate(lambda x: x * 2 + 1, 5)(1), 1)),
    "nat_double": Case("nat", f"@nat_double({relay_nat(3)})", 6),
    "nat_add": Case("nat", f"@nat_add({relay_nat(3)}, {relay_nat(4)})", 7),
    "nat_nth": Case("int32", f"@nat_nth({relay_list(XS)}, {relay_nat(3)})", XS[3]),
    "nat_update": Case("List[int32]", f"@nat_update({relay_list(XS)}, {relay_nat(3)}, 100)",
                       XS[:3] + [100] + XS[4:]),
    "nat_iterate": Case("int32", f"@nat_iterate(fn (%x: int32) -> int32 {{ %x * 3 }}, "
                        f"{relay_nat(4)})(2)", 2 * 3**4),
}


def program(case: Case) -> str:
    return f'#[version = "0.0.5"]\ndef @main() -> {case.result} {{\n  {case.body}\n}}\n'


def test_every_prelude_function_has_a_case() -> None:
    names = {gv.name for gv in kiln.std.prelude().global_vars}
    assert names == set(CASES)
    for name, case in CASES.items():
        assert re.search(rf"@{name}\(", case.body), f"the case of @{name} does not call it"


@pytest.mark.parametrize("name", CASES)
def test_prelude_function_in_the_interpreter_and_compiled(name: str) -> None:
    case = CASES[name]
    mod = kiln.std.with_prelude(program(case))
    assert py(kiln.interpret(mod)) == case.expected, "interpreted"
    assert py(kiln.build(mod)()) == case.expected, "compiled"


# The prelude's types are TVM's (prelude.rly and nat.rly): the point of shipping it.
TVM_TYPES = {
    "id": "fn [A](A) -> A",
    "compose": "fn [A, B, C](fn (B) -> C, fn (A) -> B) -> fn (A) -> C",
    "flip": "fn [A, B, C](fn (A, B) -> C) -> fn (B, A) -> C",
    "hd": "fn [A](List[A]) -> A",
    "tl": "fn [A](List[A]) -> List[A]",
    "nth": "fn [A](List[A], int32) -> A",
    "length": "fn [A](List[A]) -> int32",
    "update": "fn [A](List[A], int32, A) -> List[A]",
    "map": "fn [A, B](fn (A) -> B, List[A]) -> List[B]",
    "foldl": "fn [A, B](fn (A, B) -> A, A, List[B]) -> A",
    "foldr": "fn [A, B](fn (A, B) -> B, B, List[A]) -> B",
    "foldr1": "fn [A](fn (A, A) -> A, List[A]) -> A",
    "sum": "fn (List[int32]) -> int32",
    "concat": "fn [A](List[A], List[A]) -> List[A]",
    "filter": "fn [A](fn (A) -> bool, List[A]) -> List[A]",
    "zip": "fn [A, B](List[A], List[B]) -> List[(A, B)]",
    "rev": "fn [A](List[A]) -> List[A]",
    "map_accumr": "fn [A, B, C](fn (A, B) -> (A, C), A, List[B]) -> (A, List[C])",
    "map_accuml": "fn [A, B, C](fn (A, B) -> (A, C), A, List[B]) -> (A, List[C])",
    "unfoldr": "fn [A, B](fn (A) -> Option[(A, B)], A) -> List[B]",
    "unfoldl": "fn [A, B](fn (A) -> Option[(A, B)], A) -> List[B]",
    "tmap": "fn [A, B](fn (A) -> B, Tree[A]) -> Tree[B]",
    "size": "fn [A](Tree[A]) -> int32",
    "iterate": "fn [A](fn (A) -> A, int32) -> fn (A) -> A",
    "nat_double": "fn (nat) -> nat",
    "nat_add": "fn (nat, nat) -> nat",
    "nat_nth": "fn [A](List[A], nat) -> A",
    "nat_update": "fn [A](List[A], nat, A) -> List[A]",
    "nat_iterate": "fn [A](fn (A) -> A, nat) -> fn (A) -> A",
}


def test_prelude_types_are_tvms() -> None:
    mod = kiln.std.prelude()
    assert mod.is_typed
    types = {gv.name: type_text(mod[gv].checked_type) for gv in mod.global_vars}
    assert types == TVM_TYPES
    ctors = {name: c.belong_to.name for name, c in mod.constructors.items()}
    assert ctors == {"Cons": "List", "Nil": "List", "Some": "Option", "None": "Option",
                     "Rose": "Tree", "zero": "nat", "succ": "nat"}


def test_prelude_is_parsed_once() -> None:
    assert kiln.std.prelude() is kiln.std.prelude()


def test_inputs_from_python_use_the_modules_constructors() -> None:
    mod = kiln.std.with_prelude(
        "def @main(%xs: List[float32]) -> (float32, List[float32]) {\n"
        "  (@foldl(fn (%a: float32, %x: float32) -> float32 { %a + %x }, 0f, %xs), @rev(%xs))\n"
        "}\n")
    cons, nil = mod.get_constructor("Cons"), mod.get_constructor("Nil")
    values = [1.5, -2.0, 4.25]
    xs = kiln.ConstructorValue(nil)
    for v in reversed(values):
        xs = kiln.ConstructorValue(cons, (np.float32(v), xs))
    expected = (sum(values), values[::-1])
    assert py(kiln.interpret(mod, xs)) == expected
    assert py(kiln.build(mod)(xs)) == expected


def test_a_program_in_tvms_style_uses_the_prelude_with_tensors() -> None:
    # Tensors in the lists, a type-parameterized helper of the user's own, and the prelude's
    # functions passed as values.
    mod = kiln.std.with_prelude("""#[version = "0.0.5"]
def @scale_all[A](%k: Tensor[(2, 3), float32], %xs: List[Tensor[(2, 3), float32]])
    -> List[Tensor[(2, 3), float32]] {
  @map(fn (%x: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] { %x * %k }, %xs)
}

def @main(%a: Tensor[(2, 3), float32], %b: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
  let %xs = @scale_all(%a, Cons(%a, Cons(%b, Nil)));
  @foldl(fn (%acc: Tensor[(2, 3), float32], %x: Tensor[(2, 3), float32]) { %acc + %x },
         zeros_like(%a), @concat(%xs, @rev(%xs)))
}
""")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3), dtype="float32"), rng.standard_normal((2, 3),
                                                                             dtype="float32")
    expected = 2 * (a * a + b * a)
    np.testing.assert_allclose(kiln.interpret(mod, a, b), expected, rtol=1e-6)
    np.testing.assert_allclose(kiln.build(mod)(a, b), expected, rtol=1e-6)


@pytest.mark.parametrize(("text", "message", "where"), [
    ("def @main() { 1 }\ndef @map() { 2 }\n", "@map is defined by the prelude", "2:5"),
    ("type List[A] { Cons(A, List[A]), Nil, }\n", "type List is defined by the prelude", "1:6"),
    ("type Stack { Push(int32, Stack), Nil, }\n", "constructor Nil is defined by the prelude",
     "1:34"),
    ("@length(Cons(1, Nil))", "bare expression: write it as `def @main", "1:1"),
    ("def @main() {\n  (1, 2\n", "does not end after its definitions", "2:8"),
    ("def @main() { @lenght(Nil) }\n", "@lenght", "1:15"),
])
def test_with_prelude_errors_point_at_the_program(text: str, message: str, where: str) -> None:
    with pytest.raises(kiln.ParseError, match=re.escape(message)) as info:
        kiln.std.with_prelude(text, source_name="user.rly")
    assert str(info.value.span) == f"user.rly:{where}"


def test_type_errors_point_at_the_program_too() -> None:
    mod = kiln.std.with_prelude('#[version = "0.0.5"]\ndef @main() -> int32 {\n'
                                "  @length(Cons(1, Cons(2f, Nil)))\n}\n", source_name="user.rly")
    with pytest.raises(kiln.TypeCheckError) as info:
        kiln.infer_types(mod)
    span = info.value.span
    assert span is not None and span.source is not None and span.source.name == "user.rly"
    assert span.line == 3
