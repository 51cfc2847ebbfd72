"""eliminate-common-subexpr: equal pure computations merge, in scope, never effects."""

import time

import numpy as np

import kiln
from kiln.transform import PassContext
from kiln.transform.eliminate_common_subexpr import EliminateCommonSubexpr

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return EliminateCommonSubexpr()(mod)


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


def test_equal_calls_merge_bottom_up_in_graph_form():
    check(f"""
    def @main(%x: {F2}, %y: {F2}) {{
      (multiply(add(%x, %y), 2f), multiply(add(%x, %y), 2f), add(%y, %x))
    }}""", f"""
    def @main(%x: {F2}, %y: {F2}) {{
      %0 = add(%x, %y);
      %1 = multiply(%0, 2f);
      (%1, %1, add(%y, %x))
    }}""")


def test_attributes_and_constants_are_compared_by_value():
    x = kiln.var("x", shape=(2, 3))
    body = kiln.Tuple((
        kiln.op.sum(x, axis=0), kiln.op.sum(x, axis=[0]), kiln.op.sum(x, axis=1),
        kiln.op.add(x, kiln.const(1.0)), kiln.op.add(x, kiln.const(1.0)),
        kiln.op.add(x, kiln.const(2.0)),
        kiln.op.clip(x, a_min=0.0, a_max=1.0), kiln.op.clip(x, a_min=-0.0, a_max=1.0),
    ))
    out = run(kiln.IRModule.from_expr(kiln.Function([x], body)))
    fields = out["main"].body.fields
    assert fields[0] is fields[1] and fields[0] is not fields[2]
    assert fields[3] is fields[4] and fields[3] is not fields[5]
    assert fields[6] is not fields[7]  # -0.0 and 0.0 are different attributes


def test_let_bound_duplicates_become_uses_of_the_first_variable():
    check(f"""
    def @main(%x: {F2}) {{
      let %a = add(%x, %x);
      let %b = add(%x, %x);
      let %c = multiply(%a, %b);
      let %d = multiply(%a, %a);
      (%c, %d)
    }}""", f"""
    def @main(%x: {F2}) {{
      let %a = add(%x, %x);
      let %c = multiply(%a, %a);
      (%c, %c)
    }}""")


def test_scopes_an_outer_value_is_visible_in_branches_but_siblings_are_not_merged():
    check(f"""
    def @main(%x: {F2}, %c: bool) {{
      let %a = add(%x, %x);
      let %r = if (%c) {{
        let %b = add(%x, %x);
        let %t = negative(%x);
        multiply(%b, %t)
      }} else {{
        let %e = negative(%x);
        %e
      }};
      let %after = negative(%x);
      (%r, %after)
    }}""", f"""
    def @main(%x: {F2}, %c: bool) {{
      let %a = add(%x, %x);
      let %r = if (%c) {{
        let %t = negative(%x);
        multiply(%a, %t)
      }} else {{
        let %e = negative(%x);
        %e
      }};
      let %after = negative(%x);
      (%r, %after)
    }}""")


def test_a_let_variable_is_not_used_outside_its_body():
    check(f"""
    def @main(%x: {F2}) {{
      (let %a = negative(%x); %a, negative(%x))
    }}""", f"""
    def @main(%x: {F2}) {{
      (let %a = negative(%x); %a, negative(%x))
    }}""")


def test_match_clauses_keep_their_own_computations():
    check("""
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %k: int32) {
      match (%o) {
        Some(%v) => (%v + %k, %v + %k, %k * 2),
        Nothing => (%k * 2, %k * 2, %k * 2),
      }
    }""", """
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %k: int32) {
      match (%o) {
        Some(%v) => %0 = %v + %k; (%0, %0, %k * 2),
        Nothing => %1 = %k * 2; (%1, %1, %1),
      }
    }""")


def test_effects_are_never_merged():
    check("""
    def @bump(%r: ref(int32)) -> int32 {
      ref_write(%r, add(ref_read(%r), 1)); ref_read(%r)
    }
    def @pure(%x: int32) -> int32 { %x * 3 }
    def @main(%r: ref(int32)) {
      (ref_read(%r), ref_read(%r), ref(1), ref(1), @bump(%r), @bump(%r),
       add(ref_read(%r), 1), add(ref_read(%r), 1), @pure(2), @pure(2))
    }""", """
    def @bump(%r: ref(int32)) -> int32 {
      ref_write(%r, add(ref_read(%r), 1)); ref_read(%r)
    }
    def @pure(%x: int32) -> int32 { %x * 3 }
    def @main(%r: ref(int32)) {
      %0 = @pure(2);
      (ref_read(%r), ref_read(%r), ref(1), ref(1), @bump(%r), @bump(%r),
       add(ref_read(%r), 1), add(ref_read(%r), 1), %0, %0)
    }""")


def test_a_shared_read_is_one_value_in_its_frame_but_not_in_a_closure():
    # Graph form evaluates %0 once per function invocation: the two adds outside see one
    # read and merge; the closure reads again when called, so its add must stay its own.
    check("""
    def @main(%r: ref(int32)) {
      %0 = ref_read(%r);
      let %f = fn () { add(%0, 1) };
      (add(%0, 1), add(%0, 1), %f)
    }""", """
    def @main(%r: ref(int32)) {
      %0 = ref_read(%r);
      %1 = add(%0, 1);
      let %f = fn () { add(%0, 1) };
      (%1, %1, %f)
    }""")


def test_closures_see_pure_values_of_the_enclosing_function():
    check(f"""
    def @main(%x: {F2}) {{
      let %a = exp(%x);
      let %f = fn (%y: {F2}) {{ add(exp(%x), %y) }};
      %f(%a)
    }}""", f"""
    def @main(%x: {F2}) {{
      let %a = exp(%x);
      let %f = fn (%y: {F2}) {{ add(%a, %y) }};
      %f(%a)
    }}""")


def test_fused_kernels_see_nothing_outside():
    check("""
    def @main(%x: float32) {
      let %a = add(1f, 2f);
      %0 = fn (%p: float32, Primitive=1) { multiply(%p, add(1f, 2f)) };
      %0(%a)
    }""", """
    def @main(%x: float32) {
      let %a = add(1f, 2f);
      %0 = fn (%p: float32, Primitive=1) { multiply(%p, add(1f, 2f)) };
      %0(%a)
    }""")


def test_tuples_projections_and_constructor_calls_merge():
    check("""
    type Pair[A] { Pair(A, A) }
    def @main(%t: (int32, int32)) {
      (%t.0, %t.0, (%t.0, 1), (%t.0, 1), Pair(%t.1, %t.1), Pair(%t.1, %t.1))
    }""", """
    type Pair[A] { Pair(A, A) }
    def @main(%t: (int32, int32)) {
      %0 = %t.0;
      %1 = (%0, 1);
      %2 = %t.1;
      %3 = Pair(%2, %2);
      (%0, %0, %1, %1, %3, %3)
    }""")


def test_semantics_on_random_inputs():
    src = f"""
    def @main(%x: {F2}, %c: bool) {{
      let %r = ref(exp(%x));
      let %a = add(ref_read(%r), %x);
      ref_write(%r, negative(%x));
      let %b = add(ref_read(%r), %x);
      let %s = if (%c) {{ multiply(exp(%x), %a) }} else {{ multiply(exp(%x), %b) }};
      (%a, %b, %s, exp(%x), add(ref_read(%r), %x))
    }}"""
    mod = kiln.parse(src)
    out = run(mod)
    rng = np.random.default_rng(2)
    for c in (True, False):
        x = rng.standard_normal(2).astype("float32")
        assert canon(kiln.interpret(out, x, c)) == canon(kiln.interpret(mod, x, c))


def test_20000_node_graph_and_chain():
    n = 20000
    x = kiln.var("x", shape=(2,))
    h: kiln.Expr = x
    for i in range(n // 2):  # every step computed twice: CSE must merge all of them
        h = kiln.op.add(kiln.op.multiply(h, h), kiln.op.multiply(h, h)) if i % 2 else \
            kiln.op.negative(h)
    mod = kiln.IRModule.from_expr(kiln.Function([x], h))
    start = time.perf_counter()
    out = EliminateCommonSubexpr()(mod)
    assert time.perf_counter() - start < 30
    muls = [e for e in kiln.ir.traverse.post_order(out["main"])
            if isinstance(e, kiln.Call) and e.op.name == "multiply"]
    assert len(muls) == n // 4

    lets, prev = [], x
    for i in range(n // 2):  # each value computed twice in a row: every other let merges
        a, b = kiln.var(f"a{i}"), kiln.var(f"b{i}")
        lets += [(a, kiln.op.negative(prev)), (b, kiln.op.negative(prev))]
        prev = b
    body: kiln.Expr = prev
    for v, value in reversed(lets):
        body = kiln.Let(v, value, body)
    chain = kiln.IRModule.from_expr(kiln.Function([x], body))
    start = time.perf_counter()
    merged = EliminateCommonSubexpr()(chain)
    assert time.perf_counter() - start < 30
    e, lets = merged["main"].body, 0
    while isinstance(e, kiln.Let):
        lets, e = lets + 1, e.body
    assert lets == n // 2
    xs = np.array([0.5, -2.0], "float32")
    np.testing.assert_array_equal(kiln.interpret(merged, xs), xs * (-1) ** (n // 2))


def test_large_constants_compare_by_identity():
    x = kiln.var("x", shape=(2000,))
    w = np.arange(2000, dtype="float32")
    big1, big2 = kiln.const(w), kiln.const(w)
    body = kiln.Tuple((kiln.op.add(x, big1), kiln.op.add(x, big2), kiln.op.add(x, big1)))
    out = run(kiln.IRModule.from_expr(kiln.Function([x], body)))
    a, b, c = out["main"].body.fields
    assert a is c and a is not b
