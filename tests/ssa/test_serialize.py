"""The SSA program and loop-IR kernels as data and back; damaged documents are kiln.Errors."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime.kernel_format import read_kernel, write_kernel
from kiln.ssa import lower_kernels, lower_module, plan_memory, problems
from kiln.ssa.kernels import loop_kernels
from kiln.ssa.printer import program_text
from kiln.ssa.serialize import (
    parse_relay_function,
    read_program,
    relay_function_text,
    write_program,
)

PROGRAMS = Path(__file__).parent.parent / "programs"


def roundtrip(prog):
    doc = json.loads(json.dumps(write_program(prog, relay_function_text)))
    return read_program(doc, list(prog.constants), parse_relay_function)


@pytest.mark.parametrize("name", ["closures.rly", "cnn.rly"])
def test_programs_read_back_to_the_same_text(name):
    prog = lower_module(kiln.optimize(kiln.parse((PROGRAMS / name).read_text())))
    plan_memory(prog)
    again = roundtrip(prog)
    assert problems(again) == []
    assert program_text(again) == program_text(prog)


def test_adts_and_dynamic_kernels_read_back():
    text = """
    type List[A] { Cons(A, List[A]), Nil, }
    def @main(%x: Tensor[(n, 2), float32]) { Cons(nn.relu(%x), Nil) }
    """
    prog = lower_module(kiln.optimize(kiln.parse(text)))
    again = roundtrip(prog)
    assert program_text(again) == program_text(prog)
    (decl,) = again.kernels.values()
    assert decl.func is not None and not decl.is_static
    assert again.constructors["Cons"].belong_to.name == "List"


def test_kernels_read_back_to_the_same_loop_ir():
    prog = lower_module(kiln.optimize(kiln.parse((PROGRAMS / "cnn.rly").read_text())))
    for k in loop_kernels(lower_kernels(prog)):
        again = read_kernel(json.loads(json.dumps(write_kernel(k))))
        assert str(again) == str(k)
        assert [b.shape for b in again.params] == [b.shape for b in k.params]


def test_kernel_fingerprints_survive_the_round_trip():
    cache = pytest.importorskip("kiln.codegen.cache")
    prog = lower_module(kiln.optimize(kiln.parse((PROGRAMS / "cnn.rly").read_text())))
    for k in loop_kernels(lower_kernels(prog)):
        again = read_kernel(json.loads(json.dumps(write_kernel(k))))
        assert cache.fingerprint(again) == cache.fingerprint(k)


def test_a_parallel_loops_chunks_read_back_and_bad_ones_are_refused():
    from kiln.loops.ir import Buffer, Const, For, Kernel, Load, Store, Var

    src, dst = Buffer("src", (64,), "float32"), Buffer("dst", (64,), "float32")
    i = Var("i")
    body = For(i, Const(0), Const(64), Store(dst, (i,), Load(src, (i,))), "parallel", 16)
    kernel = Kernel("copy", (src,), (dst,), body)
    doc = json.loads(json.dumps(write_kernel(kernel)))
    again = read_kernel(doc)
    assert again.body.chunks == 16 and str(again) == str(kernel) and "16 a thread" in str(kernel)
    # a loop at the default chunks is written as before they existed
    plain = write_kernel(Kernel("copy", (src,), (dst,), For(i, Const(0), Const(64), Store(
        dst, (i,), Load(src, (i,))), "parallel")))
    assert all(len(n) == 6 for n in plain["nodes"] if n[0] == "For")
    for bad in (0, 65, -1, 2.0, "4", None):
        broken = copy.deepcopy(doc)
        loop = next(n for n in broken["nodes"] if n[0] == "For")
        loop[6] = bad
        with pytest.raises(kiln.Error, match="chunks"):
            read_kernel(broken)


def _mutations(doc, rng, count):
    """Documents like ``doc`` with one value somewhere replaced by something wrong."""
    paths = []
    stack = [((), doc)]
    while stack:
        path, v = stack.pop()
        paths.append(path)
        if isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((path + (i,), x) for i, x in enumerate(v))
    junk = [None, -1, 10**9, "x", [], {}, 1.5, True, [0, 0, 0]]
    for _ in range(count):
        path = paths[int(rng.integers(len(paths)))]
        if not path:
            continue
        bad = copy.deepcopy(doc)
        at = bad
        for key in path[:-1]:
            at = at[key]
        if rng.random() < 0.2 and isinstance(at, dict):
            del at[path[-1]]
        else:
            at[path[-1]] = junk[int(rng.integers(len(junk)))]
        yield bad


def test_damaged_program_documents_are_errors_never_crashes():
    prog = lower_module(kiln.optimize(kiln.parse((PROGRAMS / "closures.rly").read_text())))
    plan_memory(prog)
    doc = json.loads(json.dumps(write_program(prog)))
    rng = np.random.default_rng(0)
    for bad in _mutations(doc, rng, 300):
        try:
            got = read_program(bad, list(prog.constants))
        except kiln.Error:
            continue
        problems(got)  # a document that reads must at least be checkable


def test_damaged_kernel_documents_are_errors_never_crashes():
    prog = lower_module(kiln.optimize(kiln.parse((PROGRAMS / "cnn.rly").read_text())))
    kernels = loop_kernels(lower_kernels(prog))
    rng = np.random.default_rng(1)
    doc = json.loads(json.dumps(write_kernel(kernels[0])))
    for bad in _mutations(doc, rng, 300):
        try:
            read_kernel(bad)
        except kiln.Error:
            pass


def test_views_read_back_and_a_damaged_one_is_a_problem():
    from tests.ssa.test_memory import reshapes_between_products

    mod, _ = reshapes_between_products()
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    again = roundtrip(prog)
    assert problems(again) == [] and program_text(again) == program_text(prog)
    assert "view" in program_text(again)
    doc = json.loads(json.dumps(write_program(prog)))
    main = next(f for f in doc["functions"] if f["name"] == "main")
    for block in main["blocks"]:
        for ins in block["instrs"]:
            if ins[0] == "view":
                ins[3] = {"kernel": "no_such_kernel"}
    found = problems(read_program(doc, list(prog.constants)))
    assert any("no kernel @no_such_kernel" in p for p in found), found
