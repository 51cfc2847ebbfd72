"""The back end as named passes: the pass manager's instruments, disabled passes and debug
checks apply to every step from the fused module to compiled kernels."""

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.ir.attrs import Attrs
from kiln.runtime.backend import (
    BACKEND_PIPELINE,
    KERNEL_PIPELINE,
    Lowered,
    backend_pipeline,
    pipeline_steps,
)
from kiln.ssa.ir import Instr
from kiln.transform import DumpIR, PassContext, PassInstrument, PassTimingInstrument, Sequential
from kiln.transform.pass_manager import get_pass, list_passes, module_pass

from .helpers import assert_same

PROGRAMS = Path(__file__).parent.parent / "programs"

WEIGHTS = [np.random.default_rng(k).standard_normal((6, 6)).astype("float32") for k in range(3)]


def mlp():
    """Three dense layers of equal shapes and different weights, bound as constants."""
    x = kiln.var("x", shape=(2, 6))
    h = x
    for w in WEIGHTS:
        h = kiln.op.nn.relu(kiln.op.nn.dense(h, kiln.const(w)))
    return kiln.IRModule.from_expr(kiln.Function([x], h))


def mlp_numpy(x):
    for w in WEIGHTS:
        x = np.maximum(x @ w.T, 0)
    return x


class Recorder(PassInstrument):
    def __init__(self):
        self.names = []

    def run_after_pass(self, mod, info):
        self.names.append(info.name)


def test_every_back_end_pass_is_registered_with_its_level():
    infos = {i.name: i for i in list_passes()}
    for name in ("lower-to-ssa", "lift-constants", "plan-memory", "lower-kernels", "compile"):
        assert infos[name].level >= 2, name
    assert infos["fold-constant"].level == 1
    steps = [name for name, _, _ in pipeline_steps()]
    assert steps[-len(BACKEND_PIPELINE) + 1:] == list(BACKEND_PIPELINE[1:])
    assert steps.index("fuse-ops") < steps.index("lower-to-ssa")


def test_build_runs_the_back_end_under_the_context():
    rec, timing = Recorder(), PassTimingInstrument()
    with PassContext(instruments=[rec, timing]):
        exe = kiln.build(mlp())
    for name in BACKEND_PIPELINE[1:]:
        assert name in rec.names
    assert {"lower-kernels", "compile"} <= {n for n, _ in timing.times}
    x = np.random.default_rng(1).standard_normal((2, 6)).astype("float32")
    np.testing.assert_allclose(exe(x), mlp_numpy(x), rtol=1e-5, atol=1e-5)


def primitive_layers():
    """Three primitive functions that differ only in the weights they hold inside."""
    x = kiln.var("x", shape=(2, 6))
    h = x
    for w in WEIGHTS:
        p = kiln.var("p", shape=(2, 6))
        fn = kiln.Function([p], kiln.op.nn.relu(kiln.op.nn.dense(p, kiln.const(w))),
                           attrs=Attrs(Primitive=1))
        h = kiln.Call(fn, [h])
    return kiln.infer_types(kiln.IRModule.from_expr(kiln.Function([x], h)))


def test_lift_constants_merges_kernels_that_differ_only_in_weights():
    low = backend_pipeline().passes[1](primitive_layers())  # lower-to-ssa: weights inside
    assert len(low.program.kernels) == 3 and not low.program.constants
    after = get_pass("lift-constants")(low)
    assert len(after.program.kernels) == 1 and len(after.program.constants) == 3
    (decl,) = after.program.kernels.values()
    assert [tuple(t.shape) for t in decl.inputs] == [(2, 6), (6, 6)]
    consts = [i for i in after.program.main.instructions() if i.op == "const"]
    assert len(consts) == 3
    # the input is left as it was
    assert len(low.program.kernels) == 3 and not low.program.constants
    x = np.random.default_rng(3).standard_normal((2, 6)).astype("float32")
    exe = kiln.build(primitive_layers(), opt_level=0)
    np.testing.assert_allclose(exe(x), mlp_numpy(x), rtol=1e-5, atol=1e-5)
    assert exe.stats().kernels == 1


def test_dump_after_a_back_end_pass_prints_ssa_and_loop_ir():
    out = io.StringIO()
    with PassContext(instruments=[DumpIR(after=["plan-memory", "lower-kernels"], out=out)]):
        kiln.build(mlp(), target="evaluator")
    text = out.getvalue()
    assert "// ---- IR after plan-memory ----" in text
    assert "@arena+" in text and "func @main" in text
    after_lowering = text.split("// ---- IR after lower-kernels ----")[1]
    assert "kernel fused_nn_dense_nn_relu(" in after_lowering and "for " in after_lowering


def test_passes_leave_their_input_unchanged():
    low = Sequential(backend_pipeline().passes[:3])(kiln.optimize(mlp()))
    planned = get_pass("plan-memory")(low)
    allocs = [i for i in low.program.main.instructions() if i.op == "alloc"]
    assert allocs and all(i.attrs["offset"] is None for i in allocs)
    assert any(i.attrs["offset"] is not None
               for i in planned.program.main.instructions() if i.op == "alloc")
    lowered = get_pass("lower-kernels")(planned)
    assert all(d.kernel is None and d.func is not None for d in planned.program.kernels.values())
    assert all(d.kernel is not None and d.func is None for d in lowered.program.kernels.values())


def test_debug_mode_verifies_after_each_back_end_pass():
    @module_pass("test-break-ssa", level=2)
    def breaker(low, ctx):
        """Use a value before its definition (a bug the SSA verifier catches)."""
        program = low.program.copy()
        entry = program.main.entry
        bogus = Instr("tuple", [entry.instrs[-1]])
        bogus.block = entry
        entry.instrs.insert(0, bogus)
        return replace(low, program=program)

    low = Sequential(backend_pipeline().passes[:3])(kiln.optimize(mlp()))
    breaker()(low)  # without debug nothing checks
    with PassContext(debug=True), pytest.raises(kiln.InternalError, match="test-break-ssa"):
        breaker()(low)


def test_disabling_a_needed_back_end_pass_is_a_clear_error():
    with PassContext(disabled_pass=["compile"]), pytest.raises(kiln.Error, match="compile"):
        kiln.build(mlp())
    with PassContext(disabled_pass=["lower-to-ssa"]), pytest.raises(kiln.Error,
                                                                    match="lower-to-ssa"):
        kiln.build(mlp())


def test_passes_of_the_wrong_level_say_where_they_belong():
    low = backend_pipeline().passes[1](kiln.optimize(mlp()))
    with pytest.raises(kiln.Error, match="before lower-to-ssa"):
        get_pass("fold-constant")(low)
    with pytest.raises(kiln.Error, match="after lower-to-ssa"):
        get_pass("plan-memory")(kiln.optimize(mlp()))


def test_higher_order_programs_go_through_to_first_order():
    mod = kiln.parse((PROGRAMS / "closures.rly").read_text())
    rec = Recorder()
    with PassContext(instruments=[rec]):
        exe = kiln.build(mod, target="evaluator")
    assert "lambda-lift" in rec.names and "lower-to-ssa" in rec.names
    first_order = Recorder()
    with PassContext(instruments=[first_order]):
        kiln.build(mlp(), target="evaluator")
    assert "lambda-lift" not in first_order.names
    assert isinstance(exe, kiln.Executable)


def test_symbolic_shapes_are_specialized_by_the_same_passes(monkeypatch):
    mod = kiln.parse("""
    def @main(%x: Tensor[(n, 3), float32]) { nn.relu(exp(%x)) }
    """)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype("float32")
    monkeypatch.setenv("KILN_SYMBOLIC_KERNELS", "0")  # compiled for the one shape
    exe = kiln.build(mod)
    rec = Recorder()
    with PassContext(instruments=[rec]):
        y = exe(x)
    assert rec.names == list(KERNEL_PIPELINE)
    assert rec.names == ["lower-kernels", "decompose-math", "compile"]
    assert_same(y, kiln.interpret(mod, x), rtol=1e-5)
    assert exe.stats().specializations == 1 and exe.stats().shape_compiles == 1
    # compiled for every size: lowered at two stand-in sizes, compared, compiled once
    monkeypatch.delenv("KILN_SYMBOLIC_KERNELS")
    exe = kiln.build(mod)
    rec = Recorder()
    with PassContext(instruments=[rec]):
        y = exe(x)
    assert rec.names == ["lower-kernels", "decompose-math"] * 2 + ["compile"]
    assert_same(y, kiln.interpret(mod, x), rtol=1e-5)
    assert exe.stats().symbolic_compiles == 1 and exe.stats().shape_compiles == 0


def test_lowered_prints_itself():
    low = Sequential(backend_pipeline(target="evaluator").passes)(kiln.optimize(mlp()))
    assert isinstance(low, Lowered) and low.kernels is not None
    text = low.text()
    assert "kernels compiled (evaluator" in text
