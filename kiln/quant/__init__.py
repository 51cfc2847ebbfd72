"""kiln.quantize: a float model to int8, in Relay's three steps (annotate → calibrate →
realize), each a function of its own file here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.quant.annotate import Annotation, Layer, Skip, annotate, prepare
from kiln.quant.calibrate import Range, calibrate
from kiln.quant.realize import quantize_weight, realize, weight_scale
from kiln.quant.schemes import SCHEMES, check_scheme, kl_threshold, threshold


def quantize(mod: IRModule, params: Mapping[str, Any] | None = None, *,
             calibration: Iterable[Any], scheme: str = "minmax", percentile: float = 99.99,
             skip: Skip = None, skip_first: bool = False, skip_last: bool = False,
             executor: str = "build") -> tuple[IRModule, dict[str, np.ndarray]]:
    """Quantize ``mod``'s conv2d / dense layers to int8 (weights per output channel,
    activations uint8/int8 in ranges calibrated by ``scheme``: "minmax", "percentile" or
    "kl"); returns the module and its params (empty: the int8 weights are constants)."""
    check_scheme(scheme, percentile)
    ann = annotate(mod, params, skip=skip, skip_first=skip_first, skip_last=skip_last)
    ranges = calibrate(ann, calibration, scheme, percentile=percentile, executor=executor)
    return realize(ann, ranges), {}


__all__ = ["SCHEMES", "Annotation", "Layer", "Range", "annotate", "calibrate", "kl_threshold",
           "prepare", "quantize", "quantize_weight", "realize", "threshold", "weight_scale"]
