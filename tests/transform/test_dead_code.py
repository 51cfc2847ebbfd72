"""dead-code-elimination: unused pure lets go, effects stay, in every scope, at any depth."""

import time

import numpy as np

import kiln
from kiln.transform import PassContext
from kiln.transform.dead_code import DeadCodeElimination

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return DeadCodeElimination()(mod)


def check(before: str, expected: str) -> kiln.IRModule:
    out = run(kiln.parse(before))
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


def test_unused_pure_bindings_and_chains_of_them_go():
    check(f"""
    def @main(%x: {F2}) {{
      let %a = add(%x, %x);
      let %b = multiply(%a, %a);
      let %c = negative(%x);
      %x;
      %c
    }}""", f"def @main(%x: {F2}) {{ let %c = negative(%x); %c }}")


def test_reads_and_allocations_go_but_writes_stay():
    check(f"""
    def @main(%x: {F2}) {{
      let %r = ref(%x);
      let %unused_ref = ref(%x);
      let %unused_read = ref_read(%r);
      let %w = ref_write(%r, negative(%x));
      ref_write(%r, %x);
      ref_read(%r)
    }}""", f"""
    def @main(%x: {F2}) {{
      let %r = ref(%x);
      let %w = ref_write(%r, negative(%x));
      ref_write(%r, %x);
      ref_read(%r)
    }}""")


def test_calls_are_kept_when_the_callee_may_write():
    check("""
    def @bump(%r: ref(int32)) { ref_write(%r, add(ref_read(%r), 1)) }
    def @peek(%r: ref(int32)) { ref_read(%r) }
    def @pure(%x: int32) { add(%x, 1) }
    def @main(%f: fn (int32) -> int32, %r: ref(int32)) {
      let %a = @bump(%r);
      let %b = @peek(%r);
      let %c = @pure(1);
      let %d = %f(1);
      let %g = fn (%y: int32) { @bump(%r) };
      let %e = %g(2);
      let %h = fn (%y: int32) { @pure(%y) };
      let %k = %h(3);
      ref_read(%r)
    }""", """
    def @bump(%r: ref(int32)) { ref_write(%r, add(ref_read(%r), 1)) }
    def @peek(%r: ref(int32)) { ref_read(%r) }
    def @pure(%x: int32) { add(%x, 1) }
    def @main(%f: fn (int32) -> int32, %r: ref(int32)) {
      let %a = @bump(%r);
      let %d = %f(1);
      let %g = fn (%y: int32) { @bump(%r) };
      let %e = %g(2);
      ref_read(%r)
    }""")


def test_recursive_local_functions_go_when_unused_and_stay_when_used():
    check("""
    def @main(%n: int32) {
      let %dead = fn (%k: int32) -> int32 { if (%k == 0) { 0 } else { %dead(%k - 1) } };
      let %live = fn (%k: int32) -> int32 { if (%k == 0) { 0 } else { %live(%k - 1) } };
      %live(%n)
    }""", """
    def @main(%n: int32) {
      let %live = fn (%k: int32) -> int32 { if (%k == 0) { 0 } else { %live(%k - 1) } };
      %live(%n)
    }""")


def test_dead_code_in_branches_clauses_and_closures_goes():
    check("""
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %c: bool) {
      let %f = fn (%y: int32) { let %dead = %y * 2; %y + 1 };
      match (%o) {
        Some(%v) => if (%c) { let %d1 = %v - 1; %f(%v) } else { let %d2 = %f(%v); %v },
        Nothing => let %d3 = (1, 2); 0,
      }
    }""", """
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %c: bool) {
      let %f = fn (%y: int32) { %y + 1 };
      match (%o) {
        Some(%v) => if (%c) { %f(%v) } else { %v },
        Nothing => 0,
      }
    }""")


def test_unused_globals_and_graph_sharing_are_kept():
    check(f"""
    def @unused(%x: {F2}) {{ %x }}
    def @main(%x: {F2}) {{
      %0 = add(%x, %x);
      let %dead = %0;
      (%0, %0)
    }}""", f"""
    def @unused(%x: {F2}) {{ %x }}
    def @main(%x: {F2}) {{
      %0 = add(%x, %x);
      (%0, %0)
    }}""")


def test_a_module_without_dead_code_is_returned_as_is():
    mod = kiln.parse(f"def @main(%x: {F2}) {{ let %a = negative(%x); %a }}")
    assert DeadCodeElimination()(mod) is mod


def test_semantics_with_references_on_random_inputs():
    src = f"""
    def @main(%x: {F2}, %c: bool) {{
      let %r = ref(%x);
      let %count = ref(0);
      let %tick = fn () {{ ref_write(%count, add(ref_read(%count), 1)) }};
      let %unused = fn () {{ %tick() }};
      let %a = if (%c) {{ %tick(); ref_write(%r, negative(%x)) }} else {{ () }};
      let %b = multiply(ref_read(%r), 2f);
      let %dead = add(%b, %b);
      %tick();
      (ref_read(%r), ref_read(%count), %b)
    }}"""
    mod = kiln.parse(src)
    out = run(mod)
    assert "%dead" not in kiln.astext(out)
    rng = np.random.default_rng(1)
    for c in (True, False):
        x = rng.standard_normal(2).astype("float32")
        assert canon(kiln.interpret(out, x, c)) == canon(kiln.interpret(mod, x, c))


def test_a_20000_deep_chain_with_every_other_binding_dead():
    n = 20000
    x = kiln.var("x", shape=(2,))
    live = x
    lets = []
    for i in range(n):
        v = kiln.var(f"v{i}")
        if i % 2:
            lets.append((v, kiln.op.add(live, kiln.const(1.0))))
            live = v
        else:
            lets.append((v, kiln.op.negative(live)))  # never used
    body: kiln.Expr = live
    for v, value in reversed(lets):
        body = kiln.Let(v, value, body)
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    start = time.perf_counter()
    out = DeadCodeElimination()(mod)
    assert time.perf_counter() - start < 20
    remaining = 0
    e = out["main"].body
    while isinstance(e, kiln.Let):
        assert e.value.op.name == "add"
        remaining += 1
        e = e.body
    assert remaining == n // 2
    xs = np.array([1.0, 2.0], "float32")
    np.testing.assert_array_equal(kiln.interpret(out, xs), xs + n // 2)
