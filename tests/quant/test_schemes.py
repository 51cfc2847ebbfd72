"""Calibration schemes against numpy computations of the same statistics."""

import numpy as np
import pytest

import kiln
from kiln.quant.schemes import kl_divergence, kl_threshold, threshold


def _data() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000), 40 * rng.standard_normal(5)])
    return x.astype("float32")


def test_minmax_is_max_abs() -> None:
    x = _data()
    assert threshold(x, "minmax") == pytest.approx(float(max(-x.min(), x.max())))


def test_percentile_of_abs() -> None:
    x = _data()
    assert threshold(x, "percentile", 99.9) == pytest.approx(float(np.percentile(np.abs(x), 99.9)))
    # the outliers (5 of 20005) are past the 99.9th percentile: far below the maximum
    assert threshold(x, "percentile", 99.9) < 0.2 * float(np.abs(x).max())


def test_kl_hand_checkable() -> None:
    # 8 bins quantized into 4 levels: when the last 4 bins are empty, the first 4 are kept
    # exactly (each level one bin), so KL is 0 at edge 4 and the threshold is that edge.
    hist = np.array([5, 3, 2, 1, 0, 0, 0, 0])
    edges = np.arange(9, dtype=np.float64)
    assert kl_threshold(hist, edges, 4) == 4.0
    # one outlier in the last bin: keeping all 8 bins merges pairs (5,3)->(4,4), ...;
    # P at edge 4 folds the outlier into bin 3. Compute both KLs by hand here.
    hist = np.array([5, 3, 2, 1, 0, 0, 0, 1])
    p4 = np.array([5, 3, 2, 2]) / 12
    kl4 = 0.0  # Q at edge 4 is hist[:4] itself, P = [5,3,2,2]: KL(P||Q)
    q4 = np.array([5, 3, 2, 1]) / 11
    kl4 = float(np.sum(p4 * np.log(p4 / q4)))
    p8 = hist / 12
    q8 = np.array([4, 4, 1.5, 1.5, 0, 0, 0, 1]) / 12
    m = p8 > 0
    kl8 = float(np.sum(p8[m] * np.log(p8[m] / q8[m])))
    want = 4.0 if kl4 <= kl8 else 8.0
    assert kl_threshold(hist, edges, 4) == want


def test_kl_properties() -> None:
    x = _data()
    a = np.abs(x)
    t = threshold(x, "kl")
    assert 0 < t <= a.max()
    hist, edges = np.histogram(a, bins=2048, range=(0, float(a.max())))
    i = int(np.argmin(np.abs(edges - t)))
    assert edges[i] == pytest.approx(t)

    def kl_at(i: int) -> float:  # TensorRT's P and Q at edge i, written out here with loops
        p = hist[:i].astype(float).copy()
        p[-1] += hist[i:].sum()
        q = np.zeros(i)
        starts = [int(np.floor(j * i / 128)) for j in range(128)] + [i]
        for j in range(128):
            part = hist[starts[j]:starts[j + 1]].astype(float)
            nz = part > 0
            if nz.any():
                q[starts[j]:starts[j + 1]][nz] = part.sum() / nz.sum()
        return kl_divergence(p, q)

    assert kl_at(i) <= kl_at(2048) + 1e-12   # no worse than keeping the whole range (minmax)
    assert kl_at(i) <= kl_at(128) + 1e-12    # nor than the narrowest candidate
    # the outliers make the whole range a poor choice: KL clips them
    assert t < 0.5 * a.max()


def test_unknown_scheme_and_percentile() -> None:
    from kiln.quant.schemes import check_scheme
    with pytest.raises(kiln.Error, match="no calibration scheme 'entropy'"):
        check_scheme("entropy", 99.9)
    with pytest.raises(kiln.Error, match="percentile"):
        check_scheme("percentile", 120)
