"""`kiln build`: the pass list, IR dumps after back-end passes, pass timing."""

from pathlib import Path

import kiln
from kiln.cli import main

DEMO = Path(__file__).parents[2] / "examples" / "demo.rly"


def test_list_passes_shows_the_whole_pipeline_in_order(capsys):
    assert main(["build", "--list-passes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    levels = {line.split()[0]: int(line.split()[2]) for line in lines}
    for name in ("fuse-ops", "lower-to-ssa", "lift-constants", "plan-memory", "lower-kernels",
                 "decompose-math", "compile"):
        assert name in names, name
    assert names.index("fuse-ops") < names.index("lower-to-ssa") < names.index("plan-memory")
    assert names.index("plan-memory") < names.index("lower-kernels") < names.index("compile")
    assert levels["fold-constant"] == 1 and levels["plan-memory"] == 2
    assert levels["lower-kernels"] == 3


def test_dump_after_and_time_cover_the_back_end(tmp_path, capsys):
    out = tmp_path / "demo.kiln"
    assert main(["build", str(DEMO), "-o", str(out), "--dump-after", "plan-memory",
                 "--time"]) == 0
    err = capsys.readouterr().err
    assert "// ---- IR after plan-memory ----" in err and "@arena+" in err
    assert "lower-kernels" in err.split("// ----")[-1]  # the timing table, after the dump
    assert kiln.load(out).signature.startswith("@main(%a: Tensor[(1, 8), float32]")


def test_build_without_a_model_says_so(capsys):
    assert main(["build"]) == 1
    assert "needs a model file" in capsys.readouterr().err
