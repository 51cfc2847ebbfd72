"""eta-expand: globals and constructors used as values become function literals."""

import time

import numpy as np

import kiln
from kiln.transform import PassContext
from kiln.transform.eta_expand import EtaExpand

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule, **options) -> kiln.IRModule:
    with PassContext(debug=True):
        return EtaExpand(**options)(mod)


def check(before: str, expected: str, **options) -> kiln.IRModule:
    out = run(kiln.parse(before), **options)
    assert kiln.structural_equal(out, kiln.parse(expected)), kiln.astext(out)
    return out


def canon(v):
    if isinstance(v, np.ndarray):
        return ("tensor", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, tuple):
        return tuple(canon(x) for x in v)
    if isinstance(v, kiln.ConstructorValue):
        return (v.constructor.name, canon(v.fields))
    return type(v).__name__


HEAD = f"""
type List[A] {{ Cons(A, List[A]), Nil }}
def @double(%x: {F2}) -> {F2} {{ add(%x, %x) }}
def @map[A, B](%f: fn (A) -> B, %xs: List[A]) -> List[B] {{
  match (%xs) {{ Cons(%h, %t) => Cons(%f(%h), @map(%f, %t)), Nil => Nil }}
}}
def @foldr[A, B](%f: fn (A, B) -> B, %acc: B, %xs: List[A]) -> B {{
  match (%xs) {{ Cons(%h, %t) => %f(%h, @foldr(%f, %acc, %t)), Nil => %acc }}
}}
"""


def test_globals_and_constructors_used_as_values_are_expanded():
    src = HEAD + f"""
    def @main(%xs: List[{F2}], %y: {F2}) {{
      (@map(@double, %xs), @foldr(Cons, Nil, %xs), @double(%y), Cons(%y, Nil))
    }}"""
    check(src, HEAD + f"""
    def @main(%xs: List[{F2}], %y: {F2}) {{
      (@map(fn (%a: {F2}) -> {F2} {{ @double(%a) }}, %xs),
       @foldr(fn [C](%b: C, %c: List[C]) -> List[C] {{ Cons(%b, %c) }}, Nil, %xs),
       @double(%y), Cons(%y, Nil))
    }}""")


def test_the_options_choose_what_is_expanded():
    src = HEAD + f"""
    def @main(%xs: List[{F2}]) {{ (@map(@double, %xs), @foldr(Cons, Nil, %xs)) }}"""
    check(src, HEAD + f"""
    def @main(%xs: List[{F2}]) {{
      (@map(@double, %xs),
       @foldr(fn [C](%b: C, %c: List[C]) -> List[C] {{ Cons(%b, %c) }}, Nil, %xs))
    }}""", expand_global_var=False)
    check(src, HEAD + f"""
    def @main(%xs: List[{F2}]) {{
      (@map(fn (%a: {F2}) -> {F2} {{ @double(%a) }}, %xs), @foldr(Cons, Nil, %xs))
    }}""", expand_constructor=False)
    mod = kiln.parse(src)
    assert EtaExpand(expand_constructor=False, expand_global_var=False)(mod) is mod


def test_values_in_lets_tuples_branches_and_bodies():
    check("""
    def @id[A](%x: A) -> A { %x }
    def @inc(%x: int32) -> int32 { %x + 1 }
    def @pick(%c: bool) -> fn (int32) -> int32 { if (%c) { @inc } else { @id } }
    def @main(%c: bool) { let %f = @inc; (%f, @pick(%c)(3), %f(1)) }
    """, """
    def @id[A](%x: A) -> A { %x }
    def @inc(%x: int32) -> int32 { %x + 1 }
    def @pick(%c: bool) -> fn (int32) -> int32 {
      if (%c) { fn (%a: int32) -> int32 { @inc(%a) } }
      else { fn [B](%b: B) -> B { @id(%b) } }
    }
    def @main(%c: bool) {
      let %f = fn (%a: int32) -> int32 { @inc(%a) };
      (%f, @pick(%c)(3), %f(1))
    }
    """)


def test_nullary_constructors_and_fused_kernels():
    check("""
    type Unit { Unit }
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p };
      (Unit, Unit(), %0(%x))
    }""", """
    type Unit { Unit }
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p };
      (Unit, Unit(), %0(%x))
    }""")


def test_semantics_on_the_example_programs():
    for name, args in [
        ("closures", (np.array([1.5, -2.0], "float32"), np.int32(7))),
        ("lists", (np.int32(5), np.array([1.0, 2.0, 3.0], "float32"))),
    ]:
        mod = kiln.parse(open(f"tests/programs/{name}.rly").read())
        out = run(mod)
        assert canon(kiln.interpret(out, *args)) == canon(kiln.interpret(mod, *args))


def test_20000_node_graph_of_globals_used_as_values():
    n = 7000  # a call, the global called and the global passed: 21,000 nodes
    x = kiln.var("x", kiln.scalar_type("int32"))
    y = kiln.var("y", kiln.scalar_type("int32"))
    f = kiln.var("f", kiln.FuncType((kiln.scalar_type("int32"),), kiln.scalar_type("int32")))
    apply = kiln.Function([f, y], kiln.Call(f, (y,)))
    inc = kiln.Function([y], kiln.op.add(y, kiln.const(1)))
    h: kiln.Expr = x
    for _ in range(n):
        h = kiln.Call(kiln.GlobalVar("apply"), (kiln.GlobalVar("inc"), h))
    mod = kiln.IRModule({"apply": apply, "inc": inc, "main": kiln.Function([x], h)})
    start = time.perf_counter()
    out = EtaExpand()(mod)
    assert time.perf_counter() - start < 30
    assert isinstance(out["main"].body.args[0], kiln.Function)
    assert int(kiln.interpret(out, np.int32(5))) == 5 + n
