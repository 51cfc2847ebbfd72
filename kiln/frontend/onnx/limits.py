"""How much work and memory an ONNX model may cost kiln while it is imported.

A model file is untrusted input: a few bytes can ask for a tensor of 10^12 elements
(``Range(0, 1e12)``, ``ConstantOfShape``, ``OneHot`` with a huge depth), a Python loop of
2^31 steps (``LRN`` with ``size=2**31``, ``Split`` into 2^40 parts, an unrolled ``Loop``) or
a resize by a factor of a million. The importer checks each such quantity against a named
limit before doing the work, and refuses the model with a `kiln.Error` that names the node,
the quantity, its value, the limit and how to raise it.

The limits, their defaults and the environment variables that change them:

- ``max_elements`` (2**28, ``KILN_MAX_IMPORT_ELEMENTS``): elements of one array made at import
  time (constants, index and weight tables, folded values).
- ``max_tensor_elements`` (2**36, ``KILN_MAX_TENSOR_ELEMENTS``): elements of any tensor of the
  converted model, by its static shape (graph inputs and every node output; computed at run
  time).
- ``max_unroll`` (65536, ``KILN_MAX_IMPORT_UNROLL``): steps of a loop the importer runs for a
  size given by the model (LRN's window, split counts, a resized axis's output length, a 3-D
  convolution's depth taps, Scan-8's batch), and kiln operations of an unrolled recurrent
  layer (sequence length x directions x operations per step: about 32 for an LSTM step).
- ``max_resize_scale`` (1024, ``KILN_MAX_RESIZE_SCALE``): a Resize or Upsample factor (and
  1 / factor when antialiasing widens the filter).
- ``max_repeated_nodes`` (8192, ``KILN_MAX_REPEATED_NODES``): conversions of subgraph nodes
  (If, Loop and Scan bodies) beyond the first of each: every further unrolled Loop iteration,
  Scan-8 batch entry or pass over a Loop body converts its nodes again, and nested loops
  multiply these. (A node takes about a millisecond to convert: the limit keeps the worst
  case near what a model file of that many nodes costs.)

``from_onnx(model, limits={"max_unroll": 2**20})`` raises a limit for one import (on top of
the environment); ``limits=Limits(...)`` gives all of them (unset ones keep their defaults).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kiln.errors import Error

# numpy's (and so the reference interpreter's) largest rank; not a knob.
MAX_RANK = 64

ENV = {
    "max_elements": "KILN_MAX_IMPORT_ELEMENTS",
    "max_tensor_elements": "KILN_MAX_TENSOR_ELEMENTS",
    "max_unroll": "KILN_MAX_IMPORT_UNROLL",
    "max_resize_scale": "KILN_MAX_RESIZE_SCALE",
    "max_repeated_nodes": "KILN_MAX_REPEATED_NODES",
}


@dataclass(frozen=True)
class Limits:
    """The import limits (see the module's docstring for what each bounds)."""

    max_elements: int = 2**28
    max_tensor_elements: int = 2**36
    max_unroll: int = 65536
    max_resize_scale: float = 1024.0
    max_repeated_nodes: int = 8192

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, changed by the ``KILN_MAX_*`` environment variables that are set."""
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        for name, var in ENV.items():
            text = env.get(var, "").strip()
            if text:
                given[name] = _parse(name, text, f"the environment variable {var}")
        return cls(**given)

    def with_changes(self, changes: Mapping[str, Any]) -> Limits:
        """These limits with some replaced (by name); a kiln.Error for an unknown name."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise Error(f"limits= names {', '.join(map(repr, unknown))}, which are not import "
                        f"limits (they are {', '.join(sorted(known))})")
        return replace(self, **{k: _parse(k, v, f"limits[{k!r}]") for k, v in changes.items()})


LimitsLike = Limits | Mapping[str, Any] | None


def resolve(limits: LimitsLike) -> Limits:
    """The limits of one import: ``limits=`` over the environment over the defaults."""
    if isinstance(limits, Limits):
        return limits
    base = Limits.from_env()
    return base if not limits else base.with_changes(limits)


def _parse(name: str, value: Any, what: str) -> Any:
    try:
        number = float(value) if name == "max_resize_scale" else int(value)
    except (TypeError, ValueError, OverflowError):
        kind = "a number" if name == "max_resize_scale" else "an integer"
        raise Error(f"{what} must be {kind}, not {value!r}") from None
    if not number > 0 or (isinstance(number, float) and not math.isfinite(number)):
        raise Error(f"{what} must be positive and finite, not {value!r}")
    return number


def how_to_raise(name: str) -> str:
    """The sentence that says how to raise a limit."""
    return (f"a model that really needs more can raise it with "
            f"from_onnx(..., limits={{{name!r}: ...}}) or the environment variable {ENV[name]}")


def over_limit(where: str, what: str, value: object, name: str, limit: object) -> Error:
    """The error for a quantity of a model above an import limit."""
    return Error(f"{where}: {what} is {value}, more than kiln's import limit {name}={limit}; "
                 f"{how_to_raise(name)}")


def elements(shape: Iterable[int]) -> int:
    """The number of elements of a shape (a Python int: no overflow)."""
    return math.prod(int(d) for d in shape)


def check_elements(where: str, shape: Iterable[int], what: str, limits: Limits) -> None:
    """An array of ``shape`` is about to be made at import time: within ``max_elements``."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise Error(f"{where}: {what} would have the negative shape {tuple(dims)}")
    n = elements(dims)
    if n > limits.max_elements:
        shape_text = f" (shape {tuple(dims)})" if len(dims) > 1 else ""
        raise over_limit(where, f"the size of {what}{shape_text}", f"{n} elements",
                         "max_elements", limits.max_elements)


def check_shape(where: str, shape: Iterable[object], what: str, limits: Limits) -> None:
    """A tensor of the converted model: a rank numpy has, no negative dimension, and (when
    static) within ``max_tensor_elements``. Symbolic dimensions pass."""
    dims = list(shape)
    if len(dims) > MAX_RANK:
        raise Error(f"{where}: {what} has rank {len(dims)}; kiln's tensors have at most "
                    f"{MAX_RANK} dimensions")
    numbers = [d for d in dims if isinstance(d, int)]
    if any(d < 0 for d in numbers):
        raise Error(f"{where}: {what} has a negative dimension: "
                    f"({', '.join(str(d) for d in dims)})")
    if len(numbers) == len(dims):
        n = elements(numbers)
        if n > limits.max_tensor_elements:
            raise over_limit(where, f"the size of {what} (shape {tuple(numbers)})",
                             f"{n} elements", "max_tensor_elements", limits.max_tensor_elements)


def check_rank(where: str, rank: int, what: str) -> None:
    """A tensor of rank ``rank`` is about to be made: a rank numpy has."""
    if rank > MAX_RANK:
        raise Error(f"{where}: {what} would have rank {rank}; kiln's tensors have at most "
                    f"{MAX_RANK} dimensions")


def check_unroll(where: str, n: int, what: str, limits: Limits) -> None:
    """The importer is about to run a Python loop of ``n`` steps: within ``max_unroll``."""
    if n > limits.max_unroll:
        raise over_limit(where, what, n, "max_unroll", limits.max_unroll)


def check_scale(where: str, scale: float, what: str, limits: Limits,
                shrink: bool = False) -> None:
    """A resize factor: finite, positive, at most ``max_resize_scale`` (and, with
    ``shrink``, at least its inverse: antialiasing widens the filter by 1 / scale)."""
    if not (math.isfinite(scale) and scale > 0):
        raise Error(f"{where}: {what} is {scale}; a resize factor must be positive and finite")
    if scale > limits.max_resize_scale:
        raise over_limit(where, what, scale, "max_resize_scale", limits.max_resize_scale)
    if shrink and scale * limits.max_resize_scale < 1:
        raise over_limit(where, f"1 / {what} (an antialiasing filter's width)", 1 / scale,
                         "max_resize_scale", limits.max_resize_scale)


class Budget:
    """The work of one import so far, against its limits (shared by every graph importer
    of that import: subgraphs, function bodies, unrolled loop iterations)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.repeated = 0
        # id -> node: the subgraph nodes converted once (kept, so that no id is reused).
        self._converted: dict[int, object] = {}

    def count_subgraph_node(self, node: object, where: str) -> None:
        """A subgraph's node is being converted: its second and later conversions count."""
        if id(node) not in self._converted:
            self._converted[id(node)] = node
            return
        self.repeated += 1
        limit = self.limits.max_repeated_nodes
        if self.repeated > limit:
            raise Error(f"{where}: the import has converted the nodes of subgraphs {limit} "
                        "more times than they appear (once per unrolled Loop iteration, Scan-8 "
                        "batch entry or pass over a Loop body, multiplied by nesting), kiln's "
                        f"import limit max_repeated_nodes={limit}; "
                        f"{how_to_raise('max_repeated_nodes')}")
