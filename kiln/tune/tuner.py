"""kiln.tune: search the schedules of a model's kernels on this machine, into a tuning log.

    result = kiln.tune(mod, params, budget_s=120, log="model.tunelog")
    exe = kiln.build(mod, params=params, tuning_log="model.tunelog")

0. The channel block of a CNN's convolutions (kiln/transform/convert_layout.py
   `layout_space`) is a knob of the whole function, not of one kernel: the model is built
   with each block and timed whole, the builds alternated (`LAYOUT_ROUNDS`), and a block
   other than the default is kept where the model is faster by `LAYOUT_GAIN`; its final
   entry is written at once, and the sites below are those of the model in that block.
   Then, likewise, how each shape of 3×3 stride-1 convolution runs — Winograd's F(4×4) or
   F(2×2), or the direct kernel (kiln/loops/winograd.py `algorithm_space`) — one shape at
   a time, the costliest first, each kept where the whole model is faster by
   `LAYOUT_GAIN`, within `ALGORITHM_SHARE` of the budget.
1. The model is built with the default schedules and profiled on random inputs: its kernel
   sites (kiln/tune/sites.py), deduplicated by key (shape and layout; the Target is this
   run's), each with its share of the model's time.
2. The budget is split across the sites by those shares, the costliest first (what one
   finishes early goes to the next). For each site: the default schedule is measured, then
   a greedy coordinate search moves one knob at a time from the best so far (each knob's
   values in turn, a move kept when it is faster by more than `MIN_GAIN`), rounds until no
   move helps, then random points near the best (one to three knobs changed) until its time
   is up. Every candidate is compiled alone and its output checked against the default's
   before its time counts (kiln/tune/measure.py).
3. The best is confirmed against the default with interleaved samples (the default's knobs
   if the gain did not hold up).
4. Inside the model: a kernel measured alone has the caches to itself, where in the model
   the other kernels' weights and activations pass through them between its calls (and its
   own weight is read from L3 or memory instead of L2). Sites alone ran up to 1.46× faster
   with their tuned knobs while MobileNetV2 built with all of them took 1.00-1.04 of its
   untuned time. So the model is built with the confirmed knobs and without, both are
   profiled in alternation (`MODEL_ROUNDS` each), and a site keeps its knobs only where its
   kernels took less time in the model by `CONFIRM_GAIN`. Each site's entry is then
   written ``final``: its knobs and its two times (in the model where it was checked there).

Each new best is appended to the log as soon as it is found, so an interrupted run
(KeyboardInterrupt) keeps what it found: the sites confirmed so far get their final entries
(checked alone, not in the model), the log is closed and the interrupt raised again.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.expr import Expr
from kiln.ir.module import IRModule
from kiln.loops.tunable import Knobs, ScheduleOverrides, Space, overrides_scope, parse_key
from kiln.target import Target
from kiln.tune.log import Entry, LogWriter
from kiln.tune.measure import (
    Candidate,
    CandidateError,
    build_candidate,
    check_output,
    compare,
    measure,
)
from kiln.tune.sites import Site, kernel_keys, random_inputs, site_of

log = logging.getLogger(__name__)

MIN_GAIN = 0.02  # a move must be this much faster to be taken (noise is about 1 %)
CONFIRM_GAIN = 0.01  # ... and the confirmed best this much faster than the default
MODEL_ROUNDS = 3  # profiles of the model with and without the tuned knobs, alternated
MODEL_RTOL = 1e-3  # the tuned model's outputs against the untuned one's (of the largest)
LAYOUT_ROUNDS = 15  # rounds of calls of the model in each channel block, alternated
LAYOUT_CALLS = 3  # timed calls of each build a round (after one untimed)
# ... and how much faster the whole model must be in another block than in the Target's
# lanes: alternated builds of one model differ by a few % on a shared machine (ResNet-18 in
# blocks of 32 measured 0.97 of 16 once, 1.006 and 0.99 in longer runs)
LAYOUT_GAIN = 0.03
# The share of the budget the convolutions' algorithms may take (each alternative is a build
# of the whole model and a timing of it; the kernels' search gets the rest)
ALGORITHM_SHARE = 0.3


@dataclass
class LayoutResult:
    """What tuning found for the channel block of one function's convolutions."""

    key: str
    default: int  # the block the rule gives (the Target's lanes)
    block: int  # the block kept
    seconds: dict[int, float] = field(default_factory=dict)  # the model's time, by block


@dataclass
class AlgorithmResult:
    """What tuning found for the algorithm of one shape of convolution (its tile size m,
    0 for the direct kernel)."""

    key: str
    default: int  # `winograd.choose`'s
    m: int  # the one kept
    seconds: dict[int, float] = field(default_factory=dict)  # the model's time, by m


def _algorithm_name(m: int) -> str:
    return f"F({m}x{m})" if m else "direct"


def _as_algorithm(key: str, m: int) -> str:
    return f"{key} as {_algorithm_name(m)}"


@dataclass
class KernelResult:
    """What tuning found for one site."""

    key: str
    kind: str
    share: float  # of the model's kernel time, untuned
    default_s: float = 0.0
    best_s: float = 0.0
    knobs: Knobs = field(default_factory=dict)
    tuned: bool = False  # whether the best is not the default
    candidates: int = 0  # measured (the default included)
    rejected: int = 0  # that failed to build or gave another result
    time_to_best_s: float = 0.0  # from the start of this site's search
    seconds: float = 0.0  # spent on this site
    # seconds per run of the model spent in this site's kernels, untuned and tuned (0: not
    # checked in the model: the default stood already)
    model_default_s: float = 0.0
    model_best_s: float = 0.0

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


@dataclass
class TuneResult:
    """A tuning run: each site's result, the log written, whether it was interrupted."""

    kernels: list[KernelResult]
    log: str | None
    target: Target
    seconds: float
    skipped: list[str] = field(default_factory=list)  # site keys not tunable alone
    out_of_time: list[str] = field(default_factory=list)  # sites the budget did not reach
    layouts: list[LayoutResult] = field(default_factory=list)  # channel blocks searched
    algorithms: list[AlgorithmResult] = field(default_factory=list)  # convolutions' searched

    def __str__(self) -> str:
        lines = []
        for lay in self.layouts:
            times = ", ".join(f"{b} {t * 1e3:.3f} ms" for b, t in sorted(lay.seconds.items()))
            lines.append(f"{lay.key}: the model in channel blocks of {times}; block "
                         f"{lay.block}" + (" (the default)" if lay.block == lay.default
                                           else f" (default {lay.default})"))
        for alg in self.algorithms:
            times = ", ".join(f"{_algorithm_name(m)} {t * 1e3:.3f} ms"
                              for m, t in alg.seconds.items())
            lines.append(f"{alg.key}: the model with {times}; {_algorithm_name(alg.m)}"
                         + (" (the default)" if alg.m == alg.default
                            else f" (default {_algorithm_name(alg.default)})"))
        lines.append(f"{'kernel':<64} {'share':>6} {'default':>10} {'tuned':>10} {'speedup':>7} "
                     f"{'tried':>5} {'to best':>8} {'in model':>8}")
        for r in self.kernels:
            # in the model: the tuned knobs' speedup there, in parentheses where it was too
            # small and the default stands; "-" where the default stood already
            ratio = (r.model_default_s / r.model_best_s
                     if r.model_default_s > 0 and r.model_best_s > 0 else 0.0)
            model = (f"{'-':>8}" if not ratio else f"{ratio:7.2f}x" if r.tuned
                     else f"({ratio:.2f}x)".rjust(8))
            lines.append(f"{r.key[:64]:<64} {r.share:6.1%} {r.default_s * 1e3:8.3f}ms "
                         f"{r.best_s * 1e3:8.3f}ms {r.speedup:6.2f}x {r.candidates:5d} "
                         f"{r.time_to_best_s:7.1f}s {model}")
        if self.out_of_time:
            lines.append(f"{len(self.out_of_time)} more kernels not reached in the budget "
                         "(their defaults stand)")
        lines.append(f"{len(self.kernels)} kernels tuned in {self.seconds:.1f} s for "
                     f"{self.target.describe()}" + (f"; log {self.log}" if self.log else ""))
        return "\n".join(lines)


@dataclass(frozen=True)
class TuneProgress:
    """What a progress callback is told after each candidate."""

    kernels_done: int
    kernels_total: int
    current: str  # the site being tuned
    best_speedup: float  # the best so far over all sites (model time saved, estimated)
    seconds_left: float


ProgressFn = Callable[[TuneProgress], None]


def _targets(target: Target | str) -> Target:
    from kiln.runtime.compiler import resolve_target

    machine = resolve_target(target)
    if machine is None:
        raise Error("kiln.tune measures machine code on this machine; the evaluator has no "
                    "schedules to tune")
    host = Target.host()
    if machine.arch != host.arch or not machine.features <= host.features:
        raise Error(f"kiln.tune measures on this machine ({host}); it cannot run code for "
                    f"{machine}")
    return machine


def _seconds(exes: Mapping[int, Any], inputs: list[np.ndarray]) -> dict[int, float]:
    """Median seconds a call of each executable, in `LAYOUT_ROUNDS` alternated rounds."""
    samples: dict[int, list[float]] = {k: [] for k in exes}
    for _ in range(LAYOUT_ROUNDS):
        for k, exe in exes.items():
            exe(*inputs)
            for _ in range(LAYOUT_CALLS):
                t0 = time.perf_counter()
                exe(*inputs)
                samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def _same_results(plain: Any, other: Any, inputs: list[np.ndarray], what: str) -> None:
    """An `InternalError` where two builds of a model disagree on ``inputs``."""
    want = [np.asarray(o) for o in _leaves(plain(*inputs))]
    got = [np.asarray(o) for o in _leaves(other(*inputs))]
    scale = max((float(np.max(np.abs(w))) for w in want if w.size), default=0.0)
    if len(got) != len(want) or any(
            g.shape != w.shape or (w.size and float(np.max(np.abs(g - w))) > MODEL_RTOL * scale)
            for g, w in zip(got, want)):
        raise InternalError(f"kiln.tune: the model built with {what} computes another result "
                            "than with the defaults")


def tune_layouts(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                 base: dict[str, Knobs], seed: int = 0
                 ) -> tuple[list[LayoutResult], Any, list[Space]]:
    """Step 0 of the module docstring: for each function convert-layout puts in channel
    blocks, the block of the fastest build of the whole model (the default unless another
    is faster by `LAYOUT_GAIN`; added to ``base``, the knobs every later build takes); the
    model's build with the blocks kept; and the algorithm spaces of its convolutions (one
    per decision)."""
    from kiln.loops.winograd import recorded_algorithms
    from kiln.runtime.build import build
    from kiln.transform.convert_layout import layout_space, recorded_keys

    with recorded_keys() as keys, recorded_algorithms() as algorithms, \
            overrides_scope(ScheduleOverrides({}, "defaults")):
        plain = build(mod, target=target, params=params)
    inputs = random_inputs(plain, seed)
    lanes = target.lanes("float32")
    results = []
    for key in dict.fromkeys(keys):
        space = layout_space(key, lanes)
        default = int(space.default["block"])
        seconds, keep, kept = _whole_model_choice(
            mod, params, target, plain, inputs, base, space, "block",
            lambda block: f"channel blocks of {block}")
        results.append(LayoutResult(key, default, keep, seconds))
        if keep != default:
            base[key] = {"block": keep}
            plain = kept
    return results, plain, algorithms


def _whole_model_choice(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                        built: Any, inputs: list[np.ndarray], base: Mapping[str, Knobs],
                        space: Space, knob: str, what: Callable[[int], str]
                        ) -> tuple[dict[int, float], int, Any]:
    """The model built with each value of a one-knob ``space`` of the whole model (with
    ``base``'s knobs; ``built``: with the default's), checked to compute what the default
    build does and timed alternated: (seconds by value, the value kept — the default
    unless another is faster by `LAYOUT_GAIN` — and its build)."""
    from kiln.runtime.build import build

    default = int(space.default[knob])
    exes = {default: built}
    for value in space.values(knob)[1:]:
        with overrides_scope(ScheduleOverrides({**base, space.key: {knob: value}},
                                               "kiln.tune")):
            exes[value] = build(mod, target=target, params=params)
        _same_results(built, exes[value], inputs, what(value))
    seconds = _seconds(exes, inputs)
    best = min(seconds, key=seconds.__getitem__)
    keep = best if seconds[best] < seconds[default] * (1 - LAYOUT_GAIN) else default
    return seconds, keep, exes[keep]


def tune_algorithms(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                    spaces: list[Space], base: dict[str, Knobs], built: Any,
                    deadline: float, seed: int = 0) -> tuple[list[AlgorithmResult], Any]:
    """Step 0's second half: for each shape of convolution in ``spaces``, the costliest
    (in multiply-adds, all its layers) first, the model built with each of its algorithms
    and timed whole, alternated; one other than the default is kept where the model is
    faster by `LAYOUT_GAIN`, and added to ``base`` (the knobs every later build takes).
    ``built``: the model built with ``base``. Shapes the ``deadline`` does not reach keep
    the rule's. Returns the results and the model's build with the knobs kept."""
    work: dict[str, float] = {}
    by_key: dict[str, Space] = {}
    for space in spaces:
        _, f = parse_key(space.key)
        out, w = (int(v) for v in f["out"].split("x")), [int(v) for v in f["w"].split("x")]
        work[space.key] = work.get(space.key, 0.0) + math.prod(out) * math.prod(w[1:])
        by_key[space.key] = space
    inputs = random_inputs(built, seed)
    results = []
    for key in sorted(work, key=lambda k: -work[k]):
        if time.perf_counter() >= deadline:
            break
        space = by_key[key]
        default = int(space.default["m"])
        seconds, keep, kept = _whole_model_choice(
            mod, params, target, built, inputs, base, space, "m",
            partial(_as_algorithm, key))
        results.append(AlgorithmResult(key, default, keep, seconds))
        if keep != default:
            base[key] = {"m": keep}
            built = kept
    return results, built


def _algorithm_entry(alg: AlgorithmResult, target: Target, found_after_s: float) -> Entry:
    return Entry(target.fingerprint, alg.key, {"m": alg.m}, alg.seconds[alg.m],
                 alg.seconds[alg.default], True, "conv_algorithm", target.describe(),
                 found_after_s)


def _layout_entry(lay: LayoutResult, target: Target, found_after_s: float) -> Entry:
    return Entry(target.fingerprint, lay.key, {"block": lay.block}, lay.seconds[lay.block],
                 lay.seconds[lay.default], True, "convert_layout", target.describe(),
                 found_after_s)


def extract_sites(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                  seed: int = 0, base: Mapping[str, Knobs] | None = None,
                  built: Any = None) -> tuple[list[tuple[Site, float]], list[str]]:
    """The sites of ``mod`` with their shares of its kernel time (the costliest first), and
    the keys of sites that cannot be tuned alone; ``base``: knobs the model is built with
    (its functions' channel blocks), the defaults elsewhere; ``built``: that build, made
    already."""
    from kiln.runtime.build import build

    exe = built
    if exe is None:
        # the defaults, whatever the caller's scope or KILN_TUNING_LOG (``base`` only)
        with overrides_scope(ScheduleOverrides(dict(base or {}), "defaults")):
            exe = build(mod, target=target, params=params)
    prof = exe.profile(*random_inputs(exe, seed))
    times = _site_times(exe, prof)
    total = prof.kernel_total / prof.repeat or 1.0
    weight_bytes = sum(int(c.nbytes) for c in exe.program.constants)
    # the algorithms tuning gave the convolutions: what the sites' programs are built with
    pinned = {k: v for k, v in (base or {}).items() if k.startswith("conv_algorithm ")}
    sites, skipped = [], []
    with overrides_scope(ScheduleOverrides(pinned, "kiln.tune")):
        for key, t in sorted(times.items(), key=lambda kv: -kv[1]):
            site = site_of(key, target, weight_bytes)
            if site is None:
                skipped.append(key)
            else:
                sites.append((replace(site, pinned=pinned or None), t / total))
    return sites, skipped


def _site_times(exe: Any, prof: Any) -> dict[str, float]:
    """Seconds per run spent in each site's kernels (a kernel with several sites' keys
    shares its time among them evenly)."""
    times: dict[str, float] = {}
    for row in prof.rows:
        decl = exe.program.kernels.get(row.kernel)
        if decl is None or decl.kernel is None:
            continue
        keys = kernel_keys(decl.kernel.attrs)
        for key in keys:
            times[key] = times.get(key, 0.0) + row.total / prof.repeat / len(keys)
    return times


def model_times(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                tuned: Mapping[str, Knobs], seed: int = 0,
                base: Mapping[str, Knobs] | None = None
                ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per run in each site's kernels of ``mod`` built with the default schedules
    and with the ``tuned`` knobs (both with ``base``'s, see `extract_sites`), profiled
    `MODEL_ROUNDS` times each, alternated (a list of samples per key); an `InternalError`
    where the two builds compute different results."""
    from kiln.runtime.build import build

    with overrides_scope(ScheduleOverrides(dict(base or {}), "defaults")):
        plain = build(mod, target=target, params=params)
    with overrides_scope(ScheduleOverrides({**(base or {}), **tuned}, "kiln.tune")):
        fast = build(mod, target=target, params=params)
    inputs = random_inputs(plain, seed)
    _same_results(plain, fast, inputs, "the tuned schedules")
    samples: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    for _ in range(MODEL_ROUNDS):
        for exe, out in ((plain, samples[0]), (fast, samples[1])):
            for key, t in _site_times(exe, exe.profile(*inputs)).items():
                out.setdefault(key, []).append(t)
    return samples


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def check_in_model(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                   results: list[KernelResult], space_default: Callable[[str], Knobs],
                   seed: int = 0, base: Mapping[str, Knobs] | None = None) -> None:
    """Step 4 of the module docstring: the tuned sites of ``results`` keep their knobs only
    where their kernels are faster inside the model (built with ``base``'s knobs too); the
    others go back to the default (``space_default(key)``)."""
    tuned = [r for r in results if r.tuned]
    if not tuned:
        return
    plain, fast = model_times(mod, params, target, {r.key: r.knobs for r in tuned}, seed,
                              base)
    for r in tuned:
        before = statistics.median(plain.get(r.key, [0.0]))
        after = statistics.median(fast[r.key]) if r.key in fast else float("inf")
        r.model_default_s, r.model_best_s = before, after
        if not after < before * (1 - CONFIRM_GAIN):
            log.info("kiln.tune: %s is %.3f ms a run in the model tuned, %.3f untuned: its "
                     "default stands", r.key, after * 1e3, before * 1e3)
            r.tuned, r.knobs, r.best_s = False, space_default(r.key), r.default_s
            r.time_to_best_s = 0.0


class _Search:
    """The search of one site (see the module docstring)."""

    def __init__(self, site: Site, result: KernelResult, target: Target, deadline: float,
                 writer: LogWriter | None, on_step: Callable[[], None], rng: random.Random,
                 started: float) -> None:
        self.site, self.result, self.target = site, result, target
        self.deadline, self.writer, self.on_step, self.rng = deadline, writer, on_step, rng
        self.started = started
        self.tried: dict[Any, float | None] = {}
        self.best: Candidate | None = None
        self.default: Candidate | None = None
        self.confirmed = False

    def _mark(self, knobs: Knobs) -> Any:
        return self.site.space.same_kernel_as(knobs)  # one measurement per distinct kernel

    def _entry(self, knobs: Knobs, t: float, default_s: float, final: bool) -> Entry:
        return Entry(self.target.fingerprint, self.site.key, knobs, t, default_s, final,
                     self.site.kind, self.target.describe(), time.perf_counter() - self.started)

    def try_(self, knobs: Knobs) -> float | None:
        """Measure a candidate (None: rejected); keep it when it is the best."""
        mark = self._mark(knobs)
        if mark in self.tried:
            return self.tried[mark]
        self.tried[mark] = None
        r = self.result
        r.candidates += 1
        try:
            cand = build_candidate(self.site, knobs, self.target)
            assert self.default is not None
            check_output(self.site, cand, self.default.output)
        except CandidateError as e:
            r.rejected += 1
            log.warning("kiln.tune: %s", e.message)
            return None
        except InternalError as e:  # the loop-IR verifier refused it: never a kernel
            r.rejected += 1
            log.warning("kiln.tune: candidate %s of %r rejected: %s", knobs, self.site.key,
                        e.message)
            return None
        t = measure(cand)
        self.tried[mark] = t
        if t < r.best_s * (1 - MIN_GAIN):
            self.best, r.best_s, r.knobs = cand, t, dict(knobs)
            r.time_to_best_s = time.perf_counter() - self.started
            if self.writer is not None:
                self.writer.add(self._entry(knobs, t, r.default_s, False))
        self.on_step()
        return t

    def time_left(self) -> bool:
        return time.perf_counter() < self.deadline

    def run(self) -> None:
        r, space = self.result, self.site.space
        self.default = build_candidate(self.site, None, self.target)
        self.best = self.default
        r.default_s = r.best_s = measure(self.default)
        r.knobs = space.default
        r.candidates = 1
        self.tried[self._mark(space.default)] = r.default_s
        self.on_step()
        improved = True
        while improved and self.time_left():
            improved = False
            for name, values in space.knobs:  # greedy, one knob at a time
                start = dict(r.knobs)
                for v in values:
                    if not self.time_left():
                        break
                    moved = {**start, name: v}
                    if moved != start and space.legal(moved):
                        self.try_(moved)
                improved = improved or r.knobs != start
        names = space.names
        misses = 0
        while self.time_left() and misses < 200:  # random points near the best
            point = dict(r.knobs)
            for name in self.rng.sample(names, self.rng.randint(1, min(3, len(names)))):
                point[name] = self.rng.choice(space.values(name))
            if not space.legal(point) or self._mark(point) in self.tried:
                misses += 1
                continue
            misses = 0
            self.try_(point)
        self.confirm()

    def confirm(self) -> None:
        r = self.result
        assert self.default is not None and self.best is not None
        if self.best is not self.default:
            best_s, default_s = compare(self.best, self.default)
            if best_s < default_s * (1 - CONFIRM_GAIN):
                r.best_s, r.default_s, r.tuned = best_s, default_s, True
            else:
                r.knobs, r.best_s, r.default_s = self.site.space.default, default_s, default_s
                r.time_to_best_s = 0.0  # the default stands
        self.confirmed = True

    def final(self) -> None:
        """The site's final entry (after the check in the model)."""
        r = self.result
        if self.writer is not None:
            if r.model_default_s > 0:
                self.writer.add(self._entry(r.knobs, r.model_best_s if r.tuned
                                            else r.model_default_s, r.model_default_s, True))
            else:
                self.writer.add(self._entry(r.knobs, r.best_s, r.default_s, True))


def tune(mod: IRModule | Expr, params: Mapping[str, Any] | None = None, *,
         budget_s: float = 60.0, log: str | None = None, target: Target | str = "llvm",
         progress: ProgressFn | None = None, seed: int = 0) -> TuneResult:
    """Search the schedules of ``mod``'s kernels on this machine for ``budget_s`` seconds
    (about: each kernel's search finishes its current candidate and its confirmation), and
    append what is found to the tuning log ``log`` (JSON lines; kiln/tune/log.py), for
    ``kiln.build(mod, tuning_log=log)``. ``progress`` is called after every candidate.
    A KeyboardInterrupt stops the search; the log keeps every entry written so far."""
    if isinstance(mod, Expr):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise Error(f"kiln.tune takes an IRModule, not {type(mod).__name__}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s < 0:
        raise Error(f"budget_s must be a number of seconds, not {budget_s!r}")
    machine = _targets(target)
    started = time.perf_counter()
    writer = LogWriter(str(log)) if log is not None else None
    try:
        base: dict[str, Knobs] = {}  # the whole model's knobs kept, for every later build
        layouts, plain, spaces = tune_layouts(mod, params, machine, base, seed)
        if writer is not None:
            for lay in layouts:
                writer.add(_layout_entry(lay, machine, time.perf_counter() - started))
        algorithms, plain = tune_algorithms(
            mod, params, machine, spaces, base, plain,
            started + budget_s * ALGORITHM_SHARE, seed)
        if writer is not None:
            for alg in algorithms:
                writer.add(_algorithm_entry(alg, machine, time.perf_counter() - started))
        sites, skipped = extract_sites(mod, params, machine, seed, base, plain)
        results: list[KernelResult] = []
        share_left = sum(s for _, s in sites) or 1.0
        end = started + budget_s
        rng = random.Random(seed)
        saved = [0.0]  # model kernel time saved so far (shares × (1 - 1/speedup))

        def step(current: str) -> Callable[[], None]:
            def report() -> None:
                if progress is None:
                    return
                done_saved = saved[0] + sum(
                    r.share * (1 - r.best_s / r.default_s)
                    for r in results[-1:] if r.default_s > 0)
                progress(TuneProgress(len(results) - 1, len(sites), current,
                                      1 / max(1e-9, 1 - done_saved),
                                      max(0.0, end - time.perf_counter())))
            return report

        out_of_time: list[str] = []
        searches: list[_Search] = []
        for site, share in sites:
            now = time.perf_counter()
            if now >= end and results:  # the budget is spent: the rest keep their defaults
                out_of_time.append(site.key)
                continue
            allot = max(0.0, end - now) * share / share_left
            share_left -= share
            r = KernelResult(site.key, site.kind, share)
            results.append(r)
            search = _Search(site, r, machine, now + allot, writer, step(site.key), rng, now)
            searches.append(search)
            try:
                search.run()
            except KeyboardInterrupt:  # the sites confirmed so far: final, checked alone
                for done in searches:
                    if done.confirmed:
                        done.final()
                raise
            r.seconds = time.perf_counter() - now
            if r.default_s > 0:
                saved[0] += r.share * (1 - r.best_s / r.default_s)
        defaults = {site.key: site.space.default for site, _ in sites}
        check_in_model(mod, params, machine, results, defaults.__getitem__, seed, base)
        for search in searches:
            search.final()
        saved[0] = sum(r.share * (1 - r.model_best_s / r.model_default_s)
                       for r in results if r.tuned and r.model_default_s > 0)
        if progress is not None:
            progress(TuneProgress(len(sites), len(sites), "", 1 / max(1e-9, 1 - saved[0]),
                                  max(0.0, end - time.perf_counter())))
        return TuneResult(results, str(log) if log is not None else None, machine,
                          time.perf_counter() - started, skipped, out_of_time, layouts,
                          algorithms)
    finally:
        if writer is not None:
            writer.close()
