"""The dot-product kernel of batch-1 dense (kiln/loops/linear_kernels.py: `dot_rows`), compiled.

Oracle: numpy in float64. Shapes are chosen off the kernel's blocking — N not a multiple of
the rows of a block (so the remaining rows run one at a time), K with a vector tail and a
scalar tail, K shorter than one block's accumulators, several rows of x, narrow products over
many rows — and results with one and two threads must be identical (a large product runs
parallel over output columns, a narrow one over the rows of x).
For an AVX-512 Target the same kernel is compiled (not run) and uses zmm registers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kiln.codegen import assembly, compile_kernels, threads
from kiln.loops import linear_kernels as lk
from kiln.loops.ir import Buffer, For, Kernel, Seq, Store
from kiln.loops.verify import verify
from kiln.runtime.compiler import native_available
from kiln.target import Target

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def dot_kernel(m: int, n: int, k: int, name: str, target: Target | None = None) -> Kernel:
    x = Buffer("x", (m, k), "float32")
    w = Buffer("w", (n, k), "float32")
    o = Buffer("o", (m, n), "float32")
    body = lk.dot_rows(x, w, (m,), m, n, k, lambda idx, v: Store(o, idx, v), target)
    return verify(Kernel(name, (x, w), (o,), body))


@pytest.mark.parametrize(("m", "n", "k"), [
    (1, 1024, 256),   # an LSTM step's recurrent product: whole blocks of rows
    (1, 10, 100),     # N = 2 blocks + 2 rows; K: 6 vectors (one block chunk short) + 4
    (3, 7, 13),       # one block + 3 rows; K: one vector + 5 scalars, below a chunk
    (4, 5, 8),        # K exactly one vector
    (2, 3, 41),       # fewer rows than a block: all one at a time
    (1, 1030, 1030),  # big enough to run parallel on two cores
    # a narrow dense (`uses_dot`: at most one vector of units), the rows of x outermost
    (64, 10, 512),    # a classifier over a batch: 2 blocks + 2 rows, serial
    (300, 6, 600),    # 1 block + 2 rows, large enough to split the rows over the cores
    (33, 16, 17),     # K below a block's accumulators: every unit one at a time
    (9, 5, 40),
])
def test_dot_rows_matches_numpy_and_one_thread(m: int, n: int, k: int) -> None:
    kernel = dot_kernel(m, n, k, f"dot_{m}_{n}_{k}")
    f = compile_kernels([kernel])[kernel.name]
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k)).astype(np.float32)
    outs = []
    for count in (1, 2):
        out = np.full((m, n), np.nan, np.float32)
        with threads(count):
            f(x, w, out)
        outs.append(out)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_dot_rows_blocks_rows_and_runs_parallel_only_when_large() -> None:
    two = dataclasses.replace(Target.host(), cores=2, l2=1 << 20)
    one = dataclasses.replace(two, cores=1)

    def kinds(kernel: Kernel) -> list[str]:
        # the outer loops: the blocks of rows, then (a Seq) the rows left over
        body = kernel.body
        outer = list(body.stmts) if isinstance(body, Seq) else [body]
        return [s.kind for s in outer if isinstance(s, For)]

    assert kinds(dot_kernel(1, 10, 100, "dot_rest", two)) == ["serial", "serial"]
    assert "parallel" not in kinds(dot_kernel(1, 256, 256, "dot_small", two))
    # 1 MiB of weight (an LSTM step's): as large as a core's L2, so split over the cores
    assert "parallel" in kinds(dot_kernel(1, 1024, 256, "dot_lstm", two))
    # a narrow dense: one loop over the rows of x, split when the product is large
    assert kinds(dot_kernel(300, 6, 600, "dot_narrow", two)) == ["parallel"]
    assert kinds(dot_kernel(64, 10, 512, "dot_narrow_small", two)) == ["serial"]
    assert kinds(dot_kernel(300, 6, 600, "dot_narrow_one", one)) == ["serial"]
    assert "parallel" not in kinds(dot_kernel(1, 1024, 256, "dot_lstm1", one))
    assert "parallel" in kinds(dot_kernel(1, 4096, 1024, "dot_large", two))


def test_dot_rows_for_avx512_uses_zmm() -> None:
    t = Target.parse("llvm -mcpu=znver4")
    asm = assembly(dot_kernel(1, 37, 100, "dot_zmm", t), target=t)
    assert "zmm" in asm and "vfmadd" in asm
