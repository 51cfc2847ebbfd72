"""The memory planner: buffers reused when their lifetimes do not overlap, results unchanged."""

import numpy as np
import pytest

import kiln
from kiln.runtime import build
from kiln.ssa import Liveness, lower_module, plan_memory
from kiln.ssa.memory import ALIGN, tensor_bytes
from kiln.testing.models import resnet18
from kiln.testing.programs import random_program


def mlp_chain(layers: int, width: int = 16):
    x = kiln.var("x", shape=(1, width))
    h = x
    rng = np.random.default_rng(0)
    for _ in range(layers):
        w = kiln.const((rng.standard_normal((width, width)) * 0.3).astype("float32"))
        h = kiln.op.nn.relu(kiln.op.nn.dense(h, w))
    return kiln.IRModule.from_expr(kiln.Function([x], h))


def holds(v, planned):
    """The planned allocs a value may be: itself, or through tuples and projections."""
    if v in planned:
        return {v}
    out = set()
    if getattr(v, "op", None) in ("tuple", "get_field", "view"):
        for o in v.operands:
            out |= holds(o, planned)
    return out


def assert_no_live_overlap(prog):
    """No two planned tensors live at one point share a byte (checked point by point)."""
    for fn in prog.functions.values():
        live = Liveness(fn)
        planned = {i for i in fn.instructions()
                   if i.op == "alloc" and i.attrs["offset"] is not None}
        for b in fn.blocks:
            for _, values in live.points(b):
                here = set()
                for v in values:
                    here |= holds(v, planned)
                spans = sorted((a.attrs["offset"], a.attrs["offset"] + tensor_bytes(a.type))
                               for a in here)
                for (_, e0), (s1, _) in zip(spans, spans[1:]):
                    assert e0 <= s1, f"@{fn.name}: live tensors overlap in the arena"
        for a in planned:
            assert a.attrs["offset"] % ALIGN == 0
            assert a.attrs["offset"] + tensor_bytes(a.type) <= fn.arena_bytes


def test_a_chain_of_kernels_reuses_two_buffers():
    mod = mlp_chain(6)
    prog = lower_module(kiln.optimize(mod))
    plan = plan_memory(prog)
    size = 16 * 4
    # Five intermediates (the sixth is the result, which leaves the frame): two suffice.
    assert plan.intermediate_bytes == 5 * size
    assert plan.arena_bytes == 2 * max(size, ALIGN)
    assert plan.functions["main"].heap == 1
    assert_no_live_overlap(prog)
    exe = build(mod, target="evaluator")
    x = np.random.default_rng(1).standard_normal((1, 16)).astype("float32")
    np.testing.assert_allclose(exe(x), kiln.interpret(mod, x), rtol=1e-5, atol=1e-6)
    assert exe.stats().arena_bytes == plan.arena_bytes


def test_results_and_values_that_leave_the_frame_get_their_own_memory():
    text = """
    type Box[A] { Box(A), }
    def @keep(%x: Tensor[(4), float32]) -> Tensor[(4), float32] { %x }
    def @main(%x: Tensor[(4), float32]) {
      %0 = exp(%x);
      %1 = nn.relu(%0);
      (Box(negative(%1)), @keep(tanh(%1)), sum(%1))
    }"""
    mod = kiln.parse(text)
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    allocs = [i for i in prog.main.instructions() if i.op == "alloc"]
    heap = [a for a in allocs if a.attrs["offset"] is None]
    # negative (in the ADT), tanh (passed to a call) and sum (returned) escape.
    assert len(heap) == 3
    assert_no_live_overlap(prog)
    exe = build(mod, target="evaluator")
    x = np.array([0.5, -1.0, 2.0, 0.0], "float32")
    box, kept, total = exe(x)
    rbox, rkept, rtotal = kiln.interpret(mod, x)
    np.testing.assert_allclose(box.fields[0], rbox.fields[0], rtol=1e-6)
    np.testing.assert_allclose(kept, rkept, rtol=1e-6)
    np.testing.assert_allclose(total, rtotal, rtol=1e-6)


def test_values_carried_around_a_loop_are_not_overwritten():
    text = """
    def @iter(%i: int32, %x: Tensor[(3), float32]) -> Tensor[(3), float32] {
      if (%i == 0) { %x } else { @iter(%i - 1, tanh(%x) + %x) }
    }
    def @main(%x: Tensor[(3), float32]) { @iter(4, %x) }
    """
    mod = kiln.parse(text)
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    loop = prog.functions["iter"]
    carried = [a for a in loop.instructions() if a.op == "alloc" and a.type.shape == (3,)]
    assert carried and all(a.attrs["offset"] is None for a in carried)
    assert_no_live_overlap(prog)
    exe = build(mod, target="evaluator")
    x = np.array([0.1, -0.4, 1.0], "float32")
    np.testing.assert_allclose(exe(x), kiln.interpret(mod, x), rtol=1e-6)


def test_a_kernel_never_writes_over_its_own_inputs():
    # relu(dense(x)) then a reduction over it then an elementwise op of both: every kernel's
    # inputs are live while it writes its output.
    text = """
    def @main(%x: Tensor[(2, 8), float32], %w: Tensor[(8, 8), float32]) {
      %0 = nn.relu(nn.dense(%x, %w));
      %1 = sum(%0, axis=[1], keepdims=True);
      %2 = nn.dense(%0 - %1, %w);
      %3 = max(%2, axis=[1], keepdims=True);
      exp(%2 - %3)
    }"""
    mod = kiln.parse(text)
    prog = lower_module(kiln.optimize(mod))
    plan = plan_memory(prog)
    assert plan.arena_bytes < plan.intermediate_bytes + ALIGN * 4
    assert_no_live_overlap(prog)
    r = np.random.default_rng(2)
    args = (r.standard_normal((2, 8)).astype("float32"),
            (r.standard_normal((8, 8)) * 0.3).astype("float32"))
    exe = build(mod, target="evaluator")
    np.testing.assert_allclose(exe(*args), kiln.interpret(mod, *args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_never_overlap_live_tensors(seed):
    mod, _ = random_program(seed, steps=16)
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    assert_no_live_overlap(prog)


def test_resnet18_arena_is_far_smaller_than_its_intermediates():
    mod, params = resnet18(image=64, classes=10)
    prog = lower_module(kiln.optimize(mod, params=params))
    plan = plan_memory(prog)
    assert plan.arena_bytes < 0.5 * plan.intermediate_bytes
    assert_no_live_overlap(prog)


# --- views: a kernel that only reshapes is the same memory under another shape -------------


def reshapes_between_products():
    """Products whose inputs and outputs are reshaped (reshapes no kernel fuses: a product
    neither takes injective producers nor gives its result to them), the last returned.
    Each of h1 and g is read only through its view after g is made: were the views not
    keeping their tensors' memory, g could take h1's place."""
    rng = np.random.default_rng(3)
    x = kiln.var("x", shape=(4, 64))
    ws = [kiln.const((rng.standard_normal(s) * 0.2).astype("float32"))
          for s in ((64, 64), (64, 64), (64, 64))]
    h1 = kiln.op.nn.relu(kiln.op.nn.dense(x, ws[0]))  # (4, 64)
    g = kiln.op.nn.relu(kiln.op.nn.dense(x, ws[1]))
    h2 = kiln.op.nn.batch_matmul(kiln.op.reshape(h1, newshape=(1, 16, 16)),
                                 kiln.op.reshape(g, newshape=(1, 16, 16)))
    h3 = kiln.op.nn.dense(kiln.op.reshape(h2, newshape=(4, 64)), ws[2])  # a view of h2
    body = kiln.Tuple([h3, kiln.op.reshape(h3, newshape=(256,))])  # this one leaves
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))

    def reference(a):
        r1 = np.maximum(a @ ws[0].data.T, 0).reshape(16, 16)
        r2 = np.maximum(a @ ws[1].data.T, 0).reshape(16, 16)
        r3 = (r1 @ r2.T).reshape(4, 64) @ ws[2].data.T
        return r3, r3.reshape(256)

    return mod, reference


def test_reshapes_are_views_unless_they_leave_the_frame():
    mod, _ = reshapes_between_products()
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    fn = prog.functions["main"]
    views = [i for i in fn.instructions() if i.op == "view"]
    copies = [i for i in fn.instructions() if i.op == "kernel"
              and prog.kernels[i.attrs["kernel"]].ops == ("reshape",)]
    assert len(views) == 3 and len(copies) == 1  # the returned reshape is a copy
    assert all("kernel" not in v.attrs for v in views)  # their kernels are dropped
    assert sum(d.ops == ("reshape",) for d in prog.kernels.values()) == 1
    assert_no_live_overlap(prog)  # a view keeps its tensor's memory from reuse
    assert kiln.ssa.problems(prog) == []


@pytest.mark.parametrize("executor", [None, "vm"])
def test_views_compute_what_the_copies_did(executor):
    mod, reference = reshapes_between_products()
    a = np.random.default_rng(4).standard_normal((4, 64)).astype("float32")
    got = kiln.build(mod, executor=executor)(a)
    for g, w in zip(got, reference(a)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_view_of_another_size_or_dtype_is_a_verifier_problem():
    from kiln.ir.ty import TensorType

    mod, _ = reshapes_between_products()
    prog = lower_module(kiln.optimize(mod))
    plan_memory(prog)
    view = next(i for i in prog.functions["main"].instructions() if i.op == "view")
    for wrong in (TensorType((15, 16), "float32"), TensorType((16, 16), "int32")):
        view.type = wrong
        found = kiln.ssa.problems(prog)
        assert any("view" in p and "as many elements" in p for p in found), found
