"""The packed GEMM (kiln/loops/gemm.py) and the fast dense/batch_matmul kernels, compiled.

Oracles: numpy in float64 (and the reference interpreter for fused epilogues). Shapes are
chosen off the tile sizes (M, N, K not multiples of 6, 16 or kc; one row; K = 1; K larger
than kc, so partial sums go through Cp), the knobs are varied explicitly, and results with
one and two threads must be identical (each element is computed by the same instructions
whichever thread runs it). The same products are scheduled and compiled for this machine and
for it without AVX-512 (AVX2 code: 256-bit vectors, 16 registers), and the micro-kernel's
assembly is checked to use zmm registers in the first case and ymm only in the second.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import kiln
from kiln.codegen import assembly, compile_kernels, threads
from kiln.ir.traverse import post_order
from kiln.loops.gemm import GemmSchedule, gemm, register_tile
from kiln.loops.ir import Binary, Buffer, Const, Kernel, Load, Store
from kiln.loops.lower import lower_primitive
from kiln.loops.schedule import target_scope
from kiln.loops.verify import verify
from kiln.op import nn
from kiln.runtime.compiler import native_available
from kiln.target import Target

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    # float32 sums of k products, in a different order than float64's
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(k, 1) ** 0.5 * 4)


def build(params: list[kiln.Var], body: kiln.Expr) -> kiln.Executable:
    return kiln.build(kiln.IRModule.from_expr(kiln.Function(params, body)))


@pytest.mark.parametrize("m,n,k", [
    (1, 1, 1), (1, 37, 5), (1, 40, 100), (3, 10, 33),  # few rows: the dot-product kernel
    (5, 17, 1), (7, 33, 9), (6, 16, 8), (13, 48, 300), (50, 70, 600), (64, 10, 784),
    (97, 129, 257),
])
def test_dense_shapes(m: int, n: int, k: int) -> None:
    x = kiln.var("x", shape=(m, k), dtype="float32")
    w = kiln.var("w", shape=(n, k), dtype="float32")
    exe = build([x, w], nn.dense(x, w))
    a, b = rand(m, k), rand(n, k)
    close(exe(a, b), a.astype(np.float64) @ b.T.astype(np.float64), k)


def test_dense_rank3_and_float64() -> None:
    x = kiln.var("x", shape=(2, 3, 20), dtype="float32")
    w = kiln.var("w", shape=(9, 20), dtype="float32")
    a, b = rand(2, 3, 20), rand(9, 20)
    close(build([x, w], nn.dense(x, w))(a, b), a.astype(np.float64) @ b.T, 20)
    # other dtypes keep the plain reduction
    x = kiln.var("x", shape=(7, 20), dtype="float64")
    w = kiln.var("w", shape=(9, 20), dtype="float64")
    a, b = rand(7, 20, dtype="float64"), rand(9, 20, dtype="float64")
    np.testing.assert_allclose(build([x, w], nn.dense(x, w))(a, b), a @ b.T, rtol=1e-12)


@pytest.mark.parametrize("m", [2, 45])
def test_dense_epilogue(m: int) -> None:
    # relu(dense + bias) + residual: the epilogue runs on the tile before the store
    x = kiln.var("x", shape=(m, 70), dtype="float32")
    w = kiln.var("w", shape=(35, 70), dtype="float32")
    bias = kiln.var("b", shape=(35,), dtype="float32")
    r = kiln.var("r", shape=(m, 35), dtype="float32")
    body = kiln.op.add(nn.relu(nn.bias_add(nn.dense(x, w), bias)), r)
    mod = kiln.IRModule.from_expr(kiln.Function([x, w, bias, r], body))
    args = rand(m, 70), rand(35, 70), rand(35), rand(m, 35)
    exe = kiln.build(mod)
    close(exe(*args), kiln.interpret(mod, *args), 70)
    # the whole expression is one kernel: the dense has no intermediate buffer
    fused = kiln.infer_types(kiln.optimize(mod))
    prims = [f for f in post_order(fused["main"])
             if isinstance(f, kiln.Function) and f.attrs.get("Primitive")]
    assert len(prims) == 1
    kernel = lower_primitive(prims[0])
    (name, knobs), = kernel.attrs["schedules"]
    assert name == "nn.dense" and knobs["kernel"] == ("dot" if m <= 4 else "gemm")


@pytest.mark.parametrize("bx,by,ta,tb", [
    (3, 3, False, True), (3, 1, False, False), (1, 4, True, False), (2, 2, True, True),
])
def test_batch_matmul(bx: int, by: int, ta: bool, tb: bool) -> None:
    m, n, k = 11, 19, 23
    xs = (bx, k, m) if ta else (bx, m, k)
    ys = (by, n, k) if tb else (by, k, n)
    x = kiln.var("x", shape=xs, dtype="float32")
    y = kiln.var("y", shape=ys, dtype="float32")
    exe = build([x, y], nn.batch_matmul(x, y, transpose_a=ta, transpose_b=tb))
    a, b = rand(*xs), rand(*ys)
    a64 = a.astype(np.float64).swapaxes(1, 2) if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).swapaxes(1, 2) if tb else b.astype(np.float64)
    close(exe(a, b), a64 @ b64, k)


def gemm_kernel(batch: int, m: int, n: int, k: int, schedule: GemmSchedule | None,
                name: str, target: Target | None = None) -> Kernel:
    """``o[b] = x[b] @ w[b].T + 1`` with an explicit schedule (or the target's default)."""
    x = Buffer("x", (batch, m, k), "float32")
    w = Buffer("w", (batch, n, k), "float32")
    o = Buffer("o", (batch, m, n), "float32")
    body = gemm(batch, m, n, k, lambda b, i, p: Load(x, (b, i, p)),
                lambda b, p, j: Load(w, (b, j, p)),
                lambda b, i, j, v: Store(o, (b, i, j), Binary("add", v, Const(1.0, "float32"))),
                "float32", schedule, target=target)
    return verify(Kernel(name, (x, w), (o,), body))


SCHEDULES = [
    (2, 30, 50, 40, GemmSchedule(6, 16, 16, 12, 32, "n", lanes=8)),
    (2, 30, 50, 40, GemmSchedule(6, 16, 13, 12, 16, "m", unroll=1, lanes=8)),
    (3, 30, 50, 40, GemmSchedule(4, 8, 20, 8, 24, "batch", unroll=4, lanes=8)),
    (1, 25, 9, 70, GemmSchedule(12, 8, 64, 24, 8, None, unroll=2, lanes=8)),
    (1, 33, 70, 50, GemmSchedule(14, 32, 24, 28, 64, "n", lanes=16)),  # AVX-512's tile
    # the row tiles outside the column tiles, over three K blocks; a pool's chunks
    (2, 30, 50, 40, GemmSchedule(6, 16, 16, 12, 32, "n", lanes=8, order="mn", chunks=16)),
    (1, 61, 77, 40, GemmSchedule(4, 16, 16, 8, 48, "m", lanes=8, order="mn", chunks=2)),
    (1, 61, 77, 300, None),
]


def test_schedules_and_threads() -> None:
    kernels = [gemm_kernel(*case, name=f"g{i}") for i, case in enumerate(SCHEDULES)]
    lib = compile_kernels(kernels)
    for (batch, m, n, k, _), kernel in zip(SCHEDULES, kernels):
        a, b = rand(batch, m, k), rand(batch, n, k)
        results = []
        for count in (1, 2):
            out = np.full((batch, m, n), np.nan, np.float32)
            with threads(count):
                lib[kernel.name](a, b, out)
            results.append(out)
        np.testing.assert_array_equal(results[0], results[1])
        close(results[0], a.astype(np.float64) @ b.swapaxes(1, 2) + 1, k)


AVX2 = "llvm -mcpu=x86-64-v3"  # a generic AVX2 CPU: 16 registers, 32 KiB of L1d
AVX512 = "llvm -mcpu=x86-64-v4"
NO_AVX512 = "llvm -mattr=-avx512f"  # this machine without AVX-512


def test_default_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # the target's cores, not KILN_NUM_THREADS: machine code must not depend on it
    before = GemmSchedule.default(1, 1024, 1024, 1024)
    monkeypatch.setenv("KILN_NUM_THREADS", "1")
    assert GemmSchedule.default(1, 1024, 1024, 1024) == before
    avx2 = Target.parse(AVX2)
    big = GemmSchedule.default(1, 1024, 1024, 1024, threads=2, target=avx2)
    assert (big.mr, big.nr, big.kc, big.lanes) == (6, 16, 256, 8) and big.parallel == "n"
    assert big.mc % big.mr == 0 and big.nc % big.nr == 0
    wide = GemmSchedule.default(1, 1024, 1024, 1024, threads=2, target=Target.parse(AVX512))
    # 14 rows fit the registers; 13 pad 1024 rows to 1027, 14 to 1036
    assert (wide.mr, wide.nr, wide.lanes) == (13, 32, 16)
    assert GemmSchedule.default(1, 28, 1024, 64, target=Target.parse(AVX512)).mr == 14
    assert GemmSchedule.default(1, 8, 8, 8, threads=2, target=avx2).parallel is None
    assert GemmSchedule.default(8, 128, 128, 64, threads=2, target=avx2).parallel == "batch"
    assert GemmSchedule.default(1, 512, 16, 4608, threads=2, target=avx2).parallel == "m"
    assert GemmSchedule.default(1, 100, 100, 1000, threads=1, target=avx2).parallel is None
    assert GemmSchedule.default(1, 10, 5, 9, target=avx2).nr == 8  # narrow: one vector wide
    # the target's cores decide, when no thread count is given
    one_core = dataclasses.replace(avx2, cores=1)
    assert GemmSchedule.default(1, 1024, 1024, 1024, target=one_core).parallel is None
    # inside a lowering for a target, the default is that target's
    with target_scope(avx2):
        assert GemmSchedule.default(1, 64, 64, 64).nr == 16


@pytest.mark.parametrize("spec", [AVX2, AVX512, NO_AVX512, "llvm", "aarch64-linux-gnu"])
def test_register_tile_fits_the_registers(spec: str) -> None:
    # accumulators + the vectors of B + one broadcast of A <= the vector registers
    t = Target.parse(spec)
    mr, nr = register_tile(t)
    vectors = nr // t.lanes("float32")
    assert nr % t.lanes("float32") == 0 and mr * vectors + vectors + 1 <= t.registers
    narrow = GemmSchedule.default(1, 40, t.lanes("float32"), 9, target=t)
    assert narrow.mr + 2 <= t.registers


def _micro_kernel_loop(asm: str) -> list[str]:
    """The innermost loop of the assembly that does FMAs (label ... the jump back to it)."""
    lines = asm.splitlines()
    loops: list[list[str]] = []
    for start, line in enumerate(lines):
        if line.startswith(".LBB") and line.endswith(":"):
            label = line[:-1]
            for end in range(start + 1, len(lines)):
                if lines[end].split()[-1:] == [label] and lines[end].lstrip().startswith("j"):
                    loops.append(lines[start:end + 1])
                    break
    return min((b for b in loops if any("vfmadd" in x for x in b)), key=len, default=[])


@pytest.mark.parametrize("spec,register", [("llvm -mcpu=sapphirerapids", "zmm"),
                                           ("llvm -mcpu=znver4", "zmm"), (NO_AVX512, "ymm")])
def test_micro_kernel_in_registers(spec: str, register: str) -> None:
    # The K loop of the target's tile: its accumulators in vector registers of its width,
    # FMAs, no stack traffic. 6×16 (12 ymm) without AVX-512, 14×32 (28 zmm) with it.
    # Compiled, not run. (The 14×32 tile takes 31 of the 32 zmm registers; LLVM's
    # scheduling model of the Skylake-to-Rocket Lake cores — skylake-avx512, icelake-server,
    # rocketlake, x86-64-v4 — spills one of them, 4 stores in 112 FMAs, where its Sapphire
    # Rapids and Zen 4 models do not: on a Xeon whose VM reports Rocket Lake, a 1008-row
    # product in tiles of 14 ran at 163 GFLOP/s a core, one of 1014 in tiles of 13 at 170.)
    host = Target.host()
    if host.arch != "x86_64" or not host.has("fma"):
        pytest.skip("needs an x86-64 host with FMA")
    t = Target.parse(spec)
    mr, nr = register_tile(t)
    s = GemmSchedule.default(1, 2 * mr, 2 * nr, 64, target=t)
    assert (s.mr, s.nr) == (mr, nr)
    asm = assembly(gemm_kernel(1, 2 * mr, 2 * nr, 64, s, f"asm_{register}", t), target=t)
    loop = _micro_kernel_loop(asm)
    fmas = [x for x in loop if "vfmadd" in x]
    accumulators = mr * nr // t.lanes("float32")
    assert fmas and len(fmas) % accumulators == 0
    assert all(register in x for x in fmas)
    if register == "ymm":
        assert "zmm" not in asm
    # an accumulator spilled would be stored to the stack each step (reading the packed A
    # block, a local buffer, from the stack is fine)
    stores = [x for x in loop if re.search(r"%[xyz]mm\d+,\s*-?\d*\(%r[sb]p", x)]
    assert not stores, f"accumulators spilled: {stores}"


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512])
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_full_and_last_row_tiles_over_k_blocks(spec: str, rows: int) -> None:
    # The full row tiles take their own paths (A packed without a guard, the sums stored
    # from registers); the last one, ``rows`` rows long (0: full too), packs and stores
    # under guards. Partial sums between K blocks are kept tile by tile. Both thread counts
    # give the same bits, and numpy's result.
    host = Target.host()
    t = Target.parse(spec)
    if t.has("avx512f") and not host.has("avx512f"):
        pytest.skip("the host has no AVX-512")
    mr, nr = register_tile(t)
    m, n, k = 4 * mr + rows, 2 * nr + 3, 300
    s = GemmSchedule.default(1, m, n, k, target=t)
    kernels = [gemm_kernel(1, m, n, k, dataclasses.replace(s, kc=kc), f"rows{rows}_{kc}", t)
               for kc in (s.kc, 64)]
    lib = compile_kernels(kernels, target=t)
    x, w = rand(1, m, k), rand(1, n, k)
    for kernel in kernels:
        results = []
        for count in (1, 2):
            o = np.full((1, m, n), np.nan, np.float32)
            with threads(count):
                lib[kernel.name](x, w, o)
            results.append(o)
        np.testing.assert_array_equal(results[0], results[1])
        close(results[0][0], x[0].astype(np.float64) @ w[0].T.astype(np.float64) + 1, k)


SHAPES = [(1, 1, 1), (3, 10, 33), (5, 17, 1), (13, 48, 300), (29, 33, 190), (97, 129, 257),
          (15, 31, 17)]


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512])
def test_dense_and_batch_matmul_for_each_target(spec: str) -> None:
    # off every tile size of both targets (6, 14, 16, 32; kc 192 and 384)
    t = Target.parse(spec)
    for m, n, k in SHAPES:
        x = kiln.var("x", shape=(m, k), dtype="float32")
        w = kiln.var("w", shape=(n, k), dtype="float32")
        with target_scope(t):
            exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], nn.dense(x, w))),
                             target=t)
        a, b = rand(m, k), rand(n, k)
        close(exe(a, b), a.astype(np.float64) @ b.T.astype(np.float64), k)
    x = kiln.var("x", shape=(3, 29, 41), dtype="float32")
    y = kiln.var("y", shape=(3, 41, 35), dtype="float32")
    with target_scope(t):
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, y], nn.batch_matmul(
            x, y, transpose_b=False))), target=t)
    a, b = rand(3, 29, 41), rand(3, 41, 35)
    close(exe(a, b), a.astype(np.float64) @ b.astype(np.float64), 41)


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512])
def test_gemm_kernel_schedule_follows_the_target(spec: str) -> None:
    t = Target.parse(spec)
    m, n, k = 37, 75, 400  # K over two blocks: partial sums through Cp
    kernel = gemm_kernel(1, m, n, k, None, "tk", t)
    lib = compile_kernels([kernel], t)
    a, b = rand(1, m, k), rand(1, n, k)
    out = np.full((1, m, n), np.nan, np.float32)
    lib["tk"](a, b, out)
    close(out, a.astype(np.float64) @ b.swapaxes(1, 2) + 1, k)
    # the lowering records the tile it chose for the target
    x = kiln.var("x", shape=(m, k), dtype="float32")
    w = kiln.var("w", shape=(n, k), dtype="float32")
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(
        kiln.Function([x, w], nn.dense(x, w)))))
    prim = next(f for f in post_order(fused["main"])
                if isinstance(f, kiln.Function) and f.attrs.get("Primitive"))
    (name, knobs), = lower_primitive(prim, "d", target=t).attrs["schedules"]
    mr, nr = register_tile(t)
    assert (knobs["nr"], knobs["lanes"]) == (nr, t.lanes("float32"))
    # the tile's height, or up to two rows less where that pads M less (37 rows: 13 of 14)
    assert mr - 2 <= knobs["mr"] <= mr and -(-m // knobs["mr"]) * knobs["mr"] <= -(-m // mr) * mr


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512])
def test_k_blocks_are_exact_where_they_can_be(spec: str) -> None:
    # K in blocks of one length where 1 to 2× the fewest blocks of at most the target's kc
    # allow it (a 3×3 conv over 128 channels: 1152 = 6 × 192, no padded K step, no guard
    # on the unpacked operand's loads); else the fewest blocks, as even as possible
    from kiln.loops.gemm import _kc_max, k_blocking

    t = Target.parse(spec)
    kc_max = _kc_max(t, "float32")
    for k in [1, 7, 147, 576, 784, 1031, 1152, 2304, 4608, kc_max + 1, 3 * kc_max - 1]:
        kc, blocks = k_blocking(k, t)
        fewest = -(-k // kc_max)
        exact = [b for b in range(fewest, 2 * fewest + 1) if k % b == 0]
        assert kc <= kc_max and kc * blocks >= k and kc * (blocks - 1) < k
        if exact:
            assert (kc * blocks, blocks) == (k, exact[0])
        else:
            assert blocks == fewest
    # Zen 3's 32 KiB L1 (kc <= 256): 6 blocks of 192; 48 KiB with AVX2 (384): 3
    assert k_blocking(1152, Target.parse("llvm -mcpu=znver3")) == (192, 6)


def test_a_weight_larger_than_l2_is_read_with_prefetches() -> None:
    # A prepacked weight that does not stay in L2 streams from memory: the first row tile of
    # each column tile prefetches its panel ahead. Here L2 is made small (64 KiB) so a
    # small weight counts as large; the results must not change, for 1 and 2 threads.
    from kiln.loops.printer import kernel_text

    t = dataclasses.replace(Target.parse("llvm"), l2=64 * 1024)
    m, n, k = 29, 150, 300  # a 176 KiB weight, over several column tiles and K blocks
    x = kiln.var("x", shape=(m, k), dtype="float32")
    w = kiln.var("w", shape=(n, k), dtype="float32")
    b = rand(n, k)
    with target_scope(t):
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], nn.relu(
            nn.dense(x, w)))), params={"w": b}, target=t)
    (f,) = exe.kernels.functions.values()
    assert "prefetch &" in kernel_text(f.kernel)
    if t.arch == "x86_64":
        assert "prefetcht0" in assembly(f.kernel, target=t)
    a = rand(m, k)
    want = np.maximum(a.astype(np.float64) @ b.T.astype(np.float64), 0)
    with threads(1):
        one = exe(a)
    with threads(2):
        two = exe(a)
    close(one, want, k)
    np.testing.assert_array_equal(one, two)


def test_a_prefetch_is_checked_saved_and_evaluated_like_a_load() -> None:
    from kiln.errors import InternalError
    from kiln.loops import evaluate
    from kiln.loops.ir import For, Prefetch, Seq, Var
    from kiln.runtime.kernel_format import MalformedKernel, read_kernel, write_kernel

    src = Buffer("src", (64,), "float32")
    dst = Buffer("dst", (64,), "float32")

    def kernel(ahead: int) -> Kernel:
        i = Var("i")
        nxt = Binary("min", Binary("add", i, Const(ahead)), Const(63))
        body = For(i, Const(0), Const(64), Seq((
            Prefetch(Load(src, (nxt if ahead <= 16 else Binary("add", i, Const(ahead)),))),
            Store(dst, (i,), Binary("mul", Load(src, (i,)), Const(2.0, "float32"))))))
        return Kernel("pf", (src,), (dst,), body)

    good = verify(kernel(16))
    with pytest.raises(InternalError, match="src"):
        verify(kernel(17))  # i + 17 runs past the end: refused as a load would be
    data = rand(64)
    np.testing.assert_array_equal(evaluate(good, data)[0], data * 2)
    again = read_kernel(write_kernel(good))
    np.testing.assert_array_equal(evaluate(again, data)[0], data * 2)
    doc = write_kernel(good)
    bad = write_kernel(kernel(17))
    assert doc != bad
    with pytest.raises(MalformedKernel):
        read_kernel(bad)
    lib = compile_kernels([good])
    out = np.zeros(64, np.float32)
    lib["pf"](data, out)
    np.testing.assert_array_equal(out, data * 2)


def test_packing_is_not_vectorized_into_scatters() -> None:
    # The packing loops transpose (A's rows and dense's Bᵀ into panels); they are "scalar"
    # loops, which LLVM must not vectorize: on AVX-512 it scattered 8 lanes at a time, slower
    # than the scalar stores. The loop kind reaches LLVM as a hint, is saved and read back,
    # and the product stays right.
    from kiln.codegen.compile import llvm_ir
    from kiln.loops.printer import kernel_text
    from kiln.runtime.kernel_format import read_kernel, write_kernel

    t = Target.parse("llvm")
    m, n, k = 40, 70, 300
    x = kiln.var("x", shape=(m, k), dtype="float32")
    w = kiln.var("w", shape=(n, k), dtype="float32")
    with target_scope(t):
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], nn.dense(x, w))),
                         target=t)
    (f,) = exe.kernels.functions.values()
    assert "scalar" in kernel_text(f.kernel)
    assert '!"llvm.loop.vectorize.enable", i1 0' in llvm_ir(f.kernel, target=t)
    assert kernel_text(read_kernel(write_kernel(f.kernel))) == kernel_text(f.kernel)
    if t.arch == "x86_64" and t.has("avx512f"):
        assert "vscatter" not in assembly(f.kernel, target=t)
    a, b = rand(m, k), rand(n, k)
    close(exe(a, b), a.astype(np.float64) @ b.T.astype(np.float64), k)


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512])
@pytest.mark.parametrize("bx,m,ta,tb,a_way,b_way", [
    (4, 128, False, False, "in place", "in place"),  # an attention head's P·V
    (4, 128, True, False, "in place", "in place"),  # Pᵀ·dO: A's tile rows consecutive
    (4, 128, False, True, "in place", "packed"),  # Q·Kᵀ: B transposed is packed
    (1, 96, True, False, "in place", "in place"),  # A broadcast over the batch
    # no tile of half the rows or more divides M: A packed, B still read in place (ViT's
    # 197 tokens), unless transposed
    (4, 127, False, False, "packed", "in place"),
    (4, 127, False, True, "packed", "packed"),
])
def test_small_batched_products_read_operands_in_place(spec: str, bx: int, m: int, ta: bool,
                                                       tb: bool, a_way: str, b_way: str
                                                       ) -> None:
    from kiln.runtime.backend import lower

    t = Target.parse(spec)
    n, k = 64, 112
    xs = (bx, k, m) if ta else (bx, m, k)
    ys = (4, n, k) if tb else (4, k, n)
    x = kiln.var("x", shape=xs, dtype="float32")
    y = kiln.var("y", shape=ys, dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, y], nn.batch_matmul(
        x, y, transpose_a=ta, transpose_b=tb)))
    with target_scope(t):
        low = lower(mod, t, 3, upto="lower-kernels")
        exe = kiln.build(mod, target=t)
    (knobs,) = [d.kernel.attrs["schedules"][0][1] for d in low.program.kernels.values()]
    assert (knobs["a"], knobs["b"]) == (a_way, b_way)
    a, b = rand(*xs), rand(*ys)
    a64 = a.astype(np.float64).swapaxes(1, 2) if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).swapaxes(1, 2) if tb else b.astype(np.float64)
    close(exe(a, b), a64 @ b64, k)
