"""Polymorphic globals without return annotations, called from other polymorphic globals.

Each use of a polymorphic global gets its own instance of the global's type, and the global's
type is complete, result included, before a caller outside its recursive group instantiates
it. These programs follow TVM's prelude.rly and nat.rly (whose @compose has no return type);
each is type-checked and run by kiln.interpret against Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kiln

LIST = """
type List[A] {
  Cons(A, List[A]),
  Nil,
}
"""

ID_COMPOSE = """
def @id[A](%x: A) -> A {
  %x
}

def @compose[A, B, C](%f: fn(B) -> C, %g: fn(A) -> B) {
  fn (%x: A) -> C {
    %f(%g(%x))
  }
}
"""

ITERATE = """
def @iterate[A](%f: fn(A) -> A, %n: Tensor[(), int32]) -> (fn(A) -> A) {
  if (%n == 0) {
    @id
  } else {
    @compose(%f, @iterate(%f, %n - 1))
  }
}
"""

MAIN_ITERATE = """
def @main(%x: int32, %y: float32) {
  (@iterate(fn (%v: int32) -> int32 { %v * 2 + 1 }, 5)(%x),
   @iterate(fn (%v: float32) -> float32 { %v * 3f }, 2)(%y),
   @iterate(fn (%v: int32) -> int32 { %v - 7 }, 0)(%x))
}
"""


def iterate(f: Callable[[Any], Any], n: int) -> Callable[[Any], Any]:
    return lambda x: x if n == 0 else f(iterate(f, n - 1)(x))


def as_python(v: Any) -> Any:
    """A result as Python: tuples as tuples, a List as a list, tensors as scalars."""
    if isinstance(v, tuple):
        return tuple(as_python(x) for x in v)
    if isinstance(v, kiln.ConstructorValue):
        out = []
        while v.constructor.name == "Cons":
            out.append(as_python(v.fields[0]))
            v = v.fields[1]
        return out
    return np.asarray(v).item()


def relay_list(xs: list[int]) -> str:
    text = "Nil"
    for x in reversed(xs):
        text = f"Cons({x}, {text})"
    return text


def checked(text: str) -> kiln.IRModule:
    return kiln.infer_types(kiln.parse('#[version = "0.0.5"]\n' + text))


def test_iterate_calls_an_unannotated_compose() -> None:
    mod = checked(ID_COMPOSE + ITERATE + MAIN_ITERATE)
    assert kiln.astext(mod["compose"].checked_type) == (
        "fn [A, B, C](fn (B) -> C, fn (A) -> B) -> fn (A) -> C")
    got = as_python(kiln.interpret(mod, np.int32(3), np.float32(1.5)))
    assert got == (iterate(lambda v: v * 2 + 1, 5)(3), iterate(lambda v: v * 3, 2)(1.5), 3)


def test_the_order_of_definitions_does_not_matter() -> None:
    # The callers first: inference still checks @compose before @iterate instantiates it.
    mod = checked(MAIN_ITERATE + ITERATE + ID_COMPOSE)
    got = as_python(kiln.interpret(mod, np.int32(-2), np.float32(0.5)))
    assert got == (iterate(lambda v: v * 2 + 1, 5)(-2), iterate(lambda v: v * 3, 2)(0.5), -2)


def test_iterate_without_its_return_annotation_either() -> None:
    unannotated = ITERATE.replace(" -> (fn(A) -> A)", "")
    mod = checked(unannotated + ID_COMPOSE + MAIN_ITERATE)
    assert kiln.astext(mod["iterate"].checked_type) == "fn [A](fn (A) -> A, int32) -> fn (A) -> A"
    got = as_python(kiln.interpret(mod, np.int32(4), np.float32(2.0)))
    assert got == (iterate(lambda v: v * 2 + 1, 5)(4), iterate(lambda v: v * 3, 2)(2.0), 4)


def test_nat_iterate_with_an_unannotated_closure() -> None:
    # nat.rly's @nat_iterate: its second closure has no return type.
    text = """
type nat {
  zero,
  succ(nat),
}

def @nat_iterate[A](%f: fn(A) -> A, %num: nat) -> fn(A) -> A {
  match %num {
    zero => fn (%x: A) -> A { %x },
    succ(%p) => fn (%i: A) { %f(@nat_iterate(%f, %p)(%i)) }
  }
}

def @main(%x: int32) {
  (@nat_iterate(fn (%v: int32) { %v * 3 }, succ(succ(succ(zero))))(%x),
   @nat_iterate(fn (%v: (int32, int32)) { (%v.1, %v.0) }, succ(zero))((%x, 1)))
}
"""
    mod = checked(text)
    assert as_python(kiln.interpret(mod, np.int32(2))) == (2 * 27, (1, 2))


CHAIN = LIST + """
def @both[A](%x: A) {
  @swap(@pair(%x, Cons(%x, Nil)))
}

def @swap[A, B](%p: (A, B)) {
  (%p.1, %p.0)
}

def @pair[A, B](%x: A, %y: B) {
  (%x, %y)
}

def @main(%i: int32, %f: float32) {
  (@both(%i), @both(%f), @both((%i, %f)))
}
"""


def test_a_chain_of_three_unannotated_polymorphic_globals() -> None:
    mod = checked(CHAIN)
    assert kiln.astext(mod["both"].checked_type) == "fn [A](A) -> (List[A], A)"
    got = as_python(kiln.interpret(mod, np.int32(7), np.float32(0.25)))
    assert got == (([7], 7), ([0.25], 0.25), ([(7, 0.25)], (7, 0.25)))


MUTUAL = LIST + """
def @evens[A](%xs: List[A]) {
  match (%xs) {
    Nil => Nil,
    Cons(%head, %tail) => Cons(%head, @odds(%tail)),
  }
}

def @odds[B](%xs: List[B]) {
  match (%xs) {
    Nil => Nil,
    Cons(_, %tail) => @evens(%tail),
  }
}

def @has_even_length[A](%xs: List[A]) {
  match (%xs) {
    Nil => True,
    Cons(_, %tail) => @has_odd_length(%tail),
  }
}

def @has_odd_length[B](%xs: List[B]) {
  match (%xs) {
    Nil => False,
    Cons(_, %tail) => @has_even_length(%tail),
  }
}
"""


@pytest.mark.parametrize("items", [[], [5], [1, 2, 3, 4, 5, 6, 7]])
def test_mutually_recursive_polymorphic_globals(items: list[int]) -> None:
    main = f"""
def @main() {{
  let %xs = {relay_list(items)};
  let %pairs = @evens(@odds(Cons((1f, 2), Cons((3f, 4), Nil))));
  (@evens(%xs), @odds(%xs), @has_even_length(%xs), @has_odd_length(%pairs), %pairs)
}}
"""
    mod = checked(MUTUAL + main)
    assert kiln.astext(mod["odds"].checked_type) == "fn [B](List[B]) -> List[B]"
    assert kiln.astext(mod["has_odd_length"].checked_type) == "fn [B](List[B]) -> bool"
    pairs = [(1.0, 2), (3.0, 4)][1::2][0::2]
    assert as_python(kiln.interpret(mod)) == (
        items[0::2], items[1::2], len(items) % 2 == 0, len(pairs) % 2 == 1, pairs)


def test_mutual_recursion_with_annotations_is_polymorphic_recursion() -> None:
    # Fully annotated, @g may call @f at another type than its own.
    text = """
def @f[A](%x: A, %n: int32) -> int32 {
  if (%n <= 0) { 0 } else { @g((%x, %x), %n - 1) + 1 }
}

def @g[B](%y: B, %n: int32) -> int32 {
  @f(%y, %n) * 2
}

def @main(%n: int32) {
  @f(1f, %n)
}
"""
    mod = checked(text)

    def f(n: int) -> int:
        return 0 if n <= 0 else 2 * f(n - 1) + 1

    assert as_python(kiln.interpret(mod, np.int32(5))) == f(5)


# --- programs that are wrong ------------------------------------------------------------------


def test_an_ill_typed_use_of_an_unannotated_compose_is_an_error() -> None:
    text = ID_COMPOSE + """
def @main(%x: int32) {
  let %h = @compose(fn (%a: int32) -> float32 { cast(%a, dtype="float32") },
                    fn (%b: int32) { %b + 1 });
  %h(%x) + 1
}
"""
    with pytest.raises(kiln.TypeCheckError, match="float32") as info:
        checked(text)
    assert "int32" in str(info.value)
    assert info.value.span is not None and info.value.span.line == 16


def test_compose_of_functions_that_do_not_chain_is_an_error() -> None:
    text = ID_COMPOSE + """
def @main(%x: float32) {
  @compose(fn (%a: int32) { %a }, fn (%b: float32) { %b })(%x)
}
"""
    with pytest.raises(kiln.TypeCheckError, match="argument 2 of the call to @compose"):
        checked(text)


def test_a_polymorphic_global_used_at_a_rigid_type_inside_its_group_is_an_error() -> None:
    # @g's result is its own B, but @g returns what @f returns for a float32.
    text = """
def @f[A](%x: A, %n: int32) {
  if (%n == 0) { %x } else { @g(%x, %n - 1) }
}

def @g[B](%y: B, %n: int32) {
  if (%n == 0) { %y } else { @f(1f, %n - 1) }
}
"""
    with pytest.raises(kiln.TypeCheckError, match="the branches of an if have different types"):
        checked(text)


def test_a_result_only_the_recursion_could_tell_asks_for_an_annotation() -> None:
    text = """
def @f[A](%x: A) {
  @g(%x)
}

def @g[B](%y: B) {
  (%y, @f(%y))
}
"""
    with pytest.raises(kiln.TypeCheckError, match=r"annotate its return type") as info:
        checked(text)
    assert "cannot infer the type of @" in str(info.value)


def test_a_type_variable_does_not_leak_into_a_monomorphic_global() -> None:
    # @g has no annotations; the only call gives it @f's A, which means nothing in @g.
    text = """
def @g(%y) {
  %y
}

def @f[A](%x: A) -> A {
  @g(%x)
}
"""
    with pytest.raises(kiln.TypeCheckError, match="mentions the type variable A") as info:
        checked(text)
    assert "@g" in str(info.value)
