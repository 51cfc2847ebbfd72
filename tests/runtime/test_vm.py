"""The VM agrees with the reference interpreter: whole programs (lists, trees, closures,
references, recursion, a CNN) and random programs."""

import numpy as np
import pytest

import kiln
from kiln.runtime import build
from kiln.testing.programs import random_program

from .helpers import PROGRAMS, assert_same, needs_native


def program(name: str) -> kiln.IRModule:
    return kiln.parse((PROGRAMS / name).read_text(), source_name=name)


def test_closures_references_and_recursion():
    mod = program("closures.rly")
    x = np.array([1.0, 2.0], "float32")
    exe = build(mod, target="evaluator")
    assert exe.stats().backend == "evaluator"
    assert_same(exe(x, np.int32(300)), kiln.interpret(mod, x, np.int32(300)))


def test_lists():
    mod = program("lists.rly")
    v = np.array([1.0, -2.0, 0.5], "float32")
    exe = build(mod, target="evaluator")
    assert_same(exe(np.int32(6), v), kiln.interpret(mod, np.int32(6), v))


def test_trees_and_options():
    mod = program("trees.rly")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 2)).astype("float32")
    b = rng.standard_normal((2, 2)).astype("float32")
    exe = build(mod, target="evaluator")
    assert_same(exe(a, b), kiln.interpret(mod, a, b))


@needs_native
def test_cnn():
    mod = program("cnn.rly")
    rng = np.random.default_rng(1)

    def rand(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype("float32")

    params = {
        "conv1_weight": rand(8, 3, 3, 3), "conv1_bias": rand(8), "bn_gamma": rand(8) + 1,
        "bn_beta": rand(8), "bn_mean": rand(8), "bn_var": np.abs(rand(8)) + 0.5,
        "conv2_weight": rand(16, 8, 3, 3), "dw_weight": rand(16, 1, 3, 3),
        "fc_weight": rand(10, 256, scale=0.05), "fc_bias": rand(10),
    }
    data = rand(2, 3, 16, 16, scale=1.0)
    exe = build(mod, params=params)
    assert exe.stats().backend == "native"
    assert_same(exe(data), kiln.interpret(mod, data, params=params), rtol=1e-4, atol=1e-6)
    # Weights left as parameters run too.
    exe2 = build(mod)
    assert_same(exe2(data, **params), kiln.interpret(mod, data, params=params), rtol=1e-4,
                atol=1e-6)


def test_deep_recursion_does_not_use_the_python_stack():
    text = """
    def @count(%n: int32) -> int32 {
      if (%n == 0) { 0 } else { 1 + @count(%n - 1) }
    }
    def @main(%n: int32) { @count(%n) }
    """
    exe = build(kiln.parse(text), target="evaluator")
    assert int(exe(np.int32(3000))) == 3000


def test_mutual_tail_calls_replace_their_frame():
    text = """
    def @even(%n: int32) -> bool { if (%n == 0) { True } else { @odd(%n - 1) } }
    def @odd(%n: int32) -> bool { if (%n == 0) { False } else { @even(%n - 1) } }
    def @main(%n: int32) { @even(%n) }
    """
    exe = build(kiln.parse(text), target="evaluator")
    from kiln.runtime.vm import _CALL

    calls = [s for b in exe.executor.vm.codes["even"].blocks for s in b.steps if s[0] == _CALL]
    assert calls and all(s[-1] for s in calls)  # every call is a tail call
    assert bool(exe(np.int32(1001))) is False
    assert bool(exe(np.int32(1000))) is True


def test_match_question_with_no_clause_is_an_eval_error():
    text = """
    type List[A] { Cons(A, List[A]), Nil, }
    def @countdown(%n: int32) -> List[int32] {
      if (%n == 0) { Nil } else { Cons(%n, @countdown(%n - 1)) }
    }
    def @nth[A](%xs: List[A], %n: int32) -> A {
      match? (%xs) {
        Cons(%head, %tail) => { if (%n == 0) { %head } else { @nth(%tail, %n - 1) } },
      }
    }
    def @main(%n: int32) { @nth(@countdown(%n), 10) }
    """
    exe = build(kiln.parse(text, source_name="nth.rly"), target="evaluator")
    assert int(exe(np.int32(12))) == 2
    with pytest.raises(kiln.EvalError, match="nth.rly:7:7: no clause of this match\\?"):
        exe(np.int32(3))


@pytest.mark.parametrize("seed", range(10))
def test_random_programs_agree_with_the_interpreter(seed):
    mod, inputs = random_program(seed)
    exe = build(mod, target="evaluator")
    assert_same(exe(*inputs), kiln.interpret(mod, *inputs), rtol=2e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("seed", range(10, 40))
def test_random_programs_compiled_natively(seed):
    mod, inputs = random_program(seed, steps=16)
    exe = build(mod)
    assert_same(exe(*inputs), kiln.interpret(mod, *inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("seed", range(40, 240))
def test_many_random_programs_compiled_natively(seed):
    mod, inputs = random_program(seed, steps=24)
    exe = build(mod)
    assert_same(exe(*inputs), kiln.interpret(mod, *inputs), rtol=1e-4, atol=1e-5)


@needs_native
def test_a_returned_frames_arena_serves_the_next_frame():
    # A frame's arena (its intermediate tensors) goes to the function's next frame once the
    # frame has returned, never while it runs: the recursive call below needs a new arena
    # while its caller still reads %a from its own, and the two calls of @main must give
    # results that neither overwrites.
    text = """
    def @g(%x: Tensor[(16, 16), float32], %n: int32) -> Tensor[(16, 16), float32] {
      if (%n == 0) { %x } else {
        let %a = nn.dense(%x, %x);
        let %r = @g(multiply(%a, 0.125f), %n - 1);
        add(%r, nn.dense(%a, %r))
      }
    }
    def @h(%x: Tensor[(16, 16), float32]) -> Tensor[(16, 16), float32] {
      let %a = nn.dense(%x, %x);
      nn.dense(%a, %x)
    }
    def @main(%x: Tensor[(16, 16), float32], %y: Tensor[(16, 16), float32]) {
      (@g(%x, 4), @g(%y, 3), @h(%x), @h(%y))
    }
    """
    mod = kiln.parse(text)
    exe = build(mod, executor="vm")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, 16)) * 0.2).astype("float32")
    y = (rng.standard_normal((16, 16)) * 0.2).astype("float32")
    want = kiln.interpret(mod, x, y)
    vm = exe.executor.vm
    for _ in range(3):
        assert_same(exe(x, y), want, rtol=1e-4, atol=1e-6)
    assert vm.codes["g"].arena_bytes > 0 and vm.codes["h"].arena_bytes > 0
    assert 1 <= len(vm._spare["g"]) <= 2  # kept for the next calls (at most SPARE_ARENAS)
    (kept,) = vm._spare["h"]
    exe(x, y)
    (again,) = vm._spare["h"]
    assert again is kept  # @h's two calls a run took the same memory again
