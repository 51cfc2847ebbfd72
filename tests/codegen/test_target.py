"""kiln.Target: parsing the spec forms, host detection, fingerprints, and code for a target
this host cannot run (built, never run).

Oracles: /proc/cpuinfo's flags for host detection, the ELF header's e_machine for objects of
another architecture, numpy for results.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen import assembly, compile_kernels
from kiln.loops.gemm import gemm
from kiln.loops.ir import Buffer, Kernel, Load, Store
from kiln.loops.schedule import target_scope
from kiln.loops.verify import verify
from kiln.op import nn
from kiln.target import Target

EM_X86_64, EM_AARCH64 = 62, 183
NO_AVX512 = "llvm -mattr=-avx512f"


def cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


# --- parsing -------------------------------------------------------------------------------


def test_llvm_is_the_host() -> None:
    host = Target.host()
    assert Target.parse("llvm") == host and Target.parse("  llvm  ") == host
    assert Target.parse(host) is host
    assert Target.parse(f"llvm -mcpu={host.cpu}") == host
    assert Target.parse("llvm -mcpu=native") == host
    assert host.is_host and kiln.Target is Target


def test_host_detection_agrees_with_cpuinfo() -> None:
    host = Target.host()
    flags = cpuinfo_flags()
    for flag in ("avx2", "avx512f", "fma", "avx"):
        if flag in flags:
            assert host.has(flag), flag
    if "avx512f" in flags:
        assert (host.vector_bits, host.registers, host.lanes("float32")) == (512, 32, 16)
    elif "avx2" in flags:
        assert (host.vector_bits, host.registers, host.lanes("float32")) == (256, 16, 8)
    assert host.l1d >= 16 * 1024 and host.l2 >= host.l1d and host.l3 >= 0
    assert 1 <= host.cores <= 4096


def test_removing_avx512f_gives_avx2_code() -> None:
    host = Target.host()
    if host.arch != "x86_64":
        pytest.skip("an x86-64 host")
    t = Target.parse(NO_AVX512)
    assert not any(f.startswith("avx512") for f in t.features)
    assert t.cpu == host.cpu and t.is_host
    assert (t.l1d, t.l2, t.l3, t.cores) == (host.l1d, host.l2, host.l3, host.cores)
    if host.has("avx2"):
        assert (t.vector_bits, t.registers, t.lanes("float32"), t.lanes("float64")) == (
            256, 16, 8, 4)
        assert "-avx512f" in t.llvm_features.split(",") and "+avx2" in t.llvm_features
    if host.has("avx512f"):
        assert t.fingerprint != host.fingerprint and t != host
    # removing avx2 takes what needs it (AVX-512, AVX-VNNI) too
    no_avx2 = Target.parse("llvm -mattr=-avx2")
    assert not no_avx2.has("avx2") and not no_avx2.has("avx512f")
    assert not no_avx2.has("avxvnni")
    # adding a feature back
    assert Target.parse("llvm -mattr=-avx512f,+avx512f").has("avx512f")
    # removing AMX's tiles takes its products with them (a Sapphire Rapids without AMX)
    spr = Target.parse("llvm -mcpu=sapphirerapids -mattr=-amx-tile")
    assert not any(f.startswith("amx-") for f in spr.features) and spr.has("avx512vnni")


def test_named_cpus_and_triples() -> None:
    v3 = Target.parse("llvm -mcpu=x86-64-v3 -mtriple=x86_64-unknown-linux-gnu")
    assert v3.cpu == "x86-64-v3" and v3.has("avx2") and v3.has("fma")
    assert (v3.vector_bits, v3.registers) == (256, 16)
    zen5 = Target.parse("llvm -mcpu=znver5 -mtriple=x86_64-unknown-linux-gnu")
    assert zen5.has("avx512f") and zen5.has("avx512vnni") and zen5.has("avxvnni")
    arm = Target.parse("aarch64-linux-gnu")
    assert arm == Target.parse("llvm -mtriple=aarch64-linux-gnu")
    assert arm.arch == "aarch64" and arm.has("neon") and arm.cpu == "generic"
    assert (arm.vector_bits, arm.registers, arm.lanes("float32")) == (128, 32, 4)
    assert Target.parse("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1").has("sve")
    if Target.host().arch != "aarch64":
        assert not arm.is_host


@pytest.mark.parametrize("spec", ["llvm", NO_AVX512, "aarch64-linux-gnu",
                                  "llvm -mcpu=x86-64-v4 -mtriple=x86_64-unknown-linux-gnu"])
def test_str_is_canonical(spec: str) -> None:
    t = Target.parse(spec)
    assert Target.parse(str(t)) == t
    assert Target.from_json(t.to_json()) == t
    assert str(t).startswith(f"llvm -mtriple={t.triple} -mcpu={t.cpu} -mattr=")
    assert len(t.fingerprint) == 16 and t.fingerprint == Target.parse(spec).fingerprint


def test_fingerprint_is_what_changes_machine_code() -> None:
    host = Target.host()
    # caches and cores change the loop IR (part of each kernel's fingerprint), not the code
    # LLVM makes from it
    assert dataclasses.replace(host, cores=host.cores + 1).fingerprint == host.fingerprint
    assert dataclasses.replace(host, cpu="other").fingerprint != host.fingerprint
    assert dataclasses.replace(host, features=host.features | {"x"}).fingerprint \
        != host.fingerprint


@pytest.mark.parametrize("spec,message", [
    ("", "empty target"),
    ("cuda", "must start with 'llvm' or a triple"),
    ("llvm -mcpu", "malformed option '-mcpu'"),
    ("llvm -O3", "malformed option '-O3'"),
    ("llvm -mfoo=1", "unknown option '-mfoo'"),
    ("llvm -mcpu=pentium9", "unknown CPU 'pentium9'"),
    ("riscv64-linux-gnu", "unknown target triple 'riscv64-linux-gnu'"),
    ("llvm -mtriple=sparc-sun-solaris", "unknown target triple"),
    ("llvm -mattr=+", "malformed feature '\\+'"),
    ("evaluator", "not a machine"),
])
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(kiln.Error, match=message):
        Target.parse(spec)


def test_not_a_spec() -> None:
    with pytest.raises(kiln.Error, match="not int"):
        Target.parse(3)  # type: ignore[arg-type]
    with pytest.raises(kiln.Error, match="unknown dtype"):
        Target.host().lanes("complex64")


# --- code for each target ------------------------------------------------------------------


def gemm_kernel(m: int, n: int, k: int, target: Target) -> Kernel:
    x = Buffer("x", (m, k), "float32")
    w = Buffer("w", (n, k), "float32")
    o = Buffer("o", (m, n), "float32")
    body = gemm(1, m, n, k, lambda b, i, p: Load(x, (i, p)), lambda b, p, j: Load(w, (j, p)),
                lambda b, i, j, v: Store(o, (i, j), v), target=target)
    return verify(Kernel("g", (x, w), (o,), body))


def e_machine(obj: bytes) -> int:
    assert obj[:4] == b"\x7fELF"
    return struct.unpack_from("<H", obj, 18)[0]


def test_an_aarch64_build_makes_an_object_and_refuses_to_run() -> None:
    arm = Target.parse("aarch64-linux-gnu")
    kernel = gemm_kernel(9, 13, 20, arm)
    lib = compile_kernels([kernel], arm)
    assert not lib.runnable and [e_machine(o.data) for o in lib.objects] == [EM_AARCH64]
    assert "fmla" in assembly(kernel, target=arm)
    x, w = np.ones((9, 20), np.float32), np.ones((13, 20), np.float32)
    with pytest.raises(kiln.Error, match="built for aarch64-linux-gnu.*this host is .*kiln export"):
        lib["g"](x, w, np.empty((9, 13), np.float32))
    # its saved machine code is refused too
    with pytest.raises(kiln.Error, match="built for aarch64-linux-gnu"):
        kiln.codegen.KernelLibrary.from_object(lib.object_code, [kernel])
    # the cache keeps the targets apart
    host = compile_kernels([gemm_kernel(9, 13, 20, arm)])
    expected = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}[Target.host().arch]
    assert host.runnable and e_machine(host.objects[0].data) == expected


def test_an_aarch64_executable_is_built_saved_and_refused(tmp_path: Path) -> None:
    x = kiln.var("x", shape=(7, 30), dtype="float32")
    w = kiln.var("w", shape=(11, 30), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.relu(nn.dense(x, w))))
    with target_scope("aarch64-linux-gnu"):
        exe = kiln.build(mod, target="aarch64-linux-gnu")
    a, b = np.ones((7, 30), np.float32), np.ones((11, 30), np.float32)
    with pytest.raises(kiln.Error, match="aarch64-linux-gnu"):
        exe(a, b)
    path = tmp_path / "arm.kiln"
    exe.save(path)
    with pytest.raises(kiln.Error, match=r"arm\.kiln: it was built for aarch64-linux-gnu"):
        kiln.load(path)


def test_host_build_saves_and_loads_its_target(tmp_path: Path) -> None:
    t = Target.parse(NO_AVX512)
    x = kiln.var("x", shape=(20, 33), dtype="float32")
    w = kiln.var("w", shape=(17, 33), dtype="float32")
    mod = kiln.IRModule.from_expr(kiln.Function([x, w], nn.dense(x, w)))
    with target_scope(t):
        exe = kiln.build(mod, target=t)
    a = np.random.default_rng(0).standard_normal((20, 33)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((17, 33)).astype(np.float32)
    want = a.astype(np.float64) @ b.T.astype(np.float64)
    np.testing.assert_allclose(exe(a, b), want, rtol=1e-4, atol=1e-4)
    exe.save(tmp_path / "m.kiln")
    back = kiln.load(tmp_path / "m.kiln")
    assert back.kernels.target == t
    np.testing.assert_allclose(back(a, b), want, rtol=1e-4, atol=1e-4)


def test_assembly_width_follows_the_target() -> None:
    host = Target.host()
    if host.arch != "x86_64" or not host.has("avx2"):
        pytest.skip("an x86-64 host with AVX2")
    narrow = Target.parse(NO_AVX512)
    asm = assembly(gemm_kernel(30, 70, 50, narrow), target=narrow)
    assert "ymm" in asm and "zmm" not in asm
    if host.has("avx512f"):
        assert "zmm" in assembly(gemm_kernel(30, 70, 50, host), target=host)


def test_loops_llvm_vectorizes_take_the_whole_avx512_width() -> None:
    # LLVM's tuning of Intel's AVX-512 CPUs prefers 256-bit vectors for the loops it
    # vectorizes itself; kiln turns that off where the target has AVX-512 (and only there)
    from kiln.codegen.target import machine_features
    from kiln.loops.ir import Const, For, Unary, Var

    spr = Target.parse("llvm -mcpu=sapphirerapids")
    avx2 = Target.parse("llvm -mcpu=haswell")
    assert "-prefer-256-bit" in machine_features(spr).split(",")
    assert "prefer-256-bit" not in machine_features(avx2)
    x, y = Buffer("x", (4096,), "float32"), Buffer("y", (4096,), "float32")
    i = Var("i")
    body = For(i, Const(0), Const(4096), Store(y, (i,), Unary("exp", Load(x, (i,)))),
               "vectorized")
    kernel = verify(Kernel("exp_loop", (x,), (y,), body))
    assert "zmm" in assembly(kernel, target=spr)
    assert "zmm" not in assembly(kernel, target=avx2)
