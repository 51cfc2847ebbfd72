"""Lowering Level 1 to SSA, construct by construct: the shape of the program made, and its
result when the VM runs it (loop-IR evaluator kernels), against the reference interpreter."""

import numpy as np
import pytest

import kiln
from kiln.runtime import build
from kiln.ssa import lower_module, problems

LIST = """
type List[A] { Cons(A, List[A]), Nil, }
"""


def lower(text: str):
    # specialize-closures would evaluate the static closures of these small programs away;
    # here they are what is lowered
    with kiln.transform.PassContext(disabled_pass=["specialize-closures"]):
        return lower_module(kiln.optimize(kiln.parse(text)))


def ops(fn) -> list[str]:
    return [i.op for i in fn.instructions()]


def terms(fn) -> list[str]:
    return [b.terminator.op for b in fn.blocks]


def same(a, b):
    if isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(b, kiln.ConstructorValue):
        assert isinstance(a, kiln.ConstructorValue) and a.name == b.name
        same(a.fields, b.fields)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def check_runs(text: str, *args):
    mod = kiln.parse(text)
    exe = build(mod, target="evaluator")
    same(exe(*args), kiln.interpret(mod, *args))
    return exe


def test_if_joins_with_a_block_argument():
    text = """
    def @main(%x: Tensor[(2), float32], %c: bool) {
      let %y = if (%c) { negative(%x) } else { exp(%x) };
      %y * %y
    }"""
    fn = lower(text).main
    assert "cond_br" in terms(fn)
    joins = [b for b in fn.blocks if b.params and b is not fn.entry]
    assert len(joins) == 1 and joins[0].params[0].type == kiln.TensorType((2,), "float32")
    x = np.array([0.5, -1.0], "float32")
    check_runs(text, x, True)
    check_runs(text, x, False)


def test_if_in_tail_position_returns_from_each_branch():
    text = """
    def @main(%x: Tensor[(2), float32], %c: bool) {
      if (%c) { negative(%x) } else { %x }
    }"""
    fn = lower(text).main
    assert terms(fn).count("ret") == 2 and all(not b.params for b in fn.blocks[1:])
    check_runs(text, np.array([1.0, 2.0], "float32"), True)


def test_tail_self_recursion_becomes_a_loop():
    text = """
    def @sum_to(%i: int32, %acc: int32) -> int32 {
      if (%i == 0) { %acc } else { @sum_to(%i - 1, %acc + %i) }
    }
    def @main(%n: int32) { @sum_to(%n, 0) }
    """
    prog = lower(text)
    fn = prog.functions["sum_to"]
    assert "call" not in ops(fn)
    assert "br" in terms(fn)
    header = [b for b in fn.blocks if b.params and b is not fn.entry]
    assert len(header) == 1  # the loop header, reached from the entry and the back edge
    exe = check_runs(text, np.int32(200))
    assert int(exe(np.int32(3000))) == 3000 * 3001 // 2  # deeper than Python could recurse


def test_non_tail_recursion_is_a_call():
    text = """
    def @fact(%n: int32) -> int32 {
      if (%n == 0) { 1 } else { %n * @fact(%n - 1) }
    }
    def @main(%n: int32) { @fact(%n) }
    """
    assert "call" in ops(lower(text).functions["fact"])
    check_runs(text, np.int32(10))


def test_flat_match_is_one_switch():
    text = LIST + """
    def @len[A](%xs: List[A]) -> int32 {
      match (%xs) {
        Cons(_, %rest) => 1 + @len(%rest),
        Nil => 0,
      }
    }
    def @main(%n: int32) { @len(Cons(%n, Cons(%n, Nil))) }
    """
    fn = lower(text).functions["len"]
    switches = [b.terminator for b in fn.blocks if b.terminator.op == "switch"]
    assert len(switches) == 1
    assert switches[0].attrs == {"cases": ["Cons", "Nil"], "has_default": False}
    assert "adt_field" in ops(fn) and "fail" not in terms(fn)
    check_runs(text, np.int32(3))


def test_nested_patterns_and_match_question_failing():
    text = LIST + """
    def @second(%xs: List[int32]) -> int32 {
      match? (%xs) {
        Cons(_, Cons(%y, _)) => %y,
      }
    }
    def @main(%n: int32) {
      if (%n > 1) { @second(Cons(1, Cons(%n, Nil))) } else { @second(Cons(%n, Nil)) }
    }
    """
    fn = lower(text).functions["second"]
    assert [b.terminator.op for b in fn.blocks].count("switch") == 2
    assert "fail" in terms(fn)
    check_runs(text, np.int32(5))
    exe = build(kiln.parse(text), target="evaluator")
    with pytest.raises(kiln.EvalError, match="no clause of this match\\? matches"):
        exe(np.int32(0))


def test_tuple_patterns_and_wildcards():
    text = LIST + """
    def @zip(%xs: List[int32], %ys: List[int32]) -> List[(int32, int32)] {
      match (%xs, %ys) {
        (Cons(%x, %xt), Cons(%y, %yt)) => Cons((%x, %y), @zip(%xt, %yt)),
        _ => Nil,
      }
    }
    def @main(%a: int32, %b: int32) {
      @zip(Cons(%a, Cons(%b, Nil)), Cons(%b, Nil))
    }
    """
    prog = lower(text)
    assert not problems(prog)
    check_runs(text, np.int32(3), np.int32(4))


def test_closures_capture_values():
    text = """
    def @apply(%f: fn (int32) -> int32, %x: int32) -> int32 { %f(%x) }
    def @main(%k: int32, %x: int32) {
      let %add_k = fn (%y: int32) { %y + %k };
      (@apply(%add_k, %x), @apply(%add_k, %k))
    }
    """
    prog = lower(text)
    main = prog.main
    closures = [i for i in main.instructions() if i.op == "make_closure"]
    assert len(closures) == 1 and len(closures[0].operands) == 1  # %k captured
    assert "invoke_closure" in ops(prog.functions["apply"])
    check_runs(text, np.int32(3), np.int32(4))


def test_globals_and_constructors_as_values():
    text = LIST + """
    def @map(%f: fn (int32) -> int32, %xs: List[int32]) -> List[int32] {
      match (%xs) { Cons(%h, %t) => Cons(%f(%h), @map(%f, %t)), Nil => Nil }
    }
    def @foldr(%f: fn (int32, List[int32]) -> List[int32], %acc: List[int32],
               %xs: List[int32]) -> List[int32] {
      match (%xs) { Cons(%h, %t) => %f(%h, @foldr(%f, %acc, %t)), Nil => %acc }
    }
    def @double(%x: int32) -> int32 { %x * 2 }
    def @main(%n: int32) {
      let %xs = Cons(%n, Cons(%n + 1, Nil));
      (@map(@double, %xs), @foldr(Cons, Nil, %xs))
    }
    """
    prog = lower(text)
    made = [i.attrs["func"] for i in prog.main.instructions() if i.op == "make_closure"]
    assert "double" in made and len(made) == 2
    check_runs(text, np.int32(3))


def test_references():
    text = """
    def @main(%x: int32) {
      let %r = ref(%x);
      ref_write(%r, ref_read(%r) + 1);
      ref_write(%r, ref_read(%r) * 3);
      (ref_read(%r), %r)
    }
    """
    assert {"ref_new", "ref_read", "ref_write"} <= set(ops(lower(text).main))
    exe = build(kiln.parse(text), target="evaluator")
    value, ref = exe(np.int32(4))
    assert int(value) == 15 and isinstance(ref, kiln.RefValue) and int(ref.value) == 15


def test_identical_kernels_are_shared_and_weights_become_constants():
    x = kiln.var("x", shape=(1, 4))
    w1 = np.arange(12, dtype="float32").reshape(3, 4)
    w2 = -w1
    y = kiln.op.nn.relu(kiln.op.nn.dense(x, kiln.const(w1)))
    z = kiln.op.nn.relu(kiln.op.nn.dense(x, kiln.const(w2)))
    mod = kiln.IRModule.from_expr(kiln.Function([x], kiln.tuple_(y, z)))
    prog = lower_module(kiln.optimize(mod))
    assert len(prog.kernels) == 1
    (decl,) = prog.kernels.values()
    assert decl.inputs == (kiln.TensorType((1, 4), "float32"), kiln.TensorType((3, 4), "float32"))
    assert len(prog.constants) == 2
    calls = [i for i in prog.main.instructions() if i.op == "kernel"]
    assert len(calls) == 2 and all(i.operands[1].op == "const" for i in calls)
    exe = build(mod, target="evaluator")
    a = np.array([[1.0, -2.0, 0.5, 3.0]], "float32")
    same(exe(a), kiln.interpret(mod, a))


def test_tuple_arguments_are_passed_field_by_field():
    text = """
    def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(1, 3), float32]) {
      %0 = concatenate((%x, %y), axis=0);
      split(%0, indices_or_sections=[1], axis=0)
    }"""
    prog = lower(text)
    kernel = [i for i in prog.main.instructions() if i.op == "kernel"]
    assert kernel and all(v.type.__class__.__name__ == "TensorType" for i in kernel
                          for v in i.operands)
    r = np.random.default_rng(0)
    check_runs(text, r.standard_normal((2, 3)).astype("float32"),
               r.standard_normal((1, 3)).astype("float32"))


def test_symbolic_shapes_make_dynamic_kernel_calls():
    text = """
    def @main(%x: Tensor[(n, 3), float32]) { nn.relu(%x) * %x }
    """
    prog = lower(text)
    assert "kernel_dyn" in ops(prog.main) and "alloc" not in ops(prog.main)
    (decl,) = prog.kernels.values()
    assert not decl.is_static
    exe = check_runs(text, np.ones((4, 3), "float32"))
    check_runs(text, -np.ones((1, 3), "float32"))
    same(exe(np.full((2, 3), 2.0, "float32")), np.full((2, 3), 4.0, "float32"))
    assert exe.stats().specializations == 2


def test_operators_outside_fused_functions_still_become_kernels():
    x = kiln.var("x", shape=(3,))
    mod = kiln.infer_types(kiln.IRModule.from_expr(kiln.Function([x], kiln.op.exp(x))))
    prog = lower_module(mod)  # not optimized: the call was never fused
    assert [i.op for i in prog.main.instructions()] == ["alloc", "kernel"]
