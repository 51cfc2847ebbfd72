"""Measuring one candidate schedule of a site: compile it alone, check it, time it.

A candidate is built as the site's one-operator program (kiln/tune/sites.py) by `kiln.build`
under `overrides_scope` — so through the same passes, loop-IR verifier and machine-code cache
as any build — and run on the site's random inputs. Its output must match the default
schedule's (to a tolerance for the order of the K sums: blocking K differently reorders
them) before its time counts; one that does not is reported and never chosen.

Timing on a noisy, shared machine: each sample runs the program enough times to last about
a millisecond, and a measurement is the median of several samples (at least `MIN_SAMPLES`,
about `SAMPLE_SECONDS` in all), so a burst of another process's work moves a sample or two,
not the median. The winner of a search is confirmed against the default at the end with
interleaved samples (`compare`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.loops.schedule import weights_scope
from kiln.loops.tunable import Knobs, ScheduleOverrides, overrides_scope
from kiln.target import Target
from kiln.tune.sites import Site, kernel_keys

MIN_SAMPLES = 5
SAMPLE_SECONDS = 0.06  # time spent timing one candidate, about
SAMPLE_TARGET = 1e-3  # seconds one sample should last (calls are batched up to it)
RTOL = 1e-4  # of the largest output magnitude, per sqrt of the K length


class CandidateError(Error):
    """A candidate that does not build or does not compute the default's result."""


@dataclass
class Candidate:
    """A compiled candidate: a callable running its program once, and its output."""

    knobs: Knobs
    run: Callable[[], Any]
    output: np.ndarray
    compile_s: float
    tuned: bool  # whether the build took the knobs (False: the default schedule)


def _weights(site: Site) -> ContextManager[Any]:
    """The model's weight bytes for the site's build, where the site knows them."""
    return nullcontext() if site.weight_bytes is None else weights_scope(site.weight_bytes)


def build_candidate(site: Site, knobs: Knobs | None, target: Target,
                    inputs_seed: int = 0) -> Candidate:
    """``site``'s program built with ``knobs`` (None: the default), run once."""
    from kiln.runtime.build import build
    from kiln.runtime.inputs import bind_arguments
    from kiln.transform.convert_layout import block_scope

    mod, params, inputs = site.program(inputs_seed)
    overrides = ScheduleOverrides({**(site.pinned or {}),
                                   **({site.key: knobs} if knobs is not None else {})},
                                  "candidate")
    start = time.perf_counter()
    with overrides_scope(overrides), _weights(site), block_scope(site.block):
        exe = build(mod, target=target, params=params or None)
    compile_s = time.perf_counter() - start
    tuned = False
    found = False
    for decl in exe.program.kernels.values():
        if decl.kernel is None or site.key not in kernel_keys(decl.kernel.attrs):
            continue
        found = True
        for _, sched in decl.kernel.attrs.get("schedules", ()):
            tuned = tuned or (sched.get("key") == site.key and bool(sched.get("tuned")))
    if not found:
        raise CandidateError(f"the program of {site.key!r} does not lower to that site")
    main = exe.program.main
    values = bind_arguments([p.hint for p in main.params], [p.type for p in main.params],
                            exe.program.entry, inputs, {}, exe.program)
    executor = exe.executor
    first = executor.run(values)
    output = np.array(first[0] if isinstance(first, (tuple, list)) else first, copy=True)
    return Candidate(dict(knobs) if knobs is not None else site.space.default,
                     lambda: executor.run(values), output, compile_s, tuned)


def check_output(site: Site, candidate: Candidate, reference: np.ndarray) -> None:
    """A `CandidateError` unless ``candidate`` computed ``reference`` (the default's)."""
    out = candidate.output
    if out.shape != reference.shape or not np.all(np.isfinite(out)):
        raise CandidateError(f"candidate {candidate.knobs} of {site.key!r} gives a wrong "
                             "result (shape or non-finite values)")
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    k = max(1, site.flops // max(1, 2 * reference.size))
    tol = RTOL * max(scale, 1e-30) * max(1.0, float(np.sqrt(k)))
    err = float(np.max(np.abs(out - reference))) if out.size else 0.0
    if err > tol:
        raise CandidateError(f"candidate {candidate.knobs} of {site.key!r} differs from the "
                             f"default schedule's result by {err:.3g} (tolerance {tol:.3g})")


def _calls_per_sample(run: Callable[[], Any]) -> int:
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    return max(1, min(1000, int(SAMPLE_TARGET / max(once, 1e-7))))


def sample(run: Callable[[], Any], calls: int) -> float:
    """Seconds per call over one sample of ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls


def measure(candidate: Candidate, seconds: float = SAMPLE_SECONDS) -> float:
    """The median seconds per call of a candidate (see the module docstring)."""
    calls = _calls_per_sample(candidate.run)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < MIN_SAMPLES or (time.perf_counter() < deadline and len(times) < 200):
        times.append(sample(candidate.run, calls))
    return float(np.median(times))


def compare(a: Candidate, b: Candidate, rounds: int = 9) -> tuple[float, float]:
    """Median seconds per call of ``a`` and of ``b``, their samples interleaved (so a slow
    moment of the machine falls on both)."""
    calls = max(_calls_per_sample(a.run), _calls_per_sample(b.run))
    ta, tb = [], []
    for i in range(rounds):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t1, t2 = sample(first.run, calls), sample(second.run, calls)
        if first is a:
            ta.append(t1)
            tb.append(t2)
        else:
            ta.append(t2)
            tb.append(t1)
    return float(np.median(ta)), float(np.median(tb))
