"""kiln.tune end to end on small models: a tiny budget finishes, writes a log that a rebuild
uses, and a KeyboardInterrupt keeps what was found."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.loops import gemm, int8_amx
from kiln.target import Target
from kiln.tune import TuneProgress, read_log
from kiln.tune.log import best_entries
from tests.tune.helpers import conv_net, reference, winograd_net

HOST = Target.host()


def _recorded(exe: kiln.Executable) -> dict[str, dict]:
    out = {}
    for decl in exe.program.kernels.values():
        for _, knobs in (decl.kernel.attrs.get("schedules", ()) if decl.kernel else ()):
            if knobs.get("key"):
                out[knobs["key"]] = knobs
    return out


def _rebuilt_with_a_move(mod: kiln.IRModule, params: dict | None, key: str, knob: str,
                         log: Path, target: Target = HOST) -> tuple[Any, dict, dict]:
    """The model rebuilt with a log of one final entry for ``key``: the first one-knob
    move of its space that changes ``knob``. (the build, the move, the knobs it recorded)"""
    from kiln.tune.log import Entry, LogWriter
    from kiln.tune.sites import site_of

    site = site_of(key, target)
    assert site is not None, key
    space = site.space
    move = next(p for p in space.neighbours(space.default) if p[knob] != space.default[knob])
    writer = LogWriter(str(log))
    writer.add(Entry(target.fingerprint, key, move, 1.0, 2.0, final=True))
    writer.close()
    exe = kiln.build(mod, params=params, target=target, tuning_log=log)
    return exe, move, _recorded(exe)[key]


def test_tiny_budget_run_writes_a_log_that_a_rebuild_uses(tmp_path: Path) -> None:
    mod, params = conv_net()
    log = tmp_path / "net.tunelog"
    seen: list[TuneProgress] = []
    start = time.perf_counter()
    result = kiln.tune(mod, params, budget_s=4.0, log=str(log), progress=seen.append)
    elapsed = time.perf_counter() - start
    assert elapsed < 4.0 + 15  # the budget, and one candidate and confirmation per kernel
    keys = {r.key for r in result.kernels}
    # two convolutions and the dense layer (on a loaded machine the last may be left out)
    assert keys and len(keys) + len(result.out_of_time) == 3 and not result.skipped
    for r in result.kernels:
        assert r.candidates >= 1 and r.rejected == 0 and r.default_s > 0
        assert r.best_s <= r.default_s and 0 < r.share <= 1
    assert seen and seen[-1].kernels_done == seen[-1].kernels_total == 3
    entries = read_log(log)
    assert {e.key for e in entries if e.final} == keys  # every kernel confirmed
    best = best_entries(entries, HOST)
    exe = kiln.build(mod, params=params, tuning_log=log)
    recorded = _recorded(exe)
    for key, entry in best.items():
        knobs = recorded[key]
        assert gemm.tile_knobs(gemm.GemmSchedule(
            knobs["mr"], knobs["nr"], knobs["kc"], knobs["mc"], knobs["nc"],
            knobs["parallel"], knobs["unroll"], knobs["lanes"], knobs["order"],
            knobs["chunks"])) == entry.knobs
        assert knobs["tuned"] == (entry.knobs != _default(key))
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(exe(x), reference(mod, params, x), rtol=1e-4, atol=1e-4)
    lines = str(result).splitlines()  # a header, a line per kernel, a summary
    assert len(lines) == 2 + len(keys) + bool(result.out_of_time)


def test_a_log_reaches_the_blocked_winograd_products(tmp_path: Path) -> None:
    # Two 3×3 convolutions that convert-layout runs as Winograd on channel blocks: their
    # products are a site (winograd_nchwc ...); a log entry moving its register tile is
    # taken by a rebuild (U repacked for its nr), and the result stays the reference's.
    rng = np.random.default_rng(0)
    c = HOST.lanes("float32") * 2
    mod, params = winograd_net()
    plain = _recorded(kiln.build(mod, params=params))
    (key,) = [k for k in plain if k.startswith("winograd_nchwc ")]
    exe, move, got = _rebuilt_with_a_move(mod, params, key, "nr", tmp_path / "w.tunelog")
    assert got["tuned"] and (got["mr"], got["nr"]) == (move["mr"], move["nr"])
    data = rng.uniform(-1, 1, (1, c, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(exe(data), reference(mod, params, data), rtol=1e-4, atol=1e-4)


_INT8_DENSE = """#[version = "0.0.5"]
def @main(%x: Tensor[(3, 200), int8], %w: Tensor[(40, 200), int8]) {
  %0 = nn.dense(%x, %w, out_dtype="int32");
  cast(%0, dtype="float32")
}
"""


def test_an_int8_dense_is_tuned_and_a_rebuild_takes_its_knobs(tmp_path: Path) -> None:
    # An 8-bit dense of 3 rows on a constant weight runs the int8 GEMM on its prepacked
    # panels (a few rows: not AMX tiles, where the host has them); kiln.tune measures its
    # site, and a log entry moving its tile width is taken by a rebuild (the panels repacked
    # for it), whose results stay numpy's exact integer product.
    rng = np.random.default_rng(4)
    mod = kiln.parse(_INT8_DENSE)
    params = {"w": rng.integers(-128, 128, (40, 200)).astype(np.int8)}
    plain = _recorded(kiln.build(mod, params=params))
    (key,) = [k for k in plain if k.startswith("int8_gemm op=dense_prepacked ")]
    result = kiln.tune(mod, params, budget_s=3.0, log=str(tmp_path / "t.tunelog"))
    assert {r.key for r in result.kernels} | set(result.out_of_time) == {key}
    assert not result.skipped and all(r.rejected == 0 for r in result.kernels)
    exe, move, got = _rebuilt_with_a_move(mod, params, key, "nr", tmp_path / "q.tunelog")
    assert got["tuned"] and (got["mr"], got["nr"]) == (move["mr"], move["nr"])
    x = rng.integers(-128, 128, (3, 200)).astype(np.int8)
    want = x.astype(np.int64) @ params["w"].astype(np.int64).T
    np.testing.assert_array_equal(np.asarray(exe(x)), want.astype(np.float32))


@pytest.mark.skipif(not int8_amx.usable(HOST),
                    reason="the host has no AMX tiles to run")
def test_an_int8_dense_on_amx_tiles_takes_logged_units(tmp_path: Path) -> None:
    # 40 rows: the dense runs on AMX tiles, whose units (pairs of row tiles by pairs of
    # column tiles) are a site; a rebuild takes logged units and computes numpy's product
    rng = np.random.default_rng(6)
    mod = kiln.parse(_INT8_DENSE.replace("(3, 200)", "(40, 200)"))
    params = {"w": rng.integers(-128, 128, (40, 200)).astype(np.int8)}
    key = int8_amx.dense_key(40, 40, 200, "int8", "int8")
    assert key in _recorded(kiln.build(mod, params=params))
    exe, move, got = _rebuilt_with_a_move(mod, params, key, "mb", tmp_path / "a.tunelog")
    assert got["tuned"] and got["unit"] == (move["mb"], move["nb"])
    x = rng.integers(-128, 128, (40, 200)).astype(np.int8)
    want = x.astype(np.int64) @ params["w"].astype(np.int64).T
    np.testing.assert_array_equal(np.asarray(exe(x)), want.astype(np.float32))


_INT8_CONV = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 12, 10, 11), int8], %w: Tensor[(20, 12, 3, 3), int8]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], out_dtype="int32");
  cast(%0, dtype="float32")
}
"""


def test_an_int8_convolution_is_tuned_and_a_rebuild_takes_its_knobs(tmp_path: Path) -> None:
    # On a Target without AMX an 8-bit conv2d runs the int8 GEMM on channel-group planes
    # (kiln/loops/int8_conv.py): its site is measured, and a logged register tile is taken
    # by a rebuild (the weight's panels packed for it), which computes the reference's.
    target = Target.parse("llvm -mattr=-amx-tile")
    rng = np.random.default_rng(5)
    mod = kiln.parse(_INT8_CONV)
    params = {"w": rng.integers(-128, 128, (20, 12, 3, 3)).astype(np.int8)}
    plain = _recorded(kiln.build(mod, params=params, target=target))
    (key,) = [k for k in plain if k.startswith("int8_conv ")]
    result = kiln.tune(mod, params, budget_s=3.0, log=str(tmp_path / "t.tunelog"),
                       target=target)
    assert {r.key for r in result.kernels} | set(result.out_of_time) == {key}
    assert not result.skipped and all(r.rejected == 0 for r in result.kernels)
    exe, move, got = _rebuilt_with_a_move(mod, params, key, "mr", tmp_path / "q.tunelog",
                                          target)
    assert got["tuned"] and (got["mr"], got["nr"]) == (move["mr"], move["nr"])
    x = rng.integers(-128, 128, (1, 12, 10, 11)).astype(np.int8)
    np.testing.assert_array_equal(np.asarray(exe(x)), reference(mod, params, x))


_WEIGHT_GRAD = """#[version = "0.0.5"]
def @main(%g: Tensor[(2, 24, 12, 12), float32], %x: Tensor[(2, 32, 12, 12), float32]) {
  nn.conv2d_backward_weight(%g, %x, padding=[1, 1, 1, 1], channels=24, kernel_size=[3, 3])
}
"""


def test_a_weight_gradient_is_tuned_and_a_rebuild_takes_its_knobs(tmp_path: Path) -> None:
    # conv2d's weight gradient (what a training step computes) is a site: kiln.tune measures
    # it, and a logged register tile is taken by a rebuild, which computes the reference's
    rng = np.random.default_rng(7)
    mod = kiln.parse(_WEIGHT_GRAD)
    plain = _recorded(kiln.build(mod))
    (key,) = [k for k in plain if k.startswith("conv2d_backward_weight ")]
    result = kiln.tune(mod, budget_s=3.0, log=str(tmp_path / "t.tunelog"))
    assert {r.key for r in result.kernels} | set(result.out_of_time) == {key}
    assert not result.skipped and all(r.rejected == 0 for r in result.kernels)
    exe, move, got = _rebuilt_with_a_move(mod, None, key, "mr", tmp_path / "g.tunelog")
    assert got["tuned"] and got["mr"] == move["mr"]
    g = rng.uniform(-1, 1, (2, 24, 12, 12)).astype(np.float32)
    x = rng.uniform(-1, 1, (2, 32, 12, 12)).astype(np.float32)
    want = np.asarray(kiln.interpret(mod, g, x))
    np.testing.assert_allclose(np.asarray(exe(g, x)), want, rtol=1e-4, atol=1e-4)


def test_the_channel_block_is_searched_for_the_whole_model(tmp_path: Path) -> None:
    # The block convert-layout runs a function in is a knob of the whole model: kiln.tune
    # times the model in each block first (alternated), keeps the default unless another is
    # faster, and writes its choice as a final entry; a rebuild takes a logged block.
    from kiln.tune.log import Entry, LogWriter

    lanes = HOST.lanes("float32")
    mod, params = winograd_net()
    log = tmp_path / "b.tunelog"
    result = kiln.tune(mod, params, budget_s=1.0, log=str(log))
    (lay,) = result.layouts
    assert lay.key.startswith("convert_layout ") and lay.default == lanes
    assert set(lay.seconds) == {lanes, 2 * lanes} and min(lay.seconds.values()) > 0
    assert lay.block == lanes or lay.seconds[lay.block] < lay.seconds[lanes] * 0.97
    (entry,) = [e for e in read_log(log) if e.key == lay.key]
    assert entry.final and entry.kind == "convert_layout" and entry.knobs == {"block": lay.block}
    assert str(result).startswith(lay.key)
    # the sites searched are those of the model in the block kept
    blocked = [k for k in [r.key for r in result.kernels] + result.skipped + result.out_of_time
               if k.split()[0] in ("winograd_nchwc", "conv2d_nchwc")]
    assert blocked and all(k.split()[1].endswith(f"x{lay.block}") for k in blocked)
    wide = tmp_path / "wide.tunelog"
    writer = LogWriter(str(wide))
    writer.add(Entry(HOST.fingerprint, lay.key, {"block": 2 * lanes}, 1.0, 2.0, final=True))
    writer.close()
    exe = kiln.build(mod, params=params, tuning_log=wide)
    (key,) = [k for k in _recorded(exe) if k.startswith("winograd_nchwc ")]
    assert f"x=1x1x28x28x{2 * lanes} " in key
    data = np.random.default_rng(1).uniform(-1, 1, (1, 2 * lanes, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(exe(data), reference(mod, params, data), rtol=1e-4, atol=1e-4)


def _logged(path: Path, key: str, knobs: dict) -> Path:
    from kiln.tune.log import Entry, LogWriter

    writer = LogWriter(str(path))
    writer.add(Entry(HOST.fingerprint, key, knobs, 1.0, 2.0, final=True))
    writer.close()
    return path


def test_a_convolutions_algorithm_is_searched_for_the_whole_model(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Whether a shape of 3×3 convolution runs as F(4×4), F(2×2) or directly is a knob of
    # the whole model: each is built and timed whole (alternated), the rule's kept unless
    # another is faster; a log entry of the algorithm is what a rebuild runs, and the
    # kernel sites of a model tuned so are those of the algorithm kept.
    from kiln.loops.winograd import recorded_algorithms
    from kiln.tune.measure import build_candidate
    from kiln.tune.tuner import LAYOUT_GAIN, extract_sites, tune_algorithms

    c = HOST.lanes("float32") * 2
    mod, params = winograd_net()
    with recorded_algorithms() as spaces:
        plain = kiln.build(mod, params=params)
    (key,) = {s.key for s in spaces}  # two layers, one shape
    assert key == (f"conv_algorithm x=1x{c}x28x28 w={c}x{c}x3x3 padding=1x1x1x1 "
                   f"out=1x{c}x28x28")
    base: dict = {}
    (alg,), _ = tune_algorithms(mod, params, HOST, spaces, base, plain, float("inf"))
    assert alg.key == key and alg.default == 4 and set(alg.seconds) == {4, 2, 0}
    assert alg.m == 4 or alg.seconds[alg.m] < alg.seconds[4] * (1 - LAYOUT_GAIN)
    assert base == ({} if alg.m == 4 else {key: {"m": alg.m}})
    data = np.random.default_rng(2).uniform(-1, 1, (1, c, 28, 28)).astype(np.float32)
    want = reference(mod, params, data)
    for m, kind in ((0, "conv2d_nchwc"), (2, "winograd_nchwc")):
        exe = kiln.build(mod, params=params, tuning_log=_logged(tmp_path / f"{m}.tunelog",
                                                                key, {"m": m}))
        keys = [k for k in _recorded(exe) if "nchwc" in k.split()[0]]
        assert keys and all(k.split()[0] == kind for k in keys), keys
        assert m == 0 or all(k.endswith(f" m={m}") for k in keys)
        np.testing.assert_allclose(exe(data), want, rtol=1e-4, atol=1e-4)
    with caplog.at_level("WARNING", logger="kiln"):  # no F(3×3) here: the rule's, noted
        exe = kiln.build(mod, params=params, tuning_log=_logged(tmp_path / "3.tunelog",
                                                                key, {"m": 3}))
    assert "not a legal schedule" in caplog.text
    assert all(k.endswith(" m=4") for k in _recorded(exe) if k.startswith("winograd_nchwc "))
    # tuned to F(2×2), the model's products are a site, built as in the model
    sites, skipped = extract_sites(mod, params, HOST, base={key: {"m": 2}})
    (site,) = [s for s, _ in sites if s.kind == "winograd_nchwc"]
    assert site.key.endswith(" m=2") and site.pinned == {key: {"m": 2}} and not skipped
    assert not build_candidate(site, None, HOST).tuned


def _site_space(key: str) -> Any:
    from kiln.tune.sites import site_of

    site = site_of(key, HOST)
    assert site is not None, key
    return site.space


def _default(key: str) -> dict:
    from kiln.tune.sites import site_of

    site = site_of(key, HOST)
    assert site is not None
    return site.space.default


def test_defaults_are_the_baseline_whatever_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.tune.tuner import extract_sites

    mod, params = conv_net()
    monkeypatch.setenv("KILN_TUNING_LOG", str(tmp_path / "missing.tunelog"))
    sites, skipped = extract_sites(mod, params, HOST)  # the log is not even read
    assert len(sites) == 3 and not skipped
    assert [s for _, s in sites] == sorted((s for _, s in sites), reverse=True)
    assert 0 < sum(s for _, s in sites) <= 1


def test_keyboard_interrupt_keeps_the_log(tmp_path: Path) -> None:
    mod, params = conv_net()
    log = tmp_path / "cut.tunelog"

    def stop_after_first_kernel(p: TuneProgress) -> None:
        if p.kernels_done >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kiln.tune(mod, params, budget_s=3.0, log=str(log), progress=stop_after_first_kernel)
    entries = read_log(log)  # a whole log: header and flushed lines
    assert any(e.final for e in entries)  # the first kernel's search was confirmed
    assert len({e.key for e in entries}) <= 2


def test_bad_arguments() -> None:
    mod, params = conv_net()
    with pytest.raises(kiln.Error, match="budget_s"):
        kiln.tune(mod, params, budget_s=-1)
    with pytest.raises(kiln.Error, match="evaluator"):
        kiln.tune(mod, params, target="evaluator")
    with pytest.raises(kiln.Error, match="cannot run code"):
        kiln.tune(mod, params, target="aarch64-linux-gnu")


def test_a_site_is_measured_with_its_models_weights_in_mind() -> None:
    # two dense layers whose weights fit the two L2s together, not one: in the model both
    # products split N (kiln/loops/schedule.py `weights_fit_split`); the second layer's
    # weight alone fits one L2, so measured alone it would split M. The site keeps the
    # model's weight bytes: its default is the model's, and a log entry that keeps the
    # default does not turn the model's split around.
    from kiln.tune.measure import build_candidate
    from kiln.tune.tuner import extract_sites

    if HOST.cores < 2:
        pytest.skip("one core: nothing is split")
    k = 256
    big = -(-HOST.l2 // (4 * k) // 32) * 32  # one L2 of weight
    small = -(-HOST.l2 // 4 // (4 * big) // 32) * 32  # a quarter of one
    rng = np.random.default_rng(7)
    x = kiln.var("x", shape=(64, k), dtype="float32")
    w1 = kiln.var("w1", shape=(big, k), dtype="float32")
    w2 = kiln.var("w2", shape=(small, big), dtype="float32")
    body = kiln.op.nn.dense(kiln.op.nn.relu(kiln.op.nn.dense(x, w1)), w2)
    mod = kiln.IRModule.from_expr(kiln.Function([x, w1, w2], body))
    params = {"w1": rng.uniform(-0.1, 0.1, (big, k)).astype(np.float32),
              "w2": rng.uniform(-0.1, 0.1, (small, big)).astype(np.float32)}
    model = _recorded(kiln.build(mod, params=params))
    assert sorted(s["parallel"] for s in model.values()) == ["n", "n"]
    sites, _ = extract_sites(mod, params, HOST)
    assert len(sites) == 2
    total = 4 * k * big + 4 * big * small
    for site, _share in sites:
        assert site.weight_bytes == total
        assert site.space.default["parallel"] == "n" == model[site.key]["parallel"]
        # the space's default is the schedule the site's build takes by itself
        assert not build_candidate(site, site.space.default, HOST).tuned


def test_tuned_knobs_stay_only_where_the_model_is_faster(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # step 4 of kiln/tune/tuner.py: a site tuned alone keeps its knobs only where its
    # kernels took less time in the model (the model's times given here)
    from kiln.tune import tuner

    def result(key: str) -> tuner.KernelResult:
        return tuner.KernelResult(key, "gemm", 0.5, default_s=2.0, best_s=1.0,
                                  knobs={"mr": 4}, tuned=True, time_to_best_s=3.0)

    faster, slower, untuned = result("a"), result("b"), result("c")
    untuned.tuned, untuned.knobs = False, {"mr": 8}
    seen: dict[str, Any] = {}

    def times(mod: Any, params: Any, target: Any, tuned: Any, seed: int = 0,
              base: Any = None) -> Any:
        seen.update(tuned)
        return ({"a": [2.0, 2.1, 2.0], "b": [1.0, 1.0, 1.1]},
                {"a": [1.5, 1.4, 1.6], "b": [1.0, 1.2, 1.1]})

    monkeypatch.setattr(tuner, "model_times", times)
    tuner.check_in_model(None, None, HOST, [faster, slower, untuned],  # type: ignore[arg-type]
                         lambda key: {"mr": 8})
    assert set(seen) == {"a", "b"}  # only the tuned sites are built tuned
    assert faster.tuned and faster.knobs == {"mr": 4}
    assert (faster.model_default_s, faster.model_best_s) == (2.0, 1.5)
    assert not slower.tuned and slower.knobs == {"mr": 8} and slower.best_s == 2.0
    assert (slower.model_default_s, slower.model_best_s) == (1.0, 1.1)
    assert not untuned.tuned and untuned.model_default_s == 0.0


def test_the_model_is_timed_with_and_without_the_tuned_knobs() -> None:
    # the real measurement of step 4: both builds agree, and each site's kernels are timed
    # in both (a tuned register tile for the first convolution's products)
    from kiln.tune.tuner import MODEL_ROUNDS, extract_sites, model_times

    mod, params = conv_net()
    sites, _ = extract_sites(mod, params, HOST)
    site = sites[0][0]
    move = next(iter(site.space.neighbours(site.space.default)))
    plain, fast = model_times(mod, params, HOST, {site.key: move})
    keys = {s.key for s, _ in sites}
    assert keys <= set(plain) and keys <= set(fast)
    for samples in (plain, fast):
        assert all(len(v) == MODEL_ROUNDS and all(t > 0 for t in v) for v in samples.values())
