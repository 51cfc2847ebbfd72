"""kiln.grad's options (wrt, of, keeping, seedable), its result, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ad import grad
from kiln.ir.ty import TupleType

MODES = ["higher_order", "first_order"]

PROGRAM = """
#[version = "0.0.5"]
def @main(%x: Tensor[(2, 3), float64], %n: int32, %w: Tensor[(3, 3), float64]) {
  %0 = nn.dense(%x, %w);
  %1 = %0 * cast(%n, dtype="float64");
  (sum(%1 * %1), tanh(%1), %n + 1)
}
"""


@pytest.fixture(scope="module")
def mod() -> kiln.IRModule:
    return kiln.infer_types(kiln.parse(PROGRAM))


def _args(rng: np.random.Generator | None = None) -> list:
    rng = rng or np.random.default_rng(0)
    return [rng.standard_normal((2, 3)), np.int32(2), rng.standard_normal((3, 3))]


def _run(g: kiln.Function, mod: kiln.IRModule, *args: object) -> object:
    return kiln.interpret(kiln.IRModule.from_expr(g, mod), *args)


def _reference(x: np.ndarray, n: int, w: np.ndarray, seed0: float = 1.0,
               seed1: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """d/dx and d/dw of seed0 * out0 + <seed1, out1>, by the chain rule in numpy."""
    y = (x @ w.T) * n
    gy = 2 * y * seed0
    if seed1 is not None:
        gy = gy + seed1 * (1 - np.tanh(y) ** 2)
    gz = gy * n
    return gz @ w, gz.T @ x


@pytest.mark.parametrize("mode", MODES)
def test_defaults_follow_relay(mod, mode) -> None:
    g = grad(mod["main"], mod=mod, mode=mode)
    assert g.checked_type_ is not None  # typed
    assert [p.name_hint for p in g.params] == ["x", "n", "w"]
    ret = g.checked_type.ret_type
    assert isinstance(ret, TupleType) and ret.fields[0] == mod["main"].checked_type.ret_type
    args = _args()
    value, (dx, dw) = _run(g, mod, *args)  # the integer %n is left out of wrt
    expected = kiln.interpret(mod, *args)
    for a, b in zip(value, expected, strict=True):
        np.testing.assert_allclose(a, b)
    # every output seeded with ones; the integer output has no adjoint
    ex, ew = _reference(*args, seed1=np.ones((2, 3)))
    np.testing.assert_allclose(dx, ex, rtol=1e-10)
    np.testing.assert_allclose(dw, ew, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_wrt_of_keeping_and_seedable(mod, mode) -> None:
    args = _args()
    g = grad(mod["main"], mod=mod, mode=mode, wrt=(2,), of=0, keeping=(), seedable=True)
    assert [p.name_hint for p in g.params] == ["x", "n", "w", "seed"]
    assert g.params[-1].checked_type == kiln.scalar_type("float64")
    (dw,) = _run(g, mod, *args, np.float64(3.0))
    np.testing.assert_allclose(dw, _reference(*args, seed0=3.0)[1], rtol=1e-10)

    g = grad(mod["main"], mod=mod, mode=mode, wrt=[0, -1], of=1, keeping=(2, 0))
    kept, (dx, dw) = _run(g, mod, *args)
    expected = kiln.interpret(mod, *args)
    np.testing.assert_array_equal(kept[0], expected[2])
    np.testing.assert_allclose(kept[1], expected[0])
    ex, ew = _reference(*args, seed0=0.0, seed1=np.ones((2, 3)))
    np.testing.assert_allclose(dx, ex, rtol=1e-10)
    np.testing.assert_allclose(dw, ew, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_a_tuple_seed_for_a_tuple_output(mode) -> None:
    x = kiln.var("x", shape=(2,), dtype="float64")
    fn = kiln.infer_types(kiln.Function([x], kiln.Tuple((x * x, kiln.Tuple((kiln.op.sin(x), x))))))
    g = grad(fn, mode=mode, seedable=True, keeping=())
    s = (np.array([1.0, 2.0]), (np.array([3.0, 4.0]), np.array([5.0, 6.0])))
    xv = np.array([0.5, -1.0])
    (dx,) = kiln.interpret(g, xv, s)
    np.testing.assert_allclose(dx, 2 * xv * s[0] + np.cos(xv) * s[1][0] + s[1][1])


@pytest.mark.parametrize("mode", MODES)
def test_the_same_value_returned_twice_gets_both_seeds(mode) -> None:
    x = kiln.var("x", shape=(2,), dtype="float64")
    y = kiln.var("y")
    fn = kiln.infer_types(kiln.Function([x], kiln.Let(y, x * x, kiln.Tuple((y, y)))))
    (dx,) = kiln.interpret(grad(fn, mode=mode, keeping=()), np.array([1.0, 2.0]))
    np.testing.assert_allclose(dx, [4.0, 8.0])


@pytest.mark.parametrize("mode", MODES)
def test_a_tuple_parameter(mode) -> None:
    from kiln.ir.ty import TensorType

    t = TupleType((TensorType((2,), "float64"), TensorType((2,), "float64")))
    p = kiln.var("p", t)
    fn = kiln.infer_types(kiln.Function([p], kiln.op.sum(p[0] * p[1] * p[1])))
    a, b = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    _, ((da, db),) = kiln.interpret(grad(fn, mode=mode), (a, b))
    np.testing.assert_allclose(da, b * b)
    np.testing.assert_allclose(db, 2 * a * b)


@pytest.mark.parametrize("mode", MODES)
def test_the_result_prints_parses_and_optimizes_like_any_function(mod, mode) -> None:
    g = grad(mod["main"], mod=mod, mode=mode)
    whole = kiln.IRModule.from_expr(g, mod)
    text = kiln.astext(whole)
    again = kiln.parse(text)
    assert kiln.structural_equal(again, whole)
    args = _args()
    expected = kiln.interpret(whole, *args)
    actual = kiln.interpret(again, *args)
    for a, b in zip(_leaves(actual), _leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)
    # The generic passes that exist (the optimizer is built alongside) leave the numbers alone.
    transform = pytest.importorskip("kiln.transform")
    names = {p.name for p in transform.list_passes()}
    wanted = ["infer-type", "eliminate-common-subexpr", "fold-constant", "simplify-expr",
              "dead-code-elimination", "infer-type"]
    passes = transform.Sequential([transform.get_pass(n) for n in wanted if n in names])
    optimized = transform.PassContext(opt_level=3).run_pass(passes, kiln.infer_types(whole))
    for a, b in zip(_leaves(kiln.interpret(optimized, *args)), _leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)


def _leaves(v: object) -> list:
    return [x for f in v for x in _leaves(f)] if isinstance(v, tuple) else [v]


def test_grad_accepts_an_untyped_function() -> None:
    x = kiln.var("x", shape=(3,), dtype="float32")
    _, (dx,) = kiln.interpret(grad(kiln.Function([x], kiln.op.sum(x * x))), np.ones(3, "float32"))
    np.testing.assert_allclose(dx, 2 * np.ones(3))


ERRORS = [
    ({"wrt": (3,)}, "wrt index 3 is out of range: the function has 3 parameter"),
    ({"wrt": (1,)}, r"parameter 1 \(%n: int32\): it is an integer or boolean tensor"),
    ({"wrt": (0, 0)}, "names a parameter twice"),
    ({"wrt": "x"}, "wrt must be an index"),
    ({"of": 3}, "of=3 is out of range"),
    ({"of": 2}, "has type int32, which holds no floating-point tensor"),
    ({"keeping": (5,)}, "keeping index 5 is out of range"),
    ({"mode": "forward"}, "unknown mode 'forward'"),
]


@pytest.mark.parametrize(("options", "message"), ERRORS)
def test_bad_options_are_clear_errors(mod, options, message) -> None:
    with pytest.raises(kiln.Error, match=message):
        grad(mod["main"], mod=mod, **options)


def test_of_needs_a_tuple_result() -> None:
    x = kiln.var("x", shape=(3,))
    with pytest.raises(kiln.Error, match="of=0 selects an output of a tuple result, but the "
                       r"function returns Tensor\[\(3\), float32\]"):
        grad(kiln.Function([x], x * x), of=0)


@pytest.mark.parametrize("mode", MODES)
def test_a_non_differentiable_operator_on_the_path_is_named(mode) -> None:
    text = "def @main(%x: Tensor[(3), float32], %y: Tensor[(3), float32]) {\n" \
           "  %0 = round(%x * 2f);\n  sum(%0 * %x) + sum(floor(%y) * %x) + sum(%x > %y)\n}"
    mod = kiln.infer_types(kiln.parse(text.replace("sum(%x > %y)", "sum(cast(%x > %y, "
                                                   "dtype=\"float32\"))"), source_name="m.rly"))
    with pytest.raises(kiln.Error, match="cannot differentiate through round") as info:
        grad(mod["main"], mod=mod, mode=mode, wrt=(0,))
    assert (info.value.line, info.value.column) == (2, 8)


@pytest.mark.parametrize("mode", MODES)
def test_non_differentiable_operators_off_the_path_are_fine(mode) -> None:
    # floor(%y) does not depend on %x; the comparison gives booleans, which have no adjoint.
    text = """def @main(%x: Tensor[(3), float64], %y: Tensor[(3), float64]) {
        sum(floor(%y) * %x) + sum(cast(%x > %y, dtype="float64") * %x)
    }"""
    mod = kiln.infer_types(kiln.parse(text))
    g = grad(mod["main"], mod=mod, mode=mode, wrt=(0,))
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.5, 1.5, -2.5])
    _, (dx,) = kiln.interpret(kiln.IRModule.from_expr(g, mod), x, y)
    np.testing.assert_allclose(dx, np.floor(y) + (x > y))


def test_the_function_must_return_tensors() -> None:
    x = kiln.var("x", shape=(3,))
    with pytest.raises(kiln.Error, match="returning tensors or tuples of tensors"):
        grad(kiln.Function([x], kiln.Function([], x)))
