"""Kernels compiled once for every size (symbolic kernels): the loop IR takes its sizes as
run-time arguments, the verifier proves it in bounds for all of them, the call checks them
against the arrays; a model run at many shapes compiles its elementwise and reduction
kernels once, and only its GEMM-like ones per shape. Oracles: numpy, the reference
interpreter, PyTorch."""

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.errors import InternalError
from kiln.loops.ir import Allocate, Binary, Buffer, Const, For, Kernel, Load, Seq, Store, Var
from kiln.loops.verify import verify
from kiln.runtime import build
from kiln.runtime.compiler import compile_kernels

from .helpers import assert_same, needs_native

pytestmark = needs_native


def _add_bias(vector: bool = True, index_shift: int = 0) -> Kernel:
    """out[i, :] = x[i, :] + b over a symbolic number of rows m (16 columns)."""
    m = Var("m")
    x, b = Buffer("x", (m, 16), "float32"), Buffer("b", (16,), "float32")
    o = Buffer("o", (m, 16), "float32")
    i, j = Var("i"), Var("j")
    lanes = 8 if vector else 1
    step = 16 // lanes
    row = i + index_shift if index_shift else i
    body = For(i, Const(0), m, For(j, Const(0), Const(step), Store(
        o, (row, j * lanes), Load(x, (i, j * lanes), lanes) + Load(b, (j * lanes,), lanes))),
        "parallel")
    return Kernel("add_bias", (x, b), (o,), body, dims=(m,))


def test_a_symbolic_kernel_compiles_once_and_runs_at_every_size():
    f = compile_kernels([verify(_add_bias())]).functions["add_bias"]
    rng = np.random.default_rng(0)
    for m in (1, 7, 300, 0):
        x = rng.standard_normal((m, 16)).astype("float32")
        b = rng.standard_normal(16).astype("float32")
        out = np.full_like(x, np.nan)
        f(x, b, out)
        np.testing.assert_array_equal(out, x + b)


def test_arrays_that_disagree_with_the_sizes_are_refused():
    f = compile_kernels([verify(_add_bias())]).functions["add_bias"]
    x, b = np.zeros((3, 16), "float32"), np.zeros(16, "float32")
    with pytest.raises(kiln.Error, match="do not agree"):
        f(x, b, np.zeros((4, 16), "float32"))  # would write a row past x's end
    with pytest.raises(kiln.Error, match="float32"):
        f(x, np.zeros(8, "float32"), np.zeros((3, 16), "float32"))  # a static size wrong
    with pytest.raises(kiln.Error, match="float32"):
        f(x.astype("float64"), b, np.zeros((3, 16), "float32"))
    with pytest.raises(kiln.Error, match="contiguous"):
        f(np.zeros((3, 32), "float32")[:, ::2], b, np.zeros((3, 16), "float32"))
    with pytest.raises(kiln.Error, match="takes 3 arrays"):
        f(x, b)


def test_the_verifier_proves_symbolic_accesses_for_every_size():
    verify(_add_bias())
    verify(_add_bias(vector=False))
    with pytest.raises(InternalError, match="symbolic size m"):
        verify(_add_bias(index_shift=1))  # row i + 1 is out of bounds when i = m - 1
    m, i = Var("m"), Var("i")
    x, o = Buffer("x", (m,), "float32"), Buffer("o", (m,), "float32")
    vec = For(i, Const(0), m, Store(o, (i,), Load(x, (i,), 1)))
    verify(Kernel("copy", (x,), (o,), vec, dims=(m,)))
    wide = For(i, Const(0), m, Store(o, (i,), Load(x, (i,), 8)))  # 8 lanes from i: past m
    with pytest.raises(InternalError, match="lanes"):
        verify(Kernel("copy", (x,), (o,), wide, dims=(m,)))
    t = Buffer("t", (m,), "float32", "local")
    local = Allocate(t, For(i, Const(0), m, Store(o, (i,), Load(x, (i,), 1))))
    with pytest.raises(InternalError, match="local buffer t has a symbolic shape"):
        verify(Kernel("copy", (x,), (o,), local, dims=(m,)))
    with pytest.raises(InternalError, match="not one of the kernel's dims"):
        Kernel("copy", (x,), (o,), vec)


PROGRAM = """
def @main(%x: Tensor[(?, ?, 64), float32], %b: Tensor[(64), float32]) {
  %0 = nn.softmax(add(%x, %b), axis=-1);
  %1 = nn.layer_norm(%0, %b, %b, axis=-1);
  (sum(tanh(%1), axis=[2]), max(%1, axis=[0]), transpose(%1, axes=[1, 0, 2]))
}
"""


def test_elementwise_reductions_softmax_and_layer_norm_compile_once():
    mod = kiln.parse(PROGRAM)
    exe = build(mod)
    sc = exe.shape_compiler
    rng = np.random.default_rng(1)
    counts = []
    for shape in ((2, 3), (3, 5), (4, 7), (5, 5), (6, 2)):
        x = rng.standard_normal((*shape, 64)).astype("float32")
        b = rng.standard_normal(64).astype("float32")
        assert_same(exe(x, b), kiln.interpret(mod, x, b), rtol=1e-4, atol=1e-5)
        counts.append(sc.symbolic_compiles)
    assert counts[0] > 0 and counts == [counts[0]] * len(counts)  # the first shape's only
    assert sc.shape_compiles == 0 and sc.bound == 5 * exe.stats().dynamic_kernels
    assert exe.stats().symbolic_compiles == counts[0]


def _softmax_ref(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    x64 = x.astype("float64")
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    logs = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return logs if log else np.exp(logs)


@pytest.mark.parametrize("op, axis", [("nn.softmax", -1), ("nn.log_softmax", -1),
                                      ("nn.softmax", 0)])
def test_softmax_along_a_symbolic_axis_compiles_once(op, axis):
    # the row maximum's vector loop over [0, n // 64), its vector tail and scalar tail,
    # the kept exponentials (1008 of them, recomputed past that): lengths below, at and
    # past multiples of the vector width, and 1 (which is a pattern of its own)
    mod = kiln.parse(f"def @main(%x: Tensor[(?, ?), float32]) {{ {op}(%x, axis={axis}) }}")
    exe = build(mod)
    rng = np.random.default_rng(2)
    lengths = (7, 15, 16, 17, 63, 64, 65, 100, 1008, 1009, 1100)
    for n in (*lengths, 1):
        shape = (3, n) if axis == -1 else (n, 3)
        x = (4 * rng.standard_normal(shape)).astype("float32")
        np.testing.assert_allclose(exe(x), _softmax_ref(x, axis, op == "nn.log_softmax"),
                                   rtol=2e-5, atol=2e-6)
    st = exe.stats()
    assert st.symbolic_compiles == 2 and st.shape_compiles == 0  # n > 1, and n = 1


def _tail(main_extent=None, tail_start=None, tail_extent=None) -> Kernel:
    """o[:] = x[:] over a symbolic d: 16 lanes over [0, d // 16), then one at a time over
    [d // 16 * 16, d); the arguments replace those bounds (functions of d)."""
    d, p, q = Var("d"), Var("p"), Var("q")
    x, o = Buffer("x", (d,), "float32"), Buffer("o", (d,), "float32")
    main = (main_extent or (lambda d: Binary("floordiv", d, Const(16))))(d)
    start = (tail_start or (lambda d: Binary("mul", Binary("floordiv", d, Const(16)),
                                             Const(16))))(d)
    extent = tail_extent(d) if tail_extent else Binary("sub", d, start)
    body = Seq((For(p, Const(0), main, Store(o, (p * 16,), Load(x, (p * 16,), 16))),
                For(q, start, extent, Store(o, (q,), Load(x, (q,), 1)))))
    return Kernel("tail", (x,), (o,), body, dims=(d,))


def test_the_verifier_proves_a_vector_loop_and_its_tail_and_rejects_wrong_bounds():
    f = compile_kernels([verify(_tail())]).functions["tail"]
    for n in (0, 1, 15, 16, 17, 47, 48, 1000):
        x = np.arange(n, dtype="float32")
        out = np.full_like(x, np.nan)
        f(x, out)
        np.testing.assert_array_equal(out, x)
    wrong = {
        "the main loop rounding up": dict(
            main_extent=lambda d: Binary("floordiv", Binary("add", d, Const(15)), Const(16))),
        "a whole vector's tail": dict(tail_extent=lambda d: Const(16)),
        "the tail one early": dict(tail_start=lambda d: Binary(
            "sub", Binary("mul", Binary("floordiv", d, Const(16)), Const(16)), Const(1))),
        "the tail one late": dict(tail_start=lambda d: Binary(
            "add", Binary("mul", Binary("floordiv", d, Const(16)), Const(16)), Const(1)),
            tail_extent=lambda d: Binary("sub", d, Binary("mul", Binary(
                "floordiv", d, Const(16)), Const(16)))),
    }
    for what, bounds in wrong.items():
        with pytest.raises(InternalError, match="symbolic size d"):
            verify(_tail(**bounds))
            pytest.fail(f"{what}: verified")


def test_reshapes_of_symbolic_tensors_compile_once():
    # the input's last size, 32, is fixed by the reshape to (?, ?, 2, 16): stand-ins for it
    # would not type, so the kernel is compiled for every batch and sequence with it kept
    mod = kiln.parse("""
def @main(%x: Tensor[(?, ?, ?), float32]) {
  (transpose(reshape(%x, newshape=[0, 0, 2, 16]), axes=[0, 2, 1, 3]),
   reshape(add(%x, 1f), newshape=[0, 0, 32]))
}""")
    exe = build(mod)
    rng = np.random.default_rng(3)
    for b, s in ((3, 5), (4, 7), (2, 9), (5, 16)):
        x = rng.standard_normal((b, s, 32)).astype("float32")
        assert_same(exe(x), kiln.interpret(mod, x))
    st = exe.stats()
    assert st.symbolic_compiles == 2 and st.shape_compiles == 0


def _onnx_model(causal: bool):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "frontend"))
    from test_onnx_dynamic import Encoder, export, ids_and_mask

    from kiln.frontend.onnx import from_onnx

    torch.manual_seed(0)
    module = Encoder(causal, vocab=100, d=32, heads=2, layers=1).eval()
    with tempfile.TemporaryDirectory() as tmp:
        example = ids_and_mask(2, 8, vocab=100)
        names = ["ids"] if causal else ["ids", "mask"]
        path = export(module, example[:1] if causal else example, names, Path(tmp))
        mod, params = from_onnx(path)
    return module, kiln.build(mod, params=params), ids_and_mask


def _run_at_many_shapes(causal: bool):
    import torch

    module, exe, ids_and_mask = _onnx_model(causal)
    sc = exe.shape_compiler
    symbolic = []
    # (a batch equal to the heads, 2, would make a mask kernel whose types tie a symbolic
    # size to the batch count batch and heads as one size, and compile again at another)
    for b, s in ((3, 8), (4, 11), (5, 6), (3, 13)):
        inputs = ids_and_mask(b, s, vocab=100)[:1 if causal else 2]
        got = exe(*[x.numpy() for x in inputs])
        with torch.inference_mode():
            want = module(*inputs).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        symbolic.append(sc.symbolic_compiles)
    # the symbolic kernels were all compiled for the first shape; later shapes compile only
    # the kernels that are specialized per shape, GEMM-like ones among them
    assert symbolic[0] > 0 and symbolic == [symbolic[0]] * 4
    per_shape = {name for name, _ in sc._failed}
    assert any("dense" in n for n in per_shape) and any("batch_matmul" in n for n in per_shape)
    # only the GEMM-like kernels (softmax and the reshapes were per shape too, once)
    assert all("dense" in n or "matmul" in n for n in per_shape), per_shape
    generic = {name for name, _ in sc._generic}
    assert not any("dense" in n or "matmul" in n for n in generic)
    assert all(any(op in n for n in generic) for op in ("layer_norm", "softmax", "reshape"))


def test_a_bert_style_encoder_compiles_its_symbolic_kernels_once():
    _run_at_many_shapes(causal=False)


@pytest.mark.slow
def test_a_gpt_style_decoder_compiles_its_symbolic_kernels_once():
    _run_at_many_shapes(causal=True)


def test_symbolic_kernels_compile_for_an_avx512_target_and_fingerprint_their_dims():
    from kiln.codegen.cache import canonical_text
    from kiln.codegen.compile import assembly
    from kiln.target import Target

    k = verify(_add_bias())
    asm = assembly(k, target=Target.parse("llvm -mcpu=znver4"))
    assert "zmm" in asm or "ymm" in asm  # vector code, made without running it
    text = canonical_text(k)
    assert "dims v0:int64x1" in text and "['v0:int64x1', 16]" in text
    # the same loops with the rows a constant are another kernel (another fingerprint)
    m = k.dims[0]
    rows = {id(b): Buffer(b.name, tuple(5 if d is m else d for d in b.shape), b.dtype)
            for b in k.params}
    static_text = canonical_text(Kernel("add_bias", tuple(rows[id(b)] for b in k.inputs),
                                        tuple(rows[id(b)] for b in k.outputs), k.body))
    assert static_text != text and "dims" not in static_text
