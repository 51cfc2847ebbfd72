"""kiln.train.save_checkpoint / load_checkpoint: a run resumed from a checkpoint continues as
the uninterrupted run does; a hostile or mismatched file is a kiln.Error and changes nothing."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

import kiln
from kiln.train import Adam, load_checkpoint, save_checkpoint
from tests.train.helpers import batches, mlp_loss, mlp_params


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    step = kiln.train.Step(mlp_loss(), mlp_params(), Adam(lr=0.01))
    xs, ys = batches(6)
    for s in range(3):
        step(xs[s], ys[s])
    path = tmp_path_factory.mktemp("ckpt") / "run.npz"
    save_checkpoint(step, path)
    return step, path


def test_resuming_continues_the_run(trained) -> None:
    step, path = trained
    xs, ys = batches(6)
    uninterrupted = kiln.train.Step(mlp_loss(), mlp_params(), Adam(lr=0.01))
    for s in range(6):
        uninterrupted(xs[s], ys[s])
    resumed = kiln.train.Step(mlp_loss(), mlp_params(seed=7), Adam(lr=0.01))
    load_checkpoint(resumed, path)
    assert resumed.steps_taken == 3
    for s in range(3, 6):
        resumed(xs[s], ys[s])
    for name, want in uninterrupted.params.items():
        np.testing.assert_array_equal(resumed.params[name], want)


def test_the_file_is_numpys_npz(trained) -> None:
    step, path = trained
    with np.load(path, allow_pickle=False) as f:
        assert set(f.files) == {"meta", *(f"param/{n}" for n in step.params),
                                *(f"state/{n}/{s}" for n in step.params
                                  for s in ("exp_avg", "exp_avg_sq"))}
        assert list(f["meta"]) == [1, 3]


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _write(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)


def _npy(a: np.ndarray, allow_pickle: bool = False) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, a, allow_pickle=allow_pickle)
    return f.getvalue()


def _edits(step):
    w1 = step.params["w1"]
    yield "missing member", lambda m: m.pop("param/w1.npy"), "lacks param/w1"
    yield "extra member", lambda m: m.update({"param/zz.npy": _npy(w1)}), "not part"
    yield "wrong shape", lambda m: m.update({"param/w1.npy": _npy(w1.T.copy())}), "shape"
    yield "wrong dtype", lambda m: m.update({"param/w1.npy": _npy(w1.astype("float64"))}), \
        "dtype"
    obj = np.empty(w1.shape, dtype=object)
    yield "pickled objects", lambda m: m.update(
        {"param/w1.npy": _npy(obj, allow_pickle=True)}), "dtype|bytes"
    yield "truncated data", lambda m: m.update(
        {"param/w1.npy": m["param/w1.npy"][:-8]}), "bytes"
    yield "trailing data", lambda m: m.update(
        {"param/w1.npy": m["param/w1.npy"] + b"\0" * 8}), "bytes"
    yield "oversized member", lambda m: m.update(
        {"param/w1.npy": m["param/w1.npy"] + b"\0" * 100000}), "more than"
    yield "not npy", lambda m: m.update({"param/w1.npy": b"hello" * 10}), "not a valid"
    yield "not an array name", lambda m: m.update({"evil.pkl": b"x"}), "not an .npy"
    yield "nan", lambda m: m.update(
        {"param/w1.npy": _npy(np.full_like(w1, np.nan))}), "NaN"
    yield "future version", lambda m: m.update(
        {"meta.npy": _npy(np.array([99, 3], np.int64))}), "version"
    yield "negative steps", lambda m: m.update(
        {"meta.npy": _npy(np.array([1, -1], np.int64))}), "negative"


@pytest.mark.parametrize("case", range(13))
def test_a_bad_checkpoint_is_an_error_and_changes_nothing(trained, tmp_path, case) -> None:
    step, path = trained
    what, edit, message = list(_edits(step))[case]
    members = _members(path)
    edit(members)
    bad = tmp_path / "bad.npz"
    _write(bad, members)
    target = kiln.train.Step(mlp_loss(), mlp_params(seed=3), Adam(lr=0.01))
    before = {k: v.copy() for k, v in target.params.items()}
    with pytest.raises(kiln.Error, match=message):
        load_checkpoint(target, bad)
    for k, v in target.params.items():
        np.testing.assert_array_equal(v, before[k], err_msg=what)
    assert target.steps_taken == 0


def test_not_a_zip_or_another_optimizer(trained, tmp_path) -> None:
    step, path = trained
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(kiln.Error, match="cannot read checkpoint"):
        load_checkpoint(step, junk)
    sgd = kiln.train.Step(mlp_loss(), mlp_params(), kiln.train.SGD(lr=0.1))
    with pytest.raises(kiln.Error, match="another model or optimizer"):
        load_checkpoint(sgd, path)
