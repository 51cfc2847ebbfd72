"""Executables under concurrency: several Python threads at once, and several native threads.

An executable called from 4 Python threads at once must give each caller its own right
answer (the native executor gives each thread its own frames; the VM each call), checked
against the reference interpreter. Kernels run with one thread must give exactly what they
give with several (parallel loops split work, never a reduction), set in-process with
`kiln.codegen.threads` and, for a saved executable, by ``KILN_NUM_THREADS`` in a fresh
process.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.testing.models import mlp

from .helpers import assert_same, needs_native

pytestmark = needs_native

LOOP = """
def @loop(%i: int32, %acc: Tensor[(256), float32], %w: Tensor[(256, 256), float32],
          %b: Tensor[(256), float32]) -> Tensor[(256), float32] {
  if (%i == 0) { %acc } else {
    let %h = reshape(nn.dense(reshape(%acc, newshape=[1, 256]), %w), newshape=[256]);
    @loop(%i - 1, tanh(%h) * 0.5f + %b, %w, %b)
  }
}
def @main(%x: Tensor[(256), float32], %w: Tensor[(256, 256), float32], %n: int32) {
  let %y = @loop(%n, %x, %w, %x * 0.5f);
  (%y, sum(%y))
}
"""

CALLS = 12


def _hammer(exe, cases, want) -> list[str]:
    """Run ``exe`` on every case from 4 threads at once; what went wrong, if anything."""
    barrier = threading.Barrier(4)
    problems: list[str] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for k in range(CALLS):
                i = (t + k) % len(cases)
                try:
                    assert_same(exe(*cases[i]), want[i], rtol=1e-4, atol=1e-5)
                except AssertionError as e:
                    problems.append(f"thread {t}, call {k}, case {i}: {e}")
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append(f"thread {t}: {type(e).__name__}: {e}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert not any(w.is_alive() for w in workers), "a thread did not finish"
    return problems


@pytest.mark.parametrize("executor", ["native", "vm"])
def test_four_python_threads_calling_a_model(executor):
    mod, params = mlp(batch=8, sizes=(256, 384, 128, 10))
    exe = kiln.build(mod, params=params, executor=executor)
    assert exe.stats().executor == executor
    rng = np.random.default_rng(0)
    cases = [(rng.standard_normal((8, 256)).astype("float32"),) for _ in range(6)]
    want = [kiln.interpret(mod, *c, params=params) for c in cases]
    assert not _hammer(exe, cases, want)


@pytest.mark.parametrize("executor", ["native", "vm"])
def test_four_python_threads_calling_a_loop(executor):
    # Loop state lives in the frames' slots: threads sharing them would see each other's.
    mod = kiln.parse(LOOP)
    exe = kiln.build(mod, executor=executor)
    assert exe.stats().executor == executor
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((256, 256)) / 32).astype("float32")
    cases = [(rng.standard_normal(256).astype("float32"), w, np.int32(n))
             for n in (0, 30, 110, 250, 60)]
    want = [kiln.interpret(mod, *c) for c in cases]
    assert not _hammer(exe, cases, want)


@pytest.mark.parametrize("executor", ["native", "vm"])
def test_one_native_thread_gives_what_several_give(executor):
    mod, params = mlp(batch=64)
    exe = kiln.build(mod, params=params, executor=executor)
    x = np.random.default_rng(2).standard_normal((64, 784)).astype("float32")
    with threads(1):
        one = exe(x)
    with threads(4):
        four = exe(x)
    np.testing.assert_array_equal(one, four)
    assert_same(one, kiln.interpret(mod, x, params=params), rtol=1e-4, atol=1e-5)


def test_kiln_num_threads_in_a_fresh_process(tmp_path):
    mod, params = mlp(batch=32, sizes=(512, 512, 10))
    path = tmp_path / "mlp.kiln"
    kiln.build(mod, params=params).save(path)
    x = np.random.default_rng(3).standard_normal((32, 512)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for n in ("1", "3"):
        script = (f"import numpy as np, kiln; from kiln.codegen import num_threads; "
                  f"exe = kiln.load({str(path)!r}); assert num_threads() == {n}; "
                  f"np.save({str(tmp_path / ('y' + n + '.npy'))!r}, "
                  f"exe(np.load({str(tmp_path / 'x.npy')!r})))")
        env = {**os.environ, "KILN_NUM_THREADS": n}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outs[n] = np.load(tmp_path / f"y{n}.npy")
    np.testing.assert_array_equal(outs["1"], outs["3"])
    assert_same(outs["1"], kiln.interpret(mod, x, params=params), rtol=1e-4, atol=1e-5)
