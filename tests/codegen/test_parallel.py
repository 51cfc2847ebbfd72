"""Parallel loops on native threads: results equal the single-threaded ones and the
evaluator's; kernels may be called from several Python threads at once."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kiln
from kiln.codegen import compile_kernels, num_threads, threads
from kiln.codegen.threads import parallel_for_address
from kiln.loops.ir import (
    Allocate,
    Binary,
    Buffer,
    Cast,
    Const,
    For,
    Kernel,
    LetStmt,
    Load,
    Seq,
    Store,
    Unary,
    Var,
)

from .conftest import assert_same, sentinel

RNG = np.random.default_rng(11)


def row_softmax_like(rows: int, cols: int, heap: bool = False) -> Kernel:
    """Per row (in parallel): a local row buffer, a max, exp, a sum — plus a captured scale."""
    x = Buffer("x", (rows, cols), "float32")
    s = Buffer("s", (), "float32")
    y = Buffer("y", (rows, cols), "float32")
    tmp = Buffer("tmp", (cols if not heap else 20_000,), "float32", "local")
    acc = Buffer("acc", (1,), "float32", "local")
    i, j = Var("i"), Var("j")
    scale = Var("scale", "float32")
    z = (Const(0),)
    row = Seq((
        Store(acc, z, Const(float("-inf"), "float32")),
        For(j, Const(0), Const(cols), Store(acc, z, Binary("max", Load(acc, z),
                                                            Load(x, (i, j))))),
        For(j, Const(0), Const(cols), Store(tmp, (j,), Unary(
            "exp", Binary("sub", Load(x, (i, j)), Load(acc, z)))), "vectorized"),
        Store(acc, z, Const(0.0, "float32")),
        For(j, Const(0), Const(cols), Store(acc, z, Binary("add", Load(acc, z),
                                                            Load(tmp, (j,))))),
        For(j, Const(0), Const(cols), Store(y, (i, j), Binary("mul", Binary(
            "div", Load(tmp, (j,)), Load(acc, z)), scale)), "vectorized"),
    ))
    body = LetStmt(scale, Load(s, ()), For(i, Const(0), Const(rows),
                                           Allocate(tmp, Allocate(acc, row)), "parallel"))
    return Kernel(f"softmax{rows}x{cols}{'h' if heap else ''}", (x, s), (y,), body)


CHUNK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
PARALLEL_FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_int64)


def run_pool(n: int, grain: int, pause: float = 0.0) -> list[tuple[int, int, int]]:
    """``kiln_parallel_for`` over ``[0, n)`` with a Python chunk: (lo, hi, thread) of each."""
    ran: list[tuple[int, int, int]] = []

    def chunk(_data, lo: int, hi: int) -> None:
        ran.append((lo, hi, threading.get_ident()))
        time.sleep(pause)  # lets the GIL go, so that other threads' chunks overlap

    fn = CHUNK(chunk)
    PARALLEL_FOR(parallel_for_address())(ctypes.cast(fn, ctypes.c_void_p), None, n, grain)
    return ran


@pytest.mark.parametrize(("n", "grain", "count"),
                         [(0, 1, 2), (1, 1, 2), (10, 3, 2), (10, 3, 1), (7, 0, 3), (100, 7, 4),
                          (5, 100, 2)])
def test_the_pool_runs_every_chunk_exactly_once(n: int, grain: int, count: int) -> None:
    with threads(count):
        ran = run_pool(n, grain)
    covered = sorted(i for lo, hi, _ in ran for i in range(lo, hi))
    assert covered == list(range(n))
    if count > 1 and n:
        g = max(grain, 1)
        assert sorted((lo, hi) for lo, hi, _ in ran) == [
            (lo, min(lo + g, n)) for lo in range(0, n, g)]


def test_the_pool_shares_chunks_between_threads() -> None:
    assert num_threads() >= 1
    with threads(2):
        # Each chunk sleeps 20 ms; a worker that is awake takes some. Retried, since on a
        # loaded machine the worker may not get a core in time — the caller then runs all.
        helped = any(len({t for _, _, t in run_pool(8, 1, 0.02)}) > 1 for _ in range(10))
    assert helped


def test_each_thread_starts_with_its_own_range_of_chunks() -> None:
    # The caller claims chunks 0, 1, ... of its half first and a worker that joins starts at
    # the other half, so that a thread keeps the same chunks (and their data in its caches)
    # from call to call. Retried: on a loaded machine the worker may join late or not at all.
    with threads(2):
        for _ in range(10):
            ran = run_pool(8, 1, 0.02)
            firsts: dict[int, int] = {}
            for lo, _, t in ran:
                firsts.setdefault(t, lo)
            if len(firsts) == 2:
                break
    assert sorted(firsts.values()) == [0, 4], ran
    caller = threading.get_ident()
    assert firsts[caller] == 0
    covered = sorted(lo for lo, _, _ in ran)
    assert covered == list(range(8))


def test_back_to_back_regions_each_run_every_chunk_once() -> None:
    # Regions follow each other with no pause, so a worker is often still leaving the last
    # one when the next is published (the next region then runs on the caller alone): every
    # region must still run each of its chunks exactly once, on whichever threads.
    with threads(2):
        for r in range(300):
            n = 3 + r % 7
            ran = run_pool(n, 1)
            assert sorted((lo, hi) for lo, hi, _ in ran) == [(i, i + 1) for i in range(n)] \
                or sorted((lo, hi) for lo, hi, _ in ran) == [(0, n)]


def test_a_compiled_parallel_kernel_called_many_times_matches_one_thread() -> None:
    kernel = row_softmax_like(64, 33)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    s = np.array(1.5, np.float32)
    f = compile_kernels([kernel])[kernel.name]
    with threads(1):
        want = np.empty((64, 33), np.float32)
        f(x, s, want)
    with threads(2):
        for _ in range(2000):
            got = np.full((64, 33), np.nan, np.float32)
            f(x, s, got)
            np.testing.assert_array_equal(got, want)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(want, e / e.sum(axis=1, keepdims=True) * 1.5, rtol=1e-5)


def test_concurrent_callers_of_the_pool_each_get_all_their_chunks() -> None:
    results: list[list[tuple[int, int, int]]] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def call(k: int) -> None:
        barrier.wait()
        for _ in range(5):
            results[k] += run_pool(50 + k, 3, 0.0005)

    with threads(2):
        ts = [threading.Thread(target=call, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    for k, ran in enumerate(results):
        assert sorted(i for lo, hi, _ in ran for i in range(lo, hi)) == sorted(
            list(range(50 + k)) * 5)


@pytest.mark.parametrize(("rows", "cols"), [(1, 5), (2, 3), (3, 17), (64, 33), (257, 8)])
def test_parallel_rows_match_the_evaluator_and_one_thread(rows: int, cols: int) -> None:
    k = row_softmax_like(rows, cols)
    x = RNG.standard_normal((rows, cols)).astype("float32")
    s = np.array(2.0, dtype="float32")
    with threads(2):
        (many,) = assert_same(k, x, s, rtol=1e-5, atol=1e-7)
    with threads(1):
        (one,) = assert_same(k, x, s, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(many, one)


def test_a_loops_chunks_set_its_grain() -> None:
    # A parallel loop of 14 iterations on 2 threads: the default 4 chunks a thread give a
    # grain of 14 // 8 = 1 (rounded up it was 2: 7 chunks, split 4 and 3 between the
    # threads); 16 a thread, the same. The grain is what the kernel passes the pool.
    from kiln.codegen.compile import llvm_ir

    x, y = Buffer("x", (14, 33), "float32"), Buffer("y", (14, 33), "float32")
    i, j = Var("i"), Var("j")
    data = RNG.standard_normal((14, 33)).astype(np.float32)
    for chunks in (4, 16):
        body = For(i, Const(0), Const(14), For(j, Const(0), Const(33), Store(y, (i, j), Binary(
            "mul", Load(x, (i, j)), Const(3.0, "float32")))), "parallel", chunks)
        kernel = Kernel(f"triple{chunks}", (x,), (y,), body)
        text = llvm_ir(kernel, opt_level=0)
        share = re.search(r'(%"[^"]+") = mul nsw i64 %"[^"]+", (\d+)\n\s+(%"[^"]+") = sdiv '
                          r'i64 14, (%"[^"]+")\n.*@"kiln_parallel_for"\(.*i64 14, i64 (%"[^"]+")\)',
                          text)
        assert share is not None and int(share.group(2)) == chunks
        # 14 // (threads · chunks), rounded down, is the grain passed
        assert share.group(1) == share.group(4) and share.group(3) == share.group(5)
        lib = compile_kernels([kernel])
        for count in (1, 2):
            out = np.full((14, 33), np.nan, np.float32)
            with threads(count):
                lib[kernel.name](data, out)
            np.testing.assert_array_equal(out, data * np.float32(3))


def test_heap_buffers_inside_parallel_iterations() -> None:
    k = row_softmax_like(9, 40, heap=True)
    x = RNG.standard_normal((9, 40)).astype("float32")
    s = np.array(1.0, dtype="float32")
    lib = compile_kernels([k])
    outs = []
    for n in (1, 2, 3):
        y = sentinel((9, 40), "float32")
        with threads(n):
            lib[k.name](x, s, y)
        outs.append(y)
    np.testing.assert_allclose(outs[0], np.exp(x - x.max(1, keepdims=True))
                               / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True),
                               rtol=1e-5)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_a_parallel_loop_with_an_offset_start_and_int32_variable() -> None:
    x = Buffer("x", (100,), "int32")
    y = Buffer("y", (100,), "int32")
    i = Var("i", "int32")
    body = Seq((
        Store(y, (Const(0),), Const(-1, "int32")),
        For(i, Const(3, "int32"), Const(90, "int32"), Store(
            y, (Cast("int64", i),), Binary("mul", Load(x, (Cast("int64", i),)), i)), "parallel"),
    ))
    k = Kernel("offset", (x,), (y,), body)
    with threads(2):
        assert_same(k, RNG.integers(-50, 50, size=100).astype("int32"))


def test_the_thread_count_comes_from_the_environment() -> None:
    script = textwrap.dedent("""
        import numpy as np
        from kiln.codegen import compile_kernels, num_threads
        from tests.codegen.test_parallel import row_softmax_like
        k = row_softmax_like(300, 64)
        x = np.random.default_rng(3).standard_normal((300, 64)).astype("float32")
        y = np.empty_like(x)
        compile_kernels([k])[k.name](x, np.array(1.5, dtype="float32"), y)
        print(num_threads())
        np.save(__import__("sys").argv[1], y)
    """)
    results = []
    for count in ("1", "2"):
        out = os.path.join(os.environ["KILN_CACHE"], f"threads{count}.npy")
        env = dict(os.environ, KILN_NUM_THREADS=count)
        done = subprocess.run([sys.executable, "-c", script, out], env=env, text=True,
                              capture_output=True, timeout=300, cwd=_repo())
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == count
        results.append(np.load(out))
    np.testing.assert_array_equal(results[0], results[1])
    env = dict(os.environ, KILN_NUM_THREADS="many")
    done = subprocess.run([sys.executable, "-c", "import kiln.codegen as c; c.num_threads()"],
                          env=env, text=True, capture_output=True, timeout=300, cwd=_repo())
    assert done.returncode != 0 and "KILN_NUM_THREADS must be a positive integer" in done.stderr


def _repo() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_set_num_threads_rejects_nonsense() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(kiln.Error):
            kiln.codegen.set_num_threads(bad)  # type: ignore[arg-type]


def test_workers_may_stay_awake_longer() -> None:
    # KILN_SPIN_MS / set_spin_ms: how long idle workers yield before they sleep; the chunks
    # still run exactly once, and results do not change
    from kiln.codegen import set_spin_ms, spin_ms

    before = spin_ms()
    k = row_softmax_like(300, 64)
    x = RNG.standard_normal((300, 64)).astype(np.float32)
    f = compile_kernels([k])[k.name]
    want = np.empty_like(x)
    f(x, np.array(1.5, dtype="float32"), want)
    try:
        set_spin_ms(20)
        assert spin_ms() == 20
        with threads(2):
            for _ in range(3):
                got = np.empty_like(x)
                f(x, np.array(1.5, dtype="float32"), got)
                np.testing.assert_array_equal(got, want)
                time.sleep(0.03)  # past the spin: the workers sleep, and are woken again
            assert sorted(c for c, _, _ in run_pool(40, 1)) == list(range(40))
    finally:
        set_spin_ms(before)
    for bad in (-1, 1e9, "5", True):
        with pytest.raises(kiln.Error, match="milliseconds"):
            set_spin_ms(bad)  # type: ignore[arg-type]
    env = dict(os.environ, KILN_SPIN_MS="soon")
    done = subprocess.run([sys.executable, "-c", "import kiln.codegen as c; c.num_threads()"],
                          env=env, text=True, capture_output=True, timeout=300, cwd=_repo())
    assert done.returncode != 0 and "KILN_SPIN_MS must be a number" in done.stderr
    env = dict(os.environ, KILN_SPIN_MS="7.5")
    done = subprocess.run([sys.executable, "-c", "import kiln.codegen as c; print(c.spin_ms())"],
                          env=env, text=True, capture_output=True, timeout=300, cwd=_repo())
    assert done.returncode == 0 and done.stdout.split()[-1] == "7.5", done.stderr


def test_four_python_threads_call_compiled_kernels_at_once() -> None:
    parallel = row_softmax_like(128, 64)
    a, b, i = Buffer("a", (4096,), "float64"), Buffer("b", (4096,), "float64"), Var("i")
    serial = Kernel("scale", (a,), (b,), For(i, Const(0), Const(4096), Store(
        b, (i,), Binary("mul", Unary("sqrt", Load(a, (i,))), Const(3.0, "float64"))),
        "vectorized"))
    lib = compile_kernels([parallel, serial])
    s = np.array(1.0, dtype="float32")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                x = rng.standard_normal((128, 64)).astype("float32")
                y = np.empty_like(x)
                lib[parallel.name](x, s, y)
                e = np.exp(x - x.max(1, keepdims=True))
                np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-8)
                u = rng.random(4096)
                v = np.empty_like(u)
                lib["scale"](u, v)
                np.testing.assert_array_equal(v, np.sqrt(u) * 3.0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with threads(2):
        workers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert not errors, errors[0]


def test_lowered_kernels_with_parallel_loops() -> None:
    import kiln as k_
    from kiln.ir.traverse import post_order
    from kiln.loops.lower import lower_primitive

    text = """
    def @main(%x: Tensor[(256, 160), float32], %y: Tensor[(160), float32]) {
      tanh(add(multiply(%x, %y), %y))
    }
    """
    mod = k_.infer_types(k_.optimize(k_.parse(text)))
    (fn,) = [n for n in post_order(mod["main"]) if isinstance(n, k_.Function)
             and n.attrs.get("Primitive")]
    kernel = lower_primitive(fn, "big")
    assert "parallel" in str(kernel)
    x = RNG.standard_normal((256, 160)).astype("float32")
    y = RNG.standard_normal(160).astype("float32")
    lib = compile_kernels([kernel])
    outs = []
    for n in (1, 2):
        out = np.empty((256, 160), dtype="float32")
        with threads(n):
            lib["big"](x, y, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], np.tanh(x * y + y), rtol=1e-6, atol=1e-7)


def test_parallel_loops_with_no_iterations_or_a_computed_extent() -> None:
    x = Buffer("x", (50,), "float32")
    n = Buffer("n", (), "int64")
    y = Buffer("y", (50,), "float32")
    i, j, m = Var("i"), Var("j"), Var("m")
    body = Seq((
        For(i, Const(0), Const(0), Store(y, (i,), Const(1.0, "float32")), "parallel"),
        LetStmt(m, Binary("max", Binary("min", Load(n, ()), Const(50)), Const(0)), For(
            j, Const(0), m, Store(y, (j,), Unary("exp", Load(x, (j,)))), "parallel")),
    ))
    k = Kernel("computed", (x, n), (y,), body)
    xs = RNG.standard_normal(50).astype("float32")
    for count in (0, 1, 7, 50, -3):
        with threads(2):
            assert_same(k, xs, np.array(count, dtype="int64"), rtol=1e-6)


_MMAPPED_BLOCKS = """
import ctypes, kiln.codegen as c
c.num_threads()  # starts the native runtime
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
before = libc.mallinfo2().hblks
p = libc.malloc(8 << 20)
print(libc.mallinfo2().hblks - before)
"""


def test_big_blocks_come_from_the_heap_once_the_runtime_starts() -> None:
    # kiln/codegen/memory.py: an 8 MiB block (a kernel's planes, a result) is not mmapped
    # (and unmapped at its free, its pages faulted in again next call) unless asked
    if sys.platform != "linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("needs glibc's mallinfo2 (Linux, glibc 2.33 or newer)")
    counts = {}
    for keep in ("1", "0"):
        env = dict(os.environ, KILN_KEEP_MEMORY=keep)
        done = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS], env=env, text=True,
                              capture_output=True, timeout=300, cwd=_repo())
        assert done.returncode == 0, done.stderr
        counts[keep] = int(done.stdout.split()[-1])
    assert counts == {"1": 0, "0": 1}
    env = dict(os.environ, KILN_KEEP_MEMORY="yes")
    done = subprocess.run([sys.executable, "-c", "import kiln.codegen as c; c.num_threads()"],
                          env=env, text=True, capture_output=True, timeout=300, cwd=_repo())
    assert done.returncode != 0 and "KILN_KEEP_MEMORY must be 0 or 1" in done.stderr


def test_workers_run_a_region_in_its_callers_floating_point_mode() -> None:
    # Inside flush_denormals every chunk, on whichever thread, flushes a subnormal product
    # to zero (numpy's float32 multiply runs on the thread's SSE mode); outside it, and on
    # the workers afterwards, the product is the subnormal again.
    from kiln.codegen import flush_denormals

    tiny = np.float32(1e-20)
    want = tiny * tiny
    assert want != 0
    if kiln.Target.host().arch == "x86_64":  # elsewhere the mode is not carried
        seen: list[tuple[int, bool]] = []

        def chunk(_data, lo: int, hi: int) -> None:
            seen.append((threading.get_ident(), bool(tiny * tiny == 0)))
            time.sleep(0.02)

        fn = CHUNK(chunk)
        run = PARALLEL_FOR(parallel_for_address())
        with threads(2):
            for _ in range(10):  # until a worker took a chunk (see the test above)
                seen.clear()
                with flush_denormals():
                    run(ctypes.cast(fn, ctypes.c_void_p), None, 8, 1)
                if len({t for t, _ in seen}) > 1:
                    break
            assert len({t for t, _ in seen}) > 1
            assert all(flushed for _, flushed in seen)
            seen.clear()
            run(ctypes.cast(fn, ctypes.c_void_p), None, 8, 1)
            assert not any(flushed for _, flushed in seen)
    with pytest.raises(RuntimeError):
        with flush_denormals():
            raise RuntimeError("the mode comes back even so")
    assert tiny * tiny == want
    with flush_denormals(False):
        assert tiny * tiny == want


def _cpu() -> int:
    """The CPU this thread runs on now (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


_CPU_CHUNK = """
declare i32 @sched_getcpu()
declare i64 @pthread_self()
declare i32 @usleep(i32)
define void @chunk(ptr %data, i64 %lo, i64 %hi) {
  %cpu = call i32 @sched_getcpu()
  %me = call i64 @pthread_self()
  %at = mul i64 %lo, 2
  %tid.p = getelementptr i64, ptr %data, i64 %at
  store i64 %me, ptr %tid.p
  %cpu.at = add i64 %at, 1
  %cpu.p = getelementptr i64, ptr %data, i64 %cpu.at
  %cpu.64 = sext i32 %cpu to i64
  store i64 %cpu.64, ptr %cpu.p
  %r = call i32 @usleep(i32 5000)
  ret void
}
"""


def _native_cpu_chunk():
    """A chunk in machine code that records (thread, CPU) at its start and then sleeps 5 ms:
    a Python chunk would wait for the GIL first, and a scheduler may move a waiting thread
    to whichever CPU is idle, so its CPU would say nothing of where the worker woke."""
    import llvmlite.binding as llvm

    from kiln.codegen.target import initialize, machine

    initialize()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(_CPU_CHUNK),
                                        machine(kiln.Target.host(), 2).new_machine())
    engine.finalize_object()
    return engine, engine.get_function_address("chunk")


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs this process may use")
def test_a_woken_worker_runs_off_its_callers_cpu_and_stays_free_to_move() -> None:
    # A scheduler may wake a sleeping worker on its waker's CPU (a VM's scheduler packing
    # vCPUs did, every time): it then waits for the caller, which runs every chunk itself.
    # The pool sends each sleeping worker to a CPU other than its caller's before waking it,
    # and the worker frees its affinity once it runs.
    allowed = os.sched_getaffinity(0)
    engine, chunk = _native_cpu_chunk()
    seen = (ctypes.c_int64 * 16)()
    run = PARALLEL_FOR(parallel_for_address())
    me = threading.get_ident()
    apart, rounds = 0, []
    with threads(2):
        run(chunk, ctypes.cast(seen, ctypes.c_void_p), 4, 1)  # the worker exists
        for _ in range(6):
            time.sleep(0.08)  # past the workers' spinning: they sleep
            ctypes.memset(seen, 0, ctypes.sizeof(seen))
            caller = _cpu()
            run(chunk, ctypes.cast(seen, ctypes.c_void_p), 8, 1)
            pairs = [(seen[2 * i], seen[2 * i + 1]) for i in range(8)]
            rounds.append((caller, pairs))
            apart += any(t != me and cpu != caller for t, cpu in pairs)
    del engine
    assert apart >= 3, rounds
    for task in os.listdir("/proc/self/task"):
        try:
            assert os.sched_getaffinity(int(task)) == allowed, task
        except ProcessLookupError:  # a thread that has just ended
            pass


_CROWDED_CORE = """
import os, subprocess, sys, time
import numpy as np
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})  # before the pool starts: its workers share this one core
spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                           preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
try:
    from kiln.codegen import compile_kernels, threads
    from tests.codegen.test_parallel import row_softmax_like, run_pool
    kernel = row_softmax_like(64, 33)
    f = compile_kernels([kernel])[kernel.name]
    x = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float32)
    s = np.array(1.5, np.float32)
    with threads(1):
        want = np.empty_like(x)
        f(x, s, want)
    with threads(2):
        for _ in range(300):
            got = np.full_like(x, np.nan)
            f(x, s, got)
            assert np.array_equal(got, want)
        helped = 0
        for _ in range(10):
            time.sleep(0.01)
            ran = run_pool(8, 1, 0.02)
            assert sorted(lo for lo, _, _ in ran) == list(range(8)), ran
            helped += len({t for _, _, t in ran}) > 1
    print("helped", helped)
finally:
    spinner.kill()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's CPU affinity")
def test_workers_on_a_core_another_process_keeps_busy_still_join_regions() -> None:
    # Another process spinning on the workers' core makes their yields lose the core for a
    # scheduler slice; they then sleep after their pause checks (pool.py, YIELD_LOST_NS) and
    # must still be woken for every later region: results equal one thread's, every chunk
    # runs once, and a worker helps regions whose chunks leave the core (sleep).
    done = subprocess.run([sys.executable, "-c", _CROWDED_CORE], text=True,
                          capture_output=True, timeout=300, cwd=_repo())
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 3, done.stdout
