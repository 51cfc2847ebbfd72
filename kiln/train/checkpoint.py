"""Checkpoints of a `Step`: its weights, optimizer state and step count in an ``.npz`` file.

    kiln.train.save_checkpoint(step, "run.npz")
    kiln.train.load_checkpoint(step, "run.npz")     # into a Step of the same model and optimizer

The file is a zip of ``.npy`` members (numpy's ``np.savez`` layout, readable by ``np.load``):
``param/<name>``, ``state/<name>/<slot>``, ``buffer/<name>`` (running statistics of batch
norms in training mode) and ``meta`` (format version, steps taken). Loading
treats the file as hostile: no pickle, and every member's name, header, dtype and shape is
checked against what the Step holds before its data is read (so a forged header cannot make
it allocate or read more than the Step's own arrays); a missing, extra or malformed member is
a `kiln.Error` naming it, and nothing is written into the Step unless every member is right.
"""

from __future__ import annotations

import os
import zipfile
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.train.step import Step

FORMAT_VERSION = 1
_META = "meta"  # int64 [format version, steps taken]
_HEADER_LIMIT = 4096  # an .npy header is a few hundred bytes; more is not numpy's writing


def checkpoint_arrays(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """The members of a checkpoint (name -> array) of a `Step.state_dict`."""
    out: dict[str, np.ndarray] = {}
    for name, w in state["params"].items():
        out[f"param/{name}"] = np.ascontiguousarray(w, dtype=np.float32)
    for name, slots in state["state"].items():
        for slot, s in slots.items():
            out[f"state/{name}/{slot}"] = np.ascontiguousarray(s, dtype=np.float32)
    for name, b in state.get("buffers", {}).items():
        out[f"buffer/{name}"] = np.ascontiguousarray(b)
    out[_META] = np.array([FORMAT_VERSION, int(state["steps_taken"])], np.int64)
    return out


def save_checkpoint(step: Step, path: str | os.PathLike[str]) -> None:
    """Write ``step``'s weights, optimizer state, running statistics and step count to
    ``path`` (an .npz file, written whole to a temporary name and then renamed, so a crash
    leaves the old one)."""
    arrays = checkpoint_arrays(step.state_dict())
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for key, a in arrays.items():
            with z.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
    os.replace(tmp, path)


def _read_member(f: IO[bytes], key: str, want: np.ndarray) -> np.ndarray:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ValueError as e:
        raise Error(f"checkpoint member {key!r} is not a valid .npy array: {e}") from None
    if dtype != want.dtype or dtype.hasobject:
        raise Error(f"checkpoint member {key!r} has dtype {dtype}, expected {want.dtype}")
    if tuple(shape) != want.shape:
        raise Error(f"checkpoint member {key!r} has shape {tuple(shape)}, expected {want.shape}")
    data = f.read(want.nbytes)
    if len(data) != want.nbytes or f.read(1):
        raise Error(f"checkpoint member {key!r} holds {len(data)} bytes of data or more, "
                    f"expected exactly {want.nbytes}")
    a = np.frombuffer(data, dtype=dtype)
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def read_checkpoint(step: Step, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint at ``path`` as a `Step.state_dict` for ``step``, validated against it
    (names, shapes, dtypes, format version); a `kiln.Error` otherwise. Writes nothing."""
    want = checkpoint_arrays(step.state_dict())
    try:
        z = zipfile.ZipFile(os.fspath(path))
    except (OSError, zipfile.BadZipFile) as e:
        raise Error(f"cannot read checkpoint {os.fspath(path)!r}: {e}") from None
    got: dict[str, np.ndarray] = {}
    with z:
        members = {}
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                raise Error(f"checkpoint member {info.filename!r} is not an .npy array")
            key = info.filename[:-4]
            if key not in want:
                raise Error(f"checkpoint member {key!r} is not part of this step's state "
                            f"(a checkpoint of another model or optimizer?)")
            if key in members:
                raise Error(f"checkpoint member {key!r} appears twice")
            if info.file_size > want[key].nbytes + _HEADER_LIMIT:
                raise Error(f"checkpoint member {key!r} is {info.file_size} bytes, more than "
                            f"its array of {want[key].nbytes} bytes needs")
            members[key] = info
        missing = sorted(set(want) - set(members))
        if missing:
            raise Error(f"the checkpoint lacks {', '.join(missing)}")
        for key, info in members.items():
            try:
                with z.open(info) as f:
                    got[key] = _read_member(f, key, want[key])
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise Error(f"checkpoint member {key!r} cannot be read: {e}") from None
    meta = got.pop(_META)
    if int(meta[0]) != FORMAT_VERSION:
        raise Error(f"checkpoint format version {int(meta[0])}; this kiln reads "
                    f"{FORMAT_VERSION}")
    if meta[1] < 0:
        raise Error(f"checkpoint step count {int(meta[1])} is negative")
    for key, a in got.items():
        if not np.all(np.isfinite(a)):
            raise Error(f"checkpoint member {key!r} holds NaN or infinite values")
    params = {k[len("param/"):]: a for k, a in got.items() if k.startswith("param/")}
    state: dict[str, dict[str, np.ndarray]] = {}
    for k, a in got.items():
        if k.startswith("state/"):
            name, slot = k[len("state/"):].rsplit("/", 1)
            state.setdefault(name, {})[slot] = a
    buffers = {k[len("buffer/"):]: a for k, a in got.items() if k.startswith("buffer/")}
    out: dict[str, Any] = {"params": params, "state": state, "steps_taken": int(meta[1])}
    if buffers:
        out["buffers"] = buffers
    return out


def load_checkpoint(step: Step, path: str | os.PathLike[str]) -> None:
    """Set ``step``'s weights, optimizer state and step count from the checkpoint at
    ``path`` (see the module docstring for what is checked)."""
    step.load_state_dict(read_checkpoint(step, path))


__all__ = ["FORMAT_VERSION", "checkpoint_arrays", "load_checkpoint", "read_checkpoint",
           "save_checkpoint"]
