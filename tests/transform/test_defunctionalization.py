"""defunctionalization: function values become ADT values, calls become @apply."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.transform import PassContext
from kiln.transform.defunctionalization import Defunctionalization

LIST = "type List[A] { Cons(A, List[A]), Nil }"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return Defunctionalization()(mod)


def check(before: str, expected: str) -> kiln.IRModule:
    out = run(kiln.parse(before))
    assert kiln.structural_equal(out, kiln.parse(expected)), kiln.astext(out)
    assert first_order(out)
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


def first_order(mod: kiln.IRModule) -> bool:
    """No function literals, no function types, no calls of function values."""
    typed = kiln.infer_types(mod)
    for fn in typed.functions.values():
        for e in post_order(fn.body):
            if isinstance(e, kiln.Function) and not e.attrs.get("Primitive"):
                return False
            if isinstance(e, kiln.Call) and not isinstance(
                    e.op, (kiln.Op, kiln.GlobalVar, kiln.Constructor, kiln.Function)):
                return False
            if isinstance(e, (kiln.GlobalVar, kiln.Constructor, kiln.Op, kiln.Function)):
                continue  # callees
            if "fn (" in str(e.checked_type):
                return False
    return True


def py_list(ctor_cons, ctor_nil, items):
    out = kiln.ConstructorValue(ctor_nil)
    for item in reversed(items):
        out = kiln.ConstructorValue(ctor_cons, (item, out))
    return out


def test_a_closure_passed_to_a_global_becomes_a_constructor_and_apply():
    check(LIST + """
    def @map(%f: fn (float32) -> float32, %xs: List[float32]) -> List[float32] {
      match (%xs) { Cons(%h, %t) => Cons(%f(%h), @map(%f, %t)), Nil => Nil }
    }
    def @main(%k: float32, %xs: List[float32]) { @map(fn (%x: float32) { %x * %k }, %xs) }
    """, LIST + """
    type Fn0 { Fn0_lambda(float32) }
    def @map(%f: Fn0, %xs: List[float32]) -> List[float32] {
      match (%xs) { Cons(%h, %t) => Cons(@apply0(%f, %h), @map(%f, %t)), Nil => Nil }
    }
    def @main(%k: float32, %xs: List[float32]) { @map(Fn0_lambda(%k), %xs) }
    def @apply0(%f: Fn0, %a: float32) -> float32 {
      match (%f) { Fn0_lambda(%k: float32) => %a * %k }
    }
    """)


def test_polymorphic_higher_order_globals_are_specialized():
    check(LIST + """
    def @map[A, B](%f: fn (A) -> B, %xs: List[A]) -> List[B] {
      match (%xs) { Cons(%h, %t) => Cons(%f(%h), @map(%f, %t)), Nil => Nil }
    }
    def @length[A](%xs: List[A]) -> int32 {
      match (%xs) { Cons(_, %t) => 1 + @length(%t), Nil => 0 }
    }
    def @main(%xs: List[int32]) {
      let %fs = @map(fn (%i: int32) { fn (%j: int32) { %i + %j } }, %xs);
      @length(%fs)
    }
    """, LIST + """
    type Fn0 { Fn0_lambda(int32) }
    type Fn1 { Fn1_lambda }
    def @length[A](%xs: List[A]) -> int32 {
      match (%xs) { Cons(_, %t) => 1 + @length(%t), Nil => 0 }
    }
    def @main(%xs: List[int32]) {
      let %fs = @map_0(Fn1_lambda, %xs);
      @length(%fs)
    }
    def @map_0(%f: Fn1, %xs: List[int32]) -> List[Fn0] {
      match (%xs) { Cons(%h, %t) => Cons(@apply1(%f, %h), @map_0(%f, %t)), Nil => Nil }
    }
    def @apply0(%f: Fn0, %a: int32) -> int32 {
      match (%f) { Fn0_lambda(%i: int32) => %i + %a }
    }
    def @apply1(%f: Fn1, %a: int32) -> Fn0 {
      match (%f) { Fn1_lambda => Fn0_lambda(%a) }
    }
    """)


def test_closures_stored_in_adts():
    src = LIST + """
    type Op { Unary(fn (int32) -> int32), Const(int32) }
    def @run_all(%ops: List[Op], %x: int32) -> List[int32] {
      match (%ops) {
        Cons(Unary(%f), %rest) => Cons(%f(%x), @run_all(%rest, %x)),
        Cons(Const(%c), %rest) => Cons(%c, @run_all(%rest, %x)),
        Nil => Nil,
      }
    }
    def @main(%a: int32) {
      @run_all(Cons(Unary(fn (%y: int32) { %y + %a }),
               Cons(Const(7), Cons(Unary(fn (%y: int32) { %y * 2 }), Nil))), 10)
    }"""
    out = check(src, LIST + """
    type Op { Unary(Fn0), Const(int32) }
    type Fn0 { Fn0_lambda(int32), Fn0_lambda_1 }
    def @run_all(%ops: List[Op], %x: int32) -> List[int32] {
      match (%ops) {
        Cons(Unary(%f), %rest) => Cons(@apply0(%f, %x), @run_all(%rest, %x)),
        Cons(Const(%c), %rest) => Cons(%c, @run_all(%rest, %x)),
        Nil => Nil,
      }
    }
    def @main(%a: int32) {
      @run_all(Cons(Unary(Fn0_lambda(%a)), Cons(Const(7), Cons(Unary(Fn0_lambda_1), Nil))), 10)
    }
    def @apply0(%f: Fn0, %a: int32) -> int32 {
      match (%f) { Fn0_lambda(%a1: int32) => %a + %a1, Fn0_lambda_1 => %a * 2 }
    }""")
    mod = kiln.parse(src)
    assert canon(kiln.interpret(out, np.int32(5))) == canon(kiln.interpret(mod, np.int32(5)))


def test_returned_closures_recursion_references_and_globals_as_values():
    src = """
    def @inc(%x: int32) -> int32 { %x + 1 }
    def @compose(%f: fn (int32) -> int32, %g: fn (int32) -> int32) -> fn (int32) -> int32 {
      fn (%x: int32) { %f(%g(%x)) }
    }
    def @main(%n: int32) {
      let %count = ref(0);
      let %tick = fn (%x: int32) { ref_write(%count, ref_read(%count) + 1); %x };
      let %fact = fn (%k: int32) -> int32 { if (%k == 0) { 1 } else { %k * %fact(%k - 1) } };
      let %h = @compose(%tick, @compose(@inc, %fact));
      (%h(%n), %h(%n + 1), ref_read(%count))
    }"""
    mod = kiln.parse(src)
    out = run(mod)
    assert first_order(out)
    for n in range(4):
        assert canon(kiln.interpret(out, np.int32(n))) == canon(kiln.interpret(mod, np.int32(n)))


def test_the_example_programs_keep_their_meaning():
    for name, args in [
        ("closures", (np.array([1.5, -2.0], "float32"), np.int32(7))),
        ("lists", (np.int32(5), np.array([1.0, 2.0, 3.0], "float32"))),
        ("trees", (np.eye(2, dtype="float32"), np.ones((2, 2), "float32"))),
    ]:
        mod = kiln.parse(open(f"tests/programs/{name}.rly").read())
        out = run(mod)
        assert first_order(out)
        assert canon(kiln.interpret(out, *args)) == canon(kiln.interpret(mod, *args))


def test_semantics_of_a_fold_on_random_tensors():
    src = LIST + """
    def @foldl[A, B](%f: fn (A, B) -> A, %acc: A, %xs: List[B]) -> A {
      match (%xs) { Cons(%h, %t) => @foldl(%f, %f(%acc, %h), %t), Nil => %acc }
    }
    def @main(%w: Tensor[(3), float32], %xs: List[Tensor[(3), float32]]) {
      @foldl(fn (%acc: Tensor[(3), float32], %x: Tensor[(3), float32]) {
        add(multiply(%acc, %w), %x)
      }, zeros(shape=[3]), %xs)
    }"""
    mod = kiln.parse(src)
    out = run(mod)
    cons, nil = mod.get_constructor("Cons"), mod.get_constructor("Nil")
    rng = np.random.default_rng(7)
    for _ in range(3):
        w = rng.standard_normal(3).astype("float32")
        xs = py_list(cons, nil, [rng.standard_normal(3).astype("float32") for _ in range(4)])
        assert canon(kiln.interpret(out, w, xs)) == canon(kiln.interpret(mod, w, xs))


@pytest.mark.parametrize("src, message", [
    ("type Lazy[A] { Thunk(fn () -> A) }\n def @main(%x: int32) { Thunk(fn () { %x }) }",
     "constructor Thunk of type Lazy holds a function of the type's parameters"),
    ("def @main(%x: int32) { let %f = fn [A](%y: A) -> A { %y }; %f(%x) }",
     "is polymorphic"),
    ("def @id[A](%x: A) -> A { %x }\n def @main() { let %f = @id; (%f(1), %f(1f)) }",
     "no longer type-checks"),
    ("def @main[A](%f: fn (A) -> A, %x: A) { %f(%x) }",
     "@main is polymorphic and higher-order"),
    ("def @main(%x: float32) { let %k = fn (%p: float32, Primitive=1) { %p }; %k }",
     "fused kernel"),
])
def test_what_cannot_be_defunctionalized_is_a_clear_error(src, message):
    with pytest.raises(kiln.Error, match=message):
        Defunctionalization()(kiln.parse(src))


def test_first_order_programs_and_kernels_are_left_as_they_are():
    check("""
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p * 2f };
      (%0(%x), %x + 1f)
    }""", """
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { %p * 2f };
      (%0(%x), %x + 1f)
    }""")


def closure_chain(n: int, distinct: int) -> kiln.IRModule:
    """``distinct`` closures, each capturing the previous result, called n times in a chain."""
    x = kiln.var("x", kiln.scalar_type("int32"))
    lets = []
    prev: kiln.Expr = x
    fs: list[kiln.Var] = []
    for i in range(n):
        if i < distinct:
            f, y = kiln.var(f"f{i}"), kiln.var("y", kiln.scalar_type("int32"))
            lets.append((f, kiln.Function([y], kiln.op.add(y, prev))))
            fs.append(f)
        v = kiln.var(f"v{i}")
        lets.append((v, kiln.Call(fs[i % len(fs)], (kiln.const(1),))))
        prev = v
    body: kiln.Expr = prev
    for v, value in reversed(lets):
        body = kiln.Let(v, value, body)
    return kiln.IRModule.from_expr(kiln.Function([x], body))


def test_a_20000_node_chain_of_calls_through_closures():
    mod = closure_chain(7000, 3)  # 7,000 lets of calls: over 20,000 nodes
    start = time.perf_counter()
    out = Defunctionalization()(mod)
    assert time.perf_counter() - start < 60
    x = np.int32(3)
    assert int(kiln.interpret(out, x)) == int(kiln.interpret(mod, x))


def test_thousands_of_closures_make_one_constructor_each():
    n = 2000
    start = time.perf_counter()
    out = Defunctionalization()(closure_chain(n, n))
    assert time.perf_counter() - start < 60
    (fn_type,) = out.type_definitions.values()
    assert len(fn_type.constructors) == n


def test_a_first_order_program_is_returned_unchanged():
    mod = kiln.infer_types(kiln.parse("""
    type Box[A] { Box(A) }
    def @f(%x: int32) -> Box[int32] { Box(%x + 1) }
    def @main(%x: int32) { match (@f(%x)) { Box(%y) => %y } }"""))
    assert Defunctionalization()(mod) is mod
