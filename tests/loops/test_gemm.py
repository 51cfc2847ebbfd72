"""The packed GEMM (kiln/loops/gemm.py) and the fast dense/batch_matmul kernels, compiled.

Oracles: numpy in float64 (and the reference interpreter for fused epilogues). Shapes are
chosen off the tile sizes (M, N, K not multiples of 6, 16 or kc; one row; K = 1; K larger
than kc, so partial sums go through Cp), the knobs are varied explicitly, and results with
one and two threads must be identical (each element is computed by the same instructions
whichever thread runs it).
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import assembly, compile_kernels, threads
from kiln.ir.traverse import post_order
from kiln.loops.gemm import GemmSchedule, gemm
from kiln.loops.ir import Binary, Buffer, Const, Kernel, Load, Store
from kiln.loops.lower import lower_primitive
from kiln.loops.verify import verify
from kiln.op import nn
from kiln.runtime.compiler import native_available

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
                name: str) -> Kernel:
    """``o[b] = x[b] @ w[b].T + 1`` with an explicit schedule."""
    x = Buffer("x", (batch, m, k), "float32")
    w = Buffer("w", (batch, n, k), "float32")
    o = Buffer("o", (batch, m, n), "float32")
    body = gemm(batch, m, n, k, lambda b, i, p: Load(x, (b, i, p)),
                lambda b, p, j: Load(w, (b, j, p)),
                lambda b, i, j, v: Store(o, (b, i, j), Binary("add", v, Const(1.0, "float32"))),
                "float32", schedule)
    return verify(Kernel(name, (x, w), (o,), body))


SCHEDULES = [
    (2, 30, 50, 40, GemmSchedule(6, 16, 16, 12, 32, "n")),
    (2, 30, 50, 40, GemmSchedule(6, 16, 13, 12, 16, "m", unroll=1)),
    (3, 30, 50, 40, GemmSchedule(4, 8, 20, 8, 24, "batch", unroll=4)),
    (1, 25, 9, 70, GemmSchedule(12, 8, 64, 24, 8, None, unroll=2)),
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


def test_default_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # the machine's cores, not KILN_NUM_THREADS: machine code must not depend on it
    before = GemmSchedule.default(1, 1024, 1024, 1024)
    monkeypatch.setenv("KILN_NUM_THREADS", "1")
    assert GemmSchedule.default(1, 1024, 1024, 1024) == before
    big = GemmSchedule.default(1, 1024, 1024, 1024, threads=2)
    assert (big.mr, big.nr, big.kc) == (6, 16, 256) and big.parallel == "n"
    assert big.mc % big.mr == 0 and big.nc % big.nr == 0
    assert GemmSchedule.default(1, 8, 8, 8, threads=2).parallel is None
    assert GemmSchedule.default(8, 128, 128, 64, threads=2).parallel == "batch"
    assert GemmSchedule.default(1, 512, 16, 4608, threads=2).parallel == "m"
    assert GemmSchedule.default(1, 100, 100, 1000, threads=1).parallel is None
    assert GemmSchedule.default(1, 10, 5, 9).nr == 8  # narrow: one vector wide


def test_micro_kernel_in_registers() -> None:
    # The K loop of the 6×16 tile: 12 ymm accumulators, FMAs, no stack traffic.
    asm = assembly(gemm_kernel(1, 24, 32, 64, GemmSchedule(6, 16, 64, 24, 32, None), "asm"))
    lines = asm.splitlines()
    loops: list[list[str]] = []  # label ... the jump back to it
    for start, line in enumerate(lines):
        if line.startswith(".LBB") and line.endswith(":"):
            label = line[:-1]
            for end in range(start + 1, len(lines)):
                if lines[end].split()[-1:] == [label] and lines[end].lstrip().startswith("j"):
                    loops.append(lines[start:end + 1])
                    break
    loop = min((b for b in loops if any("vfmadd" in x for x in b)), key=len, default=[])
    fmas = [x for x in loop if "vfmadd" in x]
    if not fmas:
        pytest.skip("the host CPU has no FMA")
    assert len(fmas) % 12 == 0 and all("ymm" in x for x in fmas)
    assert not any("rsp" in x or "rbp" in x for x in loop), "accumulators spilled"
