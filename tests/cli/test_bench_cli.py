"""`kiln bench`: latency of a .rly, .onnx or .kiln model, and --profile's table."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.cli import main
from kiln.cli.common import read_relay

RELAY = """#[version = "0.0.5"]
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(16, 8), float32], %b: Tensor[(16), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b);
  %2 = nn.relu(%1);
  nn.softmax(%2)
}
"""


@pytest.fixture
def relay_file(tmp_path):
    path = tmp_path / "small.rly"
    path.write_text(RELAY)
    return path


def test_bench_prints_latency_and_the_profile_table(relay_file, capsys):
    assert main(["bench", str(relay_file), "--repeat", "5", "--warmup", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "5 calls after 1 warm-up: min" in out and "median" in out and "calls/s" in out
    assert "p10" in out and "p90" in out and "random inputs (seed 0)" in out
    table = out[out.index("kernel "):].splitlines()
    listed = {line.split()[0] for line in table[2:] if line.startswith("fused_")}
    kernels = set(kiln.build(read_relay(str(relay_file))).program.kernels)
    assert listed == kernels
    dense = next(line for line in table if line.startswith("fused_nn_dense"))
    assert f"{relay_file}:3:8" in dense and dense.split()[1] == "5"  # calls: 5 runs × 1 use
    assert any(line.startswith("total (kernels)") for line in table)


def test_bench_an_onnx_model_with_its_inputs(tmp_path, capsys):
    w = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "tiny.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32))
    assert main(["bench", str(tmp_path / "tiny.onnx"), "--inputs", str(tmp_path / "in.npz"),
                 "--repeat", "3", "--warmup", "0", "--threads", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "3 calls after 0 warm-up" in out and "1 thread," in out
    assert f"inputs from {tmp_path / 'in.npz'}" in out
    assert "fused_" in out and "total (kernels)" in out


def test_bench_a_saved_executable(relay_file, tmp_path, capsys):
    exe = kiln.build(read_relay(str(relay_file)))
    exe.save(tmp_path / "small.kiln")
    assert main(["bench", str(tmp_path / "small.kiln"), "--repeat", "2"]) == 0
    assert "2 calls after 3 warm-up" in capsys.readouterr().out
    assert main(["bench", str(tmp_path / "small.kiln"), "--params", "w.npz"]) == 1
    assert "--params binds weights when building" in capsys.readouterr().err


def test_random_inputs_follow_the_parameter_types(tmp_path):
    from kiln.cli.inputs import INT_HIGH, executable_inputs, random_inputs

    path = tmp_path / "ints.rly"
    path.write_text("""#[version = "0.0.5"]
def @main(%i: Tensor[(50), int64], %x: Tensor[(2, 3), float32]) {
  (%i, %x)
}
""")
    exe = kiln.build(read_relay(str(path)))
    ints, floats = random_inputs(executable_inputs(exe), 7, "bench")
    assert ints.dtype == np.int64 and ints.shape == (50,)
    assert ints.min() >= 0 and ints.max() < INT_HIGH
    assert floats.dtype == np.float32 and floats.shape == (2, 3)
    again = random_inputs(executable_inputs(exe), 7, "bench")
    assert np.array_equal(ints, again[0]) and np.array_equal(floats, again[1])


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
    (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["--warmup", "-1"], "argument --warmup: must be at least 0, got -1"),
    (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["--opt-level", "5"], "argument --opt-level: must be from 0 to 4, got 5"),
    (["--repeat", "many"], "argument --repeat: want an integer, not 'many'"),
])
def test_bad_arguments_are_errors(relay_file, capsys, argv, message):
    with pytest.raises(SystemExit) as e:  # bad arguments: status 2, before anything is read
        main(["bench", str(relay_file), *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_with_threads_sets_the_executables_count(relay_file, tmp_path, capsys):
    assert main(["bench", str(relay_file), "--repeat", "2", "--warmup", "0",
                 "--threads", "2"]) == 0
    assert ", 2 threads," in capsys.readouterr().out
    exe = kiln.build(read_relay(str(relay_file)))
    exe.save(tmp_path / "small.kiln")
    assert main(["bench", str(tmp_path / "small.kiln"), "--repeat", "2", "--warmup", "0",
                 "--threads", "1"]) == 0
    assert ", 1 thread," in capsys.readouterr().out


def test_bench_checks_its_inputs_before_building(relay_file, tmp_path, capsys, monkeypatch):
    import sys

    def no_build(*args, **kwargs):
        raise AssertionError("built before the inputs were checked")

    monkeypatch.setattr(sys.modules["kiln.runtime.build"], "build", no_build)
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 9), np.float32),
             w=np.zeros((16, 8), np.float32), b=np.zeros(16, np.float32))
    assert main(["bench", str(relay_file), "--inputs", str(tmp_path / "bad.npz")]) == 1
    err = capsys.readouterr().err
    assert "input 'x' has shape [4, 9], but the model expects Tensor[(4, 8), float32]" in err
    assert main(["bench", str(relay_file), "--inputs", str(tmp_path / "none.npz")]) == 1
    assert f"--inputs {tmp_path / 'none.npz'}: no such file" in capsys.readouterr().err


def test_bad_files_and_symbolic_shapes_are_errors(tmp_path, capsys):
    (tmp_path / "model.txt").write_text("")
    assert main(["bench", str(tmp_path / "model.txt")]) == 1
    assert "kiln bench reads .rly, .onnx and .kiln files" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "missing.rly")]) == 1
    assert "no such file" in capsys.readouterr().err
    dyn = tmp_path / "dyn.rly"
    dyn.write_text('#[version = "0.0.5"]\ndef @main(%a: Tensor[(n), float32]) { negative(%a) }\n')
    assert main(["bench", str(dyn)]) == 1
    assert "symbolic shape: give its inputs with --inputs" in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--profile" in out and "--repeat" in out and "--threads" in out
