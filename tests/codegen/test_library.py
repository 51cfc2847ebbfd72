"""Loaded machine code: calling kernels, saving and loading object code, extra modules."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen import KernelLibrary, compile_kernels, kernel_symbol
from kiln.codegen.library import ObjectCode, pack_library, unpack_library
from kiln.loops.ir import Binary, Buffer, Check, Const, For, Kernel, Load, Seq, Store, Unary, Var
from kiln.target import Target

REPO = Path(__file__).resolve().parents[2]


def make(name: str, op: str = "tanh") -> Kernel:
    x, y, i = Buffer("x", (32,), "float32"), Buffer("y", (32,), "float32"), Var("i")
    body = For(i, Const(0), Const(32), Seq((
        Check(Binary("lt", Load(x, (i,)), Const(100.0, "float32")), f"{name}: x is too big"),
        Store(y, (i,), Unary(op, Load(x, (i,)))))), "vectorized")
    return Kernel(name, (x,), (y,), body)


X = np.linspace(-2, 2, 32, dtype=np.float32)


def call(lib: KernelLibrary, name: str, x: np.ndarray = X) -> np.ndarray:
    y = np.empty_like(x)
    lib[name](x, y)
    return y


def test_a_library_maps_names_to_kernels() -> None:
    ks = [make("a"), make("b", "exp")]
    lib = compile_kernels(ks)
    assert sorted(lib) == ["a", "b"] and len(lib) == 2
    assert lib["a"].kernel is ks[0]
    assert lib.symbol("a") == kernel_symbol(ks[0])
    assert lib.address("a") == lib.function_address(lib.symbol("a")) != 0
    np.testing.assert_allclose(call(lib, "a"), np.tanh(X), rtol=1e-6)
    with pytest.raises(kiln.EvalError, match="b: x is too big"):
        call(lib, "b", np.full(32, 1e3, dtype=np.float32))
    with pytest.raises(kiln.InternalError):
        compile_kernels([make("a"), make("a", "exp")])
    with pytest.raises(kiln.InternalError):
        lib.function_address("not_a_symbol")
    with pytest.raises(kiln.InternalError, match="unknown status"):
        lib["a"].fail(99)


def test_object_code_loads_back_in_this_process() -> None:
    ks = [make("a"), make("b", "exp")]
    blob = compile_kernels(ks).object_code
    again = KernelLibrary.from_object(blob, [make("a"), make("b", "exp")])
    np.testing.assert_allclose(call(again, "b"), np.exp(X), rtol=1e-6)
    assert again.stats.compiled == 0
    with pytest.raises(kiln.Error, match="does not define kernel"):
        KernelLibrary.from_object(blob, [make("c", "sigmoid")])


def test_object_code_loads_in_a_fresh_process_without_compiling(tmp_path: Path) -> None:
    blob = compile_kernels([make("a"), make("b", "erf")]).object_code
    path = tmp_path / "lib.bin"
    path.write_bytes(blob)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import kiln.codegen.compile as compile_stage
        def refuse(*args, **kwargs):
            raise AssertionError("the loader compiled something")
        compile_stage.compile_ir = refuse
        from kiln.codegen import KernelLibrary
        from tests.codegen.test_library import make, call
        blob = open({str(path)!r}, "rb").read()
        lib = KernelLibrary.from_object(blob, [make("a"), make("b", "erf")])
        np.save({str(tmp_path / "out.npy")!r}, call(lib, "b"))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, KILN_CACHE=""))
    assert done.returncode == 0, done.stderr
    import math
    want = np.array([math.erf(v) for v in X.astype(np.float64)])
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6)


def test_damaged_object_code_is_an_error_not_a_crash() -> None:
    blob = compile_kernels([make("a")]).object_code
    ks = [make("a")]
    rng = np.random.default_rng(5)
    cuts = [0, 1, 7, 8, 15, 16, 40, len(blob) // 2, len(blob) - 33, len(blob) - 1]
    for cut in cuts:
        with pytest.raises(kiln.Error):
            KernelLibrary.from_object(blob[:cut], ks)
    for pos in rng.integers(0, len(blob), size=25):
        damaged = bytearray(blob)
        damaged[pos] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(kiln.Error):
            KernelLibrary.from_object(bytes(damaged), ks)
    with pytest.raises(kiln.Error, match="format version"):
        KernelLibrary.from_object(blob[:7] + b"\x09" + blob[8:], ks)
    target, objects = unpack_library(blob)
    # Well-formed and checksummed, but not an object file inside: still an error.
    bogus = pack_library(target, [ObjectCode(objects[0].symbols, b"\x7fELF" + b"\0" * 60)])
    with pytest.raises(kiln.Error, match="not valid kiln machine code"):
        KernelLibrary.from_object(bogus, ks)


def test_machine_code_for_a_richer_cpu_is_refused() -> None:
    blob = compile_kernels([make("a")]).object_code
    info, objects = unpack_library(blob)
    host = Target.from_json(info)
    rich = dataclasses.replace(host, cpu="future", features=host.features | {"avx1024"})
    with pytest.raises(kiln.Error, match="lacks avx1024"):
        KernelLibrary.from_object(pack_library({**info, **rich.to_json()}, objects),
                                  [make("a")])
    # fields that do not match the fingerprint saved with them: a damaged header
    forged = {**info, **rich.to_json(), "fingerprint": host.fingerprint}
    with pytest.raises(kiln.Error, match="fingerprint"):
        KernelLibrary.from_object(pack_library(forged, objects), [make("a")])


def _program_ir(symbol: str, callee: str | None = None) -> str:
    callee = callee or symbol
    return textwrap.dedent(f"""
        declare i32 @{callee}(ptr)
        define i32 @program_{symbol}(ptr %x, ptr %y) {{
          %args = alloca [2 x ptr]
          store ptr %x, ptr %args
          %slot = getelementptr [2 x ptr], ptr %args, i64 0, i64 1
          store ptr %y, ptr %slot
          %status = call i32 @{callee}(ptr %args)
          ret i32 %status
        }}
    """)


def test_extra_modules_call_kernels_by_symbol_and_are_saved() -> None:
    k = make("a", "sigmoid")
    symbol = kernel_symbol(k)
    lib = compile_kernels([k], modules=[_program_ir(symbol)])
    entry = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)(
        lib.function_address(f"program_{symbol}"))
    y = np.empty_like(X)
    assert entry(X.ctypes.data, y.ctypes.data) == 0
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-X)), rtol=1e-6)
    again = KernelLibrary.from_object(lib.object_code, [make("a", "sigmoid")])
    assert again.function_address(f"program_{symbol}")
    cached = compile_kernels([k], modules=[_program_ir(symbol)])
    assert cached.stats.cache_hits == 2


def test_a_module_needing_a_missing_symbol_is_refused() -> None:
    k = make("a")
    with pytest.raises(kiln.Error, match="kiln_no_such_function"):
        compile_kernels([k], modules=[_program_ir(kernel_symbol(k), "kiln_no_such_function")])


def test_llvm_rejecting_generated_code_is_an_internal_error() -> None:
    with pytest.raises(kiln.InternalError, match="LLVM rejected"):
        compile_kernels([make("a")], modules=["define i32 @f() { ret i64 0 }"])
