"""Tensors and arenas beyond KILN_MAX_ALLOC_BYTES are a kiln.Error naming them, never numpy's
MemoryError: refused by the memory planner at build time for static shapes, when a saved
executable is loaded, and at run time for the results of kernels of symbolic shape."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ssa.memory import alloc_limit, check_alloc, size_text

from .helpers import needs_native

EXECUTORS = [pytest.param("native", "llvm", marks=needs_native, id="native"),
             pytest.param("vm", "evaluator", id="vm")]


@pytest.mark.parametrize("executor, target", EXECUTORS)
def test_a_static_result_beyond_memory_is_refused_at_build(executor, target):
    mod = kiln.parse('def @main(%x: Tensor[(1), float32]) '
                     '{ add(zeros(shape=[1099511627776], dtype="float32"), %x) }')
    with pytest.raises(kiln.Error) as info:
        kiln.build(mod, target=target, executor=executor)
    text = str(info.value)
    assert text.startswith("@main: %0, the output of kernel @fused_zeros_add, would be "
                           "float32[1099511627776] (4.0 TiB), more than the limit of ")
    assert "KILN_MAX_ALLOC_BYTES" in text


def test_sizes_are_products_of_python_ints_that_cannot_overflow():
    # 2**32 cubed wraps to 0 in int64 arithmetic.
    with pytest.raises(kiln.Error, match=r"float32\[4294967296, 4294967296, 4294967296\] "
                                         r"\(281474976710656.0 PiB\)"):
        check_alloc("@main", "%0", (2**32, 2**32, 2**32), "float32")
    with pytest.raises(kiln.Error, match="negative dimension"):
        check_alloc("@main", "%0", (4, -1), "float32")


SMALL = """
def @main(%x: Tensor[(64, 64), float32], %w: Tensor[(64, 64), float32]) {
  let %a = nn.dense(%x, %w);
  let %b = nn.dense(%w, %x);
  nn.dense(%a, %b)
}
"""


@pytest.mark.parametrize("executor, target", EXECUTORS)
def test_the_limit_is_configurable_and_counts_tensors_and_arenas(executor, target, monkeypatch):
    mod = kiln.parse(SMALL)
    x, w = np.ones((64, 64), np.float32), np.eye(64, dtype=np.float32)
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "16K")  # each tensor is exactly 16 KiB
    with pytest.raises(kiln.Error, match=r"^@main: its arena \(the tensors that stay in its "
                                         r"frame\) would take 32.0 KiB, more than the limit "
                                         r"of 16.0 KiB"):
        kiln.build(mod, target=target, executor=executor)
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "15K")
    with pytest.raises(kiln.Error, match=r"would be float32\[64, 64\] \(16.0 KiB\), more than "
                                         r"the limit of 15.0 KiB"):
        kiln.build(mod, target=target, executor=executor)
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "65536")  # the native stack: 48 KiB
    exe = kiln.build(mod, target=target, executor=executor)
    np.testing.assert_allclose(exe(x, w), kiln.interpret(mod, x, w))


@pytest.mark.parametrize("executor, target", EXECUTORS)
def test_a_saved_executable_is_checked_again_when_loaded(executor, target, tmp_path,
                                                         monkeypatch):
    mod = kiln.parse(SMALL)
    path = tmp_path / "small.kiln"
    kiln.build(mod, target=target, executor=executor).save(path)
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "16K")
    # The native entry point's stack holds the arena of 32 KiB and its call tables.
    want = "its scratch stack .* would take 48.0 KiB" if executor == "native" else (
        "@main: its arena .* would take 32.0 KiB")
    with pytest.raises(kiln.Error, match=f"small.kiln: .*{want}, more than the limit of 16.0"):
        kiln.load(path)


DYNAMIC = """
def @main(%x: Tensor[(n, 1), float32], %y: Tensor[(1, m), float32]) { add(%x, %y) }
"""


def test_a_symbolic_result_beyond_the_limit_is_refused_at_run_time(monkeypatch):
    exe = kiln.build(kiln.parse(DYNAMIC), target="evaluator")
    monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", "1M")
    small = exe(np.ones((16, 1), np.float32), np.ones((1, 16), np.float32))
    np.testing.assert_array_equal(small, np.full((16, 16), 2, np.float32))
    with pytest.raises(kiln.EvalError, match=r"on inputs of shapes \(1024, 1\), \(1, 1024\): "
                                             r"its output 0 would be float32\[1024, 1024\] "
                                             r"\(4.0 MiB\), more than the limit of 1.0 MiB"):
        exe(np.ones((1024, 1), np.float32), np.ones((1, 1024), np.float32))


def test_a_symbolic_result_beyond_memory_is_not_a_memory_error():
    exe = kiln.build(kiln.parse(DYNAMIC), target="evaluator")
    big = np.ones((2**20, 1), np.float32)
    with pytest.raises(kiln.EvalError, match=r"float32\[1048576, 1048576\] \(4.0 TiB\)"):
        exe(big, big.reshape(1, -1))


def test_the_limit_variable(monkeypatch):
    monkeypatch.delenv("KILN_MAX_ALLOC_BYTES", raising=False)
    assert alloc_limit() > 2**20  # the machine's memory
    for text, want in [("4096", 4096), ("16K", 16 * 2**10), ("3 GiB", 3 * 2**30),
                       ("2t", 2 * 2**40), ("5MB", 5 * 2**20)]:
        monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", text)
        assert alloc_limit() == want, text
    for bad in ["lots", "-5", "0", "1.5G", "12X"]:
        monkeypatch.setenv("KILN_MAX_ALLOC_BYTES", bad)
        with pytest.raises(kiln.Error, match="KILN_MAX_ALLOC_BYTES=.* is not a size"):
            alloc_limit()
    assert size_text(1023) == "1023 B" and size_text(2**40) == "1.0 TiB"
