"""Calibration schemes: from the values a tensor took on the calibration set to the threshold
its 8-bit range covers (symmetric: ``[-t, t]`` in int8, ``[0, t]`` in uint8).

- ``"minmax"``: ``t = max |x|``.
- ``"percentile"``: ``t`` = the given percentile (default 99.99) of ``|x|``.
- ``"kl"``: TensorRT's entropy calibration (Relay's ``kl_divergence.py``): a histogram of
  ``|x|`` in 2048 bins; for each candidate edge ``i`` (from the number of quantized levels
  up), the reference distribution ``P`` is the first ``i`` bins with the outliers added to
  the last; ``Q`` is ``P``'s bins merged into as many groups as there are levels and spread
  back uniformly over the bins that were not empty; ``t`` is the edge whose ``KL(P || Q)`` is
  least.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import Error

SCHEMES = ("minmax", "percentile", "kl")
BINS = 2048


def check_scheme(scheme: str, percentile: float) -> None:
    """A clear error for a scheme that does not exist or a percentile out of range."""
    if scheme not in SCHEMES:
        raise Error(f"kiln.quantize: there is no calibration scheme {scheme!r}; the schemes are "
                    f"{', '.join(repr(s) for s in SCHEMES)}")
    if not 0 < percentile <= 100:
        raise Error(f"kiln.quantize: percentile must be in (0, 100], not {percentile}")


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) of two histograms (normalized here); bins where P is 0 add nothing."""
    p = p / p.sum()
    q = q / q.sum()
    mask = p > 0
    if np.any(q[mask] == 0):
        return float("inf")
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def candidate(hist: np.ndarray, i: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference ``P`` (first ``i`` bins, outliers in the last) and its quantized ``Q``:
    the bins split into ``levels`` groups of consecutive bins (group j starts at bin
    ``floor(j * i / levels)``), each group's mass spread evenly over its non-empty bins."""
    src = hist[:i].astype(np.float64)
    p = src.copy()
    p[-1] += hist[i:].sum()
    starts = np.floor(np.arange(levels) * (i / levels)).astype(np.int64)
    sums = np.add.reduceat(src, starts)
    counts = np.add.reduceat((src > 0).astype(np.float64), starts)
    group = np.repeat(np.arange(levels), np.diff(np.append(starts, i)))
    mean = np.divide(sums, counts, out=np.zeros(levels), where=counts > 0)
    q = np.where(src > 0, mean[group], 0.0)
    return p, q


def kl_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = 128) -> float:
    """The threshold (a bin edge) whose quantization into ``levels`` bins loses least."""
    hist = np.asarray(hist)
    if len(hist) <= levels:
        return float(edges[-1])
    best, best_i = float("inf"), len(hist)
    for i in range(levels, len(hist) + 1):
        if hist[i - 1] == 0 and i < len(hist):
            continue  # same P as a smaller edge with more outliers folded: skip empty edges
        p, q = candidate(hist, i, levels)
        d = kl_divergence(p, q)
        if d < best:
            best, best_i = d, i
    return float(edges[best_i])


def threshold(values: np.ndarray, scheme: str, percentile: float = 99.99,
              unsigned: bool = False) -> float:
    """The threshold of ``values`` under ``scheme`` (``unsigned``: the range is [0, t])."""
    a = np.abs(np.asarray(values, dtype=np.float32).reshape(-1))
    if a.size == 0:
        return 0.0
    if scheme == "minmax":
        return float(a.max())
    if scheme == "percentile":
        return float(np.percentile(a, percentile))
    top = float(a.max())
    if top == 0:
        return 0.0
    hist, edges = np.histogram(a, bins=BINS, range=(0.0, top))
    return kl_threshold(hist, edges, 256 if unsigned else 128)
