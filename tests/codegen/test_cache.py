"""The machine-code cache: fingerprints, hits, and entries that are damaged or missing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kiln.codegen import DiskCache, compile_kernels, fingerprint
from kiln.codegen.cache import canonical_text, pack_entry, unpack_entry
from kiln.loops.ir import Binary, Buffer, Const, For, Kernel, Load, Store, Unary, Var


def make(name: str = "k", scale: object = 2.0, xname: str = "x", var: str = "i",
         op: str = "exp") -> Kernel:
    x, y, i = Buffer(xname, (64,), "float32"), Buffer("y", (64,), "float32"), Var(var)
    value = Binary("mul", Unary(op, Load(x, (i,))), Const(scale, "float32"))
    return Kernel(name, (x,), (y,), For(i, Const(0), Const(64), Store(y, (i,), value),
                                        "vectorized"))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run(lib, name: str) -> np.ndarray:  # noqa: ANN001
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    y = np.empty_like(x)
    lib[name](x, y)
    return y


def test_fingerprints_ignore_names_but_not_content() -> None:
    base = fingerprint(make())
    assert fingerprint(make(name="other", xname="input", var="j")) == base
    assert fingerprint(make(scale=3.0)) != base
    assert fingerprint(make(scale=np.float32(2.5))) != fingerprint(make(scale=np.float32(2.25)))
    assert fingerprint(make(op="tanh")) != base
    assert "exp" in canonical_text(make())


def test_a_second_compile_hits_the_cache(cache_dir: Path) -> None:
    first = compile_kernels([make()])
    assert first.stats.compiled == 1 and first.stats.cache_hits == 0
    entries = list((cache_dir / "objects").iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".o"
    second = compile_kernels([make(name="again")])
    assert second.stats.compiled == 0 and second.stats.cache_hits == 1
    np.testing.assert_array_equal(run(first, "k"), run(second, "again"))
    other_level = compile_kernels([make()], opt_level=1)
    assert other_level.stats.compiled == 1


def test_identical_kernels_share_machine_code(cache_dir: Path) -> None:
    lib = compile_kernels([make("a"), make("b"), make("c", scale=5.0)])
    assert lib.stats.distinct == 2 and lib.stats.compiled == 2
    assert lib.symbol("a") == lib.symbol("b") != lib.symbol("c")
    np.testing.assert_array_equal(run(lib, "a"), run(lib, "b"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "old-format"])
def test_a_damaged_entry_is_rebuilt(cache_dir: Path, damage: str) -> None:
    good = run(compile_kernels([make()]), "k")
    (entry,) = (cache_dir / "objects").iterdir()
    data = entry.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:-100] + bytes([data[-100] ^ 0x40]) + data[-99:]
    elif damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "empty":
        data = b""
    else:
        data = b"KILNOBJ0" + data[8:]
    entry.write_bytes(data)
    lib = compile_kernels([make()])
    assert lib.stats.compiled == 1 and lib.stats.cache_hits == 0
    np.testing.assert_array_equal(run(lib, "k"), good)
    assert unpack_entry(entry.read_bytes()) is not None  # rewritten intact
    assert compile_kernels([make()]).stats.cache_hits == 1


def test_writes_are_atomic_and_leave_no_temporary_files(cache_dir: Path) -> None:
    compile_kernels([make(), make("k7", scale=7.0)])
    names = sorted(p.name for p in (cache_dir / "objects").iterdir())
    assert len(names) == 2 and all(n.endswith(".o") and not n.startswith(".") for n in names)


def test_an_empty_kiln_cache_turns_the_cache_off(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "")
    assert DiskCache.default() is None
    assert compile_kernels([make()]).stats.compiled == 1
    assert compile_kernels([make()]).stats.compiled == 1


def test_an_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KILN_CACHE", str(blocker))
    lib = compile_kernels([make()])
    assert lib.stats.compiled == 1
    assert np.isfinite(run(lib, "k")).all()


def test_the_default_cache_is_under_the_home_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_CACHE", raising=False)
    cache = DiskCache.default()
    assert cache is not None
    assert cache.root == Path(os.path.expanduser("~")) / ".cache" / "kiln"


def test_entries_check_their_integrity() -> None:
    payload = os.urandom(1000)
    entry = pack_entry(payload)
    assert unpack_entry(entry) == payload
    assert unpack_entry(entry[:-1]) is None
    assert unpack_entry(entry + b"x") is None
