"""lambda-lift: local functions become globals taking their captured variables first."""

import time

import numpy as np

import kiln
from kiln.ir.traverse import post_order
from kiln.transform import PassContext
from kiln.transform.lambda_lift import LambdaLift, is_closure_stub

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return LambdaLift()(mod)


def check(before: str, expected: str) -> kiln.IRModule:
    out = run(kiln.parse(before))
    assert kiln.structural_equal(out, kiln.parse(expected)), kiln.astext(out)
    assert only_kernels_and_stubs_nested(out)
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


def only_kernels_and_stubs_nested(mod: kiln.IRModule) -> bool:
    """No nested functions but fused kernels and stubs that only call a global."""
    for fn in mod.functions.values():
        for e in post_order(fn.body):
            if not isinstance(e, kiln.Function) or e.attrs.get("Primitive"):
                continue
            call = e.body
            if not (is_closure_stub(e) and isinstance(call, kiln.Call)
                    and isinstance(call.op, kiln.GlobalVar)
                    and call.args[len(call.args) - len(e.params):] == e.params):
                return False
    return True


def test_a_closure_called_directly_gets_its_captured_values_at_the_call():
    check(f"""
    def @main(%x: {F2}) {{ let %f = fn (%y: float32) {{ add(%x, %y) }}; %f(1f) }}
    """, f"""
    def @main_f(%x: {F2}, %y: float32) -> {F2} {{ add(%x, %y) }}
    def @main(%x: {F2}) {{ @main_f(%x, 1f) }}
    """)


def test_an_escaping_closure_becomes_a_partial_application():
    check("""
    def @apply(%f: fn (int32) -> int32, %v: int32) -> int32 { %f(%v) }
    def @main(%k: int32) {
      (@apply(fn (%y: int32) { %y * %k }, 2), @apply(fn (%y: int32) { %y + 1 }, 3))
    }""", """
    def @apply(%f: fn (int32) -> int32, %v: int32) -> int32 { %f(%v) }
    def @main_lambda(%k: int32, %y: int32) -> int32 { %y * %k }
    def @main_lambda1(%y: int32) -> int32 { %y + 1 }
    def @main(%k: int32) {
      (@apply(fn (%z: int32, Closure=1) -> int32 { @main_lambda(%k, %z) }, 2),
       @apply(@main_lambda1, 3))
    }""")


def test_recursive_local_functions_pass_their_captures_along():
    check("""
    def @main(%n: int32, %step: int32) {
      let %down = fn (%i: int32) -> int32 { if (%i <= 0) { 0 } else { 1 + %down(%i - %step) } };
      %down(%n)
    }""", """
    def @main_down(%step: int32, %i: int32) -> int32 {
      if (%i <= 0) { 0 } else { 1 + @main_down(%step, %i - %step) }
    }
    def @main(%n: int32, %step: int32) { @main_down(%step, %n) }
    """)


def test_capturing_a_lifted_function_captures_what_it_captures():
    check("""
    def @main(%a: int32, %b: int32) {
      let %g = fn (%x: int32) { %x + %a };
      let %h = fn (%y: int32) { %g(%y) * %b };
      (%h(1), %g)
    }""", """
    def @main_g(%a: int32, %x: int32) -> int32 { %x + %a }
    def @main_h(%a: int32, %b: int32, %y: int32) -> int32 { @main_g(%a, %y) * %b }
    def @main(%a: int32, %b: int32) {
      (@main_h(%a, %b, 1), fn (%z: int32, Closure=1) -> int32 { @main_g(%a, %z) })
    }""")


def test_a_closure_returned_from_a_polymorphic_global_is_polymorphic():
    check("""
    def @const[A, B](%v: A) -> fn (B) -> A { fn (%ignored: B) -> A { %v } }
    def @main(%x: int32) { @const(%x)(1f) }
    """, """
    def @const[A, B](%v: A) -> fn (B) -> A {
      fn (%i: B, Closure=1) -> A { @const_lambda(%v, %i) }
    }
    def @const_lambda[C, D](%v: C, %ignored: D) -> C { %v }
    def @main(%x: int32) { @const(%x)(1f) }
    """)


def test_closures_over_references_in_branches_and_clauses():
    src = """
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %c: bool) {
      let %cell = ref(0);
      let %add = fn (%k: int32) { ref_write(%cell, ref_read(%cell) + %k) };
      match (%o) {
        Some(%v) => if (%c) { %add(%v); %add(%v) } else { let %g = fn () { %add(%v) }; %g() },
        Nothing => (),
      };
      ref_read(%cell)
    }"""
    mod = kiln.parse(src)
    out = run(mod)
    assert only_kernels_and_stubs_nested(out)
    some, nothing = mod.get_constructor("Some"), mod.get_constructor("Nothing")
    for o in (kiln.ConstructorValue(some, (np.int32(5),)), kiln.ConstructorValue(nothing)):
        for c in (True, False):
            assert canon(kiln.interpret(out, o, c)) == canon(kiln.interpret(mod, o, c))


def test_fused_kernels_are_not_lifted():
    check("""
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p * 2f };
      %0(%x)
    }""", """
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p * 2f };
      %0(%x)
    }""")


def test_the_example_programs_keep_their_meaning():
    for name, args in [
        ("closures", (np.array([1.5, -2.0], "float32"), np.int32(7))),
        ("lists", (np.int32(5), np.array([1.0, 2.0, 3.0], "float32"))),
        ("trees", (np.eye(2, dtype="float32"), np.ones((2, 2), "float32"))),
    ]:
        mod = kiln.parse(open(f"tests/programs/{name}.rly").read())
        out = run(mod)
        assert only_kernels_and_stubs_nested(out)
        assert canon(kiln.interpret(out, *args)) == canon(kiln.interpret(mod, *args))


def test_a_20000_deep_chain_of_closures():
    n = 5000  # each step: a let, a closure, its body, a call: over 20,000 nodes
    x = kiln.var("x", kiln.scalar_type("int32"))
    lets = []
    prev: kiln.Expr = x
    for i in range(n):
        f, y, v = kiln.var(f"f{i}"), kiln.var("y", kiln.scalar_type("int32")), kiln.var(f"v{i}")
        lets.append((f, kiln.Function([y], kiln.op.add(y, prev))))
        lets.append((v, kiln.Call(f, (kiln.const(1),))))
        prev = v
    body: kiln.Expr = prev
    for v, value in reversed(lets):
        body = kiln.Let(v, value, body)
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    start = time.perf_counter()
    out = LambdaLift()(mod)
    assert time.perf_counter() - start < 30
    assert len(out.functions) == n + 1
    assert int(kiln.interpret(out, np.int32(3))) == 3 + n
