"""The build, run and show commands."""

import numpy as np
import pytest

import kiln
from kiln.cli import main

MODEL = """
def @main(%x: Tensor[(2, 5), float32], %w: Tensor[(3, 5), float32], %b: Tensor[(3), float32]) {
  %0 = nn.relu(nn.bias_add(nn.dense(%x, %w), %b, axis=-1));
  (%0, tanh(sum(%0, axis=[1])))
}
"""


@pytest.fixture
def files(tmp_path):
    r = np.random.default_rng(0)
    (tmp_path / "m.rly").write_text(MODEL)
    w = {"w": r.standard_normal((3, 5)).astype("float32"),
         "b": r.standard_normal(3).astype("float32")}
    x = r.standard_normal((2, 5)).astype("float32")
    np.savez(tmp_path / "w.npz", **w)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "pos.npz", x)
    return tmp_path, w, x


def expected(w, x):
    return kiln.interpret(kiln.parse(MODEL), x, params=w)


def test_build_then_run(files, capsys):
    d, w, x = files
    assert main(["build", str(d / "m.rly"), "-o", str(d / "m.kiln"), "--params",
                 str(d / "w.npz"), "--target", "evaluator", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "wrote" in err and "@main(%x: Tensor[(2, 5), float32])" in err and "arena" in err
    assert main(["run", str(d / "m.kiln"), "--inputs", str(d / "in.npz"), "-o",
                 str(d / "out.npz")]) == 0
    with np.load(d / "out.npz") as out:
        want = expected(w, x)
        np.testing.assert_allclose(out["output_0"], want[0], rtol=1e-5)
        np.testing.assert_allclose(out["output_1"], want[1], rtol=1e-5)
    # Inputs may also be given in order (numpy's savez names them arr_0, arr_1, ...).
    assert main(["run", str(d / "m.kiln"), "--inputs", str(d / "pos.npz"), "--time"]) == 0
    captured = capsys.readouterr()
    assert "output_0: float32[2, 3]" in captured.out and "ran in" in captured.err


def test_run_builds_a_relay_file_first(files, capsys):
    d, w, x = files
    assert main(["run", str(d / "m.rly"), "--params", str(d / "w.npz"), "--inputs",
                 str(d / "in.npz"), "--target", "evaluator", "-o", str(d / "o.npz")]) == 0
    with np.load(d / "o.npz") as out:
        np.testing.assert_allclose(out["output_1"], expected(w, x)[1], rtol=1e-5)


@pytest.mark.parametrize("level,marker", [
    ("relay", "nn.dense(%x, %w"),
    ("fused", "Primitive=1"),
    ("ssa", "kernel @fused_nn_dense"),
    ("loops", "kernel fused_nn_dense"),
])
def test_show_levels(files, capsys, level, marker):
    d, _, _ = files
    assert main(["show", "--level", level, str(d / "m.rly")]) == 0
    out = capsys.readouterr().out
    assert marker in out
    if level == "ssa":
        assert "func @main" in out and "// arena" in out


def test_errors_are_one_line_with_a_nonzero_status(files, capsys):
    d, _, _ = files
    np.savez(d / "bad.npz", x=np.zeros((2, 4), "float32"))
    main(["build", str(d / "m.rly"), "-o", str(d / "m.kiln"), "--params", str(d / "w.npz"),
          "--target", "evaluator"])
    capsys.readouterr()
    cases = [
        (["run", str(d / "m.kiln"), "--inputs", str(d / "bad.npz")],
         "input 'x' has shape [2, 4], but the model expects Tensor[(2, 5), float32]"),
        (["run", str(d / "m.kiln")], "give them with --inputs"),
        (["build", str(d / "none.rly")], "no such file"),
        (["run", str(d / "w.npz")], "not a valid kiln executable"),
        (["run", str(d / "m.kiln"), "--params", str(d / "w.npz"), "--inputs",
          str(d / "in.npz")], "--params binds weights when building"),
    ]
    for argv, message in cases:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("command", ["build", "run", "show"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage: kiln " + command in capsys.readouterr().out
