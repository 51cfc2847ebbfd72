"""Python numbers and nested lists as tensors of a parameter's dtype, converted exactly or refused.

The interpreter and every executable read arguments through `exact_array`. The rules:

- a bool converts to any dtype (as 0 or 1);
- an int converts only to a value equal to it: within an integer dtype's range, or exactly
  representable in a float dtype (``2**60 + 1`` is not a float32; ``2**24`` is);
- a float converts to a float dtype by rounding, as floats do, unless a finite float would
  become infinite (``1e300`` is not a float32); inf and nan stay what they are. To an integer or
  bool dtype only a finite float with no fractional part within its range converts (``2.0``
  for int32, not ``2.5``);
- nested lists and tuples follow the same rules element by element; anything else inside
  (strings, None, complex numbers, ragged nesting) is refused.

Numpy arrays and scalars are not converted here: they must already have the parameter's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.errors import Error


def exact_array(value: Any, dtype: str, what: object, expects: str) -> np.ndarray:
    """``value`` (a Python number or nested list) as an array of ``dtype``, nothing changed.

    A value that does not convert exactly is a `kiln.Error` naming ``what`` (the parameter),
    the type it ``expects``, the offending element and why it does not fit.
    """
    try:
        natural = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise Error(f"{what} expects {expects}, but got {_short(value)}: {exc}") from None
    target = np.dtype(dtype)
    kind = natural.dtype.kind
    if kind in "biu":  # only bools and ints inside: checked at once
        _check_ints(natural, target, value, what, expects)
    elif kind == "f" and not _has_int_leaf(value):  # only floats (and bools)
        _check_floats(natural, target, value, what, expects)
    elif kind in "fO":  # ints and floats mixed, or ints too large for int64: one by one
        for index, leaf in zip(np.ndindex(natural.shape), _leaves(value, natural.ndim)):
            reason = _leaf_misfit(leaf, target)
            if reason is not None:
                _refuse(value, natural, index, leaf, target, reason, what, expects)
        # ``natural`` may have rounded an int that fits the target (2**63 - 1 as a float64).
        with np.errstate(all="ignore"):
            return np.asarray(value, dtype=target)
    else:
        raise Error(f"{what} expects {expects}, but got {_short(value)}, which is not made "
                    f"of numbers (numpy reads it as {natural.dtype.name})")
    with np.errstate(all="ignore"):  # every element is known to fit
        return natural.astype(target, copy=False)


def _check_ints(natural: np.ndarray, target: np.dtype, value: Any, what: object,
                expects: str) -> None:
    if natural.size == 0 or natural.dtype.kind == "b":  # bools are 0 and 1 in every dtype
        return
    if target.kind in "iub":
        lo, hi = _int_range(target)
        bad = (natural < lo) | (natural > hi)
    else:
        with np.errstate(all="ignore"):
            converted = natural.astype(target)
            # An integral float below 2**63 (2**64 unsigned) converts back to the integer type
            # exactly, so the round trip says whether ``converted`` holds the integer.
            wide = converted.astype(np.float64)
            if natural.dtype.kind == "i":
                fits = (wide >= -(2.0**63)) & (wide < 2.0**63)
            else:
                fits = (wide >= 0) & (wide < 2.0**64)
            back = np.where(fits, converted, 0).astype(natural.dtype)
        bad = ~fits | (back != natural)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        leaf = natural[index].item()
        reason = _leaf_misfit(leaf, target)
        assert reason is not None
        _refuse(value, natural, index, leaf, target, reason, what, expects)


def _check_floats(natural: np.ndarray, target: np.dtype, value: Any, what: object,
                  expects: str) -> None:
    if natural.size == 0:
        return
    with np.errstate(all="ignore"):
        if target.kind == "f":
            bad = np.isfinite(natural) & ~np.isfinite(natural.astype(target))
        else:
            lo, hi = _int_range(target)
            # hi + 1 is a power of two (or 2 for bool), which a float holds exactly.
            bad = ~(np.isfinite(natural) & (natural == np.floor(natural))
                    & (natural >= lo) & (natural < float(hi + 1)))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        leaf = float(natural[index])
        reason = _leaf_misfit(leaf, target)
        assert reason is not None
        _refuse(value, natural, index, leaf, target, reason, what, expects)


def _int_range(target: np.dtype) -> tuple[int, int]:
    if target.kind == "b":
        return 0, 1
    info = np.iinfo(target)
    return int(info.min), int(info.max)


def _leaf_misfit(leaf: Any, target: np.dtype) -> str | None:
    """Why the number ``leaf`` does not convert to ``target`` exactly; None when it does."""
    name = target.name
    if isinstance(leaf, (bool, np.bool_)):
        return None
    if isinstance(leaf, (int, np.integer)):
        v = int(leaf)
        if target.kind in "iub":
            lo, hi = _int_range(target)
            if lo <= v <= hi:
                return None
            if target.kind == "b":
                return "a bool holds only 0 and 1"
            return f"it is out of the range of {name} ({lo} to {hi})"
        try:
            as_float = float(v)
        except OverflowError:
            return f"it is beyond the range of {name}"
        with np.errstate(all="ignore"):
            held = target.type(as_float)
        if not np.isfinite(held):
            return f"it is beyond the range of {name}"
        if int(held) == v:
            return None
        return f"{name} cannot hold it exactly (the nearest {name} is {int(held)})"
    if isinstance(leaf, (float, np.floating)):
        f = float(leaf)
        if target.kind == "f":
            with np.errstate(all="ignore"):
                held = target.type(f)
            if math.isfinite(f) and not np.isfinite(held):
                return f"it is beyond the range of {name} (at most {np.finfo(target).max})"
            return None
        if not math.isfinite(f):
            return f"{name} has no {f}"
        if not f.is_integer():
            return "it has a fractional part"
        lo, hi = _int_range(target)
        if lo <= int(f) <= hi:
            return None
        if target.kind == "b":
            return "a bool holds only 0 and 1"
        return f"it is out of the range of {name} ({lo} to {hi})"
    return f"it is a {type(leaf).__name__}, not a number"


def _has_int_leaf(value: Any) -> bool:
    """Whether an int (not a bool) is among the numbers in ``value``; a list at a time."""
    if not isinstance(value, (list, tuple)):
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    stack: list[Any] = [value]
    while stack:
        x = stack.pop()
        kinds = set(map(type, x))
        if kinds <= _FLOATS:  # the common case: a row of floats
            continue
        for k in kinds:
            if issubclass(k, (list, tuple)):
                stack.extend(y for y in x if isinstance(y, (list, tuple)))
            elif issubclass(k, np.ndarray):
                if any(y.dtype.kind in "iu" for y in x if isinstance(y, np.ndarray)):
                    return True
            elif issubclass(k, (int, np.integer)) and not issubclass(k, bool):
                return True
    return False


_FLOATS = {float, bool}


def _leaves(value: Any, ndim: int) -> list[Any]:
    """The numbers in ``value`` in row-major order (numpy arrays inside opened up)."""
    out: list[Any] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        x, depth = stack.pop()
        if depth < ndim and isinstance(x, (list, tuple, np.ndarray)):
            stack.extend((y, depth + 1) for y in reversed(list(x)))
        else:
            out.append(x.item() if isinstance(x, np.generic) else x)
    return out


def _refuse(value: Any, natural: np.ndarray, index: tuple[int, ...], leaf: Any,
            target: np.dtype, reason: str, what: object, expects: str) -> None:
    shown = f"{leaf!r}" if natural.ndim == 0 else (
        f"element [{', '.join(map(str, index))}] of {_short(value)}, {leaf!r},")
    raise Error(f"{what} expects {expects}; {shown} does not convert to {target.name} "
                f"exactly: {reason}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
