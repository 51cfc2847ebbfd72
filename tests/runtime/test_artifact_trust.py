"""Whose machine code runs: a .kiln file's own only when its seal counts; any other file's
kernels are made again from its verified loop IR (kiln/runtime/artifact.py, kiln/trust.py).
"""

import json
import os

import numpy as np
import pytest

import kiln
from kiln import trust
from kiln.runtime import build, load

from .artifact_fuzz import join, reseal, split
from .helpers import assert_same, needs_native

pytestmark = needs_native

MODEL = """
def @main(%x: Tensor[(2, 5), float32], %w: Tensor[(3, 5), float32], %b: Tensor[(3), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w), %b, axis=-1));
  (%0, tanh(sum(%0, axis=[1])))
}
"""

# A program the VM runs (a loop by recursion over a list), with kernels in it.
LIST_MODEL = """
type List[A] { Cons(A, List[A]), Nil }
def @sum(%xs: List[Tensor[(4), float32]], %acc: Tensor[(4), float32]) -> Tensor[(4), float32] {
  match (%xs) {
    Cons(%h, %t) => @sum(%t, tanh(%acc) + %h),
    Nil => %acc,
  }
}
def @main(%x: Tensor[(4), float32]) -> Tensor[(4), float32] {
  @sum(Cons(%x, Cons(%x * %x, Nil)), %x)
}
"""

OTHER_KEY = bytes(range(32))


def params():
    r = np.random.default_rng(0)
    return {"w": r.standard_normal((3, 5)).astype("float32"),
            "b": r.standard_normal(3).astype("float32")}


def x_input():
    return np.random.default_rng(1).standard_normal((2, 5)).astype("float32")


@pytest.fixture()
def config(tmp_path, monkeypatch):
    """A config directory of the test's own (a fresh local key)."""
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.fixture(scope="module")
def exe():
    return build(kiln.parse(MODEL), params=params())


# --- which seals count ----------------------------------------------------------------------

def test_a_file_saved_here_uses_its_own_machine_code(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln")
    again = load(tmp_path / "m.kiln")
    assert again.code_source == "file" and exe.code_source == "built"
    assert (config / "key").exists() and (config / "key").stat().st_mode & 0o077 == 0
    assert_same(again(x_input()), exe(x_input()))


def test_a_file_from_elsewhere_is_rebuilt_from_its_loop_ir(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln", key=OTHER_KEY)  # as someone else's machine would
    again = load(tmp_path / "m.kiln")
    assert again.code_source == "rebuilt"
    assert again.executor.name == "native"  # the entry point is made again too
    assert_same(again(x_input()), exe(x_input()))
    assert load(tmp_path / "m.kiln", trust="any").code_source == "file"
    assert load(tmp_path / "m.kiln", trust="key", key=OTHER_KEY).code_source == "file"
    assert load(tmp_path / "m.kiln", trust="key").code_source == "rebuilt"


def test_keys_the_user_trusts_are_read_from_the_config_directory(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln", key=OTHER_KEY)
    trust.write_key(config / "trusted-keys" / "team.key", OTHER_KEY)
    (config / "trusted-keys" / "notes.key").write_text("not a key")  # skipped
    assert load(tmp_path / "m.kiln", trust="key").code_source == "file"
    assert load(tmp_path / "m.kiln").code_source == "rebuilt"  # "local" is the local key only


def test_a_local_file_is_not_trusted_under_another_users_key(tmp_path, monkeypatch, exe):
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "alice"))
    exe.save(tmp_path / "m.kiln")
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "bob"))
    assert load(tmp_path / "m.kiln").code_source == "rebuilt"


def test_without_a_config_directory_files_are_unsealed_and_rebuilt(tmp_path, monkeypatch, exe):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_CONFIG_DIR", str(blocker / "kiln"))  # cannot be created
    assert trust.local_key() is None
    exe.save(tmp_path / "m.kiln")
    assert split((tmp_path / "m.kiln").read_bytes())[2] == bytes(trust.ID_BYTES + trust.MAC_BYTES)
    assert load(tmp_path / "m.kiln").code_source == "rebuilt"


def test_bad_trust_levels_and_keys_are_errors(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln")
    with pytest.raises(kiln.Error, match="trust='nobody'"):
        load(tmp_path / "m.kiln", trust="nobody")
    with pytest.raises(kiln.Error, match="32 bytes"):
        load(tmp_path / "m.kiln", trust="key", key=b"short")
    with pytest.raises(kiln.Error, match="32 bytes"):
        exe.save(tmp_path / "n.kiln", key=b"short")
    (config / "bad.key").write_text("12ab")
    with pytest.raises(kiln.Error, match="not a kiln key"):
        trust.read_key(config / "bad.key")


# --- what an attacker can do: anything, and recompute the checksum ---------------------------

def test_edited_machine_code_never_runs(tmp_path, config, exe):
    """Every byte of the machine code replaced by a trap, the checksum made right: the file
    still loads and computes the right numbers, from code made here."""
    exe.save(tmp_path / "m.kiln")
    header, sections, seal = split((tmp_path / "m.kiln").read_bytes())
    for name in ("machine_code", "program_code"):
        sections[name] = b"\xcc" * len(sections[name])  # int3
    bad = join(header, sections, seal)  # the old seal no longer matches the bytes
    (tmp_path / "bad.kiln").write_bytes(bad)
    again = load(tmp_path / "bad.kiln")
    assert again.code_source == "rebuilt"
    assert_same(again(x_input()), exe(x_input()))
    # the owner of the key sealing it again means the owner vouches for it: used as it is
    (tmp_path / "sealed.kiln").write_bytes(reseal(bad, trust.local_key()))
    with pytest.raises(kiln.Error, match="not valid kiln machine code"):
        load(tmp_path / "sealed.kiln")


def test_a_seal_copied_from_another_file_does_not_count(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln")
    header, sections, seal = split((tmp_path / "m.kiln").read_bytes())
    sections["constants"] = bytes(len(sections["constants"]))
    (tmp_path / "bad.kiln").write_bytes(join(header, sections, seal))
    again = load(tmp_path / "bad.kiln")
    assert again.code_source == "rebuilt"
    relu, tanh_sum = again(x_input())  # the weights were zeroed: relu(0), tanh(0)
    assert not relu.any() and not tanh_sum.any()


def test_an_arena_offset_past_the_arena_is_refused(tmp_path, config, exe):
    exe.save(tmp_path / "m.kiln")
    header, sections, seal = split((tmp_path / "m.kiln").read_bytes())
    doc = json.loads(sections["program"])
    text = json.dumps(doc)
    assert '"offset": 0' in text  # the planner put a tensor at the arena's start
    sections["program"] = text.replace('"offset": 0', '"offset": 1048576', 1).encode()
    (tmp_path / "bad.kiln").write_bytes(join(header, sections, seal))
    with pytest.raises(kiln.Error, match="past the arena"):
        load(tmp_path / "bad.kiln")


def test_the_vm_checks_kernel_calls_of_a_file_it_does_not_trust(tmp_path, config):
    exe = build(kiln.parse(LIST_MODEL))
    assert exe.executor.name == "vm"
    exe.save(tmp_path / "l.kiln")
    exe.save(tmp_path / "o.kiln", key=OTHER_KEY)
    mine, other = load(tmp_path / "l.kiln"), load(tmp_path / "o.kiln")
    assert mine.executor.vm._trusted and not other.executor.vm._trusted
    x = np.linspace(-1, 1, 4, dtype="float32")
    want = kiln.interpret(kiln.parse(LIST_MODEL), x)
    assert_same(other(x), want)
    assert_same(mine(x), want)


def test_key_files_are_private_and_made_once(config):
    first = trust.local_key()
    trust._LOCAL.clear()
    assert trust.local_key() == first
    assert os.stat(config / "key").st_mode & 0o777 == 0o600
