"""`--trust`/`--key` on the commands that load .kiln files (run, bench, show): a file not
sealed by a trusted key is compiled again from its loop IR, and says so with -v."""

import numpy as np
import pytest

import kiln
from kiln import trust
from kiln.cli import main

RELAY = "def @main(%x: Tensor[(4), float32]) { nn.relu(%x) * %x }"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    exe = kiln.build(kiln.parse(RELAY))
    key = trust.write_key(tmp_path / "team.key")
    exe.save(tmp_path / "mine.kiln")
    exe.save(tmp_path / "theirs.kiln", key=key)
    x = np.array([-2, -1, 1, 3], "float32")
    np.savez(tmp_path / "in.npz", x=x)
    return tmp_path, x * np.maximum(x, 0)


def run(tmp_path, name, *options):
    return main(["run", str(tmp_path / name), "--inputs", str(tmp_path / "in.npz"), "-o",
                 str(tmp_path / "out.npz"), "-v", *options])


@pytest.mark.parametrize("options, rebuilt", [
    ((), True),
    (("--trust", "any"), False),
    (("--trust", "key", "--key", "team.key"), False),
    (("--trust", "key"), True),
])
def test_run_uses_a_files_machine_code_only_when_its_seal_counts(files, capsys, options, rebuilt):
    tmp_path, want = files
    options = tuple(str(tmp_path / o) if o.endswith(".key") else o for o in options)
    assert run(tmp_path, "theirs.kiln", *options) == 0
    assert ("compiled again from its verified loop IR" in capsys.readouterr().err) == rebuilt
    with np.load(tmp_path / "out.npz") as f:
        np.testing.assert_array_equal(f[f.files[0]], want)


def test_a_local_file_is_used_as_it_is(files, capsys):
    tmp_path, _ = files
    assert run(tmp_path, "mine.kiln") == 0
    assert "compiled again" not in capsys.readouterr().err


def test_key_options_are_checked(files, capsys):
    tmp_path, _ = files
    assert run(tmp_path, "theirs.kiln", "--key", str(tmp_path / "team.key")) == 1
    assert "--trust key" in capsys.readouterr().err
    (tmp_path / "bad.key").write_text("nope")
    assert run(tmp_path, "theirs.kiln", "--trust", "key", "--key", str(tmp_path / "bad.key")) == 1
    assert "not a kiln key" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "theirs.kiln"), "--trust", "key", "--key",
                 str(tmp_path / "team.key")]) == 0
    assert "@main" in capsys.readouterr().out
