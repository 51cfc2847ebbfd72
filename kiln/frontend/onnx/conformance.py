"""The ONNX backend node tests, run through kiln: per-operator pass rates and reasons.

The ``onnx`` package ships about 1,900 small test cases (``onnx.backend.test.case.node``),
each a model of one operator (or its expansion into a function body) with inputs and expected
outputs. `run_cases` imports each with `from_onnx`, runs it with the reference interpreter and
compares with the expected outputs at the case's tolerance; `Report` groups the results by
ONNX operator and says, for every case that does not pass, why: an operator kiln does not
convert, an element type kiln has no dtype for, an error while converting or running, or
results that differ.

A *float32 case* is one whose first input (or, without inputs, first output) is float32 and
all of whose graph inputs and outputs have element types kiln has: ``Cast`` from float32 to
bfloat16 tests bfloat16, not float32. Such cases are counted under "dtype", and the summary
says how many there are. Cases whose expected outputs are random draws (training-mode
``Dropout``: numpy's generator, seeded) cannot be reproduced by any other implementation; they
are reported as unsupported and not counted as float32 cases (ONNX Runtime's own backend test
run excludes them too).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from kiln.errors import Error
from kiln.eval import interpret
from kiln.frontend.onnx.context import DTYPES, NeedsConstant, RandomOutput, UnsupportedDtype
from kiln.frontend.onnx.functions import has_function
from kiln.frontend.onnx.model import import_model
from kiln.frontend.onnx.table import versions

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
_DOMAINS = ("", "ai.onnx.preview", "ai.onnx.preview.training")
_LATEST = 1000  # an opset above every released one: the latest version of a schema


@dataclass
class CaseResult:
    name: str
    operator: str
    float32: bool
    status: str
    reason: str = ""
    seconds: float = 0.0
    float32_input: bool = False  # float32 data, though maybe not a float32 case (see above)
    imported: bool = False  # whether from_onnx converted the model


def collect_cases() -> list[Any]:
    """The node test cases of the installed onnx package."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return list(collect_testcases(None))


_EXPANDED = re.compile(r"(.*)_expanded(_ver\d+)?$")
# Helpers that test models wrap around the operator under test.
_HELPERS = frozenset(["Constant", "Identity", "SequenceConstruct", "Optional", "Not", "Add",
                      "Mul", "Slice", "Unsqueeze", "Gather", "Reshape", "Shape", "Where",
                      "Range", "GreaterOrEqual", "Cast", "Sub", "Div", "Tanh",
                      "SequenceInsert"])


def case_operator(case: Any, by_name: dict[str, Any]) -> str:
    """The ONNX operator a case tests: its single node's, or the one its expansion stands for."""
    m = _EXPANDED.match(case.name)
    if m and m.group(1) in by_name:
        return case_operator(by_name[m.group(1)], by_name)
    ops = sorted({n.op_type for n in case.model.graph.node if n.op_type != "Constant"})
    if not ops:
        return "Constant"
    if len(ops) == 1:
        return ops[0]
    main = [o for o in ops if o not in _HELPERS]
    return main[0] if len(main) == 1 else "+".join(ops)


def _elem_type(info: onnx.ValueInfoProto) -> int | None:
    t = info.type
    return t.tensor_type.elem_type if t.HasField("tensor_type") else None


def is_float32(case: Any) -> bool:
    """Whether the case's data is float32 (its first input's type, or its first output's)
    and every graph input and output has an element type kiln has."""
    g = case.model.graph
    infos = list(g.input) or list(g.output)
    return _elem_type(infos[0]) == onnx.TensorProto.FLOAT and not other_dtypes(case)


def other_dtypes(case: Any) -> bool:
    """Whether a graph input or output has a tensor element type kiln lacks (bfloat16...)."""
    g = case.model.graph
    return any(t is not None and t not in DTYPES
               for t in map(_elem_type, [*g.input, *g.output]))


def float32_input(case: Any) -> bool:
    """Whether the case's first input (or first output) is float32, whatever its others are."""
    g = case.model.graph
    infos = list(g.input) or list(g.output)
    return _elem_type(infos[0]) == onnx.TensorProto.FLOAT


def _arrays(values: Sequence[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, onnx.TensorProto):
            v = onnx.numpy_helper.to_array(v)
        if isinstance(v, np.generic):
            v = np.asarray(v)
        out.append(v)
    return out


def _compare(got: Any, expected: list[Any], rtol: float, atol: float) -> str | None:
    """What differs (None when the results agree)."""
    outs = list(got) if isinstance(got, tuple) else [got]
    if len(outs) != len(expected):
        return f"{len(outs)} results, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(outs, expected)):
        if isinstance(e, np.generic):
            e = np.asarray(e)
        if not isinstance(e, np.ndarray):
            return f"result {k}: expected a {type(e).__name__}, which kiln does not produce"
        g = np.asarray(g)
        if g.dtype != e.dtype:
            return f"result {k}: dtype {g.dtype}, expected {e.dtype}"
        if g.shape != e.shape:
            return f"result {k}: shape {g.shape}, expected {e.shape}"
        if e.dtype.kind in "biu":
            if not np.array_equal(g, e):
                return f"result {k}: {int(np.sum(g != e))} of {e.size} elements differ"
        elif not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            with np.errstate(all="ignore"):
                err = np.nanmax(np.abs(g.astype("float64") - e.astype("float64")))
            return f"result {k}: values differ (max abs error {err:.3g})"
    return None


def run_case(case: Any, operator: str, runner: Callable[..., Any] | None = None) -> CaseResult:
    """Import and run one case; ``runner(mod, params, inputs)`` runs it (the interpreter)."""
    f32, f32_input = is_float32(case), float32_input(case)
    start = time.perf_counter()

    converted = False  # read by done(): set once from_onnx has converted the model

    def done(status: str, reason: str = "") -> CaseResult:
        return CaseResult(case.name, operator, f32 and not reason.startswith("random"),
                          status, reason, time.perf_counter() - start, f32_input, converted)

    # Inputs that are shapes, axes or counts in ONNX are fixed at import time in kiln: a case
    # that passes one as a graph input is imported with it bound to the case's value.
    bound: dict[str, np.ndarray] = {}
    feeds = dict(zip((i.name for i in case.model.graph.input if i.name not in
                      {t.name for t in case.model.graph.initializer}),
                     _arrays(case.data_sets[0][0])))
    try:
        while True:
            try:
                imported = import_model(case.model, check=False, constants=bound)
                break
            except NeedsConstant as err:
                if err.value in feeds and err.value not in bound:
                    bound[err.value] = feeds[err.value]
                    continue
                # computed from inputs: bind the integer inputs (shapes, axes, counts)
                more = {n: a for n, a in feeds.items() if n not in bound
                        and np.asarray(a).dtype.kind in "iub"}
                if not more:
                    raise
                bound.update(more)
    except UnsupportedDtype as err:
        return done(UNSUPPORTED, f"dtype: {err.message}")
    except RandomOutput as err:
        return done(UNSUPPORTED, f"random: {err.message}")
    except Error as err:
        first = err.message.splitlines()
        text = " ".join(x.strip() for x in first)
        if text.startswith("kiln cannot convert these ONNX operators"):
            return done(UNSUPPORTED, "unsupported op: " + text.split(":", 1)[1].strip())
        if "ONNX element type" in text:
            return done(UNSUPPORTED, f"dtype: {text}")
        return done(FAIL, f"import error: {text}")
    except Exception as exc:  # noqa: BLE001 - a bug in kiln, reported as such
        return done(FAIL, f"import crashed: {type(exc).__name__}: {exc}")
    rtol, atol = float(case.rtol), float(case.atol)
    converted = True

    for inputs, outputs in case.data_sets:
        args, expected = _arrays(inputs), _arrays(outputs)
        names = list(feeds)
        if bound:
            if any(not np.array_equal(a, bound[n]) for n, a in zip(names, args) if n in bound):
                return done(FAIL, "data sets differ in an input bound at import")
            args = [a for n, a in zip(names, args) if n not in bound]
        if any(not isinstance(a, np.ndarray) for a in args):
            return done(UNSUPPORTED, "input: a sequence or optional input")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if runner is not None:
                    got = runner(imported.module, imported.params, args)
                else:
                    got = interpret(imported.module, *args, params=imported.params)
        except UnsupportedDtype as err:
            return done(UNSUPPORTED, f"dtype: {err.message}")
        except Error as err:
            return done(FAIL, f"run error: {err.message.splitlines()[0]}")
        except Exception as exc:  # noqa: BLE001
            return done(FAIL, f"run crashed: {type(exc).__name__}: {exc}")
        problem = _compare(got, expected, rtol, atol)
        if problem:
            return done(FAIL, f"mismatch: {problem}")
    return done(PASS, f"bound at import: {', '.join(sorted(bound))}" if bound else "")


def run_cases(cases: Iterable[Any] | None = None,
              runner: Callable[..., Any] | None = None) -> list[CaseResult]:
    """Run every node test case (or the given ones)."""
    all_cases = collect_cases() if cases is None else list(cases)
    by_name = {c.name: c for c in all_cases}
    results = []
    for case in all_cases:
        with np.errstate(all="ignore"):
            results.append(run_case(case, case_operator(case, by_name), runner))
    return results


@dataclass
class OperatorStats:
    operator: str
    cases: int = 0
    passed: int = 0
    float32: int = 0
    float32_passed: int = 0
    imported: int = 0  # cases that from_onnx converted
    problems: list[CaseResult] = field(default_factory=list)

    @property
    def in_table(self) -> bool:
        """Whether kiln's converter table has the operator (at some opset)."""
        return any(versions(d, self.operator) for d in _DOMAINS)

    @property
    def implemented(self) -> bool:
        """Whether kiln converts the operator: by its table, or through the function body
        ONNX defines for it (`functions.py`) when that converted in some case (Bernoulli's
        body draws random numbers, which kiln does not)."""
        return self.in_table or (self.imported > 0 and any(
            has_function(self.operator, d, _LATEST) for d in _DOMAINS))


@dataclass
class Report:
    results: list[CaseResult]

    def by_operator(self) -> dict[str, OperatorStats]:
        stats: dict[str, OperatorStats] = {}
        for r in self.results:
            s = stats.setdefault(r.operator, OperatorStats(r.operator))
            s.cases += 1
            s.float32 += r.float32
            s.imported += r.imported
            if r.status == PASS:
                s.passed += 1
                s.float32_passed += r.float32
            else:
                s.problems.append(r)
        return dict(sorted(stats.items()))

    @property
    def passed(self) -> int:
        return sum(r.status == PASS for r in self.results)

    def implemented_float32(self) -> tuple[int, int]:
        """(passed, total) float32 cases of the operators kiln implements."""
        ops = [s for s in self.by_operator().values() if s.implemented]
        return sum(s.float32_passed for s in ops), sum(s.float32 for s in ops)

    def below(self, fraction: float) -> list[OperatorStats]:
        """Implemented operators whose float32 cases pass less often than ``fraction``."""
        return [s for s in self.by_operator().values() if s.implemented and s.float32
                and s.float32_passed < fraction * s.float32]

    def missing_operators(self) -> list[str]:
        return [s.operator for s in self.by_operator().values() if not s.implemented]

    def through_functions(self) -> list[str]:
        """Operators converted through ONNX's function bodies, not a table entry."""
        return [s.operator for s in self.by_operator().values()
                if s.implemented and not s.in_table]

    def summary(self) -> str:
        n = len(self.results)
        fp, ft = self.implemented_float32()
        missing = self.missing_operators()
        excluded = sum(r.float32_input and not r.float32 for r in self.results)
        return (f"ONNX node tests: {self.passed}/{n} passed ({self.passed / max(n, 1):.1%}); "
                f"float32 cases of implemented operators: {fp}/{ft} ({fp / max(ft, 1):.1%}) "
                f"(not counted as float32: {excluded} cases with float32 data that also use an "
                "element type kiln lacks or expect random draws); "
                f"{len(missing)} operators not implemented: {', '.join(missing)}; converted "
                f"through ONNX's function bodies: {', '.join(self.through_functions())}")

    def table(self) -> str:
        """One line per operator, then each case that did not pass with its reason."""
        lines = [f"{'operator':32} {'cases':>5} {'passed':>6} {'f32':>5} {'f32 ok':>6}"]
        for s in self.by_operator().values():
            lines.append(f"{s.operator:32} {s.cases:5} {s.passed:6} {s.float32:5} "
                         f"{s.float32_passed:6}")
        lines.append("")
        for s in self.by_operator().values():
            for r in s.problems:
                lines.append(f"{r.operator}: {r.name}: {r.status}: {r.reason}")
        return "\n".join(lines) + "\n"
