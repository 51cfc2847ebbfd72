"""to-graph-normal-form: pure lets become sharing; effects and closures keep their lets."""

import time

import numpy as np

import kiln
from kiln.transform import PassContext
from kiln.transform.a_normal_form import ToANormalForm
from kiln.transform.graph_normal_form import ToGraphNormalForm

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return ToGraphNormalForm()(mod)


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


def test_pure_lets_become_shared_nodes():
    out = check(f"""
    def @main(%x: {F2}, %y: {F2}) {{
      let %a = add(%x, %y);
      let %b = multiply(%a, %a);
      let %unused = exp(%a);
      subtract(%b, %a)
    }}""", f"""
    def @main(%x: {F2}, %y: {F2}) {{
      %0 = add(%x, %y);
      subtract(multiply(%0, %0), %0)
    }}""")
    body = out["main"].body
    assert body.args[1] is body.args[0].args[0]  # one node, used three times


def test_lets_with_effects_stay_in_order():
    check("""
    def @main(%r: ref(int32)) {
      let %before = ref_read(%r);
      let %sum = %before + 1;
      ref_write(%r, %sum);
      let %cell = ref(%sum);
      let %after = ref_read(%r);
      (%before, %after, %cell)
    }""", """
    def @main(%r: ref(int32)) {
      let %before = ref_read(%r);
      ref_write(%r, %before + 1);
      let %cell = ref(%before + 1);
      let %after = ref_read(%r);
      (%before, %after, %cell)
    }""")


def test_calls_that_may_write_keep_their_lets_pure_calls_do_not():
    check("""
    def @bump(%r: ref(int32)) -> int32 { ref_write(%r, 1); 1 }
    def @twice(%k: int32) -> int32 { %k * 2 }
    def @main(%r: ref(int32), %f: fn (int32) -> int32) {
      let %a = @bump(%r);
      let %b = %f(%a);
      let %c = @twice(%b);
      (%c, %c)
    }""", """
    def @bump(%r: ref(int32)) -> int32 { ref_write(%r, 1); 1 }
    def @twice(%k: int32) -> int32 { %k * 2 }
    def @main(%r: ref(int32), %f: fn (int32) -> int32) {
      let %a = @bump(%r);
      let %b = %f(%a);
      %0 = @twice(%b);
      (%0, %0)
    }""")


def test_values_used_in_closures_and_recursive_functions_keep_their_lets():
    check("""
    def @main(%n: int32) {
      let %k = %n * 3;
      let %m = %n + 1;
      let %g = fn (%y: int32) { %y + %k };
      let %fact = fn (%i: int32) -> int32 { if (%i == 0) { 1 } else { %i * %fact(%i - 1) } };
      (%g(%m), %fact(%m), %m)
    }""", """
    def @main(%n: int32) {
      let %k = %n * 3;
      let %fact = fn (%i: int32) -> int32 { if (%i == 0) { 1 } else { %i * %fact(%i - 1) } };
      %0 = %n + 1;
      (fn (%y: int32) { %y + %k }(%0), %fact(%0), %0)
    }""")


def test_scopes_branches_and_clauses_are_rewritten_inside():
    check("""
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %c: bool) {
      match (%o) {
        Some(%v) => let %w = %v * 2; if (%c) { let %z = %w + 1; (%z, %z) } else { (%w, %w) },
        Nothing => (0, 0),
      }
    }""", """
    type Opt[A] { Some(A), Nothing }
    def @main(%o: Opt[int32], %c: bool) {
      match (%o) {
        Some(%v) => %0 = %v * 2; if (%c) { %1 = %0 + 1; (%1, %1) } else { (%0, %0) },
        Nothing => (0, 0),
      }
    }""")


def test_round_trip_with_a_normal_form_on_random_inputs():
    src = f"""
    def @main(%x: {F2}, %c: bool) {{
      let %r = ref(%x);
      %0 = exp(%x);
      %1 = if (%c) {{ add(%0, 1f) }} else {{ multiply(%0, %0) }};
      ref_write(%r, %1);
      let %f = fn (%y: {F2}) {{ subtract(%y, %0) }};
      (%f(%1), ref_read(%r), %0)
    }}"""
    mod = kiln.parse(src)
    with PassContext(debug=True):
        anf = ToANormalForm()(mod)
        back = ToGraphNormalForm()(anf)
    rng = np.random.default_rng(6)
    for c in (True, False):
        x = rng.standard_normal(2).astype("float32")
        want = canon(kiln.interpret(mod, x, c))
        assert canon(kiln.interpret(anf, x, c)) == want
        assert canon(kiln.interpret(back, x, c)) == want


def test_the_example_programs_keep_their_meaning():
    for name, args in [
        ("closures", (np.array([1.5, -2.0], "float32"), np.int32(7))),
        ("lists", (np.int32(5), np.array([1.0, 2.0, 3.0], "float32"))),
        ("trees", (np.eye(2, dtype="float32"), np.ones((2, 2), "float32"))),
    ]:
        mod = kiln.parse(open(f"tests/programs/{name}.rly").read())
        out = run(mod)
        assert canon(kiln.interpret(out, *args)) == canon(kiln.interpret(mod, *args))


def test_a_20000_deep_let_chain_becomes_a_graph():
    n = 20000
    x = kiln.var("x", shape=(2,))
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body: kiln.Expr = vs[-1]
    for i in reversed(range(n)):
        prev = x if i == 0 else vs[i - 1]
        body = kiln.Let(vs[i], kiln.op.add(prev, kiln.const(1.0)), body)
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    start = time.perf_counter()
    out = ToGraphNormalForm()(mod)
    assert time.perf_counter() - start < 30
    e, depth = out["main"].body, 0
    while isinstance(e, kiln.Call):
        e, depth = e.args[0], depth + 1
    assert e is out["main"].params[0] and depth == n
    xs = np.array([1.0, -1.0], "float32")
    np.testing.assert_array_equal(kiln.interpret(out, xs), xs + n)
