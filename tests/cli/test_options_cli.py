"""The `kiln` command's options: --version, -v/-q, run --random/--seed/--threads, options checked
before any work (numbers in range, pass names, files), elided constants, compile progress and
`kiln cache`."""

import logging
import sys

import numpy as np
import pytest

import kiln
from kiln.cli import main

RELAY = """#[version = "0.0.5"]
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(16, 8), float32], %b: Tensor[(16), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("KILN_CACHE_MAX_BYTES", raising=False)


@pytest.fixture
def model(tmp_path):
    """A Relay file, its weights in an .npz, and inputs for it."""
    path = tmp_path / "small.rly"
    path.write_text(RELAY)
    r = np.random.default_rng(0)
    w, b = r.standard_normal((16, 8)).astype("float32"), r.standard_normal(16).astype("float32")
    np.savez(tmp_path / "w.npz", w=w, b=b)
    x = r.standard_normal((4, 8)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    return path, tmp_path / "w.npz", tmp_path / "in.npz", np.maximum(x @ w.T + b, 0)


def bad_arguments(argv, capsys) -> str:
    """The message of an argv that argparse refuses (status 2)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def no_build(monkeypatch):
    """Make building fail the test: what is checked must be checked before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("built before the options were checked")

    monkeypatch.setattr(sys.modules["kiln.runtime.build"], "build", refuse)


# --- --version, -v, -q -----------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kiln {kiln.__version__} (LLVM ") and "llvmlite" in out


def test_verbose_shows_each_kernel_compiled_and_debug_the_cache(model, tmp_path, capsys):
    path, weights, inputs, want = model
    args = ["run", str(path), "--params", str(weights), "--inputs", str(inputs)]
    assert main(["-v", *args]) == 0
    err = capsys.readouterr().err
    assert "kiln: compiling kernel 1/" in err and "fused_nn_dense" in err
    assert "cache hit" not in err
    assert main([*args, "-vv"]) == 0  # after the subcommand too
    err = capsys.readouterr().err
    assert "kiln.codegen.cache: cache hit" in err and "compiling kernel" not in err
    assert main(args) == 0  # default: warnings only
    assert capsys.readouterr().err == ""
    # the command leaves kiln's loggers as it found them
    assert all(type(h) is logging.NullHandler for h in logging.getLogger("kiln").handlers)
    assert logging.getLogger("kiln").level == logging.NOTSET


def test_quiet_hides_warnings(model, tmp_path, capsys):
    path, weights, inputs, _ = model
    args = ["build", str(path), "--params", str(weights), "-o", str(tmp_path / "m.kiln")]
    assert main(args) == 0
    for entry in (tmp_path / "cache" / "objects").iterdir():  # damage every entry
        data = bytearray(entry.read_bytes())
        data[-1] ^= 1
        entry.write_bytes(bytes(data))
    assert main(["-q", *args]) == 0
    assert "seal is wrong" not in capsys.readouterr().err
    for entry in (tmp_path / "cache" / "objects").iterdir():
        data = bytearray(entry.read_bytes())
        data[-1] ^= 1
        entry.write_bytes(bytes(data))
    assert main(args) == 0
    assert "its seal is wrong; deleted, to be rebuilt" in capsys.readouterr().err
    assert "contradict" in bad_arguments(["-v", "-q", *args], capsys)


def test_progress_counts_the_kernels(model, tmp_path, capsys):
    path, weights, _, _ = model
    assert main(["build", str(path), "--params", str(weights), "-o", str(tmp_path / "m.kiln"),
                 "--progress"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "compiling kernels:" in line]
    assert lines and lines[-1].startswith("kiln: compiling kernels: ")
    done, total = lines[-1].split()[-1].split("/")
    assert done == total and int(total) >= 1


# --- run --random, --seed, --threads; inputs checked before building ------------------------


def test_run_on_random_inputs(model, tmp_path):
    path, weights, _, _ = model
    outs = []
    for seed in (3, 3, 4):
        out = tmp_path / f"out{len(outs)}.npz"
        assert main(["run", str(path), "--params", str(weights), "--random", "--seed",
                     str(seed), "--threads", "1", "-o", str(out)]) == 0
        with np.load(out) as f:
            outs.append(next(iter(dict(f).values())))
    assert outs[0].shape == (4, 16) and outs[0].dtype == np.float32
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_run_with_threads(model, capsys):
    path, weights, inputs, want = model
    assert main(["run", str(path), "--params", str(weights), "--inputs", str(inputs),
                 "--threads", "2"]) == 0
    assert "float32[4, 16]" in capsys.readouterr().out
    assert "must be at least 1, got 0" in bad_arguments(
        ["run", str(path), "--random", "--threads", "0"], capsys)
    assert "not allowed with argument" in bad_arguments(
        ["run", str(path), "--random", "--inputs", str(inputs)], capsys)


def test_run_checks_inputs_before_building(model, tmp_path, capsys, monkeypatch):
    path, weights, _, _ = model
    no_build(monkeypatch)
    cases = {
        "dtype": ({"x": np.zeros((4, 8), np.float64)},
                  "input 'x' has dtype float64, but the model expects Tensor[(4, 8), float32]"),
        "rank": ({"x": np.zeros(32, np.float32)}, "input 'x' has shape [32], but the model"),
        "shape": ({"x": np.zeros((4, 9), np.float32)}, "(axis 1 is 9, not 8)"),
        "name": ({"xx": np.zeros((4, 8), np.float32)},
                 "has an array 'xx', which is not an input of the model; did you mean 'x'?"),
        "missing": ({}, "lacks input 'x'"),
    }
    for name, (arrays, message) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        assert main(["run", str(path), "--params", str(weights), "--inputs",
                     str(tmp_path / f"{name}.npz")]) == 1, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (name, err)
    assert main(["run", str(path), "--params", str(weights)]) == 1
    assert "give them with --inputs file.npz (or --random)" in capsys.readouterr().err
    assert main(["run", str(path), "--params", str(weights), "--inputs",
                 str(tmp_path / "nope.npz")]) == 1
    assert "--inputs" in capsys.readouterr().err
    # without --params the weights are inputs too
    assert main(["run", str(path), "--inputs", str(tmp_path / "shape.npz")]) == 1
    assert "lacks inputs 'w', 'b'" in capsys.readouterr().err


def test_symbolic_dimensions_must_agree(tmp_path, capsys, monkeypatch):
    path = tmp_path / "sym.rly"
    path.write_text('#[version = "0.0.5"]\n'
                    "def @main(%a: Tensor[(n, 2), float32], %b: Tensor[(n, 2), float32]) {\n"
                    "  add(%a, %b)\n}\n")
    np.savez(tmp_path / "in.npz", a=np.zeros((3, 2), np.float32), b=np.zeros((5, 2), np.float32))
    no_build(monkeypatch)
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz")]) == 1
    assert "input 'b' has n = 5 (axis 0), but input 'a' has n = 3" in capsys.readouterr().err
    assert main(["run", str(path), "--random"]) == 1
    assert "of symbolic shape: give its inputs with --inputs" in capsys.readouterr().err


# --- options checked ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["optimize", "build", "show", "run", "bench", "export"])
def test_opt_level_is_in_range(model, command, capsys):
    path, _, _, _ = model
    err = bad_arguments([command, str(path), "--opt-level", "9"], capsys)
    assert "argument --opt-level: must be from 0 to 4, got 9" in err


@pytest.mark.parametrize("option, value, message", [
    ("--dump-after", "fuse-opss", "--dump-after fuse-opss: no pass is named 'fuse-opss'; "
     "did you mean fuse-ops?"),
    ("--dump-before", "nosuch", "--dump-before nosuch: no pass is named 'nosuch'"),
    ("--disable", "fold-constant,fold-constnt", "--disable fold-constnt: no pass is named "
     "'fold-constnt'; did you mean fold-constant?"),
    ("--passes", "fuse-ops,lowr-to-ssa", "did you mean lower-to-ssa?"),
])
def test_pass_names_are_checked(model, monkeypatch, capsys, option, value, message):
    path, weights, _, _ = model
    no_build(monkeypatch)
    for command in (["optimize"], ["build"]) if option != "--passes" else (["optimize"],):
        assert main([*command, str(path), option, value]) == 1
        err = capsys.readouterr().err
        assert message in err and "kiln optimize --list shows them all" in err, err


def test_dumps_accept_every_pass_and_a_star(model, capsys):
    path, weights, _, _ = model
    assert main(["optimize", str(path), "--params", str(weights), "--dump-after", "*"]) == 0
    err = capsys.readouterr().err
    assert "// ---- IR after fuse-ops ----" in err
    assert "/* float32[16, 8] elided */" in err  # dumps elide big constants
    assert main(["optimize", str(path), "--params", str(weights), "--dump-after", "fuse-ops",
                 "--show-constants"]) == 0
    assert "elided" not in capsys.readouterr().err


def test_missing_files_name_their_option(model, tmp_path, capsys):
    path, _, _, _ = model
    for command in ("optimize", "build", "show", "export", "run", "bench"):
        assert main([command, str(path), "--params", str(tmp_path / "no.npz")]) == 1
        assert f"--params {tmp_path / 'no.npz'}: no such file" in capsys.readouterr().err


# --- elided constants --------------------------------------------------------------------------


def test_show_elides_big_constants_unless_asked(model, capsys):
    path, weights, _, _ = model
    assert main(["show", "--level", "fused", str(path), "--params", str(weights)]) == 0
    out = capsys.readouterr().out
    assert "meta[relay.Constant][0] /* float32[16, 8] elided */" in out
    assert '{"dtype": "float32", "shape": [16, 8], "elided": true}' in out
    assert out.count('"data"') == 1  # the bias: 16 elements are few enough to show
    assert main(["show", "--level", "fused", str(path), "--params", str(weights),
                 "--show-constants"]) == 0
    full = capsys.readouterr().out
    assert "elided" not in full
    assert kiln.parse(full) is not None


def test_optimize_to_a_file_keeps_every_weight(model, tmp_path, capsys):
    path, weights, inputs, want = model
    out = tmp_path / "opt.rly"
    assert main(["optimize", str(path), "--params", str(weights), "-o", str(out)]) == 0
    text = out.read_text()
    assert "elided" not in text
    mod = kiln.parse(text)
    with np.load(inputs) as f:
        x = f["x"]
    np.testing.assert_allclose(kiln.interpret(mod, x), want, rtol=1e-5, atol=1e-5)
    assert main(["optimize", str(path), "--params", str(weights)]) == 0  # stdout, not a TTY
    assert "elided" not in capsys.readouterr().out


# --- kiln cache ----------------------------------------------------------------------------


def test_cache_info_and_clear(model, tmp_path, capsys):
    path, weights, _, _ = model
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"location  {tmp_path / 'cache'}" in out and "entries   0" in out
    assert "cap       1.0 GiB" in out
    assert main(["build", str(path), "--params", str(weights), "-o",
                 str(tmp_path / "m.kiln")]) == 0
    capsys.readouterr()
    assert main(["cache", "info"]) == 0
    entries = int(capsys.readouterr().out.split("entries")[1].split()[0])
    assert entries == len(list((tmp_path / "cache" / "objects").iterdir())) > 0
    assert main(["cache", "clear"]) == 0
    assert f"removed {entries} entries" in capsys.readouterr().out
    assert list((tmp_path / "cache" / "objects").iterdir()) == []
    bad_arguments(["cache"], capsys)


def test_cache_off(monkeypatch, capsys):
    monkeypatch.setenv("KILN_CACHE", "")
    assert main(["cache", "info"]) == 0
    assert "the cache is off (KILN_CACHE='')" in capsys.readouterr().out
    monkeypatch.setenv("KILN_CACHE", "0")
    assert main(["cache", "info"]) == 0
    assert "the cache is off (KILN_CACHE='0')" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 1
    assert "nothing to clear" in capsys.readouterr().err
    monkeypatch.setenv("KILN_CACHE", "/tmp/x")
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "huge")
    assert main(["cache", "info"]) == 1
    assert "KILN_CACHE_MAX_BYTES='huge'" in capsys.readouterr().err
