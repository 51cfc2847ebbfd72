"""exe.profile: every kernel listed with its calls, FLOPs counted from the shapes, times that
add up, and each kernel pointed at its line of Relay text."""

import numpy as np
import pytest

import kiln
from kiln.ssa.serialize import read_program, write_program
from kiln.text import parse

# M = 42 rows and N = 32 columns are whole multiples of every target's GEMM register tile
# (6×16 on AVX2, 14×32 on AVX-512, 14×8 on NEON), and K ≤ 40 fits one K block: no tile
# computes padding, so a dense kernel's arithmetic is exactly 2·M·N·K plus its epilogue.
M, K1, N = 42, 40, 32
MLP = f"""#[version = "0.0.5"]
def @main(%x: Tensor[({M}, {K1}), float32], %w1: Tensor[({N}, {K1}), float32],
          %b1: Tensor[({N}), float32], %w2: Tensor[({N}, {N}), float32],
          %b2: Tensor[({N}), float32], %w3: Tensor[({N}, {N}), float32],
          %b3: Tensor[({N}), float32]) {{
  %0 = nn.dense(%x, %w1);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.dense(%2, %w2);
  %4 = nn.bias_add(%3, %b2);
  %5 = nn.relu(%4);
  %6 = nn.dense(%5, %w3);
  %7 = nn.bias_add(%6, %b3);
  %8 = nn.relu(%7);
  nn.softmax(%8)
}}
"""


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line of ``text`` containing ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture(scope="module")
def mlp():
    mod = parse(MLP, "mlp.rly")
    rng = np.random.default_rng(0)
    params = {p.name_hint: rng.standard_normal([int(d) for d in p.type_annotation.shape])
              .astype("float32") for p in mod["main"].params[1:]}
    exe = kiln.build(mod, params=params)
    x = rng.standard_normal((M, K1)).astype("float32")
    return exe, x


def kernel_uses(program) -> dict[str, int]:
    uses: dict[str, int] = {}
    for fn in program.functions.values():
        for ins in fn.instructions():
            if ins.op in ("kernel", "kernel_dyn"):
                uses[ins.attrs["kernel"]] = uses.get(ins.attrs["kernel"], 0) + 1
    return uses


def test_every_kernel_is_listed_with_repeats_times_uses_calls(mlp):
    exe, x = mlp
    p = exe.profile(x, repeat=5)
    uses = kernel_uses(exe.program)
    assert sorted(r.kernel for r in p.rows) == sorted(exe.program.kernels)
    assert {r.kernel: r.calls for r in p.rows} == {k: 5 * n for k, n in uses.items()}
    assert max(uses.values()) == 2  # layers 2 and 3 share one kernel
    assert p.repeat == 5


def test_dense_flops_are_2mnk_plus_the_epilogue(mlp):
    exe, x = mlp
    p = exe.profile(x, repeat=2)
    by_shape = {}
    for r in p.rows:
        decl = exe.program.kernels[r.kernel]
        if "nn.dense_packed" in decl.ops:
            (m, k), n = decl.inputs[0].static_shape, decl.outputs[0].static_shape[1]
            by_shape[k] = r.flops, m, n
    # per output element: a bias add and relu's max, one operation each
    for k, (flops, m, n) in by_shape.items():
        assert flops == 2 * m * n * k + m * n + m * n, k
    assert sorted(by_shape) == [N, K1]


def test_times_add_up(mlp):
    exe, x = mlp
    p = exe.profile(x, repeat=4)
    assert all(r.total >= 0 and 0 <= r.share <= 1 for r in p.rows)
    assert sum(r.total for r in p.rows) <= p.vm_total
    assert sum(r.share for r in p.rows) <= 1 + 1e-9
    assert p.whole > 0 and p.executor == exe.stats().executor
    for r in p.rows:
        assert r.mean == pytest.approx(r.total / r.calls)
        assert r.gflops == pytest.approx(r.flops * r.calls / r.total / 1e9)
    # the table: every kernel, the costliest first, and a totals line
    text = str(p).splitlines()
    listed = [line.split()[0] for line in text[2:2 + len(p.rows)]]
    assert listed == [r.kernel for r in sorted(p.rows, key=lambda r: -r.total)]
    assert any(line.startswith("total (kernels)") for line in text)


def test_source_locations_point_at_the_relay_lines(mlp):
    exe, _ = mlp
    loc = {name: d.location for name, d in exe.program.kernels.items()}
    first = line_of(MLP, "%0 = nn.dense")
    second = line_of(MLP, "%3 = nn.dense")  # the kernel layers 2 and 3 share: first met
    softmax = line_of(MLP, "nn.softmax")
    expected = {f"mlp.rly:{first}:8", f"mlp.rly:{second}:8", f"mlp.rly:{softmax}:3"}
    assert set(loc.values()) == expected
    p = exe.profile(np.zeros((M, K1), "float32"), repeat=1)
    assert {r.location for r in p.rows} == expected


def test_locations_are_saved_and_old_files_still_read(mlp, tmp_path):
    exe, x = mlp
    exe.save(tmp_path / "mlp.kiln")
    loaded = kiln.load(tmp_path / "mlp.kiln")
    assert ({n: d.location for n, d in loaded.program.kernels.items()}
            == {n: d.location for n, d in exe.program.kernels.items()})
    doc = write_program(exe.program)
    for k in doc["kernels"]:
        del k["location"]  # as written before kernels had one
    old = read_program(doc, exe.program.constants)
    assert all(d.location is None for d in old.kernels.values())


def test_a_kernel_of_symbolic_shape_is_profiled_by_its_specialization():
    mod = parse("""#[version = "0.0.5"]
def @main(%a: Tensor[(n, 4), float32], %b: Tensor[(n, 4), float32]) {
  multiply(%a, %b)
}
""", "dyn.rly")
    exe = kiln.build(mod)
    x = np.ones((3, 4), "float32")
    p = exe.profile(x, x, repeat=3)
    (decl,) = exe.program.kernels.values()
    (row,) = p.rows
    assert row.kernel.startswith(decl.name + "__") and row.kernel != decl.name
    assert row.calls == 3 and row.flops == 3 * 4  # one multiply per element
    assert row.location == "dyn.rly:3:3" and row.ops == ("multiply",)


def test_profile_checks_its_arguments(mlp):
    exe, x = mlp
    with pytest.raises(kiln.Error, match="repeat"):
        exe.profile(x, repeat=0)
    with pytest.raises(kiln.Error, match="shape"):
        exe.profile(x[:, :3], repeat=1)


def test_the_flop_rule_on_hand_written_loop_ir():
    from kiln.loops.ir import (
        FMA,
        Binary,
        Buffer,
        Const,
        For,
        IfThenElse,
        Kernel,
        Load,
        Seq,
        Store,
        Var,
    )
    from kiln.runtime.profile import kernel_flops

    a = Buffer("a", (4, 4), "float32")
    out = Buffer("out", (4, 4), "float32")
    i, j = Var("i"), Var("j")
    x = Load(a, (i, j))
    sq = Binary("mul", x, x)
    # a triangle: row i has i + 1 columns, and rows below 2 take the other branch
    body = IfThenElse(Binary("lt", i, Const(2)),
                      Store(out, (i, j), Binary("add", sq, sq)),  # sq shared: 2 operations
                      Store(out, (i, j), FMA(x, x, Const(1.0, "float32"))))  # 2
    tri = For(i, Const(0), Const(4), For(j, Const(0), Binary("add", i, Const(1)), body))
    idx = Store(out, (Const(0), Const(0)), Load(a, (Binary("mul", Const(2), Const(1)),
                                                     Const(0))))  # index arithmetic: 0
    k = Kernel("k", (a,), (out,), Seq((tri, idx)))
    assert kernel_flops(k) == 2 * (1 + 2 + 3 + 4)


def test_folded_batch_norm_keeps_the_convolutions_source_line():
    """fold-scale-axis and batch-norm folding keep spans: the conv kernel points at its conv."""
    text = """
def @main(%x: Tensor[(1, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32],
          %g: Tensor[(4), float32], %b: Tensor[(4), float32], %m: Tensor[(4), float32],
          %v: Tensor[(4), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.batch_norm(%0, %g, %b, %m, %v);
  nn.relu(%1.0)
}
"""
    r = np.random.default_rng(0)
    params = {"w": r.standard_normal((4, 3, 3, 3)).astype("float32"),
              **{k: (r.random(4) + 0.5).astype("float32") for k in "gbmv"}}
    exe = kiln.build(kiln.parse(text), params=params)
    (decl,) = exe.program.kernels.values()
    conv_line = text.splitlines().index("  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);") + 1
    assert decl.location is not None and decl.location.split(":")[1] == str(conv_line)
