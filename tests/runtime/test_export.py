"""kiln export: a shared library and header that a C program links and calls, checked against the
reference interpreter — on this machine, and for aarch64 under qemu when the cross tools exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.cli import main as cli_main
from kiln.runtime.export import export_library
from kiln.testing.models import mlp

CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
needs_cross = pytest.mark.skipif(
    shutil.which(CROSS_CC) is None or shutil.which(QEMU) is None,
    reason=f"{CROSS_CC} or {QEMU} is not installed (make cross-tools installs them)")

SMALL_CONV = """
def @main(%x: Tensor[(1, 3, 8, 8), float32], %w1: Tensor[(8, 3, 3, 3), float32],
          %b1: Tensor[(8), float32], %w2: Tensor[(4, 8, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, padding=[1, 1], channels=8, kernel_size=[3, 3]);
  %1 = nn.relu(nn.bias_add(%0, %b1));
  %2 = nn.max_pool2d(%1, pool_size=[2, 2], strides=[2, 2]);
  %3 = nn.conv2d(%2, %w2, channels=4, kernel_size=[1, 1]);
  (%3, nn.softmax(nn.batch_flatten(%3)))
}
"""


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def c_main(lib) -> str:
    """A C program: each input read from in<i>.bin, the model run, each output written to
    out<i>.bin; the status's message on stderr."""
    p, up = lib.name, lib.name.upper()
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{lib.header.name}"', "",
             "int main(void) {"]
    for i, t in enumerate(lib.inputs):
        lines += [f"    static {t.c_type} in{i}[{up}_INPUT_{i}_COUNT];",
                  f'    FILE *f{i} = fopen("in{i}.bin", "rb");',
                  f"    if (!f{i} || fread(in{i}, 1, {up}_INPUT_{i}_BYTES, f{i}) != "
                  f"{up}_INPUT_{i}_BYTES) return 10;",
                  f"    fclose(f{i});"]
    for i, t in enumerate(lib.outputs):
        lines.append(f"    static {t.c_type} out{i}[{up}_OUTPUT_{i}_COUNT];")
    args = ", ".join([f"in{i}" for i in range(len(lib.inputs))]
                     + [f"out{i}" for i in range(len(lib.outputs))])
    lines += [f"    int status = {p}_run({args});",
              f'    if (status != {up}_OK) {{ fprintf(stderr, "%s\\n", {p}_error(status)); '
              "return 11; }"]
    for i in range(len(lib.outputs)):
        lines += [f'    FILE *g{i} = fopen("out{i}.bin", "wb");',
                  f"    fwrite(out{i}, 1, {up}_OUTPUT_{i}_BYTES, g{i});", f"    fclose(g{i});"]
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def run_c(lib, inputs: list[np.ndarray], cc: str = "cc", runner: Sequence[str] = (),
          env: dict[str, str] | None = None) -> list:
    """Compile `c_main` against the library, run it on ``inputs``, read its outputs back."""
    work = lib.library.parent
    (work / "main.c").write_text(c_main(lib))
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", "main", "main.c", lib.library.name,
                    "-Wl,-rpath,$ORIGIN"], cwd=work, check=True, capture_output=True)
    for i, a in enumerate(inputs):
        (work / f"in{i}.bin").write_bytes(np.ascontiguousarray(a).tobytes())
    done = subprocess.run([*runner, "./main"], cwd=work, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return [np.fromfile(work / f"out{i}.bin", t.type.dtype).reshape(t.shape)
            for i, t in enumerate(lib.outputs)]


def flat(value) -> list[np.ndarray]:
    return list(value) if isinstance(value, tuple) else [value]


def check(got: list[np.ndarray], want) -> None:
    want = flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def conv_case() -> tuple[kiln.IRModule, dict[str, np.ndarray], np.ndarray]:
    mod = kiln.parse(SMALL_CONV)
    params = {"w1": rand(8, 3, 3, 3, seed=1) * 0.3, "b1": rand(8, seed=2) * 0.1,
              "w2": rand(4, 8, 1, 1, seed=3) * 0.3}
    return mod, params, rand(1, 3, 8, 8, seed=4)


@needs_cc
def test_an_mlp_runs_from_c_like_the_interpreter(tmp_path: Path) -> None:
    mod, params = mlp(batch=2, sizes=(64, 48, 10))
    lib = export_library(mod, tmp_path / "mlp.so", params=params)
    assert lib.prototype == "int mlp_run(const float *data, float *output)"
    header = lib.header.read_text()
    assert "#define MLP_INPUT_0_COUNT 128" in header and "#define MLP_OUTPUT_0_BYTES 80" in header
    x = rand(2, 64, seed=5)
    check(run_c(lib, [x]), kiln.interpret(mod, x, params=params))


@needs_cc
def test_hostile_tensor_names_cannot_write_c_code(tmp_path: Path) -> None:
    """A model's names reach the header only as C identifiers, string literals and comments
    that they cannot close."""
    mod, params = mlp(batch=2, sizes=(16, 8, 4))
    evil = 'x */ int pwned(void) { return 1; } /* "\\'
    lib = export_library(mod, tmp_path / "evil.so", params=params, input_names=[evil],
                         output_names=["y\n#define BAD 1"])
    header = lib.header.read_text()
    outside_literals = re.sub(r'"(?:\\.|[^"\\])*"', '""', header)
    assert "int pwned(" not in outside_literals and "#define BAD" not in outside_literals
    x = rand(2, 16, seed=7)
    check(run_c(lib, [x]), kiln.interpret(mod, x, params=params))  # it still compiles and runs


@needs_cc
@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f,-avx2"])
def test_a_conv_net_with_a_tuple_result_from_c(tmp_path: Path, target: str) -> None:
    mod, params, x = conv_case()
    lib = export_library(mod, tmp_path / "conv.so", target, params=params,
                         output_names=["features", "probs"])
    assert [t.c_name for t in lib.outputs] == ["features", "probs"]
    check(run_c(lib, [x]), kiln.interpret(mod, x, params=params))


@needs_cc
def test_an_executable_exports_and_weights_may_stay_inputs(tmp_path: Path) -> None:
    mod = kiln.parse("def @main(%x: Tensor[(3, 5), float32], %k: float32, %c: bool) {"
                     " if (%c) { nn.relu(%x) * %k } else { %x - %k } }")
    lib = export_library(kiln.build(mod), tmp_path / "branch.so")
    assert lib.prototype == ("int branch_run(const float *x, const float *k, const uint8_t *c, "
                             "float *output)")
    x, k = rand(3, 5, seed=6), np.float32(1.5)
    for c in (True, False):
        check(run_c(lib, [x, k, np.bool_(c)]), kiln.interpret(mod, x, k, np.bool_(c)))


@needs_cc
def test_parallel_kernels_run_on_the_library_s_own_pool_with_any_thread_count(
        tmp_path: Path) -> None:
    mod, params = mlp(batch=64, sizes=(784, 512, 10))  # a 784x512 layer worth two threads
    lib = export_library(mod, tmp_path / "big.so", params=params)
    undefined = subprocess.run(["nm", "-u", str(lib.library)], text=True,
                               capture_output=True).stdout
    assert "pthread_create" in undefined  # the pool is in the library, on libc's threads
    assert "GOMP" not in undefined and "kiln_parallel_for" not in undefined
    needed = subprocess.run(["readelf", "-d", str(lib.library)], text=True,
                            capture_output=True).stdout
    assert "libgomp" not in needed
    x = rand(64, 784, seed=7)
    want = kiln.interpret(mod, x, params=params)
    for n in ("1", "2"):
        check(run_c(lib, [x], env={"KILN_NUM_THREADS": n}), want)


ERRORS_MAIN = """
#include <stdio.h>
#include <stdlib.h>
#include "m.h"
int main(void) {
    static float x[M_INPUT_0_COUNT], y[M_OUTPUT_0_COUNT];
    int s = m_run(x, NULL);
    printf("%d %s\\n", s, m_error(s));
    char *ws = aligned_alloc(64, M_WORKSPACE_BYTES + 64);
    s = m_run_with_workspace(x, y, ws + 1);
    printf("%d %s\\n", s, m_error(s));
    printf("%d %s\\n", m_run_with_workspace(x, y, ws), m_error(12345 << 16));
    m_set_num_threads(3);
    printf("%d\\n", m_num_threads());
    return 0;
}
"""


@needs_cc
def test_bad_calls_return_statuses_that_say_what_was_wrong(tmp_path: Path) -> None:
    mod = kiln.parse("def @main(%x: Tensor[(4, 4), float32]) { nn.softmax(%x) }")
    export_library(mod, tmp_path / "m.so")
    (tmp_path / "main.c").write_text(ERRORS_MAIN)
    subprocess.run(["cc", "-Wall", "-Werror", "-o", "main", "main.c", "m.so",
                    "-Wl,-rpath,$ORIGIN"], cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(["./main"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert out.splitlines() == ["1 a tensor pointer is NULL",
                                "3 the workspace is not aligned to 64 bytes",
                                "0 unknown status", "3"]
    exported = subprocess.run(["nm", "-D", "--defined-only", "m.so"], cwd=tmp_path, text=True,
                              capture_output=True).stdout
    assert sorted(line.split()[-1] for line in exported.splitlines()) == [
        "m_error", "m_num_threads", "m_run", "m_run_with_workspace", "m_set_num_threads"]


def test_a_program_that_is_not_static_is_a_clear_error(tmp_path: Path) -> None:
    mod = kiln.parse("def @count(%n: int32) -> int32 { if (%n == 0) { 0 } else "
                     "{ 1 + @count(%n - 1) } }  def @main(%n: int32) { @count(%n) }")
    with pytest.raises(kiln.Error, match="recursively.*static programs only"):
        export_library(mod, tmp_path / "count.so")
    sym = kiln.parse("def @main(%x: Tensor[(n, 3), float32]) { nn.relu(%x) }")
    with pytest.raises(kiln.Error, match="symbolic shape"):
        export_library(sym, tmp_path / "sym.so")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("target, message", [
    ("sparc-sun-solaris", "sparc"), ("llvm -mfoo=1", "unknown option"),
    ("evaluator", "not a machine"), ("", "empty target")])
def test_bad_targets_are_errors(tmp_path: Path, target: str, message: str) -> None:
    mod = kiln.parse("def @main(%x: Tensor[(4), float32]) { %x * 2f }")
    with pytest.raises(kiln.Error, match=message):
        export_library(mod, tmp_path / "m.so", target=target)


def test_an_unwritable_output_path_is_an_error(tmp_path: Path) -> None:
    mod = kiln.parse("def @main(%x: Tensor[(4), float32]) { %x * 2f }")
    with pytest.raises(kiln.Error, match="no directory"):
        export_library(mod, tmp_path / "missing" / "m.so")
    with pytest.raises(kiln.Error, match="is a directory"):
        export_library(mod, tmp_path)
    with pytest.raises(kiln.Error, match="not a C identifier"):
        export_library(mod, tmp_path / "m.so", name="my model")
    with pytest.raises(kiln.Error, match="that is where the header goes"):
        export_library(mod, tmp_path / "m.h")
    with pytest.raises(kiln.Error, match="C compiler 'no-such-cc'.*not installed"):
        export_library(mod, tmp_path / "m.so", cc="no-such-cc")
    assert not list(tmp_path.iterdir())


@needs_cc
def test_the_command_exports_a_relay_file(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli_main(["export", "--help"])
    assert e.value.code == 0
    assert "shared library" in capsys.readouterr().out
    src = tmp_path / "twice.rly"
    src.write_text("def @main(%x: Tensor[(2, 3), float32], %k: Tensor[(3), float32]) "
                   "{ %x * %k }")
    np.savez(tmp_path / "k.npz", k=np.float32([2, 3, 4]))
    assert cli_main(["export", str(src), "--params", str(tmp_path / "k.npz"),
                     "-o", str(tmp_path / "twice.so")]) == 0
    err = capsys.readouterr().err
    assert "int twice_run(const float *x, float *output)" in err
    assert (tmp_path / "twice.h").is_file()
    assert cli_main(["export", str(src), "--target", "mips-linux-gnu",
                     "-o", str(tmp_path / "m.so")]) == 1
    assert "mips" in capsys.readouterr().err


@needs_cc
def test_the_command_exports_an_onnx_model_under_its_graph_names(tmp_path: Path, capsys) -> None:
    from onnx import TensorProto, helper, numpy_helper, save

    w, b = rand(6, 4, seed=8), rand(6, seed=9)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input.1", "w", "b"], ["h"], transB=1),
         helper.make_node("Relu", ["h"], ["logits"])], "g",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
         str(tmp_path / "gemm.onnx"))
    assert cli_main(["export", str(tmp_path / "gemm.onnx"), "--name", "net"]) == 0
    assert "int net_run(const float *input_1, float *logits)" in capsys.readouterr().err
    header = (tmp_path / "gemm.h").read_text()
    assert '#define NET_INPUT_0_NAME "input.1"' in header
    x = rand(3, 4, seed=10)
    (tmp_path / "main.c").write_text(GEMM_MAIN)
    subprocess.run(["cc", "-Wall", "-Werror", "-o", "main", "main.c", "gemm.so",
                    "-Wl,-rpath,$ORIGIN"], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "in0.bin").write_bytes(x.tobytes())
    subprocess.run(["./main"], cwd=tmp_path, check=True)
    got = np.fromfile(tmp_path / "out0.bin", np.float32).reshape(3, 6)
    np.testing.assert_allclose(got, np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)


GEMM_MAIN = """
#include <stdio.h>
#include "gemm.h"
int main(void) {
    float x[NET_INPUT_0_COUNT], y[NET_OUTPUT_0_COUNT];
    FILE *f = fopen("in0.bin", "rb");
    if (!f || fread(x, 1, NET_INPUT_0_BYTES, f) != NET_INPUT_0_BYTES) return 2;
    fclose(f);
    if (net_run(x, y) != NET_OK) return 3;
    f = fopen("out0.bin", "wb");
    fwrite(y, 1, NET_OUTPUT_0_BYTES, f);
    fclose(f);
    return 0;
}
"""


@needs_cross
def test_aarch64_under_qemu(tmp_path: Path) -> None:
    mod, params, x = conv_case()
    lib = export_library(mod, tmp_path / "conv.so", target="aarch64-linux-gnu", params=params)
    assert "aarch64" in subprocess.run(["file", "-b", str(lib.library)], capture_output=True,
                                       text=True).stdout.lower() or shutil.which("file") is None
    got = run_c(lib, [x], cc=CROSS_CC, runner=[QEMU, "-L", SYSROOT])
    check(got, kiln.interpret(mod, x, params=params))


@needs_cross
def test_aarch64_parallel_kernels_run_on_the_pool_under_qemu(tmp_path: Path) -> None:
    mod, params = mlp(batch=64, sizes=(784, 512, 10))  # parallel for the target's 8 cores
    lib = export_library(mod, tmp_path / "big.so", target="aarch64-linux-gnu", params=params)
    x = rand(64, 784, seed=8)
    want = kiln.interpret(mod, x, params=params)
    outs = [run_c(lib, [x], cc=CROSS_CC, runner=[QEMU, "-L", SYSROOT],
                  env={"KILN_NUM_THREADS": n}) for n in ("1", "3")]
    check(outs[0], want)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@needs_cc
def test_an_int8_conv_on_amx_tiles_runs_from_c(tmp_path: Path) -> None:
    # the library asks Linux for the tile state when it loads (a C program never called
    # arch_prctl), and the conv's tiles then compute what numpy does
    from kiln.loops import int8_amx
    from kiln.target import Target

    if not int8_amx.usable(Target.host()):
        pytest.skip("this machine has no AMX-INT8 (or Linux did not grant the tile state)")
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (24, 40, 3, 3)).astype("int8")
    x = kiln.var("x", shape=(1, 40, 6, 7), dtype="uint8")
    body = kiln.op.nn.conv2d(x, kiln.const(w), padding=(1, 1), channels=24,
                             kernel_size=(3, 3), out_dtype="int32")
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    lib = export_library(mod, tmp_path / "tiles.so")
    assert "kiln_init_tiles" in (tmp_path / "tiles.so").read_bytes().decode("latin-1")
    xs = rng.integers(0, 256, (1, 40, 6, 7)).astype("uint8")
    xp = np.pad(xs.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + 6, kx:kx + 7],
                         w[:, :, ky, kx].astype(np.int64)) for ky in range(3) for kx in range(3))
    np.testing.assert_array_equal(run_c(lib, [xs])[0], want.astype(np.int32))
