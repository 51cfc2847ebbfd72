"""Higher-order mode on the whole language, against central finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ad import grad
from kiln.ir.traverse import post_order
from kiln.testing.gradcheck import check_grad

RNN = """
#[version = "0.0.5"]
/* An RNN as a tail-recursive loop over the rows of %xs. */
def @rnn(%i: int32, %n: int32, %h: Tensor[(1, 4), float64], %xs: Tensor[(5, 3), float64],
         %wx: Tensor[(4, 3), float64], %wh: Tensor[(4, 4), float64]) -> Tensor[(1, 4), float64] {
  if (%i == %n) {
    %h
  } else {
    let %x = reshape(take(%xs, %i, axis=0), newshape=[1, 3]);
    let %h2 = tanh(nn.dense(%x, %wx) + nn.dense(%h, %wh));
    @rnn(%i + 1, %n, %h2, %xs, %wx, %wh)
  }
}

def @main(%xs: Tensor[(5, 3), float64], %wx: Tensor[(4, 3), float64],
          %wh: Tensor[(4, 4), float64], %h0: Tensor[(1, 4), float64], %steps: int32) {
  let %h = @rnn(0, %steps, %h0, %xs, %wx, %wh);
  sum(%h * %h)
}
"""

FOLD = """
#[version = "0.0.5"]
type List[A] {
  Cons(A, List[A]),
  Nil,
}

def @foldl[A, B](%f: fn (A, B) -> A, %acc: A, %xs: List[B]) -> A {
  match (%xs) {
    Cons(%x, %rest) => @foldl(%f, %f(%acc, %x), %rest),
    Nil => %acc,
  }
}

def @main(%a: Tensor[(2, 3), float64], %b: Tensor[(2, 3), float64],
          %c: Tensor[(2, 3), float64], %w: Tensor[(2, 3), float64]) {
  let %decay = sigmoid(%w);
  let %step = fn (%acc: Tensor[(2, 3), float64], %x: Tensor[(2, 3), float64]) {
    %acc * %decay + sin(%x)
  };
  sum(@foldl(%step, zeros_like(%a), Cons(%a, Cons(%b, Cons(%c, Nil)))) * %w)
}
"""

CLOSURE = """
#[version = "0.0.5"]
type Option[A] {
  Some(A),
  None,
}

/* Returns a closure over %w: used after @make_layer has returned. */
def @make_layer(%w: Tensor[(3, 3), float64])
    -> fn (Tensor[(2, 3), float64]) -> Tensor[(2, 3), float64] {
  fn (%h: Tensor[(2, 3), float64]) { tanh(nn.dense(%h, %w)) }
}

def @twice(%f: fn (Tensor[(2, 3), float64]) -> Tensor[(2, 3), float64],
           %x: Tensor[(2, 3), float64]) -> Tensor[(2, 3), float64] {
  %f(%f(%x))
}

def @main(%x: Tensor[(2, 3), float64], %w: Tensor[(3, 3), float64], %b: Tensor[(3), float64]) {
  let %layer = @make_layer(%w);
  let %shift = fn (%h: Tensor[(2, 3), float64]) { %h + %b };
  let %y = match (Some(%shift)) {
    Some(%f) => @twice(%f, @twice(%layer, %x)),
    None => %x,
  };
  (sum(%y * %y), (%y, argmax(%y)))
}
"""

MUTUAL = """
#[version = "0.0.5"]
def @ping(%n: int32, %x: Tensor[(3), float64]) -> Tensor[(3), float64] {
  if (%n == 0) { %x } else { @pong(%n - 1, sin(%x) * 2f64) }
}

def @pong(%n: int32, %x: Tensor[(3), float64]) -> Tensor[(3), float64] {
  if (%n == 0) { %x } else { @ping(%n - 1, %x * %x) }
}

def @main(%x: Tensor[(3), float64]) {
  sum(@ping(5, %x))
}
"""

REFS = """
#[version = "0.0.5"]
def @main(%x: Tensor[(3), float64], %w: Tensor[(3), float64]) {
  let %acc = ref(zeros_like(%x));
  let %add = fn (%v: Tensor[(3), float64]) { ref_write(%acc, ref_read(%acc) + %v * %w) };
  %add(%x);
  %add(exp(%x));
  %add(%x * %x);
  let %r = ref_read(%acc);
  if (sum(%r) > 0f64) { %r * %r } else { negative(%r) }
}
"""

MAP = """
#[version = "0.0.5"]
type List[A] {
  Cons(A, List[A]),
  Nil,
}

def @map[A, B](%f: fn (A) -> B, %xs: List[A]) -> List[B] {
  match (%xs) {
    Cons(%x, %rest) => Cons(%f(%x), @map(%f, %rest)),
    Nil => Nil,
  }
}

def @length[A](%xs: List[A]) -> int32 {
  match (%xs) {
    Cons(_, %rest) => 1 + @length(%rest),
    Nil => 0,
  }
}

def @square(%x: Tensor[(2), float64]) -> Tensor[(2), float64] {
  %x * %x
}

def @total(%xs: List[Tensor[(2), float64]]) -> Tensor[(2), float64] {
  match (%xs) {
    Cons(%x, %rest) => %x + @total(%rest),
    Nil => zeros(shape=[2], dtype="float64"),
  }
}

def @main(%a: Tensor[(2), float64], %b: Tensor[(2), float64]) {
  let %xs = @map(@square, Cons(%a, Cons(%b * %a, Nil)));
  let %n = cast(@length(%xs), dtype="float64");
  sum(@total(%xs)) * %n
}
"""


def _mod(text: str) -> kiln.IRModule:
    return kiln.infer_types(kiln.parse(text))


def _rng() -> np.random.Generator:
    return np.random.default_rng(42)


def _roundtrip(g: kiln.Function, mod: kiln.IRModule) -> None:
    whole = kiln.IRModule.from_expr(g, mod)
    assert kiln.structural_equal(kiln.parse(kiln.astext(whole)), whole)


def test_tail_recursive_rnn_loop() -> None:
    mod, rng = _mod(RNN), _rng()
    args = [rng.standard_normal((5, 3)), 0.5 * rng.standard_normal((4, 3)),
            0.5 * rng.standard_normal((4, 4)), rng.standard_normal((1, 4)), np.int32(5)]
    check_grad(mod, args)
    _roundtrip(grad(mod["main"], mod=mod), mod)


def test_rnn_gradient_is_zero_for_weights_not_reached() -> None:
    # With no steps the loop returns %h0: the weights get exactly zero gradients.
    mod, rng = _mod(RNN), _rng()
    args = [rng.standard_normal((5, 3)), rng.standard_normal((4, 3)),
            rng.standard_normal((4, 4)), rng.standard_normal((1, 4)), np.int32(0)]
    g = grad(mod["main"], mod=mod)
    _, (dxs, dwx, dwh, dh0) = kiln.interpret(kiln.IRModule.from_expr(g, mod), *args)
    assert not dxs.any() and not dwx.any() and not dwh.any()
    np.testing.assert_allclose(dh0, 2 * args[3])


def test_fold_over_a_list_of_tensors() -> None:
    mod, rng = _mod(FOLD), _rng()
    check_grad(mod, [rng.standard_normal((2, 3)) for _ in range(4)])


def test_closure_captured_from_an_outer_scope() -> None:
    mod, rng = _mod(CLOSURE), _rng()
    args = [rng.standard_normal((2, 3)), rng.standard_normal((3, 3)), rng.standard_normal(3)]
    check_grad(mod, args, of=0)
    _roundtrip(grad(mod["main"], mod=mod, of=0), mod)


def test_mutual_recursion() -> None:
    mod = _mod(MUTUAL)
    check_grad(mod, [_rng().uniform(-1, 1, 3)])
    _roundtrip(grad(mod["main"], mod=mod), mod)


def test_references_and_if() -> None:
    mod, rng = _mod(REFS), _rng()
    check_grad(mod, [rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3)])
    # the other branch
    check_grad(mod, [-rng.uniform(0.5, 1, 3), rng.uniform(0.5, 1, 3)])


def test_polymorphic_globals_and_a_global_passed_as_a_value() -> None:
    mod, rng = _mod(MAP), _rng()
    g = grad(mod["main"], mod=mod)
    text = kiln.astext(g)
    # @map and @length never touch a float tensor: they are called as they are.
    assert "@map(" in text and "@length(" in text
    assert "map_grad" not in text and "length_grad" not in text
    assert "square_grad" in text and "total_grad" in text
    check_grad(mod, [rng.uniform(-1, 1, 2), rng.uniform(-1, 1, 2)])
    _roundtrip(g, mod)


def test_gradient_of_a_program_with_only_tuples_and_integers_on_the_side() -> None:
    x = kiln.var("x", shape=(3,), dtype="float64")
    n = kiln.var("n", shape=(), dtype="int32")
    pair = kiln.Tuple((x * x, n + kiln.const(1)))
    body = kiln.op.sum(kiln.TupleGetItem(pair, 0) * kiln.op.cast(kiln.TupleGetItem(pair, 1),
                                                                 dtype="float64"))
    fn = kiln.infer_types(kiln.Function([x, n], body))
    g = grad(fn)
    value, (dx,) = kiln.interpret(g, np.array([1.0, 2.0, 3.0]), np.int32(2))
    np.testing.assert_allclose(dx, 2 * 3 * np.array([1.0, 2.0, 3.0]))


def _deep_chain(depth: int) -> kiln.Function:
    x = kiln.var("x", shape=(2,), dtype="float64")
    e: kiln.Expr = x
    for i in range(depth):
        e = kiln.op.sin(e) if i % 2 else e * kiln.const(1.0001, "float64")
    return kiln.infer_types(kiln.Function([x], kiln.op.sum(e)))


def _deep_check(depth: int, mode: str) -> None:
    g = grad(_deep_chain(depth), mode=mode)
    x = np.array([0.3, -0.2])
    _, (dx,) = kiln.interpret(g, x)
    expected = np.ones(2)
    v = x.copy()
    for i in range(depth):  # the chain rule by hand, forward
        if i % 2:
            expected *= np.cos(v)
            v = np.sin(v)
        else:
            expected *= 1.0001
            v = v * 1.0001
    np.testing.assert_allclose(dx, expected, rtol=1e-9)


@pytest.mark.parametrize("mode", ["higher_order", "first_order"])
def test_programs_deeper_than_pythons_recursion_limit(mode: str) -> None:
    _deep_check(1200, mode)  # Python allows 1000 nested calls


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["higher_order", "first_order"])
def test_programs_20000_operators_deep(mode: str) -> None:
    _deep_check(20000, mode)


def test_adts_must_hold_tensors_through_type_parameters() -> None:
    mod = kiln.infer_types(kiln.parse("""
        type Leaf { Leaf(Tensor[(3), float32]), }
        def @main(%x: Tensor[(3), float32]) { match (Leaf(%x)) { Leaf(%y) => %y } }
    """))
    with pytest.raises(kiln.Error, match="constructor Leaf of type Leaf has a field of type"):
        grad(mod["main"], mod=mod)


def test_parameters_must_be_tensors_or_tuples_of_tensors() -> None:
    mod = kiln.infer_types(kiln.parse("""
        def @main(%f: fn (Tensor[(3), float32]) -> Tensor[(3), float32],
                  %x: Tensor[(3), float32]) { %f(%x) }
    """))
    with pytest.raises(kiln.Error, match="%f has type fn"):
        grad(mod["main"], mod=mod, wrt=1)


def test_the_result_runs_no_python_recursion_per_loop_iteration() -> None:
    # 300 iterations of the tail-recursive loop, each registering a backward closure: the
    # backward chain runs as tail calls.
    mod = _mod(RNN.replace("(5, 3)", "(300, 3)"))
    rng = _rng()
    args = [rng.standard_normal((300, 3)) * 0.1, 0.3 * rng.standard_normal((4, 3)),
            0.3 * rng.standard_normal((4, 4)), rng.standard_normal((1, 4)), np.int32(300)]
    g = grad(mod["main"], mod=mod)
    _, grads = kiln.interpret(kiln.IRModule.from_expr(g, mod), *args)
    assert all(np.isfinite(gi).all() for gi in grads)
    assert not any(isinstance(n, kiln.GlobalVar) and n.name == "rnn" for n in post_order(g.body))
