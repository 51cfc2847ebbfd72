"""@kiln.script: each feature against numpy written here for the same computation.

Errors are checked for the line and column of the Python construct they name, found in the
source of the test itself.
"""


import importlib.util
import inspect
import sys

import numpy as np
import pytest

import kiln
from kiln.frontend import ScriptError, ScriptFunction, Tensor, script
from kiln.testing.gradcheck import check_grad, numerical_gradient

# Annotations name their dtype through constants: linters read a string inside an annotation,
# Tensor[(2,), "float32"], as a forward reference to a name float32 (pyflakes' F821).
F32, F64, I32 = "float32", "float64", "int32"
RNG = np.random.default_rng(0)
WX = RNG.standard_normal((6, 4)).astype("float32")
WH = RNG.standard_normal((6, 6)).astype("float32")
SCALE = 0.5
USE_SCALE = True


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def where(sf: ScriptFunction, text: str) -> tuple[int, int]:
    """The file line and 1-based column where ``text`` first occurs in sf's source."""
    lines, first = inspect.getsourcelines(sf.python)
    for k, line in enumerate(lines):
        if text in line:
            return first + k, line.index(text) + 1
    raise AssertionError(f"{text!r} is not in the source of {sf.__name__}")


def staging_error(sf: ScriptFunction, kind: type[kiln.Error] = kiln.Error) -> kiln.Error:
    with pytest.raises(kind) as info:
        _ = sf.function
    return info.value


# --- the RNN cell of the docs, module-level weights ----------------------------------------


@script
def cell(x: Tensor[(1, 4), "float32"], h: Tensor[(1, 6), "float32"]):  # noqa: F821
    return kiln.op.tanh(x @ WX.T + h @ WH.T)


def cell_numpy(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    return np.tanh(x @ WX.T + h @ WH.T)


def test_rnn_cell_matches_numpy():
    x, h = rand(1, 4), rand(1, 6)
    np.testing.assert_allclose(cell(x, h), cell_numpy(x, h), rtol=1e-5, atol=1e-6)


def test_function_and_module_are_typed():
    fn = cell.function
    assert isinstance(fn, kiln.Function)
    assert str(fn.checked_type) == (
        "fn (Tensor[(1, 4), float32], Tensor[(1, 6), float32]) -> Tensor[(1, 6), float32]")
    assert [p.name_hint for p in fn.params] == ["x", "h"]
    assert cell.module.is_typed and cell.module["main"] is fn
    assert cell.__name__ == "cell" and "cell" in repr(cell)


def test_numpy_weight_transposed_becomes_a_dense_weight():
    # x @ W.T with W a captured array is nn.dense(x, W): the constant is W itself.
    text = kiln.astext(cell.module)
    assert text.count("nn.dense") == 2 and "transpose" not in text
    consts = [e for e in _post_order(cell.function) if isinstance(e, kiln.Constant)]
    assert any(np.array_equal(c.data, WX) for c in consts)


def _post_order(e: kiln.Expr) -> list[kiln.Expr]:
    from kiln.ir.traverse import post_order

    return post_order(e)


# --- an MLP over closure variables -----------------------------------------------------------


def test_mlp_with_closure_weights_matches_numpy():
    w1, b1 = rand(16, 8), rand(16)
    w2, b2 = rand(3, 16), rand(3)

    @script
    def mlp(x: Tensor[(5, 8), F32]):
        h = kiln.op.nn.relu(kiln.op.nn.bias_add(x @ w1.T, b1))
        logits = h @ w2.T + b2
        return kiln.op.nn.softmax(logits, axis=-1)

    x = rand(5, 8)
    h = np.maximum(x @ w1.T + b1, 0)
    logits = h @ w2.T + b2
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(mlp(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_weights_as_parameters_and_matmul_without_transpose():
    @script
    def layer(x: Tensor[(2, 3), F32], w: Tensor[(3, 4), F32],
              v: Tensor[(5, 4), F32]):
        return (x @ w) @ v.T

    x, w, v = rand(2, 3), rand(3, 4), rand(5, 4)
    np.testing.assert_allclose(layer(x, w, v), (x @ w) @ v.T, rtol=1e-5, atol=1e-6)
    text = kiln.astext(layer.module)
    assert text.count("nn.dense") == 2 and text.count("transpose") == 1


def test_batched_matmul():
    @script
    def bmm(a: Tensor[(2, 3, 4), F32], b: Tensor[(2, 4, 5), F32],
            m: Tensor[(5, 6), F32], c: Tensor[(4, 3), F32]):
        return (a @ b) @ m, c @ a

    a, b, m, c = rand(2, 3, 4), rand(2, 4, 5), rand(5, 6), rand(4, 3)
    p, q = bmm(a, b, m, c)
    np.testing.assert_allclose(p, (a @ b) @ m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(q, c @ a, rtol=1e-5, atol=1e-5)

    @script
    def bmm_t(a: Tensor[(2, 3, 4), F32], w: Tensor[(5, 4), F32]):
        return a @ w.T, a @ WX.T

    w = rand(5, 4)
    p, q = bmm_t(a, w)
    np.testing.assert_allclose(p, a @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(q, a @ WX.T, rtol=1e-5, atol=1e-5)
    assert "nn.batch_matmul" in kiln.astext(bmm.module)


# --- arithmetic, literals, comparisons --------------------------------------------------------


def test_arithmetic_and_python_numbers_take_the_tensor_dtype():
    @script
    def arith(x: Tensor[(3,), F64], y: Tensor[(3,), F64]):
        return -x + y * 2 - x / 4.0 + x ** 2, 1.5 - y

    x, y = rand(3, dtype="float64"), rand(3, dtype="float64")
    a, b = arith(x, y)
    assert a.dtype == np.float64 and b.dtype == np.float64
    np.testing.assert_allclose(a, -x + y * 2 - x / 4.0 + x**2, rtol=1e-12)
    np.testing.assert_allclose(b, 1.5 - y, rtol=1e-12)


def test_literals_alone_are_int32_float32_and_bool():
    @script
    def lits(x: Tensor[(), F32]):
        return 3, 2.5, True, x + SCALE * 2

    out = lits(np.float32(1.0))
    assert [np.asarray(o).dtype.name for o in out] == ["int32", "float32", "bool", F32]
    assert out[0] == 3 and out[1] == 2.5 and out[2] and out[3] == 2.0


def test_comparisons_boolean_operators_and_conditional_expression():
    @script
    def cmp(x: Tensor[(4,), F32], y: Tensor[(4,), F32], s: Tensor[(), F32]):
        both = (x < y) and (x >= 0.0)
        either = x == y or not (x != y) or -1.0 < x <= 1.0
        z = x if s > 0.0 else y
        return both, either, z

    x, y = np.array([-1, 0.5, 2, 3], "float32"), np.array([0, 0.5, 1, 4], "float32")
    both, either, z = cmp(x, y, np.float32(1))
    np.testing.assert_array_equal(both, (x < y) & (x >= 0))
    np.testing.assert_array_equal(either, (x == y) | ~(x != y) | ((-1 < x) & (x <= 1)))
    np.testing.assert_array_equal(z, x)
    np.testing.assert_array_equal(cmp(x, y, np.float32(-1))[2], y)


def test_operator_attributes_positional_and_keyword():
    @script
    def reduce(x: Tensor[(2, 3, 4), F32]):
        a = kiln.op.sum(x, 1, keepdims=True)
        b = kiln.op.mean(x, axis=(0, 2))
        c = kiln.op.reshape(x, newshape=(x.shape[0], -1))
        d = kiln.op.concatenate((c, c * 2.0), axis=1)
        e = kiln.op.cast(kiln.op.argmax(x, axis=2), "float32")
        z = kiln.op.zeros((2, 3), "float32")
        return a, b, d, e + z

    x = rand(2, 3, 4)
    a, b, d, e = reduce(x)
    np.testing.assert_allclose(a, x.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(b, x.mean(axis=(0, 2)), rtol=1e-5)
    c = x.reshape(2, -1)
    np.testing.assert_allclose(d, np.concatenate([c, c * 2], axis=1), rtol=1e-6)
    np.testing.assert_array_equal(e, x.argmax(axis=2).astype("float32"))


def test_reassignment_makes_a_new_variable():
    @script
    def ssa(x: Tensor[(2,), F32]):
        y = x
        x = x + 1.0
        x += 1.0
        return y, x

    x = rand(2)
    y, x2 = ssa(x)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_allclose(x2, x + 2, rtol=1e-6)
    lets = [e for e in _post_order(ssa.function) if isinstance(e, kiln.Let)]
    assert len({id(let.var) for let in lets}) == len(lets) == 2


# --- tuples -----------------------------------------------------------------------------------


@script
def split_stats(x: Tensor[(4, 3), F32]):
    """Mean and maximum of the rows."""
    return kiln.op.mean(x, axis=0), kiln.op.max(x, axis=0)


def test_tuple_return_unpacking_and_indexing():
    @script
    def use(x: Tensor[(4, 3), F32]):
        mu, top = split_stats(x)
        pair = split_stats(x * 2.0)
        swapped = (pair[-1], pair[0])
        a, (b, c) = mu, swapped
        return a - top, b, c

    x = rand(4, 3)
    d, b, c = use(x)
    np.testing.assert_allclose(d, x.mean(0) - x.max(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, (2 * x).max(0), rtol=1e-6)
    np.testing.assert_allclose(c, (2 * x).mean(0), rtol=1e-5)


def test_tuple_parameter():
    @script
    def first(p: (Tensor[(2,), F32], Tensor[(), I32])):
        v, n = p
        return v * kiln.op.cast(n, "float32")

    np.testing.assert_allclose(first((np.ones(2, "float32"), np.int32(3))), [3, 3])


# --- calls between scripted functions -------------------------------------------------------


@script
def affine(x: Tensor[(1, 4), F32], w: Tensor[(3, 4), F32],
           b: Tensor[(1, 3), F32]):
    return x @ w.T + b


def test_calls_between_scripted_functions_are_inlined():
    @script
    def two_layers(x: Tensor[(1, 4), F32], w: Tensor[(3, 4), F32],
                   b: Tensor[(1, 3), F32], v: Tensor[(4, 3), F32]):
        h = kiln.op.tanh(affine(x, w, b))
        return affine(h @ v.T, w, b * 2.0)

    x, w, b, v = rand(1, 4), rand(3, 4), rand(1, 3), rand(4, 3)
    h = np.tanh(x @ w.T + b)
    expected = (h @ v.T) @ w.T + 2 * b
    np.testing.assert_allclose(two_layers(x, w, b, v), expected, rtol=1e-5, atol=1e-6)
    mod = two_layers.module
    assert list(mod.functions) == [kiln.GlobalVar("main")]  # inlined: no other globals


def test_call_checks_argument_types():
    @script
    def bad(x: Tensor[(1, 5), F32], w: Tensor[(3, 4), F32]):
        return affine(x, w, w)

    e = staging_error(bad, kiln.TypeCheckError)
    assert (e.line, e.column) == where(bad, "x, w, w)")
    assert "argument 'x' of affine must be Tensor[(1, 4), float32]" in e.message


# --- if / else --------------------------------------------------------------------------------


@script
def piecewise(x: Tensor[(3,), F32], t: Tensor[(), F32]):
    if kiln.op.sum(x) > t:
        y = x * 2.0
        z = x
    elif kiln.op.sum(x) > 0.0:
        y = x - 1.0
        z = -x
    else:
        y = x
        z = x + 1.0
    return y + z


def piecewise_numpy(x: np.ndarray, t: float) -> np.ndarray:
    if x.sum() > t:
        y, z = x * 2, x
    elif x.sum() > 0:
        y, z = x - 1, -x
    else:
        y, z = x, x + 1
    return y + z


@pytest.mark.parametrize("shift,t", [(5.0, 1.0), (1.0, 100.0), (-5.0, 1.0)])
def test_if_elif_else_merges_assigned_variables(shift, t):
    x = rand(3) + np.float32(shift)
    np.testing.assert_allclose(piecewise(x, np.float32(t)), piecewise_numpy(x, t), rtol=1e-6)


def test_if_without_else_and_returns_in_branches():
    @script
    def clamp(x: Tensor[(), F32]):
        if x > 1.0:
            return x * 0.0 + 1.0, False
        y = x
        if y < -1.0:
            y = y * 0.0 - 1.0
        if y < 0.0:
            return -y, True
        else:
            return y, False

    def numpy_clamp(x):
        if x > 1:
            return 1.0, False
        y = max(x, -1.0)
        return (-y, True) if y < 0 else (y, False)

    for v in (3.0, 0.5, -0.5, -3.0):
        value, negative = clamp(np.float32(v))
        assert (float(value), bool(negative)) == pytest.approx(numpy_clamp(v))


def test_if_on_a_python_value_is_decided_while_staging():
    @script
    def scaled(x: Tensor[(2,), F32]):
        if USE_SCALE:
            x = x * SCALE
        else:
            x = kiln.op.tanh(x)
        return x

    x = rand(2)
    np.testing.assert_allclose(scaled(x), x * SCALE)
    text = kiln.astext(scaled.module)
    assert "if (" not in text and "tanh" not in text


# --- loops ------------------------------------------------------------------------------------


def test_for_loop_recurrence_of_ten_steps_matches_a_python_loop():
    w = (0.3 * rand(5, 5)).astype("float32")

    @script
    def recur(x: Tensor[(1, 5), F32], h: Tensor[(1, 5), F32]):
        total = kiln.op.zeros_like(h)
        for i in range(10):
            h = kiln.op.tanh(h @ w.T + x)
            total = total + h * kiln.op.cast(i, "float32")
        return h, total

    x, h = rand(1, 5), rand(1, 5)
    total = np.zeros_like(h)
    hh = h
    for i in range(10):
        hh = np.tanh(hh @ w.T + x)
        total = total + hh * i
    out_h, out_total = recur(x, h)
    np.testing.assert_allclose(out_h, hh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_total, total, rtol=1e-5, atol=1e-5)
    # A loop is a local tail-recursive function, not ten copies of the body.
    text = kiln.astext(recur.module)
    assert text.count("tanh(") == 1 and "%loop(" in text


def test_for_loop_over_an_argument_count_runs_thousands_of_steps():
    @script
    def count(n: Tensor[(), I32], x: Tensor[(2,), F32]):
        acc = x * 0.0
        for _ in range(n):
            acc = acc + x
        return acc

    x = rand(2)
    np.testing.assert_allclose(count(np.int32(7), x), 7 * x, rtol=1e-6)
    np.testing.assert_allclose(count(np.int32(0), x), 0 * x)
    np.testing.assert_allclose(count(np.int32(3000), x), 3000 * x, rtol=1e-4)


def test_range_with_start_and_negative_step():
    @script
    def series(x: Tensor[(), I32]):
        total = 0
        for i in range(10, x, -3):
            total = total * 2 + i
        return total

    def numpy_series(x):
        total = 0
        for i in range(10, x, -3):
            total = total * 2 + i
        return total

    for x in (0, -5, 11):
        assert int(series(np.int32(x))) == numpy_series(x)


def test_nested_loops_and_if_in_a_loop():
    @script
    def table(x: Tensor[(3,), F32]):
        acc = kiln.op.zeros_like(x)
        for i in range(3):
            for j in range(i + 1):
                if i == j:
                    acc = acc + x
                else:
                    acc = acc - 1.0
        return acc

    x = rand(3)
    acc = np.zeros_like(x)
    for i in range(3):
        for j in range(i + 1):
            acc = acc + x if i == j else acc - 1
    np.testing.assert_allclose(table(x), acc, rtol=1e-6)


def test_while_loop():
    @script
    def halve(x: Tensor[(3,), F32]):
        steps = 0
        while kiln.op.max(kiln.op.abs(x)) > 1.0:
            x = x * 0.5
            steps = steps + 1
        return x, steps

    x = np.array([10.0, -3.0, 0.25], "float32")
    y, steps = halve(x)
    ref, n = x.copy(), 0
    while np.abs(ref).max() > 1:
        ref, n = ref * 0.5, n + 1
    np.testing.assert_array_equal(y, ref)
    assert int(steps) == n


# --- symbolic dimensions, lazy staging --------------------------------------------------------


def test_symbolic_dimensions():
    @script
    def norm_rows(x: Tensor[("n", 4), F32]):
        return x / kiln.op.sum(x * x, axis=1, keepdims=True)

    for n in (1, 5):
        x = rand(n, 4)
        np.testing.assert_allclose(norm_rows(x), x / (x * x).sum(1, keepdims=True), rtol=1e-5)
    assert "Tensor[(n, 4), float32]" in str(norm_rows.function.checked_type)


def test_globals_are_read_when_first_used():
    @script
    def late(x: Tensor[(2,), F32]):
        return x + LATER

    global LATER
    LATER = np.array([1.0, 2.0], "float32")
    np.testing.assert_allclose(late(np.zeros(2, "float32")), [1.0, 2.0])


# --- gradients -------------------------------------------------------------------------------


def test_grad_of_a_scripted_function_against_finite_differences():
    w = RNG.standard_normal((3, 4))  # float64, so that differences of 1e-6 are meaningful

    @script
    def loss(x: Tensor[(2, 4), F64], v: Tensor[(2, 3), F64]):
        h = kiln.op.tanh(x @ w.T)
        return kiln.op.sum(h * v + h * h)

    x, v = RNG.standard_normal((2, 4)), RNG.standard_normal((2, 3))
    g = kiln.grad(loss.function)
    value, (dx, dv) = kiln.interpret(kiln.IRModule.from_expr(g), x, v)
    h = np.tanh(x @ w.T)
    assert value == pytest.approx(np.sum(h * v + h * h))

    def f(x, v):
        return loss(x, v)

    np.testing.assert_allclose(dx, numerical_gradient(f, [x, v], 0, 1.0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dv, numerical_gradient(f, [x, v], 1, 1.0), rtol=1e-5, atol=1e-7)
    for mode in ("higher_order", "first_order"):
        check_grad(loss.module, [x, v], mode=mode)


def test_grad_through_a_loop_and_an_if():
    @script
    def unrolled(x: Tensor[(3,), F64], n: Tensor[(), I32]):
        h = x
        for _ in range(n):
            if kiln.op.sum(h) > 0.0:
                h = kiln.op.tanh(h * x + 0.5)
            else:
                h = h * h - x
        return h

    x = RNG.standard_normal(3)
    check_grad(unrolled.module, [x, np.int32(4)], wrt=[0])


# --- errors point at the Python source ------------------------------------------------------


def test_unannotated_parameter():
    @script
    def f(x: Tensor[(2,), F32], y):
        return x

    e = staging_error(f, ScriptError)
    assert (e.line, e.column) == where(f, "y):")
    assert "parameter 'y' of f has no type annotation" in e.message
    text = str(e)
    assert f"{__file__}:{e.line}:{e.column}" in text
    assert "def f(x: Tensor" in text and text.splitlines()[-1].strip().endswith("^")


@pytest.mark.parametrize("construct,marker", [
    ("lambda", "lambda v: v"),
    ("list comprehension", "[v for v in"),
    ("class", "class Box"),
    ("try", "try:"),
    ("with", "with open"),
    ("break", "break\n"),
])
def test_unsupported_constructs_point_at_their_line_and_column(construct, marker):
    @script
    def uses_lambda(x: Tensor[(2,), F32]):
        f = lambda v: v  # noqa: E731
        return f

    @script
    def uses_comprehension(x: Tensor[(2,), F32]):
        ys = [v for v in (x, x)]
        return ys

    @script
    def uses_class(x: Tensor[(2,), F32]):
        class Box:
            pass
        return x

    @script
    def uses_try(x: Tensor[(2,), F32]):
        try:
            y = x
        except ValueError:
            y = x
        return y

    @script
    def uses_with(x: Tensor[(2,), F32]):
        with open("f") as fh:
            y = fh
        return y

    @script
    def uses_break(x: Tensor[(2,), F32]):
        for _ in range(3):
            x = x + 1.0
            break
        return x

    sf = {"lambda": uses_lambda, "list comprehension": uses_comprehension, "class": uses_class,
          "try": uses_try, "with": uses_with, "break": uses_break}[construct]
    e = staging_error(sf, ScriptError)
    assert (e.line, e.column) == where(sf, marker)
    assert "not supported in a kiln script" in e.message


def test_shape_mismatch_found_by_type_inference_points_at_the_expression():
    @script
    def mismatch(x: Tensor[(2, 3), F32], w: Tensor[(4, 5), F32]):
        y = kiln.op.tanh(x)
        z = kiln.op.nn.dense(y, w)
        return z

    e = staging_error(mismatch, kiln.TypeCheckError)
    assert (e.line, e.column) == where(mismatch, "kiln.op.nn.dense(y, w)")
    assert "nn.dense" in e.message and "(2, 3)" in e.message and "(4, 5)" in e.message
    assert "z = kiln.op.nn.dense(y, w)" in str(e)


def test_matmul_shape_mismatch_names_both_operands():
    @script
    def mismatch(x: Tensor[(2, 3), F32], w: Tensor[(4, 5), F32]):
        return x @ w.T

    e = staging_error(mismatch, kiln.TypeCheckError)
    assert (e.line, e.column) == where(mismatch, "x @ w.T")
    assert "(2, 3)" in e.message and "(5, 4)" in e.message


def test_broadcast_mismatch_in_a_nested_expression():
    @script
    def mismatch(x: Tensor[(2, 3), F32], b: Tensor[(4,), F32]):
        return kiln.op.tanh(x * 2.0 + b)

    e = staging_error(mismatch, kiln.TypeCheckError)
    assert (e.line, e.column) == where(mismatch, "x * 2.0 + b")
    assert "add" in e.message and "(2, 3)" in e.message and "(4,)" in e.message


def test_type_error_inside_an_operator_call_in_a_loop():
    @script
    def grows(x: Tensor[(2,), F32]):
        for _ in range(3):
            x = kiln.op.concatenate((x, x), axis=0)
        return x

    e = staging_error(grows, kiln.TypeCheckError)
    assert (e.line, e.column) == where(grows, "x = kiln.op.concatenate")
    assert "loop-carried variable 'x'" in e.message and "Tensor[(4), float32]" in e.message


def test_branches_giving_different_types():
    @script
    def branches(x: Tensor[(2,), F32]):
        if kiln.op.sum(x) > 0.0:
            y = x
        else:
            y = kiln.op.sum(x)
        return y

    e = staging_error(branches, kiln.TypeCheckError)
    assert (e.line, e.column) == where(branches, "y = kiln.op.sum")
    assert "both branches must give it the same type" in e.message


@pytest.mark.parametrize("case", ["python call", "undefined", "one branch", "return in loop",
                                  "missing return", "tensor index", "recursion", "loop var",
                                  "tensor attribute", "bad attribute", "tensor condition"])
def test_more_errors(case):
    @script
    def python_call(x: Tensor[(2,), F32]):
        return np.tanh(x)

    @script
    def undefined(x: Tensor[(2,), F32]):
        return x + nowhere  # noqa: F821

    @script
    def one_branch(x: Tensor[(2,), F32]):
        if kiln.op.sum(x) > 0.0:
            y = x
        return y

    @script
    def return_in_loop(x: Tensor[(2,), F32]):
        for _ in range(3):
            return x
        return x

    @script
    def missing_return(x: Tensor[(2,), F32]):
        x = x + 1.0

    @script
    def tensor_index(x: Tensor[(2,), F32]):
        return x[0]

    @script
    def recursion(x: Tensor[(2,), F32]):
        return recursion(x)

    @script
    def loop_var(x: Tensor[(2,), F32]):
        for i in range(3):  # noqa: B007
            x = x + 1.0
        return i

    @script
    def tensor_attribute(x: Tensor[(2,), F32]):
        return x.sum()

    @script
    def bad_attribute(x: Tensor[(2,), F32]):
        return kiln.op.sum(x, axes=0)

    @script
    def tensor_condition(x: Tensor[(2,), F32]):
        if x > 0.0:
            x = -x
        return x

    cases = {
        "python call": (python_call, "np.tanh(x)", "cannot call the function tanh"),
        "undefined": (undefined, "nowhere", "name 'nowhere' is not defined"),
        "one branch": (one_branch, "y\n", "assigned in only one branch"),
        "return in loop": (return_in_loop, "return x\n        return", "return inside the for"),
        "missing return": (missing_return, "x = x + 1.0", "without returning a value"),
        "tensor index": (tensor_index, "x[0]", "only tuples can be indexed"),
        "recursion": (recursion, "recursion(x)", "recursion -> recursion"),
        "loop var": (loop_var, "i\n", "loop variable 'i' is not available"),
        "tensor attribute": (tensor_attribute, "x.sum", "no attribute 'sum'"),
        "bad attribute": (bad_attribute, "kiln.op.sum(x, axes", "did you mean 'axis'"),
        "tensor condition": (tensor_condition, "x > 0.0", "must be a bool scalar"),
    }
    sf, marker, message = cases[case]
    e = staging_error(sf)
    first_line = marker.split("\n")[0]
    line, col = where(sf, first_line if first_line != "y" and first_line != "i" else
                      "return " + first_line)
    if first_line in ("y", "i"):
        col += len("return ")
    assert (e.line, e.column) == (line, col), str(e)
    assert message in e.message


def test_script_of_something_else_is_an_error():
    with pytest.raises(kiln.Error, match="lambda"):
        _ = script(lambda x: x).function
    with pytest.raises(kiln.Error, match="annotation"):
        Tensor()


def test_printed_program_parses_back_equal():
    text = kiln.astext(piecewise.module)
    assert kiln.structural_equal(kiln.infer_types(kiln.parse(text)), piecewise.module)


MODULE = """\
from __future__ import annotations

import kiln
from kiln.frontend import Tensor, script


@script
def double(x: Tensor[("n",), "int32"]):
    return x * 2


class Holder:
    @staticmethod
    def inner():
        @script
        def bad(x: Tensor[(2,), "float32"]):
            y = x
            return y @ y
        return bad
"""


def test_script_in_a_module_with_postponed_annotations(tmp_path):
    path = tmp_path / "scripted_module.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("scripted_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scripted_module"] = module
    try:
        spec.loader.exec_module(module)
        np.testing.assert_array_equal(module.double(np.arange(3, dtype="int32")), [0, 2, 4])
        e = staging_error(module.Holder.inner(), kiln.TypeCheckError)
    finally:
        del sys.modules["scripted_module"]
    assert (e.line, e.column) == (18, 20)
    assert str(e).startswith(f"{path}:18:20: type error: @ multiplies matrices")
    assert "            return y @ y" in str(e)
