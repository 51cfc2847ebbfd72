"""An executable's own thread count: ``kiln.build(threads=)``, ``exe.set_threads``,
``kiln.load(threads=)`` — applied for each call, results unchanged, the process's count
given back (also when calls with different counts overlap)."""

from __future__ import annotations

import importlib
import threading
from contextlib import contextmanager

import numpy as np
import pytest

import kiln
from kiln.codegen import num_threads, set_num_threads
from kiln.op import nn
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(5)
# the module (kiln.codegen's attribute of that name is its `threads` context manager)
native_threads = importlib.import_module("kiln.codegen.threads")


def _mlp() -> tuple[kiln.IRModule, dict[str, np.ndarray]]:
    x = kiln.var("x", shape=(64, 300))
    w = kiln.var("w", shape=(400, 300))
    body = nn.relu(nn.dense(x, w))
    return kiln.IRModule.from_expr(kiln.Function([x, w], body)), {
        "w": RNG.standard_normal((400, 300)).astype(np.float32)}


def test_an_executable_runs_with_its_own_count(monkeypatch: pytest.MonkeyPatch) -> None:
    mod, params = _mlp()
    x = RNG.standard_normal((64, 300)).astype(np.float32)
    one = kiln.build(mod, params=params, threads=1)
    two = kiln.build(mod, params=params, threads=2)
    default = kiln.build(mod, params=params)
    assert (one.threads, two.threads, default.threads) == (1, 2, None)
    seen: list[int] = []
    real = native_threads.run_threads

    @contextmanager
    def spy(n: int):  # noqa: ANN202
        with real(n):
            seen.append(num_threads())
            yield

    monkeypatch.setattr(native_threads, "run_threads", spy)
    before = num_threads()
    results = [one(x), two(x), default(x)]
    assert seen == [1, 2]  # the default executable takes the process's count as it is
    assert num_threads() == before
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    want = np.maximum(x.astype(np.float64) @ params["w"].T.astype(np.float64), 0)
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)
    one.set_threads(None)
    assert one.threads is None
    one(x)
    assert seen == [1, 2]


def test_overlapping_counts_give_the_process_count_back() -> None:
    before = num_threads()
    with native_threads.run_threads(1):
        assert num_threads() == 1
        with native_threads.run_threads(3):
            assert num_threads() == 3
        assert num_threads() == 1
        set_num_threads(before)  # the process's count changes, the call's stays
        assert num_threads() == 1
    assert num_threads() == before


def test_calls_with_different_counts_from_several_threads() -> None:
    mod, params = _mlp()
    x = RNG.standard_normal((64, 300)).astype(np.float32)
    exes = [kiln.build(mod, params=params, threads=n) for n in (1, 2, 1, 2)]
    want = exes[0](x)
    before = num_threads()
    errors: list[BaseException] = []

    def work(exe: kiln.Executable) -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(exe(x), want)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    workers = [threading.Thread(target=work, args=(e,)) for e in exes]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors
    assert num_threads() == before


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_a_bad_count_is_a_clear_error(bad: object) -> None:
    mod, params = _mlp()
    with pytest.raises(kiln.Error, match="number of threads"):
        kiln.build(mod, params=params, threads=bad)  # type: ignore[arg-type]
    exe = kiln.build(mod, params=params)
    with pytest.raises(kiln.Error, match="number of threads"):
        exe.set_threads(bad)  # type: ignore[arg-type]


def test_a_loaded_executable_takes_a_count(tmp_path) -> None:  # noqa: ANN001
    mod, params = _mlp()
    path = tmp_path / "mlp.kiln"
    kiln.build(mod, params=params).save(path)
    exe = kiln.load(path, threads=1)
    assert exe.threads == 1
    x = RNG.standard_normal((64, 300)).astype(np.float32)
    np.testing.assert_array_equal(exe(x), kiln.load(path)(x))
