"""loop-invariant-code-motion: invariant work leaves recursive loops, meaning stays the same."""

import collections
import time

import numpy as np
import pytest

import kiln
from kiln.eval import interpreter
from kiln.testing.programs import random_program
from kiln.transform import PassContext, Sequential, get_pass
from kiln.transform.fuse_ops import FuseOps
from kiln.transform.loop_invariant import LoopInvariantCodeMotion

H, XS, W, U = ("Tensor[(1, 4), float32]", "Tensor[(5, 1, 3), float32]",
               "Tensor[(4, 3), float32]", "Tensor[(4, 4), float32]")


def licm(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return LoopInvariantCodeMotion()(mod)


def check(before_text: str, expected_text: str) -> kiln.IRModule:
    before = kiln.parse(before_text)
    after = licm(before)
    assert kiln.structural_equal(after, kiln.parse(expected_text)), kiln.astext(after)
    assert kiln.structural_equal(before, kiln.parse(before_text))  # the input is untouched
    return after


def run_counting(mod: kiln.IRModule, args, monkeypatch) -> tuple[object, collections.Counter]:
    """The result of @main, and how many times each operator ran."""
    counts: collections.Counter = collections.Counter()
    apply_op = interpreter.apply_op

    def counting(call, values):
        counts[call.op.name] += 1
        return apply_op(call, values)

    with monkeypatch.context() as m:
        m.setattr(interpreter, "apply_op", counting)
        return kiln.interpret(mod, *args), counts


RNN = f"""
def @loop(%i: int32, %n: int32, %h: {H}, %xs: {XS}, %w: {W}, %u: {U}) -> {H} {{
  if (less(%i, %n)) {{
    %0 = take(%xs, %i, axis=0);
    %1 = nn.dense(%0, multiply(%w, 2f));
    %2 = nn.dense(%h, transpose(%u));
    %3 = tanh(add(%1, %2));
    @loop(add(%i, 1), %n, %3, %xs, %w, %u)
  }} else {{
    %h
  }}
}}

def @main(%xs: {XS}, %w: {W}, %u: {U}) -> {H} {{
  @loop(0, 5, zeros(shape=[1, 4]), %xs, %w, %u)
}}"""

RNN_EXPECTED = f"""
def @loop(%i: int32, %n: int32, %h: {H}, %xs: {XS}, %w: {W}, %u: {U}) -> {H} {{
  @loop_licm(%i, %n, %h, %xs, %w, %u, multiply(%w, 2f), transpose(%u))
}}

def @loop_licm(%i: int32, %n: int32, %h: {H}, %xs: {XS}, %w: {W}, %u: {U},
               %w2: {W}, %ut: {U}) -> {H} {{
  if (less(%i, %n)) {{
    %0 = take(%xs, %i, axis=0);
    %1 = nn.dense(%0, %w2);
    %2 = nn.dense(%h, %ut);
    %3 = tanh(add(%1, %2));
    @loop_licm(add(%i, 1), %n, %3, %xs, %w, %u, %w2, %ut)
  }} else {{
    %h
  }}
}}

def @main(%xs: {XS}, %w: {W}, %u: {U}) -> {H} {{
  @loop(0, 5, zeros(shape=[1, 4]), %xs, %w, %u)
}}"""


def rnn_args(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in ((5, 1, 3), (4, 3), (4, 4))]


def test_rnn_loop_hoists_the_weight_transforms(monkeypatch):
    before = kiln.parse(RNN)
    after = check(RNN, RNN_EXPECTED)
    want, ran_before = run_counting(before, rnn_args(), monkeypatch)
    got, ran_after = run_counting(after, rnn_args(), monkeypatch)
    np.testing.assert_array_equal(got, want)  # the same operations on the same values
    assert ran_before["transpose"] == 5 and ran_after["transpose"] == 1
    assert ran_before["multiply"] == 5 and ran_after["multiply"] == 1
    assert ran_before["nn.dense"] == ran_after["nn.dense"] == 10


def test_local_loop_with_a_captured_weight():
    check(f"""
def @main(%u: {U}, %acc0: {H}) -> {H} {{
  let %f = fn (%j: int32, %acc: {H}) -> {H} {{
    if (less(%j, 3)) {{
      %f(add(%j, 1), add(%acc, sum(sigmoid(%u), axis=[0], keepdims=True)))
    }} else {{
      %acc
    }}
  }};
  %f(0, %acc0)
}}""", f"""
def @main(%u: {U}, %acc0: {H}) -> {H} {{
  let %f = fn (%j0: int32, %a0: {H}) -> {H} {{
    let %f_licm = fn (%j: int32, %acc: {H}, %s: {H}) -> {H} {{
      if (less(%j, 3)) {{ %f_licm(add(%j, 1), add(%acc, %s), %s) }} else {{ %acc }}
    }};
    %f_licm(%j0, %a0, sum(sigmoid(%u), axis=[0], keepdims=True))
  }};
  %f(0, %acc0)
}}""")


def test_invariant_let_chains_leave_the_loop_and_only_their_result_is_passed():
    check(f"""
def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  let %t = transpose(%u);
  let %s = multiply(%t, 0.5f);
  let %unused = exp(%u);
  if (less(%i, 4)) {{ @loop(add(%i, 1), nn.dense(%h, %s), %u) }} else {{ %h }}
}}""", f"""
def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  %0 = transpose(%u);
  @loop_licm(%i, %h, %u, multiply(%0, 0.5f))
}}

def @loop_licm(%i: int32, %h: {H}, %u: {U}, %s: {U}) -> {H} {{
  if (less(%i, 4)) {{ @loop_licm(add(%i, 1), nn.dense(%h, %s), %u, %s) }} else {{ %h }}
}}""")


def test_references_are_read_and_written_in_place(monkeypatch):
    text = f"""
def @loop(%i: int32, %r: ref({W}), %w: {W}) -> () {{
  if (less(%i, 3)) {{
    ref_write(%r, add(ref_read(%r), transpose(transpose(%w))));
    @loop(add(%i, 1), %r, %w)
  }} else {{
    ()
  }}
}}

def @main(%w: {W}) -> {W} {{
  let %r = ref(zeros_like(%w));
  @loop(0, %r, %w);
  ref_read(%r)
}}"""
    after = check(text, f"""
def @loop(%i: int32, %r: ref({W}), %w: {W}) -> () {{
  @loop_licm(%i, %r, %w, transpose(transpose(%w)))
}}

def @loop_licm(%i: int32, %r: ref({W}), %w: {W}, %tt: {W}) -> () {{
  if (less(%i, 3)) {{
    ref_write(%r, add(ref_read(%r), %tt));
    @loop_licm(add(%i, 1), %r, %w, %tt)
  }} else {{
    ()
  }}
}}

def @main(%w: {W}) -> {W} {{
  let %r = ref(zeros_like(%w));
  @loop(0, %r, %w);
  ref_read(%r)
}}""")
    w = rnn_args()[1]
    got, ran = run_counting(after, [w], monkeypatch)
    np.testing.assert_allclose(got, 3 * w, rtol=1e-6)  # three writes, none lost or repeated
    assert ran["transpose"] == 2


def test_closures_in_the_body_read_the_hoisted_value():
    check(f"""
def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  let %t = transpose(%u);
  let %k = fn (%y: {H}) {{ nn.dense(%y, %t) }};
  if (less(%i, 2)) {{ @loop(add(%i, 1), %k(%h), %u) }} else {{ %h }}
}}""", f"""
def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  @loop_licm(%i, %h, %u, transpose(%u))
}}

def @loop_licm(%i: int32, %h: {H}, %u: {U}, %t: {U}) -> {H} {{
  let %k = fn (%y: {H}) {{ nn.dense(%y, %t) }};
  if (less(%i, 2)) {{ @loop_licm(add(%i, 1), %k(%h), %u, %t) }} else {{ %h }}
}}""")


def test_loops_over_lists_with_match():
    adt = "type List[A] { Cons(A, List[A]), Nil }"
    check(f"""
{adt}

def @sum_all(%xs: List[{H}], %acc: {H}, %u: {U}) -> {H} {{
  match (%xs) {{
    Cons(%x, %rest) => @sum_all(%rest, add(%acc, nn.dense(%x, transpose(%u))), %u),
    Nil => %acc,
  }}
}}""", f"""
{adt}

def @sum_all(%xs: List[{H}], %acc: {H}, %u: {U}) -> {H} {{
  @sum_all_licm(%xs, %acc, %u, transpose(%u))
}}

def @sum_all_licm(%xs: List[{H}], %acc: {H}, %u: {U}, %t: {U}) -> {H} {{
  match (%xs) {{
    Cons(%x, %rest) => @sum_all_licm(%rest, add(%acc, nn.dense(%x, %t)), %u, %t),
    Nil => %acc,
  }}
}}""")


CALLS = f"""
def @g(%x: {U}) -> {U} {{ transpose(%x) }}

def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  let %k = fn (%y: {U}) {{ exp(%y) }};
  if (less(%i, 2)) {{
    @loop(add(%i, 1), nn.dense(nn.dense(%h, @g(%u)), %k(%u)), %u)
  }} else {{
    %h
  }}
}}"""


def test_calls_of_globals_and_closures_stay():
    check(CALLS, CALLS)  # they could have effects: nothing to hoist


def test_a_parameter_that_changes_is_not_invariant():
    text = f"""
def @loop(%i: int32, %h: {H}, %u: {U}) -> {H} {{
  if (less(%i, 2)) {{
    @loop(add(%i, 1), nn.dense(%h, transpose(%u)), multiply(%u, 0.5f))
  }} else {{
    %h
  }}
}}"""
    check(text, text)


def test_a_function_that_is_not_a_loop_is_left_alone():
    text = f"""
def @main(%h: {H}, %u: {U}) -> {H} {{ nn.dense(%h, transpose(%u)) }}"""
    check(text, text)


def test_operators_that_can_fail_are_not_computed_speculatively():
    text = """
def @loop(%i: int32, %n: int32, %d: int32, %x: float32, %y: float32, %acc: float32) -> float32 {
  if (less(%i, %n)) {
    %0 = cast(divide(%n, %d), dtype="float32");
    @loop(add(%i, 1), %n, %d, %x, %y, add(%acc, add(%0, divide(%x, %y))))
  } else {
    %acc
  }
}

def @main(%n: int32, %d: int32) -> float32 { @loop(0, %n, %d, 1f, 0f, 0f) }"""
    after = check(text, """
def @loop(%i: int32, %n: int32, %d: int32, %x: float32, %y: float32, %acc: float32) -> float32 {
  @loop_licm(%i, %n, %d, %x, %y, %acc, divide(%x, %y))
}

def @loop_licm(%i: int32, %n: int32, %d: int32, %x: float32, %y: float32, %acc: float32,
               %q: float32) -> float32 {
  if (less(%i, %n)) {
    %0 = cast(divide(%n, %d), dtype="float32");
    @loop_licm(add(%i, 1), %n, %d, %x, %y, add(%acc, add(%0, %q)), %q)
  } else {
    %acc
  }
}

def @main(%n: int32, %d: int32) -> float32 { @loop(0, %n, %d, 1f, 0f, 0f) }""")
    # A loop that never runs must not divide by zero; one that runs does.
    assert kiln.interpret(after, np.int32(0), np.int32(0)) == 0
    with pytest.raises(kiln.EvalError, match="division by zero"):
        kiln.interpret(after, np.int32(1), np.int32(0))


def test_escaping_references_reach_the_entry_and_names_stay_fresh():
    before = kiln.parse(f"""
def @loop_licm(%x: {U}) -> {U} {{ %x }}

def @main(%u: {U}, %acc0: {H}) -> {H} {{
  let %f = fn (%j: int32, %acc: {H}) -> {H} {{
    if (less(%j, 2)) {{
      %f(add(%j, 1), add(%acc, sum(exp(%u), axis=[0], keepdims=True)))
    }} else {{
      if (less(%j, 4)) {{ let %g = %f; %g(add(%j, 1), %acc) }} else {{ %acc }}
    }}
  }};
  let %l = fn (%i: int32, %h: {H}, %w: {U}) -> {H} {{
    if (less(%i, 2)) {{ %l(add(%i, 1), nn.dense(%h, transpose(%w)), %w) }} else {{ %h }}
  }};
  %l(0, %f(0, %acc0), @loop_licm(%u))
}}""")
    after = licm(before)
    assert "loop_licm1" not in kiln.astext(after)  # the local loops get local names
    text = kiln.astext(after)
    assert "%f_licm" in text and "%l_licm" in text
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((4, 4)).astype("float32"),
            rng.standard_normal((1, 4)).astype("float32")]
    np.testing.assert_allclose(kiln.interpret(after, *args), kiln.interpret(before, *args),
                               rtol=1e-5)


def test_global_names_stay_fresh():
    before = kiln.parse(RNN + f"\ndef @loop_licm(%x: {U}) -> {U} {{ %x }}")
    after = licm(before)
    assert "loop_licm1" in {gv.name for gv in after.functions}
    np.testing.assert_allclose(kiln.interpret(after, *rnn_args()),
                               kiln.interpret(before, *rnn_args()), rtol=1e-6)


def test_after_fusion_kernel_calls_are_hoisted(monkeypatch):
    before = kiln.parse(RNN)
    with PassContext(debug=True):
        after = Sequential([FuseOps(), LoopInvariantCodeMotion()])(before)
    want, _ = run_counting(before, rnn_args(), monkeypatch)
    got, ran = run_counting(after, rnn_args(), monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert ran["transpose"] == 1 and ran["multiply"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_keep_their_meaning(seed):
    mod, inputs = random_program(seed, steps=16)
    after = licm(mod)
    want, got = kiln.interpret(mod, *inputs), kiln.interpret(after, *inputs)
    for w, g in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_registered_by_name():
    assert get_pass("loop-invariant-code-motion").info.opt_level == 2


def test_20000_node_loop_body(monkeypatch):
    i = kiln.var("i", kiln.TensorType((), "int32"))
    h = kiln.var("h", shape=(2,))
    w = kiln.var("w", shape=(2,))
    inv: kiln.Expr = w
    var: kiln.Expr = h
    for k in range(10000):  # invariant: 5,000 tanh and 5,000 negative
        inv = kiln.op.tanh(inv) if k % 2 else kiln.op.negative(inv)
    for k in range(10000):  # varying, reading the invariant value once
        var = kiln.op.sin(var) if k % 2 else kiln.op.add(var, inv if k == 0 else w)
    loop = kiln.GlobalVar("loop")
    step = kiln.Call(loop, [kiln.op.add(i, kiln.const(1)), var, w])
    body = kiln.if_(kiln.op.less(i, kiln.const(2)), step, h)
    fn = kiln.Function([i, h, w], body, kiln.TensorType((2,), "float32"))
    x, y = kiln.var("x", shape=(2,)), kiln.var("y", shape=(2,))
    main = kiln.Function([x, y], kiln.Call(loop, [kiln.const(0), x, y]))
    before = kiln.infer_types(kiln.IRModule({"loop": fn, "main": main}))
    start = time.perf_counter()
    after = LoopInvariantCodeMotion()(before)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"loop-invariant-code-motion took {elapsed:.2f} s"
    x0, w0 = np.array([0.3, -0.2], "float32"), np.array([0.5, 1.5], "float32")
    got, ran = run_counting(after, [x0, w0], monkeypatch)
    inv_np = w0
    for k in range(10000):
        inv_np = np.tanh(inv_np) if k % 2 else -inv_np
    want = x0
    for _ in range(2):
        for k in range(10000):
            want = np.sin(want) if k % 2 else want + (inv_np if k == 0 else w0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert ran["tanh"] == 5000  # once, not once per iteration
    assert ran["sin"] == 2 * 5000
