"""The whole-program native executor against the reference interpreter.

Static programs (branches, loops by tail recursion, tuples, calls between functions, whole
models) must run natively — one entry point, no Python between kernels — and agree with
`kiln.interpret`; everything else must fall back to the VM. Also: inputs checked at the
boundary, kernel failures as `kiln.EvalError`, and saving and loading in a fresh process.
"""

import hashlib
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.ir.expr import Function, const, tuple_, var
from kiln.ir.module import IRModule
from kiln.ir.ty import tensor_type
from kiln.runtime.compiler import KernelSet
from kiln.runtime.native import make_native_executor
from kiln.testing.models import mlp, resnet18

from .helpers import PROGRAMS, assert_same, needs_native

pytestmark = needs_native

LOOP = """
def @loop(%i: int32, %acc: Tensor[(4), float32]) -> Tensor[(4), float32] {
  if (%i == 0) { %acc } else { @loop(%i - 1, nn.relu(%acc * 0.5f) + 1f) }
}
def @main(%x: Tensor[(4), float32], %n: int32) -> (Tensor[(4), float32], Tensor[(4), float32]) {
  let %y = @loop(%n, %x);
  (%y, exp(%y))
}
"""


def native(text_or_mod, **kw) -> kiln.Executable:
    mod = kiln.parse(text_or_mod) if isinstance(text_or_mod, str) else text_or_mod
    exe = kiln.build(mod, **kw)
    assert exe.stats().executor == "native", "the native executor should run this program"
    return exe


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_branches_on_a_scalar():
    text = """
    def @main(%x: Tensor[(3, 5), float32], %c: bool) -> Tensor[(3, 5), float32] {
      if (%c) { nn.relu(%x) * 2f } else { tanh(%x) - %x }
    }
    """
    exe = native(text)
    mod = kiln.parse(text)
    x = rand(3, 5)
    for c in (True, False):
        assert_same(exe(x, np.bool_(c)), kiln.interpret(mod, x, np.bool_(c)))


@pytest.mark.parametrize("n", [0, 1, 7, 200])
def test_tail_recursion_is_a_native_loop(n):
    mod = kiln.parse(LOOP)
    exe = native(mod)
    x = rand(4)
    assert_same(exe(x, np.int32(n)), kiln.interpret(mod, x, np.int32(n)))


def test_loop_arguments_that_swap_places():
    # Each iteration passes the loop's own parameters back in another order: the copies
    # into the parameter slots must not overwrite one another (Fibonacci on tensors).
    text = """
    def @fib(%i: int32, %a: Tensor[(2, 3), float32], %b: Tensor[(2, 3), float32])
        -> (Tensor[(2, 3), float32], Tensor[(2, 3), float32]) {
      if (%i == 0) { (%a, %b) } else { @fib(%i - 1, %b, %a + %b) }
    }
    def @main(%a: Tensor[(2, 3), float32], %b: Tensor[(2, 3), float32], %n: int32) {
      @fib(%n, %a, %b)
    }
    """
    mod = kiln.parse(text)
    exe = native(mod)
    a, b = rand(2, 3, seed=1), rand(2, 3, seed=2)
    for n in (0, 1, 2, 9):
        assert_same(exe(a, b, np.int32(n)), kiln.interpret(mod, a, b, np.int32(n)))


def test_tuples_in_and_out_and_several_functions():
    text = """
    def @scale(%p: (Tensor[(4), float32], Tensor[(4), float32]), %k: float32)
        -> (Tensor[(4), float32], (Tensor[(4), float32], float32)) {
      (%p.0 * %k, (%p.1 + %k, %k))
    }
    def @norm(%x: Tensor[(4), float32]) -> Tensor[(4), float32] {
      %x / (sum(%x * %x) + 1f)
    }
    def @main(%p: (Tensor[(4), float32], Tensor[(4), float32]), %k: float32) {
      let %s = @scale(%p, %k);
      let %t = @scale((@norm(%s.0), %s.1.0), %s.1.1 * 2f);
      (@norm(%t.0), %t, %p.0)
    }
    """
    mod = kiln.parse(text)
    exe = native(mod)
    p = (rand(4, seed=3), rand(4, seed=4))
    got = exe(p, np.float32(1.5))
    assert_same(got, kiln.interpret(mod, p, np.float32(1.5)))
    got[2][0] = 123.0  # an input returned as it is comes back as a copy
    assert p[0][0] != 123.0


def test_identity_and_constants_come_back_as_fresh_arrays():
    x = rand(3)
    v = var("x", tensor_type((3,), "float32"))
    mod = IRModule.from_expr(Function([v], tuple_(v, const(np.arange(3, dtype="float32")))))
    exe = native(mod)
    a, c = exe(x)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(c, np.arange(3, dtype="float32"))
    assert a.flags.writeable and c.flags.writeable and a is not x
    c[0] = 7.0
    np.testing.assert_array_equal(exe(x)[1], np.arange(3, dtype="float32"))


def test_a_loop_inside_a_function_called_from_a_loop():
    text = """
    def @inner(%j: int32, %v: Tensor[(3), float32]) -> Tensor[(3), float32] {
      if (%j == 0) { %v } else { @inner(%j - 1, sin(%v) + 0.25f) }
    }
    def @outer(%i: int32, %v: Tensor[(3), float32]) -> Tensor[(3), float32] {
      if (%i == 0) { %v } else { @outer(%i - 1, @inner(%i, %v) * 0.9f) }
    }
    def @main(%v: Tensor[(3), float32], %n: int32) { @outer(%n, %v) }
    """
    mod = kiln.parse(text)
    exe = native(mod)
    v = rand(3, seed=5)
    assert_same(exe(v, np.int32(6)), kiln.interpret(mod, v, np.int32(6)), rtol=1e-4)


def test_mlp_agrees_with_the_interpreter():
    mod, params = mlp(batch=4)
    exe = native(mod, params=params)
    x = rand(4, 784, seed=6)
    assert_same(exe(x), kiln.interpret(mod, x, params=params), rtol=1e-4, atol=1e-5)


def test_resnet18_agrees_with_the_interpreter():
    mod, params = resnet18(batch=1, image=32, classes=10)
    exe = native(mod, params=params)
    x = rand(1, 3, 32, 32, seed=7)
    assert_same(exe(x), kiln.interpret(mod, x, params=params), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["lists.rly", "closures.rly"])
def test_programs_it_cannot_take_fall_back_to_the_vm(name):
    exe = kiln.build(kiln.parse((PROGRAMS / name).read_text(), source_name=name))
    assert exe.stats().executor == "vm"


def test_a_reference_used_in_straight_line_code_is_evaluated_away():
    mod = kiln.parse("def @main(%x: float32) { let %r = ref(%x); ref_write(%r, %x + 1f); "
                     "ref_read(%r) }")
    exe = kiln.build(mod)
    assert exe.stats().executor == "native"
    for x in (np.float32(2.0), np.float32(-3.5)):
        assert_same(exe(x), kiln.interpret(mod, x))


def test_a_program_of_static_trees_and_closures_is_evaluated_to_first_order():
    # trees.rly builds its trees from its inputs in @main and folds closures over them:
    # specialize-closures (partial evaluation) leaves straight-line tensor code
    mod = kiln.parse((PROGRAMS / "trees.rly").read_text(), source_name="trees.rly")
    exe = kiln.build(mod)
    assert exe.stats().executor == "native"
    assert kiln.build(mod, opt_level=1).stats().executor == "vm"  # the pass is opt_level 2
    a, b = rand(2, 2, seed=1), rand(2, 2, seed=2)
    assert_same(exe(a, b), kiln.interpret(mod, a, b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("text", [
    # non-tail recursion
    """def @count(%n: int32) -> int32 { if (%n == 0) { 0 } else { 1 + @count(%n - 1) } }
       def @main(%n: int32) { @count(%n) }""",
    # mutual tail calls: recursion between functions, not a loop of one
    """def @even(%n: int32) -> bool { if (%n == 0) { True } else { @odd(%n - 1) } }
       def @odd(%n: int32) -> bool { if (%n == 0) { False } else { @even(%n - 1) } }
       def @main(%n: int32) { @even(%n) }""",
    # a reference written where the data says
    """def @main(%x: float32) {
         let %r = ref(%x);
         let %u = if (%x > 0f) { ref_write(%r, %x + 1f) } else { () };
         ref_read(%r)
       }""",
])
def test_recursion_and_references_fall_back_to_the_vm(text):
    mod = kiln.parse(text)
    exe = kiln.build(mod)
    assert exe.stats().executor == "vm"
    arg = np.float32(2.0) if "%x" in text else np.int32(11)
    assert_same(exe(arg), kiln.interpret(mod, arg))
    with pytest.raises(kiln.Error, match="native executor cannot run"):
        kiln.build(mod, executor="native")


def test_symbolic_shapes_fall_back_to_the_vm():
    mod = kiln.parse("def @main(%x: Tensor[(n, 3), float32]) { nn.relu(%x) * 2f }")
    exe = kiln.build(mod)
    assert exe.stats().executor == "vm"
    x = rand(5, 3)
    assert_same(exe(x), kiln.interpret(mod, x))


def test_the_evaluator_target_is_left_to_the_vm():
    exe = kiln.build(kiln.parse("def @main(%x: float32) { %x * 2f }"), target="evaluator")
    assert exe.stats().executor == "vm"


def test_wrong_inputs_are_errors_that_name_the_parameter():
    exe = native("""
    def @main(%x: Tensor[(2, 5), float32], %p: (Tensor[(5), float32], int32)) {
      (%x + %p.0, %p.1)
    }""")
    x, v = rand(2, 5), rand(5)
    with pytest.raises(kiln.Error, match=r"argument 1 \(%x\) of @main expects "
                                         r"Tensor\[\(2, 5\), float32\].*shape \(2, 4\)"):
        exe(rand(2, 4), (v, np.int32(1)))
    with pytest.raises(kiln.Error, match=r"argument 1 \(%x\).*dtype float64"):
        exe(x.astype("float64"), (v, np.int32(1)))
    with pytest.raises(kiln.Error, match=r"argument 2 \(%p\).*tuple of 2"):
        exe(x, (v,))
    with pytest.raises(kiln.Error, match=r"argument 2 \(%p\) of @main, field 1 expects int32"):
        exe(x, (v, np.float32(1)))
    with pytest.raises(kiln.Error, match=r"takes 2 argument"):
        exe(x, (v, np.int32(1)), x)
    with pytest.raises(kiln.Error, match=r"needs argument"):
        exe(x)
    with pytest.raises(kiln.Error, match=r"expects .* but got a str"):
        exe("x", (v, np.int32(1)))
    # Arrays native code cannot read as they are (strided, foreign byte order) are copied.
    wide = rand(2, 10)[:, ::2]
    big_endian = x.astype(">f4")
    for arg in (wide, big_endian):
        got = exe(arg, (v, np.int32(3)))
        np.testing.assert_array_equal(got[0], np.asarray(arg, "float32") + v)
        assert int(got[1]) == 3


def test_a_failing_kernel_is_an_eval_error():
    text = """
    def @div(%a: Tensor[(4), int32], %b: Tensor[(4), int32]) -> Tensor[(4), int32] { %a / %b }
    def @main(%a: Tensor[(4), int32], %b: Tensor[(4), int32]) { @div(%a, %b) + 1 }
    """
    exe = native(text)
    a = np.array([4, 9, -8, 3], "int32")
    np.testing.assert_array_equal(exe(a, np.array([2, 3, 4, 1], "int32")),
                                  kiln.interpret(kiln.parse(text), a,
                                                 np.array([2, 3, 4, 1], "int32")))
    with pytest.raises(kiln.EvalError, match="division by zero"):
        exe(a, np.array([2, 0, 4, 1], "int32"))


def test_saved_and_loaded_in_a_fresh_process(tmp_path):
    mod = kiln.parse(LOOP)
    exe = native(mod)
    path = tmp_path / "loop.kiln"
    exe.save(path)
    x = rand(4, seed=8)
    np.save(tmp_path / "x.npy", x)
    script = f"""
import json, numpy as np, kiln, kiln.codegen.compile

def forbidden(*args, **kwargs):
    raise AssertionError("compiler work while loading")

kiln.codegen.compile.compile_ir = forbidden
exe = kiln.load({str(path)!r})
s = exe.stats()
y, z = exe(np.load({str(tmp_path / 'x.npy')!r}), np.int32(5))
np.save({str(tmp_path / 'y.npy')!r}, y); np.save({str(tmp_path / 'z.npy')!r}, z)
print(json.dumps({{"executor": s.executor, "compile": s.compile_seconds}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"executor": "native", "compile": 0.0}
    want = kiln.interpret(mod, x, np.int32(5))
    assert_same((np.load(tmp_path / "y.npy"), np.load(tmp_path / "z.npy")), want)


def test_the_saved_executor_is_the_one_loaded(tmp_path):
    mod = kiln.parse(LOOP)
    kiln.build(mod, executor="vm").save(tmp_path / "vm.kiln")
    assert kiln.load(tmp_path / "vm.kiln").stats().executor == "vm"
    native(mod).save(tmp_path / "native.kiln")
    loaded = kiln.load(tmp_path / "native.kiln")
    assert loaded.stats().executor == "native"
    x = rand(4, seed=9)
    assert_same(loaded(x, np.int32(3)), kiln.interpret(mod, x, np.int32(3)))


def test_an_entry_point_of_another_program_is_refused():
    a = native(LOOP)
    b = native("def @main(%x: Tensor[(4), float32], %n: int32) { (%x, %x) }")
    kernels = KernelSet(dict(b.kernels.functions), b.kernels.backend, b.kernels.library,
                        loaded=True, program_code=a.executor.object_code)
    with pytest.raises(kiln.Error, match="another program"):
        make_native_executor(b.program, kernels)
    kernels.program_code = b"KILNLIB\x01 garbage"
    with pytest.raises(kiln.Error, match="not valid kiln machine code"):
        make_native_executor(b.program, kernels)


def test_a_damaged_entry_point_behind_a_valid_checksum_is_an_error(tmp_path):
    # The file's checksum resealed over damage to the entry point's machine code. The seal no
    # longer matches, so by default the code is made again (and runs right); trusted anyway,
    # the blob's own checksum (kiln.codegen's library) catches it before anything runs.
    mod = kiln.parse(LOOP)
    native(mod).save(tmp_path / "ok.kiln")
    data = (tmp_path / "ok.kiln").read_bytes()
    (hlen,) = struct.unpack_from("<Q", data, 16)
    header = json.loads(data[24: 24 + hlen].decode())
    assert header["executor"] == "native"
    (section,) = [s for s in header["sections"] if s["name"] == "program_code"]
    rng = np.random.default_rng(10)
    for _ in range(20):
        body = bytearray(data[:-32])
        at = section["offset"] + int(rng.integers(section["length"]))
        body[at] ^= 1 << int(rng.integers(8))
        (tmp_path / "bad.kiln").write_bytes(bytes(body) + hashlib.sha256(body).digest())
        with pytest.raises(kiln.Error, match="bad.kiln: not valid kiln machine code"):
            kiln.load(tmp_path / "bad.kiln", trust="any")
    again = kiln.load(tmp_path / "bad.kiln")
    assert again.code_source == "rebuilt" and again.executor.name == "native"


def test_lstm_loop_agrees_with_pytorch():
    # 32 steps by tail recursion: one native loop, the weights passed round it uncopied.
    pytest.importorskip("torch")
    from kiln.testing.models import lstm
    from kiln.testing.torch_models import run_torch, torch_lstm

    mod, params = lstm(steps=32, input=64, hidden=64)
    exe = native(mod, params=params)
    x = rand(32, 1, 64, seed=11)
    assert_same(exe(x), run_torch(torch_lstm(params), x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("text, args", [
    ("def @main(%x: Tensor[(0, 3), float32]) { (%x * 2f, sum(%x, axis=[0])) }",
     [np.zeros((0, 3), "float32")]),
    ("def @main(%x: float32) { () }", [np.float32(1)]),
    ('def @main() { ones(shape=[2, 2], dtype="float32") }', []),
    ("def @main(%x: Tensor[(3), int64]) { (%x > 1i64, %x * 3i64, ()) }",
     [np.arange(3, dtype="int64")]),
    ("def @main(%x: Tensor[(3), float16]) { %x + %x }", [np.arange(3, dtype="float16")]),
    ("def @main(%x: Tensor[(2, 6), float32]) { split(%x, indices_or_sections=3, axis=1) }",
     [np.arange(12, dtype="float32").reshape(2, 6)]),
])
def test_edge_cases(text, args):
    # Empty tensors, unit results, no parameters, other dtypes, kernels with several outputs.
    mod = kiln.parse(text)
    assert_same(native(mod)(*args), kiln.interpret(mod, *args))


def test_a_long_chain_of_kernels():
    # More call sites than LARGE_PROGRAM: the entry point is compiled quickly (O0).
    x = kiln.var("x", shape=(3, 4))
    h: kiln.Expr = x
    for _ in range(400):
        h = kiln.op.nn.softmax(h * kiln.const(3.0))
    mod = kiln.IRModule.from_expr(kiln.Function([x], h))
    exe = native(mod)
    assert exe.executor.code.call_sites > 256
    a = rand(3, 4, seed=12)
    assert_same(exe(a), kiln.interpret(mod, a))


def test_random_programs():
    # Random well-typed programs (tuples, ifs, calls, references, ...): those that are
    # static run natively, the rest on the VM; all agree with the interpreter.
    from kiln.testing.programs import random_program

    ran = []
    for seed in range(300, 308):
        mod, inputs = random_program(seed, steps=16)
        exe = kiln.build(mod)
        ran.append(exe.stats().executor)
        assert_same(exe(*inputs), kiln.interpret(mod, *inputs), rtol=1e-4, atol=1e-5)
    assert ran.count("native") >= 2, ran


# Large results are written by their kernels straight into the caller's arrays (the direct
# entry point, kiln/codegen/program.py); `run_into` keeps the entry that copies at `ret`.
BIG = """
def @main(%x: Tensor[(128, 256), float32], %w: Tensor[(256, 256), float32]) {
  let %y = nn.relu(nn.dense(%x, %w));
  (%y, nn.softmax(%y), %y, %x)
}
"""


def test_large_results_are_written_in_place_and_agree():
    exe = native(BIG)
    ex = exe.executor
    assert ex._direct is not None  # 128×256 floats: over DIRECT_MIN_BYTES
    x, w = rand(128, 256, seed=1), rand(256, 256, seed=2)
    want = kiln.interpret(kiln.parse(BIG), x, w)
    got = exe(x, w)
    assert_same(got, want)
    # %y comes back twice and %x is an input: none of the four shares memory with another
    # or with the inputs
    arrays = list(got) + [x, w]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
    again = exe(x, w)
    assert not any(np.shares_memory(a, b) for a, b in zip(got, again))
    assert_same(again, want)


def test_run_into_with_donated_arrays_keeps_copying_at_ret():
    # y = relu(x @ w) donated into x's own array: safe only if nothing writes x before the
    # kernels have read it, which the copying entry guarantees
    text = """
def @main(%x: Tensor[(128, 256), float32], %w: Tensor[(256, 256), float32]) {
  nn.relu(nn.dense(%x, %w)) + %x
}
"""
    exe = native(text)
    x, w = rand(128, 256, seed=3), rand(256, 256, seed=4)
    want = kiln.interpret(kiln.parse(text), x, w)
    x_donated = x.copy()
    exe.executor.run_into([x_donated, w], [x_donated])
    assert_same(x_donated, want)


def test_a_saved_program_keeps_its_in_place_entry(tmp_path):
    exe = native(BIG)
    exe.save(tmp_path / "big.kiln")
    loaded = kiln.load(tmp_path / "big.kiln")
    assert loaded.stats().executor == "native" and loaded.executor._direct is not None
    x, w = rand(128, 256, seed=5), rand(256, 256, seed=6)
    assert_same(loaded(x, w), kiln.interpret(kiln.parse(BIG), x, w))


def test_small_results_have_only_the_copying_entry():
    exe = native("def @main(%x: Tensor[(4, 4), float32]) { nn.relu(%x) }")
    assert exe.executor._direct is None
