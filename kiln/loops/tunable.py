"""What a kernel's schedule can be told from outside: search spaces and schedule overrides.

A kernel kind whose knobs can be searched (the packed GEMM, kiln/loops/gemm.py; conv2d's
implicit GEMM, kiln/loops/conv_kernels.py) declares, beside the rule that picks its default,
a `Space`: for one site (a shape on a `kiln.Target`, named by a *key* such as
``gemm batch=1 m=64 n=128 k=256 dtype=float32 a_prepacked=0 b_prepacked=0``) the legal
values of each knob, the default's first. A point of the space is a plain dict of knob
values (what a tuning log stores, kiln/tune/log.py).

A build takes knobs from outside through `ScheduleOverrides` (key -> knobs), set for the
length of a block with `overrides_scope`. It is a context variable, like the lowering's
target (kiln/loops/schedule.py): nothing outlives the block, so one build's tuned knobs
never leak into another's, and threads and tasks building at once keep their own. Where a
schedule is chosen, `override(key, space)` gives the knobs to use instead of the default,
or None — also when the entry is not a legal point of the space (another kiln, another
shape): then it says so in the log and the default stands, so an entry can never make a
wrong kernel.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)

Knobs = dict[str, Any]
T = TypeVar("T")


def site_key(kind: str, **fields: Any) -> str:
    """``kind name=value ...``: a site's key, tuples written ``AxBxC``, booleans 0/1."""
    parts = [kind]
    for name, value in fields.items():
        if isinstance(value, bool):
            text = str(int(value))
        elif isinstance(value, (tuple, list)):
            text = "x".join(str(int(v)) for v in value)
        else:
            text = str(value)
        if not text or any(c.isspace() or c == "=" for c in text):
            raise ValueError(f"key field {name}={text!r}")
        parts.append(f"{name}={text}")
    return " ".join(parts)


def parse_key(key: str) -> tuple[str, dict[str, str]]:
    """(kind, {name: text}) of a key made by `site_key`; ValueError when it is not one."""
    kind, *rest = key.split(" ")
    fields: dict[str, str] = {}
    for part in rest:
        name, sep, text = part.partition("=")
        if not sep or not name or not text:
            raise ValueError(f"not a kernel key: {key!r}")
        fields[name] = text
    if not kind:
        raise ValueError(f"not a kernel key: {key!r}")
    return kind, fields


@dataclass(frozen=True)
class Space:
    """The legal knobs of one site: each knob's values (the default's first) and a check
    of the combinations (``legal``), e.g. that a register tile fits the registers."""

    key: str
    knobs: tuple[tuple[str, tuple[Any, ...]], ...]
    check: Callable[[Mapping[str, Any]], bool] | None = field(default=None, compare=False)
    # the kernel a point builds, as a hashable value: points equal under it need one
    # measurement (None: the points themselves)
    canonical: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.knobs)

    @property
    def default(self) -> Knobs:
        """The default schedule's knobs."""
        return {name: values[0] for name, values in self.knobs}

    def values(self, name: str) -> tuple[Any, ...]:
        return dict(self.knobs)[name]

    def legal(self, knobs: Mapping[str, Any]) -> bool:
        """Whether ``knobs`` is a point of this space: every knob, each at one of its values,
        and the combination allowed."""
        if set(knobs) != set(self.names):
            return False
        for name, values in self.knobs:
            v = knobs[name]
            if not any(v == x and type(v) is type(x) for x in values):
                return False
        return self.check is None or dict(knobs) == self.default or bool(self.check(knobs))

    def same_kernel_as(self, knobs: Mapping[str, Any]) -> Any:
        """A hashable value equal for points that build the same kernel."""
        if self.canonical is not None:
            return self.canonical(knobs)
        return tuple(sorted((name, str(v)) for name, v in knobs.items()))

    def neighbours(self, knobs: Mapping[str, Any]) -> Iterator[Knobs]:
        """The legal points that differ from ``knobs`` in one knob (coordinate moves)."""
        for name, values in self.knobs:
            for v in values:
                if v != knobs[name]:
                    moved = {**knobs, name: v}
                    if self.legal(moved):
                        yield moved

    def points(self) -> Iterator[Knobs]:
        """Every legal point (the product of the knobs' values, checked)."""
        names = self.names
        for combo in itertools.product(*(values for _, values in self.knobs)):
            knobs = dict(zip(names, combo))
            if self.legal(knobs):
                yield knobs

    @property
    def size(self) -> int:
        """How many combinations the knobs' values make (before the check)."""
        n = 1
        for _, values in self.knobs:
            n *= len(values)
        return n


def ordered(default: Any, others: Any) -> tuple[Any, ...]:
    """``default`` first, then the other values (distinct, sorted; None first)."""
    rest = sorted({v for v in others if v != default}, key=lambda v: (v is not None, str(
        type(v)), v if v is not None else 0))
    return (default, *rest)


@dataclass(frozen=True)
class ScheduleOverrides:
    """Knobs to use instead of the defaults, by site key (what a tuning log gives a build)."""

    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = ""  # where they come from, for notes (a log's path)

    def __len__(self) -> int:
        return len(self.knobs)

    def get(self, key: str) -> Mapping[str, Any] | None:
        return self.knobs.get(key)


_OVERRIDES: ContextVar[ScheduleOverrides | None] = ContextVar("kiln_schedule_overrides",
                                                              default=None)


@contextmanager
def overrides_scope(overrides: ScheduleOverrides | None) -> Iterator[ScheduleOverrides | None]:
    """Kernels lowered inside the block take their knobs from ``overrides`` where a key
    matches (None: the defaults everywhere, also inside an outer scope)."""
    token = _OVERRIDES.set(overrides)
    try:
        yield overrides
    finally:
        _OVERRIDES.reset(token)


@contextmanager
def recording(seen: ContextVar[list[T] | None]) -> Iterator[list[T]]:
    """A new list in ``seen`` for the length of the block, given to it: where a pass notes
    the knobs of a whole model it meets (what kiln.tune searches)."""
    noted: list[T] = []
    token = seen.set(noted)
    try:
        yield noted
    finally:
        seen.reset(token)


def current_overrides() -> ScheduleOverrides | None:
    """The overrides of the enclosing `overrides_scope`, if any."""
    return _OVERRIDES.get()


def overridden(base: T, space: Callable[[], Space], apply: Callable[[T, Knobs], T]) -> T:
    """``base`` (a rule's schedule) with the knobs the enclosing `overrides_scope` gives its
    site — ``apply(base, knobs)`` — or ``base`` itself; ``space()`` is built only inside a
    scope."""
    if current_overrides() is None:
        return base
    knobs = override(space())
    return base if knobs is None else apply(base, knobs)


_WARNED: set[tuple[str, str]] = set()  # (source, key) said once per process


def override(space: Space) -> Knobs | None:
    """The knobs the enclosing scope gives ``space``'s site, when they are a legal point of
    the space; None otherwise (no scope, no entry, or an entry not legal here: noted)."""
    ov = _OVERRIDES.get()
    if ov is None:
        return None
    knobs = ov.get(space.key)
    if knobs is None:
        return None
    missing = set(space.names) - set(knobs)
    if missing:  # an entry written before these knobs existed: they keep their defaults
        knobs = {**{n: space.default[n] for n in missing}, **knobs}
    if not space.legal(knobs):
        if (ov.source, space.key) not in _WARNED:
            _WARNED.add((ov.source, space.key))
            log.warning("tuning log %s: the knobs %s for %r are not a legal schedule of that "
                        "kernel here; its default schedule is used", ov.source or "(given)",
                        dict(knobs), space.key)
        return None
    return dict(knobs)
