"""inline: marked globals are inlined with fresh variables, in evaluation order."""

import time

import numpy as np
import pytest

import kiln
from kiln.transform import PassContext
from kiln.transform.inline import Inline

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule, **config) -> kiln.IRModule:
    with PassContext(debug=True, config=config):
        return Inline()(mod)


def check(before: str, expected: str, **config) -> kiln.IRModule:
    out = run(kiln.parse(before), **config)
    assert kiln.structural_equal(out, kiln.parse(expected)), kiln.astext(out)
    return out


def canon(v):
    if isinstance(v, np.ndarray):
        return ("tensor", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, tuple):
        return tuple(canon(x) for x in v)
    if isinstance(v, kiln.ConstructorValue):
        return (v.constructor.name, canon(v.fields))
    if isinstance(v, kiln.RefValue):
        return ("ref", canon(v.value))
    return type(v).__name__


def test_marked_functions_are_inlined_and_removed():
    check(f"""
    def @square(%x: {F2}, Inline=1) {{ multiply(%x, %x) }}
    def @main(%x: {F2}) {{ @square(add(%x, 1f)) }}
    """, f"""
    def @main(%x: {F2}) {{ let %a: {F2} = add(%x, 1f); multiply(%a, %a) }}
    """)


def test_atomic_arguments_are_substituted_and_each_copy_is_fresh():
    out = check(f"""
    def @f(%x: {F2}, %y: float32, inline=1) {{ let %t = multiply(%x, %y); add(%t, %t) }}
    def @main(%x: {F2}) {{ (@f(%x, 2f), @f(%x, 3f)) }}
    """, f"""
    def @main(%x: {F2}) {{
      (let %t1 = multiply(%x, 2f); add(%t1, %t1), let %t2 = multiply(%x, 3f); add(%t2, %t2))
    }}
    """)
    first, second = out["main"].body.fields
    assert first.var is not second.var


def test_nested_inline_functions_expand_completely():
    check(f"""
    def @inc(%x: {F2}, Inline=1) {{ add(%x, 1f) }}
    def @twice(%x: {F2}, Inline=1) {{ @inc(@inc(%x)) }}
    def @main(%x: {F2}) {{ @twice(%x) }}
    """, f"""
    def @main(%x: {F2}) {{ let %a: {F2} = add(%x, 1f); add(%a, 1f) }}
    """)


def test_a_polymorphic_function_inlined_at_two_types():
    # Each copy must be fresh (its Nil and its variables), or inference would see one
    # node at two types.
    check("""
    type List[A] { Cons(A, List[A]), Nil }
    def @single[A](%x: A, Inline=1) -> List[A] { let %empty: List[A] = Nil; Cons(%x, %empty) }
    def @main(%i: int32, %f: float32) { (@single(%i), @single(%f)) }
    """, """
    type List[A] { Cons(A, List[A]), Nil }
    def @main(%i: int32, %f: float32) {
      (let %e1 = Nil; Cons(%i, %e1), let %e2 = Nil; Cons(%f, %e2))
    }
    """)


def test_arguments_are_evaluated_once_in_order_before_the_body():
    src = """
    def @second(%a: int32, %b: int32, Inline=1) { (%b, %b) }
    def @main(%r: ref(int32)) {
      @second(ref_write(%r, 1); ref_read(%r), ref_write(%r, 2); ref_read(%r))
    }"""
    check(src, """
    def @main(%r: ref(int32)) {
      let %a: int32 = (ref_write(%r, 1); ref_read(%r));
      let %b: int32 = (ref_write(%r, 2); ref_read(%r));
      (%b, %b)
    }""")


def test_globals_used_as_values_stay_and_unmarked_ones_are_kept():
    check(f"""
    def @neg(%x: {F2}, Inline=1) {{ negative(%x) }}
    def @helper(%x: {F2}) {{ %x }}
    def @apply(%f: fn ({F2}) -> {F2}, %x: {F2}) {{ %f(%x) }}
    def @main(%x: {F2}) {{ (@apply(@neg, %x), @neg(%x), @helper(%x)) }}
    """, f"""
    def @neg(%x: {F2}, Inline=1) {{ negative(%x) }}
    def @helper(%x: {F2}) {{ %x }}
    def @apply(%f: fn ({F2}) -> {F2}, %x: {F2}) {{ %f(%x) }}
    def @main(%x: {F2}) {{ (@apply(@neg, %x), negative(%x), @helper(%x)) }}
    """)


def test_recursive_functions_marked_inline_are_an_error():
    src = """
    def @even(%n: int32, Inline=1) -> bool { if (%n == 0) { True } else { @odd(%n - 1) } }
    def @odd(%n: int32) -> bool { if (%n == 0) { False } else { @even(%n - 1) } }
    def @main(%n: int32) { @even(%n) }
    """
    with pytest.raises(kiln.Error, match=r"@even is marked Inline=1 but is recursive "
                                         r"\(@even -> @odd\)"):
        run(kiln.parse(src))


def test_small_functions_with_the_size_option_but_never_recursive_ones_or_main():
    check(f"""
    def @small(%x: {F2}) {{ negative(%x) }}
    def @big(%x: {F2}) {{ exp(log(sqrt(abs(negative(%x))))) }}
    def @rec(%n: int32) -> int32 {{ if (%n == 0) {{ 0 }} else {{ @rec(%n - 1) }} }}
    def @main(%x: {F2}) {{ (@small(%x), @big(%x), @rec(3)) }}
    """, f"""
    def @small(%x: {F2}) {{ negative(%x) }}
    def @big(%x: {F2}) {{ exp(log(sqrt(abs(negative(%x))))) }}
    def @rec(%n: int32) -> int32 {{ if (%n == 0) {{ 0 }} else {{ @rec(%n - 1) }} }}
    def @main(%x: {F2}) {{ (negative(%x), @big(%x), @rec(3)) }}
    """, **{"inline.max_size": 3})


def test_inlining_into_closures_matches_and_shared_calls():
    src = f"""
    type Box[A] {{ Box(A) }}
    def @dbl(%x: {F2}, Inline=1) {{ add(%x, %x) }}
    def @main(%b: Box[{F2}]) {{
      match (%b) {{
        Box(%v) => %0 = @dbl(%v); let %f = fn (%y: {F2}) {{ @dbl(%y) }}; (%0, %0, %f(%0)),
      }}
    }}"""
    mod = kiln.parse(src)
    out = run(mod)
    assert "@dbl" not in kiln.astext(out)
    ctor = mod.get_constructor("Box")
    x = np.array([1.5, -2.0], "float32")
    box = kiln.ConstructorValue(ctor, (x,))
    assert canon(kiln.interpret(out, box)) == canon(kiln.interpret(mod, box))


def test_semantics_with_effects_on_random_inputs():
    src = f"""
    def @log_and_scale(%r: ref(int32), %x: {F2}, %k: float32, Inline=1) -> {F2} {{
      ref_write(%r, add(ref_read(%r), 1));
      multiply(%x, %k)
    }}
    def @main(%x: {F2}, %k: float32) {{
      let %r = ref(0);
      let %a = @log_and_scale(%r, %x, %k);
      let %b = @log_and_scale(%r, @log_and_scale(%r, %a, 2f), %k);
      (%a, %b, ref_read(%r))
    }}"""
    mod = kiln.parse(src)
    out = run(mod)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal(2).astype("float32")
        k = np.float32(rng.standard_normal())
        assert canon(kiln.interpret(out, x, k)) == canon(kiln.interpret(mod, x, k))


def test_20000_inlined_calls():
    n = 20000
    x = kiln.var("x", shape=(2,))
    p = kiln.var("p", shape=(2,))
    inc = kiln.Function([p], kiln.op.add(p, kiln.const(1.0)), attrs={"Inline": 1})
    h: kiln.Expr = x
    for _ in range(n):
        h = kiln.Call(kiln.GlobalVar("inc"), (h,))
    mod = kiln.IRModule({"inc": inc, "main": kiln.Function([x], h)})
    start = time.perf_counter()
    out = Inline()(mod)
    assert time.perf_counter() - start < 30
    assert list(out.functions) == [kiln.GlobalVar("main")]
    xs = np.array([1.0, 2.0], "float32")
    np.testing.assert_array_equal(kiln.interpret(out, xs), xs + n)
