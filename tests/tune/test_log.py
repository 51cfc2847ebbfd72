"""Builds with tuning logs: the best entry of the build's Target is used; other Targets'
entries, entries that do not parse and knobs that are not legal are skipped with a note;
a file that is not a log of this version is a clear kiln.Error — never a wrong kernel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.loops import gemm
from kiln.target import Target
from kiln.tune import TuningLogError, read_log
from kiln.tune.log import Entry, LogWriter, best_entries
from tests.tune.helpers import conv_net, reference

HOST = Target.host()


def _schedules(exe: kiln.Executable) -> dict[str, dict]:
    out = {}
    for decl in exe.program.kernels.values():
        for _, knobs in (decl.kernel.attrs.get("schedules", ()) if decl.kernel else ()):
            if knobs.get("key"):
                out[knobs["key"]] = knobs
    return out


def _dense_key_and_move() -> tuple[str, dict, dict]:
    space = gemm.space_of(1, 6, 20, 60, b_prepacked=True)
    move = next(p for p in space.neighbours(space.default) if p["unroll"] == 4)
    return space.key, space.default, move


def _write(path: Path, entries: list[Entry]) -> None:
    w = LogWriter(str(path))
    for e in entries:
        w.add(e)
    w.close()


def _run(exe: kiln.Executable) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32)
    return exe(x), x


def test_an_entry_from_before_a_knob_existed_keeps_its_default(tmp_path: Path) -> None:
    # a log written before the GEMM's vector width was a knob: its entry has no "lanes";
    # the build takes it with the default width, and half the width where an entry says so
    mod, params = conv_net()
    key, default, move = _dense_key_and_move()
    old = {k: v for k, v in move.items() if k != "lanes"}
    log = tmp_path / "old.tunelog"
    _write(log, [Entry(HOST.fingerprint, key, old, 1.0, 1.5, final=True)])
    got = _schedules(kiln.build(mod, params=params, tuning_log=log))[key]
    assert got["tuned"] and got["unroll"] == 4 and got["lanes"] == default["lanes"]
    space = gemm.space_of(1, 6, 20, 60, b_prepacked=True)
    narrow = next(p for p in space.points() if p["lanes"] == default["lanes"] // 2)
    log2 = tmp_path / "narrow.tunelog"
    _write(log2, [Entry(HOST.fingerprint, key, narrow, 1.0, 1.5, final=True)])
    exe = kiln.build(mod, params=params, tuning_log=log2)
    assert _schedules(exe)[key]["lanes"] == default["lanes"] // 2
    out, x = _run(exe)
    np.testing.assert_allclose(out, reference(mod, params, x), rtol=1e-4, atol=1e-4)


def test_build_uses_the_best_entry(tmp_path: Path) -> None:
    mod, params = conv_net()
    key, default, move = _dense_key_and_move()
    slower = {**move, "unroll": 2}
    log = tmp_path / "m.tunelog"
    _write(log, [
        Entry(HOST.fingerprint, key, slower, 1.0, 1.1, final=False),  # an early best
        Entry(HOST.fingerprint, key, move, 1.0, 1.5, final=True),     # the confirmed one
        Entry(HOST.fingerprint, key, slower, 1.0, 3.0, final=False),  # not confirmed
    ])
    exe = kiln.build(mod, params=params, tuning_log=log)
    got = _schedules(exe)[key]
    assert got["tuned"] and got["unroll"] == 4
    assert gemm.tile_knobs(gemm.GemmSchedule(**{
        k: v for k, v in got.items() if k not in ("kernel", "b_prepacked")})) == move
    out, x = _run(exe)
    np.testing.assert_allclose(out, reference(mod, params, x), rtol=1e-4, atol=1e-4)
    # the other kernels, not in the log, keep their defaults; the profile lists them all
    assert sum(k["tuned"] for k in _schedules(exe).values()) == 1
    rows = exe.profile(x, repeat=2).rows
    assert {r.kernel for r in rows} == set(exe.program.kernels)


def test_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod, params = conv_net()
    key, _, move = _dense_key_and_move()
    log = tmp_path / "env.tunelog"
    _write(log, [Entry(HOST.fingerprint, key, move, 1.0, 2.0, final=True)])
    monkeypatch.setenv("KILN_TUNING_LOG", str(log))
    assert _schedules(kiln.build(mod, params=params))[key]["tuned"]
    monkeypatch.delenv("KILN_TUNING_LOG")
    assert not _schedules(kiln.build(mod, params=params))[key]["tuned"]


def test_foreign_target_entries_are_ignored(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    mod, params = conv_net()
    key, _, move = _dense_key_and_move()
    log = tmp_path / "other.tunelog"
    _write(log, [Entry("0123456789abcdef", key, move, 1.0, 2.0, True, "gemm", "another CPU")])
    with caplog.at_level("WARNING", logger="kiln"):
        exe = kiln.build(mod, params=params, tuning_log=log)
    assert not _schedules(exe)[key]["tuned"]
    assert "another Target (another CPU) ignored" in caplog.text


def test_bad_entries_are_skipped_with_a_note(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    mod, params = conv_net()
    key, default, move = _dense_key_and_move()
    log = tmp_path / "bad.tunelog"
    _write(log, [Entry(HOST.fingerprint, key, move, 1.0, 2.0, final=True)])
    conv_key = next(k for k in _schedules(kiln.build(mod, params=params)) if "w=8x3" in k)
    illegal = {"mr": 5, "nr": 3, "kc": 1, "mb": 1, "nb": 1, "parallel": "sideways",
               "unroll": 1}
    with open(log, "a") as f:
        f.write('{"target": "' + HOST.fingerprint + '", "key": "gemm batch=1"\n')  # cut off
        f.write(json.dumps({"target": HOST.fingerprint, "key": key, "knobs": move,
                            "time_s": -1, "default_s": 1}) + "\n")
        f.write(json.dumps({"target": HOST.fingerprint, "key": conv_key, "knobs": illegal,
                            "time_s": 1.0, "default_s": 9.0, "final": True}) + "\n")
    with caplog.at_level("WARNING", logger="kiln"):
        entries = read_log(log)
        exe = kiln.build(mod, params=params, tuning_log=log)
    assert len(entries) == 2  # the good one and the illegal-knobs one parse
    assert "bad.tunelog:3: skipped" in caplog.text and "bad.tunelog:4: skipped" in caplog.text
    assert "not a legal schedule" in caplog.text
    got = _schedules(exe)
    assert got[key]["tuned"] and not got[conv_key]["tuned"]
    out, x = _run(exe)
    np.testing.assert_allclose(out, reference(mod, params, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("text,message", [
    ("", "is empty"),
    ("\x00\x01garbage", "not a kiln tuning log"),
    ('{"format": "something-else", "version": 1}\n', "not a kiln tuning log"),
    ('{"format": "kiln-tunelog", "version": 99}\n', "version 99; this kiln reads version 1"),
])
def test_unusable_logs_are_errors(tmp_path: Path, text: str, message: str) -> None:
    mod, params = conv_net()
    log = tmp_path / "x.tunelog"
    log.write_text(text)
    with pytest.raises(TuningLogError, match=message) as info:
        kiln.build(mod, params=params, tuning_log=log)
    assert isinstance(info.value, kiln.Error)
    with pytest.raises(TuningLogError, match="no such tuning log"):
        kiln.build(mod, params=params, tuning_log=tmp_path / "missing.tunelog")
    if text:  # nor is a file that is not a log appended to
        with pytest.raises(TuningLogError, match=message):
            LogWriter(str(log))


def test_best_entry_prefers_confirmed_then_speedup() -> None:
    k = "gemm batch=1 m=2 n=2 k=2 dtype=float32 a_prepacked=0 b_prepacked=0"
    a = Entry(HOST.fingerprint, k, {"u": 1}, 1.0, 4.0)
    b = Entry(HOST.fingerprint, k, {"u": 2}, 1.0, 1.2, final=True)
    c = Entry(HOST.fingerprint, k, {"u": 3}, 1.0, 1.3, final=True)
    assert best_entries([a, b, c], HOST)[k] is c
    assert best_entries([a], HOST)[k] is a
