"""Saving and loading executables: a fresh process runs them without compiling; a damaged
file is a kiln.Error, never a crash."""

import hashlib
import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln.runtime import build, load
from kiln.runtime.artifact import FORMAT_VERSION, MAGIC

from .helpers import PROGRAMS, assert_same, needs_native

MODEL = """
def @main(%x: Tensor[(2, 5), float32], %w: Tensor[(3, 5), float32], %b: Tensor[(3), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w), %b, axis=-1));
  (%0, tanh(sum(%0, axis=[1])))
}
"""


def weights():
    r = np.random.default_rng(0)
    return {"w": r.standard_normal((3, 5)).astype("float32"),
            "b": r.standard_normal(3).astype("float32")}


def x_input():
    return np.random.default_rng(1).standard_normal((2, 5)).astype("float32")


# In the fresh process, anything that would compile fails loudly.
FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    import kiln.loops.lower
    import kiln.ssa.kernels

    def forbidden(*args, **kwargs):
        raise AssertionError("compiler work while loading")

    kiln.loops.lower.lower_primitive = forbidden
    kiln.ssa.kernels.lower_primitive = forbidden
    try:
        import kiln.codegen.compile
        kiln.codegen.compile.compile_ir = forbidden
    except ImportError:
        pass
    from kiln.runtime import load
    exe = load(sys.argv[1])
    with np.load(sys.argv[2]) as f:
        args = [f[k] for k in sorted(f.files)]
    out = exe(*args)
    out = out if isinstance(out, tuple) else (out,)
    np.savez(sys.argv[3], *out)
    print(exe.stats().backend)
""")


def run_fresh(tmp_path, exe_path, *args):
    np.savez(tmp_path / "in.npz", **{f"a{i}": a for i, a in enumerate(args)})
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    done = subprocess.run([sys.executable, str(script), str(exe_path), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as f:
        outs = tuple(f[f"arr_{i}"] for i in range(len(f.files)))
    return outs, done.stdout.strip()


@pytest.mark.parametrize("target", ["evaluator", pytest.param("llvm", marks=needs_native)])
def test_a_fresh_process_runs_a_saved_executable_without_compiling(tmp_path, target):
    exe = build(kiln.parse(MODEL), target=target, params=weights())
    path = tmp_path / "model.kiln"
    exe.save(path)
    x = x_input()
    outs, backend = run_fresh(tmp_path, path, x)
    assert backend == ("native" if target == "llvm" else "evaluator")
    assert_same(outs, exe(x))


def test_programs_with_adts_closures_and_recursion_round_trip(tmp_path):
    mod = kiln.parse((PROGRAMS / "closures.rly").read_text())
    exe = build(mod, target="evaluator")
    exe.save(tmp_path / "c.kiln")
    again = load(tmp_path / "c.kiln")
    x = np.array([1.0, 2.0], "float32")
    assert_same(again(x, np.int32(50)), kiln.interpret(mod, x, np.int32(50)))
    s = again.stats()
    assert s.load_seconds > 0 and s.kernels == exe.stats().kernels
    assert s.arena_bytes == exe.stats().arena_bytes


def test_symbolic_shapes_round_trip(tmp_path):
    text = "def @main(%x: Tensor[(n, 2), float32]) { nn.relu(%x) * %x }"
    exe = build(kiln.parse(text), target="evaluator")
    exe.save(tmp_path / "d.kiln")
    again = load(tmp_path / "d.kiln")
    for n in (1, 3):
        x = np.linspace(-1, 1, 2 * n, dtype="float32").reshape(n, 2)
        assert_same(again(x), kiln.interpret(kiln.parse(text), x))


def saved_bytes(tmp_path, target="evaluator") -> bytes:
    exe = build(kiln.parse(MODEL), target=target, params=weights())
    exe.save(tmp_path / "m.kiln")
    return (tmp_path / "m.kiln").read_bytes()


def load_bytes(tmp_path, data: bytes, name="bad.kiln"):
    path = tmp_path / name
    path.write_bytes(data)
    return load(path)


def test_truncated_files_are_errors(tmp_path):
    data = saved_bytes(tmp_path)
    rng = np.random.default_rng(0)
    cuts = sorted({0, 1, 7, 8, 23, 24, len(data) - 1, len(data) - 32,
                   *rng.integers(0, len(data), 40).tolist()})
    for cut in cuts:
        with pytest.raises(kiln.Error, match="not a valid kiln executable"):
            load_bytes(tmp_path, data[:cut])


@pytest.mark.parametrize("target", ["evaluator", pytest.param("llvm", marks=needs_native)])
def test_flipped_bytes_are_errors(tmp_path, target):
    data = saved_bytes(tmp_path, target)
    rng = np.random.default_rng(1)
    for _ in range(60):
        bad = bytearray(data)
        at = int(rng.integers(len(bad)))
        bad[at] ^= 1 << int(rng.integers(8))
        with pytest.raises(kiln.Error, match="not a valid kiln executable"):
            load_bytes(tmp_path, bytes(bad))


def resealed(data: bytes, body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def test_damage_behind_a_valid_checksum_is_still_an_error(tmp_path):
    # A file damaged and then given a fresh checksum: every section is still checked as read.
    data = saved_bytes(tmp_path)
    body = data[:-32]
    rng = np.random.default_rng(2)
    loaded = 0
    for _ in range(200):
        bad = bytearray(body)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(24, len(bad)))
            bad[at] = int(rng.integers(256))
        try:
            exe = load_bytes(tmp_path, resealed(data, bytes(bad)))
        except kiln.Error:
            continue
        loaded += 1
        try:
            exe(x_input())
        except kiln.Error:
            pass
    assert loaded < 200


def test_wrong_magic_version_and_missing_files(tmp_path):
    data = saved_bytes(tmp_path)
    with pytest.raises(kiln.Error, match="wrong magic number"):
        load_bytes(tmp_path, b"PK\x03\x04" + data[4:])
    newer = data[:8] + struct.pack("<I", FORMAT_VERSION + 1) + data[12:]
    with pytest.raises(kiln.Error, match=f"format version {FORMAT_VERSION + 1}"):
        load_bytes(tmp_path, newer)
    with pytest.raises(kiln.Error, match="too short"):
        load_bytes(tmp_path, b"")
    with pytest.raises(kiln.Error, match="cannot read it"):
        load(tmp_path / "missing.kiln")
    with pytest.raises(kiln.Error, match="cannot write"):
        build(kiln.parse(MODEL), target="evaluator").save(tmp_path / "no" / "such" / "x.kiln")
    assert data.startswith(MAGIC)


def test_the_file_is_one_self_describing_document(tmp_path):
    data = saved_bytes(tmp_path)
    magic, version, _, hlen = struct.unpack_from("<8sIIQ", data)
    assert magic == MAGIC and version == FORMAT_VERSION
    header = json.loads(data[24:24 + hlen])
    names = [s["name"] for s in header["sections"]]
    assert names[:3] == ["program", "kernels", "constants"]
    assert all(s["offset"] % 64 == 0 for s in header["sections"])
    assert hashlib.sha256(data[:-32]).digest() == data[-32:]
    assert b"pickle" not in data and b"\x80\x04\x95" not in data
