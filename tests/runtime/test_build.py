"""kiln.build and the Executable: what a caller passes in, what comes back, statistics."""

import threading

import numpy as np
import pytest

import kiln
from kiln.runtime import Executable, build

from .helpers import assert_same, needs_native

DENSE = """
def @main(%x: Tensor[(2, 5), float32], %w: Tensor[(3, 5), float32], %b: Tensor[(3), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w), %b, axis=-1));
  (%0, sum(%0, axis=[1]))
}
"""


@pytest.fixture(scope="module")
def dense_exe() -> Executable:
    return build(kiln.parse(DENSE), target="evaluator")


def args(seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((2, 5)).astype("float32"),
            r.standard_normal((3, 5)).astype("float32"),
            r.standard_normal(3).astype("float32"))


def test_build_runs_main_and_returns_tuples(dense_exe):
    out = dense_exe(*args())
    assert isinstance(out, tuple) and len(out) == 2
    assert_same(out, kiln.interpret(kiln.parse(DENSE), *args()))


def test_a_single_result_is_an_array():
    x = kiln.var("x", shape=(3,))
    exe = build(kiln.Function([x], kiln.op.exp(x)), target="evaluator")
    out = exe(np.zeros(3, "float32"))
    assert isinstance(out, np.ndarray) and out.flags.writeable
    np.testing.assert_array_equal(out, np.ones(3, "float32"))


def test_params_bind_weights_and_arguments_go_by_name(dense_exe):
    x, w, b = args()
    exe = build(kiln.parse(DENSE), target="evaluator", params={"w": w, "b": b})
    assert exe.signature.startswith("@main(%x: Tensor[(2, 5), float32])")
    assert_same(exe(x), dense_exe(x, w, b))
    assert_same(exe(x=x), dense_exe(x, w=w, b=b))
    assert exe.stats().constant_bytes == w.nbytes + b.nbytes


def test_wrong_dtype_names_the_parameter(dense_exe):
    x, w, b = args()
    with pytest.raises(kiln.Error, match=r"argument 1 \(%x\) of @main expects "
                       r"Tensor\[\(2, 5\), float32\], but got an array of dtype float64"):
        dense_exe(x.astype("float64"), w, b)


def test_wrong_shape_names_the_parameter_and_dimension(dense_exe):
    x, w, b = args()
    with pytest.raises(kiln.Error, match=r"argument 2 \(%w\) .* shape \(3, 4\) "
                       r"\(dimension 1 must be 5\)"):
        dense_exe(x, w[:, :4], b)
    with pytest.raises(kiln.Error, match=r"argument 3 \(%b\) .* shape \(\)"):
        dense_exe(x, w, np.float32(1))


def test_wrong_argument_count_and_names(dense_exe):
    x, w, b = args()
    with pytest.raises(kiln.Error, match="takes 3 argument"):
        dense_exe(x, w, b, b)
    with pytest.raises(kiln.Error, match="needs argument.*%b"):
        dense_exe(x, w)
    with pytest.raises(kiln.Error, match="no parameter named 'q'"):
        dense_exe(x, w, b=b, q=1)
    with pytest.raises(kiln.Error, match="both in order and by name"):
        dense_exe(x, w, b, x=x)
    with pytest.raises(kiln.Error, match="but got a str"):
        dense_exe("x", w, b)


def test_non_contiguous_and_foreign_arrays_are_copied_not_refused(dense_exe):
    x, w, b = args()
    want = dense_exe(x, w, b)
    wide = np.zeros((2, 10), "float32")
    wide[:, ::2] = x
    assert not wide[:, ::2].flags.c_contiguous
    assert_same(dense_exe(wide[:, ::2], w, b), want)
    assert_same(dense_exe(x, np.asfortranarray(w), b), want)
    assert_same(dense_exe(x, w.astype(">f4"), b), want)
    assert_same(dense_exe(x.tolist(), w, b), want)  # nested lists convert exactly


def test_python_scalars_convert_only_exactly():
    n = kiln.var("n", shape=(), dtype="int32")
    exe = build(kiln.Function([n], n + kiln.const(1)), target="evaluator")
    assert int(exe(41)) == 42
    with pytest.raises(kiln.Error, match="does not convert to int32 exactly"):
        exe(1.5)


def test_symbolic_dimensions_must_agree_across_arguments():
    text = """
    def @main(%a: Tensor[(n, 2), float32], %b: Tensor[(n, 2), float32]) { %a + %b }
    """
    exe = build(kiln.parse(text), target="evaluator")
    ones = np.ones((3, 2), "float32")
    np.testing.assert_array_equal(exe(ones, ones), 2 * ones)
    with pytest.raises(kiln.Error, match="dimension n is 3 in an earlier argument"):
        exe(ones, np.ones((4, 2), "float32"))


def test_adt_arguments_and_results():
    text = """
    type List[A] { Cons(A, List[A]), Nil, }
    def @main(%xs: List[int32]) -> List[int32] {
      match (%xs) { Cons(%h, %t) => Cons(%h + 1, %t), Nil => Nil }
    }
    """
    mod = kiln.infer_types(kiln.parse(text))
    cons, nil = mod.get_constructor("Cons"), mod.get_constructor("Nil")
    xs = kiln.ConstructorValue(cons, (np.int32(4), kiln.ConstructorValue(nil)))
    exe = build(mod, target="evaluator")
    out = exe(xs)
    assert isinstance(out, kiln.ConstructorValue) and out.name == "Cons"
    assert int(out.fields[0]) == 5 and out.fields[1].name == "Nil"
    with pytest.raises(kiln.Error, match="expects a value of type List\\[int32\\]"):
        exe(np.int32(3))


def test_constant_results_come_back_writable():
    exe = build(kiln.Function([], kiln.const(np.arange(3, dtype="float32"))),
                target="evaluator")
    out = exe()
    out[0] = 7.0  # the executable's own constant is untouched
    np.testing.assert_array_equal(exe(), np.arange(3, dtype="float32"))


def test_stats(dense_exe):
    s = dense_exe.stats()
    assert s.kernels == len(dense_exe.program.kernels) >= 1
    assert s.functions == 1 and s.executor == "vm" and s.backend == "evaluator"
    assert s.optimize_seconds > 0 and s.lower_seconds > 0 and s.load_seconds == 0
    assert "arena" in str(s) and "kernels" in str(s)
    assert repr(dense_exe).startswith("<kiln.Executable @main(")


def test_bad_build_requests_are_errors():
    mod = kiln.parse(DENSE)
    with pytest.raises(kiln.Error, match="unknown target 'cuda'"):
        build(mod, target="cuda")
    with pytest.raises(kiln.Error, match="opt_level must be"):
        build(mod, opt_level=9)
    with pytest.raises(kiln.Error, match="takes an IRModule"):
        build("not a module")
    with pytest.raises(kiln.Error, match="no parameter named 'nope'"):
        build(mod, params={"nope": np.zeros(1)})
    with pytest.raises(kiln.Error, match="unknown executor"):
        build(mod, target="evaluator", executor="gpu")


def test_an_executor_can_claim_programs_first():
    from kiln.runtime.executor import VMExecutor, register_executor, unregister_executor

    seen = []

    class Native:
        name = "test-native"

        def __init__(self, program, kernels, specialize):
            self.inner = VMExecutor(program, kernels, specialize)

        def run(self, values):
            seen.append(len(values))
            return self.inner.run(values)

    def factory(program, kernels, specialize):
        return Native(program, kernels, specialize) if len(program.functions) == 1 else None

    register_executor("test-native", factory, priority=100)
    try:
        exe = build(kiln.parse(DENSE), target="evaluator")
        assert exe.stats().executor == "test-native"
        exe(*args())
        assert seen == [3]
        recursive = build(kiln.parse("""
            def @f(%n: int32) -> int32 { if (%n == 0) { 0 } else { @f(%n - 1) } }
            def @main(%n: int32) { @f(%n) }"""), target="evaluator")
        assert recursive.stats().executor == "vm"  # declined: the VM runs it
    finally:
        unregister_executor("test-native")


@needs_native
def test_four_python_threads_at_once():
    r = np.random.default_rng(3)
    x = kiln.var("x", shape=(8, 32))
    w = kiln.const((r.standard_normal((32, 32)) * 0.2).astype("float32"))
    h = x
    for _ in range(4):
        h = kiln.op.tanh(kiln.op.nn.dense(h, w))
    exe = build(kiln.Function([x], h))
    inputs = [r.standard_normal((8, 32)).astype("float32") for _ in range(4)]
    want = [exe(a) for a in inputs]
    errors, results = [], {}

    def work(i):
        try:
            for _ in range(50):
                results[i] = exe(inputs[i])
                np.testing.assert_array_equal(results[i], want[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
