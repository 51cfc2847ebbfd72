"""Shapes as data on the VM: shape_of and dyn.* run on the host between kernels of symbolic
shape, which are compiled per shape met and kept in a bounded cache; checked against the
interpreter (the oracle) at several shapes, through save and load."""

import numpy as np
import pytest

import kiln
from kiln.runtime import build, load

from .helpers import assert_same, needs_native

pytestmark = needs_native

# A flatten-like reshape whose target is computed from the input's own shape, a broadcast to
# a computed shape, a slice with computed bounds: what an exporter with dynamic axes emits.
PROGRAM = """
def @main(%x: Tensor[(?, 4), float32], %w: Tensor[(2, 8), float32]) {
  %0 = shape_of(%x, dtype="int64");
  %1 = multiply(take(%0, 0), 2i64);
  %2 = concatenate((expand_dims(%1, axis=0), expand_dims(-1i64, axis=0)), axis=0);
  %3 = dyn.reshape(nn.relu(%x), %2);
  %4 = nn.dense(%3, transpose(%w));
  %10 = concatenate((expand_dims(take(%0, 0), axis=0), expand_dims(8i64, axis=0)), axis=0);
  %5 = dyn.strided_slice(%4, arange(0i64, 2i64, 1i64, dtype="int64"), %10,
                         arange(1i64, 3i64, 1i64, dtype="int64"));
  %6 = dyn.full(1.5f, shape_of(%5, dtype="int64"));
  (%3, tanh(%5) + %6)
}
"""


def inputs(n):
    r = np.random.default_rng(n)
    return (r.standard_normal((n, 4)).astype("float32"),
            r.standard_normal((2, 8)).astype("float32"))


@pytest.fixture(scope="module")
def exe():
    return build(kiln.parse(PROGRAM))


def test_the_program_runs_on_the_vm_with_host_steps(exe):
    assert exe.executor.name == "vm"
    text = str(exe.program)
    assert "host dyn.reshape" in text and "host shape_of" in text and "host dyn.full" in text


@pytest.mark.parametrize("n", [1, 3, 6])
def test_every_shape_agrees_with_the_interpreter(exe, n):
    mod = kiln.parse(PROGRAM)
    x, w = inputs(n)
    got, want = exe(x, w), kiln.interpret(mod, x, w)
    assert got[0].shape == (2 * n, 2) and got[1].shape == (n, 4)
    assert_same(got, want)


def test_static_shape_of_folds_away():
    exe = build(kiln.parse("""
        def @main(%x: Tensor[(3, 4), float32]) { dyn.reshape(%x, shape_of(%x)) }"""))
    assert "host shape_of" not in str(exe.program)
    assert exe.executor.name == "vm"  # dyn.reshape itself is data-dependent
    x = np.arange(12, dtype="float32").reshape(3, 4)
    assert_same(exe(x), x)


def test_a_bad_shape_at_run_time_is_an_error():
    exe = build(kiln.parse("""
        def @main(%x: Tensor[(?), float32], %s: Tensor[(2), int64]) { dyn.reshape(%x, %s) }"""))
    x = np.zeros(6, "float32")
    assert exe(x, np.array([3, 2])).shape == (3, 2)
    with pytest.raises(kiln.Error, match="cannot reshape"):
        exe(x, np.array([4, 2]))


def test_host_results_are_checked_against_the_allocation_limit(monkeypatch):
    exe = build(kiln.parse("""
        def @main(%s: Tensor[(2), int64]) { dyn.zeros(%s, dtype="float32") }"""))
    assert exe(np.array([2, 3])).shape == (2, 3)
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "1G")
    with pytest.raises(kiln.Error, match="more than the limit"):
        exe(np.array([1 << 30, 1 << 30]))


def test_specializations_are_kept_in_a_bounded_cache(monkeypatch):
    monkeypatch.setenv("KILN_MAX_SPECIALIZATIONS", "2")
    monkeypatch.setenv("KILN_SYMBOLIC_KERNELS", "0")  # every kernel compiled per shape
    exe = build(kiln.parse("def @main(%x: Tensor[(?, 3), float32]) { tanh(%x) * %x }"))
    vm = exe.executor.vm
    for n in (1, 2, 3, 4, 1):
        x = np.linspace(-1, 1, 3 * n, dtype="float32").reshape(n, 3)
        assert_same(exe(x), np.tanh(x) * x)
        assert len(vm._dynamic) <= 2
    assert exe.stats().specializations == 5  # 1 came back after it was evicted
    monkeypatch.setenv("KILN_MAX_SPECIALIZATIONS", "none")
    with pytest.raises(kiln.Error, match="KILN_MAX_SPECIALIZATIONS"):
        build(kiln.parse("def @main(%x: Tensor[(?), float32]) { tanh(%x) }"))


def test_kernels_compiled_per_shape_are_not_pushed_out_by_bound_symbolic_ones(monkeypatch):
    # a symbolic kernel seen at a shape (a BoundKernel) has no code of its own: a model whose
    # per-shape GEMMs sit among many symbolic kernels kept compiling a shape it had met
    # 4 shapes before, the bound ones having filled the 64 places
    monkeypatch.setenv("KILN_MAX_SPECIALIZATIONS", "2")
    exe = build(kiln.parse("def @main(%x: Tensor[(?, 3), float32]) { tanh(%x) * %x }"))
    for n in (1, 2, 3, 4, 1):
        x = np.linspace(-1, 1, 3 * n, dtype="float32").reshape(n, 3)
        assert_same(exe(x), np.tanh(x) * x)
    st = exe.stats()
    # one row is compiled for its shape (a size of 1 broadcasts), more bind the symbolic kernel
    assert (st.shape_compiles, st.symbolic_compiles) == (1, 1)
    assert st.specializations == 4  # the 1-row kernel outlived the three bound ones


def test_host_steps_survive_save_and_load(exe, tmp_path):
    exe.save(tmp_path / "d.kiln")
    exe.save(tmp_path / "o.kiln", key=bytes(32))
    x, w = inputs(5)
    for again in (load(tmp_path / "d.kiln"), load(tmp_path / "o.kiln")):
        assert_same(again(x, w), exe(x, w))


def test_gradients_flow_through_dyn_reshape():
    mod = kiln.parse("""
        def @main(%x: Tensor[(2, 3), float32], %s: Tensor[(1), int64]) {
          sum(tanh(dyn.reshape(%x, %s)))
        }""")
    mod = kiln.infer_types(mod)
    g = kiln.grad(mod["main"], mod=mod, wrt=(0,))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    _, (dx,) = kiln.interpret(kiln.IRModule.from_expr(g), x, np.array([6]))
    assert_same(dx, 1 - np.tanh(x) ** 2, rtol=1e-5)
