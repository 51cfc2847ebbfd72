"""fold-constant: before/expected pairs, dtypes, size limit, effects, semantics, deep programs."""

import time

import numpy as np
import pytest

import kiln
from kiln.transform import PassContext
from kiln.transform.fold_constant import MAX_CREATED_ELEMENTS, FoldConstant

F2 = "Tensor[(2), float32]"


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return FoldConstant()(mod)


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
    return type(v).__name__


def test_a_let_chain_of_constants_folds_away():
    check(f"""
    def @main(%x: {F2}) {{
      let %a = add(1f, 2f);
      let %b = multiply(%a, 2f);
      add(%x, %b)
    }}""", f"def @main(%x: {F2}) {{ add(%x, 6f) }}")


def test_tuples_projections_and_ifs_fold():
    check(f"""
    def @main(%x: {F2}) {{
      let %t = (1f, less(1, 2));
      if (%t.1) {{ multiply(%x, %t.0) }} else {{ negative(%x) }}
    }}""", f"def @main(%x: {F2}) {{ multiply(%x, 1f) }}")


def test_a_projection_does_not_drop_an_effect():
    src = f"""
    def @main(%r: ref({F2})) {{
      (ref_write(%r, ones(shape=[2])), 1f).1
    }}"""
    out = run(kiln.parse(src))
    ones = kiln.const(np.ones(2, "float32"))
    r = kiln.var("r", kiln.RefType(kiln.tensor_type((2,))))
    expected = kiln.Function([r], kiln.TupleGetItem(
        kiln.Tuple((kiln.RefWrite(r, ones), kiln.const(1.0))), 1))
    assert kiln.structural_equal(out["main"], expected)


def test_operators_returning_arrays_and_tuples_fold_to_exact_constants():
    x = kiln.var("x", shape=(3,))
    body = kiln.Tuple((
        kiln.op.add(x, kiln.op.ones(shape=(3,))),
        kiln.op.split(kiln.op.arange(kiln.const(0.0), kiln.const(4.0), kiln.const(1.0)),
                      indices_or_sections=2),
    ))
    out = run(kiln.IRModule.from_expr(kiln.Function([x], body)))
    expected = kiln.Function([x], kiln.Tuple((
        kiln.op.add(x, kiln.const(np.ones(3, "float32"))),
        kiln.Tuple((kiln.const(np.array([0, 1], "float32")),
                    kiln.const(np.array([2, 3], "float32")))),
    )))
    assert kiln.structural_equal(out["main"], expected)


def test_an_operator_of_data_dependent_shape_folds_to_its_count():
    # argwhere's relation says (?, 1); the folded constant has the count of the mask
    mask = kiln.const(np.array([True, False, True, True]))
    out = run(kiln.IRModule.from_expr(kiln.Function([], kiln.op.argwhere(mask))))
    body = out["main"].body
    assert isinstance(body, kiln.Constant)
    np.testing.assert_array_equal(body.data, np.argwhere(mask.data))


@pytest.mark.parametrize("expr, value", [
    ("divide(7, 2)", np.int32(3)),
    ("divide(-7, 2)", np.int32(-3)),
    ("cast(2.75f, dtype=\"int64\")", np.int64(2)),
    ("add(1f16, 2f16)", np.float16(3)),
    ("sum(ones(shape=[3], dtype=\"int8\"))", np.int8(3)),
    ("mean(ones(shape=[4]))", np.float32(1)),
    ("less(1f64, 2f64)", np.bool_(True)),
])
def test_folded_values_keep_their_dtype(expr, value):
    out = run(kiln.parse(f"def @main() {{ {expr} }}"))
    body = out["main"].body
    assert isinstance(body, kiln.Constant)
    assert body.data.dtype == value.dtype and body.data.shape == ()
    assert body.data == value


def test_large_created_tensors_are_not_folded_but_large_inputs_are():
    side = int(np.sqrt(MAX_CREATED_ELEMENTS)) * 2
    w = np.arange(side * side, dtype="float32").reshape(side, side)
    body = kiln.Tuple((
        kiln.op.zeros(shape=(4096, 4096)),
        kiln.op.zeros(shape=(2, 2)),
        kiln.op.broadcast_to(kiln.const(1.0), shape=(side, side)),
        kiln.op.transpose(kiln.const(w)),
    ))
    out = run(kiln.IRModule.from_expr(kiln.Function([], body)))
    expected = kiln.Tuple((
        kiln.op.zeros(shape=(4096, 4096)),
        kiln.const(np.zeros((2, 2), "float32")),
        kiln.op.broadcast_to(kiln.const(1.0), shape=(side, side)),
        kiln.const(np.ascontiguousarray(w.T)),
    ))
    assert kiln.structural_equal(out["main"].body, expected)


def test_failing_calls_are_left_for_run_time():
    src = "def @main() { (divide(1, 0), mod(5, 0), add(2, 3)) }"
    out = run(kiln.parse(src))
    assert kiln.structural_equal(out, kiln.parse("def @main() { (divide(1, 0), mod(5, 0), 5) }"))
    with pytest.raises(kiln.EvalError):
        kiln.interpret(out)


def test_references_are_not_folded_but_their_operands_are():
    check(f"""
    def @main(%x: {F2}) {{
      let %r = ref(add(1f, 2f));
      let %unused = add(ref_read(%r), 1f);
      ref_write(%r, multiply(2f, 2f));
      ref_read(%r)
    }}""", f"""
    def @main(%x: {F2}) {{
      let %r = ref(3f);
      let %unused = add(ref_read(%r), 1f);
      ref_write(%r, 4f);
      ref_read(%r)
    }}""")


def test_closures_matches_and_shared_nodes_fold_inside():
    check("""
    type Box[A] { Box(A) }
    def @main(%b: Box[float32]) {
      %0 = add(1f, 1f);
      let %f = fn (%y: float32) { multiply(%y, %0) };
      match (%b) {
        Box(%v) => (%f(%v), %0, if (True) { subtract(%v, %0) } else { %v }),
      }
    }""", """
    type Box[A] { Box(A) }
    def @main(%b: Box[float32]) {
      let %f = fn (%y: float32) { multiply(%y, 2f) };
      match (%b) {
        Box(%v) => (%f(%v), 2f, subtract(%v, 2f)),
      }
    }""")


def test_fused_kernels_are_left_alone():
    src = """
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { add(%p, add(1f, 1f)) };
      (%0(%x), add(1f, 1f))
    }"""
    expected = """
    def @main(%x: float32) {
      %0 = fn (%p: float32, Primitive=1) { add(%p, add(1f, 1f)) };
      (%0(%x), 2f)
    }"""
    check(src, expected)


def test_recursive_globals_and_semantics_on_random_inputs():
    src = f"""
    def @pow(%x: {F2}, %n: int32) -> {F2} {{
      if (equal(%n, 0)) {{ ones(shape=[2]) }} else {{ multiply(%x, @pow(%x, subtract(%n, 1))) }}
    }}
    def @main(%x: {F2}, %n: int32) {{
      let %scale = divide(exp(0f), add(1f, 1f));
      %0 = add(%x, multiply(%scale, full(3f, shape=[2])));
      (@pow(%0, add(%n, 1)), sum(%0), @pow(ones(shape=[2]), 3))
    }}"""
    mod = kiln.parse(src)
    out = run(mod)
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.standard_normal(2).astype("float32")
        n = np.int32(rng.integers(0, 4))
        assert canon(kiln.interpret(out, x, n)) == canon(kiln.interpret(mod, x, n))


def test_input_module_is_not_changed():
    mod = kiln.parse("def @main() { add(1f, 2f) }")
    text = kiln.astext(mod)
    run(mod)
    assert kiln.astext(mod) == text


def test_a_20000_deep_chain_folds_quickly():
    n = 20000
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body: kiln.Expr = vs[-1]
    for i in reversed(range(n)):
        prev = kiln.const(0.0) if i == 0 else vs[i - 1]
        body = kiln.Let(vs[i], kiln.op.add(prev, kiln.const(1.0)), body)
    mod = kiln.IRModule.from_expr(kiln.Function([], body))
    start = time.perf_counter()
    out = FoldConstant()(mod)
    assert time.perf_counter() - start < 20
    assert kiln.structural_equal(out["main"].body, kiln.const(float(n)))


def test_deeply_nested_constant_tuples_fold_without_recursion():
    depth = 3000
    t: kiln.Expr = kiln.const(1.5)
    for _ in range(depth):
        t = kiln.Tuple((t,))
    e: kiln.Expr = t
    for _ in range(depth):
        e = kiln.TupleGetItem(e, 0)
    concat = kiln.op.concatenate(kiln.Tuple((kiln.op.expand_dims(e, axis=0),) * 2))
    out = run(kiln.IRModule.from_expr(kiln.Function([], concat)))
    assert kiln.structural_equal(out["main"].body, kiln.const(np.array([1.5, 1.5], "float32")))
