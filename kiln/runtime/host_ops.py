"""The VM's ``host`` instruction: an operator whose result's shape is data (kiln/op/dyn.py),
run by its numpy compute on the actual arrays.

The result is checked against the instruction's type before the program sees it — dtype,
rank, and every dimension the type knows — so a kernel after it never gets an array of
another shape than its declaration says; the computes check sizes against
``KILN_MAX_ALLOC_BYTES`` before allocating. Their errors (a shape tensor that does not fit
the data) are `kiln.Error`s naming the operator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.ty import TensorType, Type
from kiln.op.registry import lookup


def host_step(op: str, pairs: Sequence[Sequence[Any]], out: Type) -> Callable[[list[Any]], Any]:
    """The function the VM calls with the operands' arrays to run ``op``."""
    opdef = lookup(op)
    if opdef is None or not isinstance(out, TensorType):
        raise InternalError(f"VM: no host operator {op!r} giving {out}")
    attrs = opdef.normalize_attrs({str(k): v for k, v in pairs})
    dtype = np.dtype(out.dtype)
    rank = out.ndim
    fixed = [(i, d) for i, d in enumerate(out.shape) if isinstance(d, int)]

    def run(arrays: list[Any]) -> np.ndarray:
        try:
            result = np.ascontiguousarray(opdef.compute(arrays, attrs))
        except Error:
            raise
        except (ValueError, TypeError, IndexError, OverflowError, MemoryError) as e:
            raise Error(f"{op}: {type(e).__name__}: {e}") from None
        if result.dtype != dtype or result.ndim != rank or any(
                result.shape[i] != d for i, d in fixed):
            raise Error(f"{op} gave {result.dtype}{list(result.shape)} where the program "
                        f"expects {out}")
        return result

    return run
