"""The machine-code cache: fingerprints, hits, sealed entries, eviction, and entries that are
damaged, forged or missing."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from kiln import trust
from kiln.codegen import DiskCache, compile_kernels, fingerprint
from kiln.codegen.cache import (
    canonical_text,
    default_max_bytes,
    open_entry,
    parse_size,
    seal_entry,
)
from kiln.codegen.compile import compile_progress
from kiln.errors import Error
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
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("KILN_CACHE_MAX_BYTES", raising=False)
    return tmp_path / "cache"


def local_key() -> bytes:
    key = trust.local_key()
    assert key is not None
    return key


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
    assert open_entry(entry.read_bytes(), local_key(), entry.stem)[0] is not None  # rewritten
    assert compile_kernels([make()]).stats.cache_hits == 1


def test_writes_are_atomic_and_leave_no_temporary_files(cache_dir: Path) -> None:
    compile_kernels([make(), make("k7", scale=7.0)])
    names = sorted(p.name for p in (cache_dir / "objects").iterdir())
    assert len(names) == 2 and all(n.endswith(".o") and not n.startswith(".") for n in names)


@pytest.mark.parametrize("value", ["", " ", "0", "off", "OFF", "false", "no", "none"])
def test_an_empty_or_off_kiln_cache_turns_the_cache_off(value: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # "0" means off, not a directory named 0 in the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_CACHE", value)
    assert DiskCache.default() is None
    assert compile_kernels([make()]).stats.compiled == 1
    assert compile_kernels([make()]).stats.compiled == 1
    assert not any(tmp_path.iterdir())


def test_an_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KILN_CACHE", str(blocker))
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    lib = compile_kernels([make()])
    assert lib.stats.compiled == 1
    assert np.isfinite(run(lib, "k")).all()


def test_without_a_local_key_there_is_no_disk_cache(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_CONFIG_DIR", str(blocker / "kiln"))  # cannot be created
    assert trust.local_key() is None and DiskCache.default() is None
    assert compile_kernels([make()]).stats.compiled == 1
    assert not (tmp_path / "cache").exists()


def test_where_the_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    cache = DiskCache.default()
    assert cache is not None
    assert cache.root == Path(os.path.expanduser("~")) / ".cache" / "kiln"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert DiskCache.default().root == tmp_path / "xdg" / "kiln"  # type: ignore[union-attr]
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "mine"))
    assert DiskCache.default().root == tmp_path / "mine"  # type: ignore[union-attr]


def test_entries_are_sealed_with_the_key_and_their_name() -> None:
    secret, other = os.urandom(32), os.urandom(32)
    payload = os.urandom(1000)
    entry = seal_entry(payload, secret, "abc")
    assert open_entry(entry, secret, "abc") == (payload, "")
    assert open_entry(entry[:-1], secret, "abc")[1] == "its seal is wrong"
    assert open_entry(entry + b"x", secret, "abc")[1] == "its seal is wrong"
    assert open_entry(entry, secret, "abd")[1] == "its seal is wrong"  # moved to another key
    assert open_entry(entry, other, "abc")[1] == "it is sealed with another key"
    assert open_entry(entry[:20], secret, "abc")[1] == "it is truncated"
    assert open_entry(b"KILNOBJ1" + entry[8:], secret, "abc")[1] == "it has another format"
    flipped = bytearray(entry)
    flipped[-1] ^= 1
    assert open_entry(bytes(flipped), secret, "abc")[0] is None


def test_a_tampered_entry_is_deleted_and_rebuilt(cache_dir: Path, caplog) -> None:  # noqa: ANN001
    good = run(compile_kernels([make()]), "k")
    (entry,) = (cache_dir / "objects").iterdir()
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # in the machine code: the seal no longer matches
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        lib = compile_kernels([make()])
    assert lib.stats.compiled == 1 and lib.stats.cache_hits == 0
    assert "its seal is wrong" in caplog.text
    np.testing.assert_array_equal(run(lib, "k"), good)
    assert open_entry(entry.read_bytes(), local_key(), entry.stem)[0] is not None


@pytest.mark.parametrize("content", ["garbage", "another-kernel", "truncated-object"])
def test_a_sealed_entry_with_wrong_content_is_replaced(cache_dir: Path, content: str) -> None:
    """An entry whose seal is right but whose object cannot stand for the kernel (not an
    object file, or one without the kernel's symbol) is deleted, recompiled and stored."""
    good = run(compile_kernels([make()]), "k")
    (entry,) = (cache_dir / "objects").iterdir()
    intact, _ = open_entry(entry.read_bytes(), local_key(), entry.stem)
    assert intact is not None
    if content == "garbage":
        wrong = os.urandom(len(intact))
    elif content == "another-kernel":
        other = compile_kernels([make("other", scale=9.0)], cache=False)
        (wrong,) = [o.data for o in other.objects]
    else:
        wrong = intact[:200]
    entry.write_bytes(seal_entry(wrong, local_key(), entry.stem))
    lib = compile_kernels([make()])
    assert lib.stats.compiled == 1 and lib.stats.cache_hits == 0
    np.testing.assert_array_equal(run(lib, "k"), good)
    assert open_entry(entry.read_bytes(), local_key(), entry.stem)[0] == intact
    assert compile_kernels([make()]).stats.cache_hits == 1


def test_a_sealed_entry_that_does_not_link_is_replaced(cache_dir: Path) -> None:
    """A well-formed object defining the kernel's symbol but needing one nobody provides: the
    library will not link from the cache, so its cached objects are compiled again."""
    import llvmlite.binding as llvm

    from kiln.codegen.compile import compile_ir
    from kiln.codegen.target import machine
    from kiln.target import Target

    good = run(compile_kernels([make()]), "k")
    lib = compile_kernels([make()])
    symbol = lib.symbol("k")
    text = (f"declare i32 @kiln_no_such_function()\n"
            f"define i32 @{symbol}(ptr %a) {{\n  %r = call i32 @kiln_no_such_function()\n"
            "  ret i32 %r\n}\n")
    llvm.parse_assembly(text)
    wrong, _ = compile_ir(text, machine(Target.host(), 3), "a forgery")
    (entry,) = (cache_dir / "objects").iterdir()
    entry.write_bytes(seal_entry(wrong, local_key(), entry.stem))
    healed = compile_kernels([make()])
    assert healed.stats.compiled == 1 and healed.stats.cache_hits == 0
    np.testing.assert_array_equal(run(healed, "k"), good)
    assert compile_kernels([make()]).stats.cache_hits == 1


def test_the_cache_keeps_under_its_cap_evicting_the_least_recently_used(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compile_kernels([make("k1", scale=1.0)])
    (first,) = (cache_dir / "objects").iterdir()
    size = first.stat().st_size
    # Room for three entries, and a scan on every store.
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", str(3 * size + size // 2))
    old = time.time() - 1000
    for n, scale in enumerate([2.0, 3.0], 2):
        compile_kernels([make(f"k{n}", scale=scale)])
    for i, p in enumerate(sorted((cache_dir / "objects").iterdir(), key=lambda p: p.name)):
        os.utime(p, (old + i, old + i))
    os.utime(first, (old - 10, old - 10))  # the oldest ...
    assert compile_kernels([make("k1", scale=1.0)]).stats.cache_hits == 1  # ... used again
    compile_kernels([make("k4", scale=4.0)])
    cache = DiskCache.default()
    assert cache is not None
    info = cache.info()
    assert info.total_bytes <= info.max_bytes and info.entries <= 3
    assert first.exists()  # touched by its hit, so another entry went first
    assert compile_kernels([make("k4", scale=4.0)]).stats.cache_hits == 1


def test_info_and_clear(cache_dir: Path) -> None:
    compile_kernels([make(), make("k7", scale=7.0)])
    cache = DiskCache.default()
    assert cache is not None
    info = cache.info()
    assert info.entries == 2 and info.root == cache_dir and info.max_bytes == 1 << 30
    assert info.total_bytes == sum(p.stat().st_size for p in (cache_dir / "objects").iterdir())
    assert cache.clear() == 2
    assert cache.info().entries == 0
    assert compile_kernels([make()]).stats.compiled == 1


def test_the_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "512M")
    assert default_max_bytes() == 512 << 20
    assert parse_size("2G") == 2 << 30 and parse_size("1000") == 1000
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "lots")
    with pytest.raises(Error, match="KILN_CACHE_MAX_BYTES='lots': want a positive number"):
        default_max_bytes()


def test_compile_progress_reports_every_kernel(cache_dir: Path, caplog) -> None:  # noqa: ANN001
    seen: list[tuple[int, int, str]] = []
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        with compile_progress(lambda done, total, name: seen.append((done, total, name))):
            compile_kernels([make("a"), make("b"), make("c", scale=3.0)])
        compile_kernels([make("a")])
    assert seen == [(1, 3, "a"), (2, 3, "b"), (3, 3, "c")]
    assert "compiling kernel 1/3 a" in caplog.text and "compiling kernel 3/3 c" in caplog.text
    assert "cache hit: kernel 1/1 a" in caplog.text
