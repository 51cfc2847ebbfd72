"""The pass manager: levels, disabling, requirements, instruments, debug type checks."""

import io

import pytest

import kiln
from kiln.transform import (
    DumpIR,
    PassContext,
    PassInstrument,
    PassTimingInstrument,
    Sequential,
    get_pass,
    list_passes,
    module_pass,
)
from kiln.transform.pass_manager import FunctionPass, PassInfo


def _mod():
    x = kiln.var("x", shape=(2,))
    return kiln.IRModule.from_expr(kiln.Function([x], kiln.op.add(x, x)))


calls: list[str] = []


@module_pass("test-level-one", opt_level=1)
def LevelOne(mod, ctx):
    calls.append("test-level-one")
    return mod


@module_pass("test-level-three", opt_level=3, required=["test-level-one"])
def LevelThree(mod, ctx):
    calls.append("test-level-three")
    return mod


@module_pass("test-break-types", opt_level=0)
def BreakTypes(mod, ctx):
    """Replace @main's body by an ill-typed call (a deliberately buggy pass)."""
    fn = mod["main"]
    bad = kiln.op.add(fn.params[0], kiln.const(1))  # float32 + int32
    return mod.with_function("main", kiln.Function(fn.params, bad))


def test_sequential_respects_opt_level_and_disabled_passes():
    calls.clear()
    seq = Sequential([LevelOne(), LevelThree()])
    with PassContext(opt_level=2):
        seq(_mod())
    assert calls == ["test-level-one"]
    calls.clear()
    with PassContext(opt_level=3, disabled_pass=["test-level-one"]):
        seq(_mod())
    assert calls == ["test-level-three"]
    calls.clear()
    with PassContext(opt_level=0, required_pass=["test-level-three"]):
        seq(_mod())
    assert calls == ["test-level-three"]


def test_required_passes_run_first():
    calls.clear()
    with PassContext(opt_level=3):
        Sequential([LevelThree()])(_mod())
    assert calls == ["test-level-one", "test-level-three"]


def test_unknown_pass_names_are_errors():
    with pytest.raises(kiln.Error, match="unknown pass 'fold-constnat'"):
        PassContext(disabled_pass=["fold-constnat"])
    with pytest.raises(kiln.Error, match="unknown pass"):
        get_pass("no-such-pass")


def test_timing_and_dump_instruments():
    timing = PassTimingInstrument()
    out = io.StringIO()
    dump = DumpIR(before=["infer-type"], after=["infer-type"], out=out)
    with PassContext(instruments=[timing, dump]):
        Sequential([get_pass("infer-type")])(_mod())
    assert [name for name, _ in timing.times] == ["infer-type", "sequential"]
    assert "infer-type" in timing.render()
    text = out.getvalue()
    assert "// ---- IR before infer-type ----" in text and "add(%x, %x)" in text
    assert "// ---- IR after infer-type ----" in text


def test_instruments_can_skip_passes():
    class SkipAll(PassInstrument):
        def should_run(self, mod, info):
            return info.name != "test-level-one"

    calls.clear()
    with PassContext(opt_level=3, instruments=[SkipAll()]):
        LevelOne()(_mod())
    assert calls == []


def test_debug_mode_reports_an_ill_typed_result_as_a_bug_in_the_pass():
    BreakTypes()(_mod())  # without debug, nothing checks
    with PassContext(debug=True):
        with pytest.raises(kiln.InternalError, match="pass test-break-types produced an ill-typed"):
            BreakTypes()(_mod())


def test_function_pass_skips_primitive_functions():
    seen = []

    def visit(fn, mod, ctx):
        seen.append(fn)
        return fn

    x = kiln.var("x", shape=(2,))
    prim = kiln.Function([x], x, attrs={"Primitive": 1})
    mod = kiln.IRModule({"main": _mod()["main"], "kernel": prim})
    FunctionPass(PassInfo("visit"), visit)(mod)
    assert len(seen) == 1 and seen[0] is mod["main"]


def test_passes_are_listed_by_kebab_case_name():
    names = [info.name for info in list_passes()]
    assert "infer-type" in names
    assert all(n == n.lower() and " " not in n and "_" not in n for n in names)
