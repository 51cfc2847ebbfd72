"""Tuning logs: the schedules `kiln.tune` found, as versioned JSON lines.

A log is a text file, one JSON object a line. The first is the header::

    {"format": "kiln-tunelog", "version": 1, "kiln": "0.1.0", "created": "2026-12-02T06:10:00Z"}

and each later line an entry, written (and flushed) as soon as it is found::

    {"target": "3f0c...", "target_spec": "x86_64-unknown-linux-gnu znver3 ...",
     "key": "conv2d x=1x64x56x56 w=64x64x3x3 ...", "kind": "conv2d",
     "knobs": {"mr": 6, "nr": 16, "kc": 192, "mb": 4, "nb": 8, "parallel": "n", "unroll": 2},
     "time_s": 0.000412, "default_s": 0.000466, "final": true, "found_after_s": 7.3}

``target`` is the `kiln.Target`'s fingerprint (triple, CPU, features): a build uses only the
entries made for its own Target. ``key`` names the kernel site (kiln/loops/tunable.py),
``knobs`` a point of its search space, ``time_s`` and ``default_s`` the candidate's and the
default schedule's times measured side by side. An entry marked ``final`` was confirmed at
the end of that kernel's search (the default measured again, interleaved with it); the
others are the best so far, kept in case the search was interrupted. Several runs may append
to one log (or logs may be concatenated after their headers are checked).

For each key a build takes the final entries if there are any, else the others, and of those
the largest speedup (``default_s / time_s``, measured in one session, so comparable across
machines of one Target); the latest wins a tie.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kiln.errors import Error
from kiln.loops.tunable import ScheduleOverrides, parse_key
from kiln.target import Target

log = logging.getLogger(__name__)

FORMAT = "kiln-tunelog"
VERSION = 1


class TuningLogError(Error):
    """A tuning log that cannot be used: missing, not a kiln tuning log, another version."""


@dataclass(frozen=True)
class Entry:
    """One line of a log: a schedule for one kernel site on one Target."""

    target: str  # the Target's fingerprint
    key: str
    knobs: Mapping[str, Any]
    time_s: float
    default_s: float
    final: bool = False
    kind: str = ""
    target_spec: str = ""
    found_after_s: float | None = None

    @property
    def speedup(self) -> float:
        return self.default_s / self.time_s if self.time_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"target": self.target, "target_spec": self.target_spec,
                               "key": self.key, "kind": self.kind, "knobs": dict(self.knobs),
                               "time_s": self.time_s, "default_s": self.default_s,
                               "final": self.final}
        if self.found_after_s is not None:
            doc["found_after_s"] = round(self.found_after_s, 3)
        return doc


def header() -> dict[str, Any]:
    import kiln

    return {"format": FORMAT, "version": VERSION, "kiln": kiln.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _check_header(doc: Any, path: str) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TuningLogError(f"{path} is not a kiln tuning log (its first line is not a "
                             f'{{"format": "{FORMAT}", ...}} header)')
    version = doc.get("version")
    if version != VERSION:
        raise TuningLogError(f"{path} is a kiln tuning log of version {version!r}; this kiln "
                             f"reads version {VERSION} (tune again to make one)")


def _entry(doc: Any) -> Entry:
    """An entry from its JSON object; ValueError saying what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    for name, kind in (("target", str), ("key", str), ("knobs", dict)):
        if not isinstance(doc.get(name), kind):
            raise ValueError(f"{name!r} missing or not a {kind.__name__}")
    times = []
    for name in ("time_s", "default_s"):
        t = doc.get(name)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or t <= 0:
            raise ValueError(f"{name!r} missing or not a positive number")
        times.append(float(t))
    parse_key(doc["key"])
    for name, value in doc["knobs"].items():
        if value is not None and not isinstance(value, (int, str)):
            raise ValueError(f"knob {name!r} is {value!r}")
    return Entry(doc["target"], doc["key"], dict(doc["knobs"]), times[0], times[1],
                 bool(doc.get("final", False)), str(doc.get("kind", "")),
                 str(doc.get("target_spec", "")), doc.get("found_after_s"))


def read_log(path: str | os.PathLike) -> list[Entry]:
    """The entries of a log, in order. A missing file, one that is not a tuning log, or
    another version of the format is a `TuningLogError`; an entry that does not parse is
    skipped with a warning naming its line."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TuningLogError(f"{where}: no such tuning log") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TuningLogError(f"{where}: cannot read it as a tuning log ({e})") from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise TuningLogError(f"{where} is empty, not a kiln tuning log")
    try:
        head = json.loads(lines[first])
    except ValueError:
        head = None
    _check_header(head, where)
    entries: list[Entry] = []
    for number, line in enumerate(lines[first + 1:], start=first + 2):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if isinstance(doc, dict) and doc.get("format") == FORMAT:
                _check_header(doc, f"{where}:{number}")  # another run's header: fine
                continue
            entries.append(_entry(doc))
        except ValueError as e:
            log.warning("%s:%d: skipped a tuning log entry that does not parse (%s)",
                        where, number, e)
    return entries


def best_entries(entries: Iterable[Entry], target: Target, source: str = "") -> dict[str, Entry]:
    """The entry a build uses for each key on ``target`` (see the module docstring); entries
    for other Targets are ignored with a note."""
    mine: dict[str, list[Entry]] = {}
    foreign: dict[str, int] = {}
    for e in entries:
        if e.target != target.fingerprint:
            foreign[e.target_spec or e.target] = foreign.get(e.target_spec or e.target, 0) + 1
            continue
        mine.setdefault(e.key, []).append(e)
    for spec, count in foreign.items():
        log.warning("tuning log %s: %d entries for another Target (%s) ignored; this build "
                    "is for %s", source or "(given)", count, spec, target)
    best: dict[str, Entry] = {}
    for key, group in mine.items():
        finals = [e for e in group if e.final]
        pool = finals or group
        chosen = pool[0]
        for e in pool[1:]:
            if e.speedup >= chosen.speedup:
                chosen = e
        best[key] = chosen
    return best


def overrides_from_log(path: str | os.PathLike, target: Target) -> ScheduleOverrides:
    """The schedule overrides a build for ``target`` takes from the log at ``path``."""
    best = best_entries(read_log(path), target, str(path))
    log.info("tuning log %s: %d tuned kernels for %s", path, len(best), target)
    return ScheduleOverrides({k: dict(e.knobs) for k, e in best.items()}, str(path))


@dataclass
class LogWriter:
    """Appends entries to a log, each flushed (and synced) as it is written, so that an
    interrupted run keeps everything found; a new file gets the header first."""

    path: str
    _file: IO[str] | None = field(default=None, init=False)
    written: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        p = Path(self.path)
        fresh = not p.exists() or p.stat().st_size == 0
        if not fresh:
            read_log(p)  # appending to something else would corrupt it: say so first
        try:
            self._file = open(p, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise TuningLogError(f"{self.path}: cannot write the tuning log "
                                 f"({e.strerror or e})") from None
        if fresh:
            self._write(header())

    def _write(self, doc: Mapping[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(doc, sort_keys=False) + "\n")
        self._file.flush()
        try:
            os.fsync(self._file.fileno())
        except OSError:
            pass

    def add(self, entry: Entry) -> None:
        self._write(entry.to_json())
        self.written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
