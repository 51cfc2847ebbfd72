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
from kiln.loops.ir import Allocate, Buffer, Const, For, Kernel, Load, Store, Var
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
    generic = {name for name, _ in sc._generic}
    assert not any("dense" in n or "matmul" in n for n in generic)
    assert any("layer_norm" in n for n in generic)


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
