"""calibrate: run the float model on calibration inputs and choose each observed tensor's
8-bit range (Relay's second step).

The annotated module's @main, made to return every observed tensor beside its result, runs
compiled (``executor="build"``, the default) or on the reference interpreter
(``"interpret"``); each tensor's values over all inputs go to the scheme (kiln/quant/
schemes.py). A tensor that was never negative gets uint8 ``[0, t]``, others int8 ``[-t, t]``
— zero point 0 in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.ir.ty import TensorType
from kiln.quant.annotate import Annotation, observing
from kiln.quant.schemes import check_scheme, threshold


@dataclass(frozen=True)
class Range:
    """An observed tensor's 8-bit quantization: ``x ≈ scale * q``, q in ``dtype``."""

    dtype: str  # "uint8" or "int8"
    scale: float
    lo: float  # the least and greatest values seen, for reference
    hi: float
    threshold: float


def range_of(values: np.ndarray, scheme: str, percentile: float) -> Range:
    """The 8-bit range ``scheme`` chooses for these values."""
    lo, hi = float(values.min()), float(values.max())
    unsigned = lo >= 0
    t = threshold(values, scheme, percentile, unsigned)
    levels = 255 if unsigned else 127
    scale = float(np.float32(t / levels)) if t > 0 else 1.0
    return Range("uint8" if unsigned else "int8", scale, lo, hi, t)


def _inputs(item: Any, i: int, params: list[tuple[str, TensorType]]) -> list[np.ndarray]:
    """One calibration item as @main's arguments, checked against their types."""
    if isinstance(item, Mapping):
        missing = [n for n, _ in params if n not in item]
        if missing:
            raise Error(f"kiln.quantize: calibration input {i} has no {', '.join(missing)}")
        args = [item[n] for n, _ in params]
    elif isinstance(item, (tuple, list)):
        args = list(item)
    else:
        args = [item]
    if len(args) != len(params):
        raise Error(f"kiln.quantize: calibration input {i} has {len(args)} tensors; the model "
                    f"takes {len(params)} ({', '.join(n for n, _ in params)})")
    out = []
    for a, (name, t) in zip(args, params, strict=True):
        arr = np.asarray(a)
        shape = tuple(t.shape)
        if tuple(arr.shape) != shape or not all(isinstance(d, int) for d in shape):
            raise Error(f"kiln.quantize: calibration input {i}: %{name} has shape "
                        f"{tuple(arr.shape)}, the model's %{name} is {shape}")
        out.append(arr.astype(t.dtype, copy=False))
    return out


def calibrate(ann: Annotation, calibration: Iterable[Any], scheme: str = "minmax", *,
              percentile: float = 99.99, executor: str = "build") -> tuple[Range, ...]:
    """The `Range` of each tensor ``ann.observed`` lists, from running the float model on
    each item of ``calibration`` (an array, a tuple of arrays or a dict by input name)."""
    check_scheme(scheme, percentile)
    if executor not in ("build", "interpret"):
        raise Error(f"kiln.quantize: executor must be 'build' or 'interpret', not {executor!r}")
    fn = observing(ann)
    params = []
    for p in fn.params:
        t = p.checked_type if p.checked_type is not None else p.type_annotation
        if not isinstance(t, TensorType):
            raise Error(f"kiln.quantize: input %{p.name_hint} is not a tensor")
        params.append((p.name_hint, t))
    if executor == "build":
        from kiln.runtime import build

        exe = build(fn)

        def run(*args: np.ndarray) -> Any:
            return exe(*args)
    else:
        from kiln.eval import interpret

        def run(*args: np.ndarray) -> Any:
            return interpret(fn, *args)

    seen: list[list[np.ndarray]] = [[] for _ in ann.observed]
    count = 0
    for i, item in enumerate(calibration):
        outs = run(*_inputs(item, i, params))
        for slot, v in enumerate(list(outs)[1:]):
            seen[slot].append(np.asarray(v, dtype=np.float32).reshape(-1))
        count += 1
    if count == 0:
        raise Error("kiln.quantize: the calibration set is empty; give at least one input")
    return tuple(range_of(np.concatenate(vs), scheme, percentile) for vs in seen)
