"""KL-divergence (entropy) calibration, TensorRT style, and TPU-MLIR style threshold search.

The threshold search on a histogram of |x| (``bins`` bins of width w over
[0, R), see :mod:`.histogram`), for ``levels`` quantization levels on one
side of zero (128 for int8):

* only bins up to the last non-empty one are considered (TensorRT's
  histogram ends at the absolute maximum);
* for every i from ``levels`` to that count: the reference P is hist[:i]
  with the outlier mass hist[i:] added to bin i-1; the candidate Q is
  hist[:i] (without the outliers, as in TensorRT's description and
  MXNet/onnxruntime) merged into ``levels`` groups and expanded back evenly
  over the bins that are non-empty in P; the divergence is KL(P || Q) of the
  normalised distributions.
* groups are balanced: group j covers bins [j*i // levels, (j+1)*i // levels)
  (MXNet and onnxruntime give every group i // levels bins and the leftover
  to the last one, which makes the divergence jump between multiples of
  ``levels``);
* smoothing: P and Q share their support except where a group holds no
  mass of hist[:i] but P holds outliers; there Q is given ``eps`` = 1e-4
  counts per bin (MXNet's smoothing constant); elsewhere zero bins of both
  contribute nothing, which is what smoothing both with eps gives to first
  order;
* the i with the smallest divergence wins (the first on ties) and the
  threshold is (i + 0.5) * w, never above the absolute maximum;
* the observer first sets the count of bin 0 to that of bin 1, as NVIDIA's
  pytorch-quantization does: zeros are exact under any threshold, and the
  spike of exact zeros after a ReLU (half the values) would otherwise force
  group 0 to be that one bin, i.e. i < 2 * levels: on half-normal data the
  threshold drops from 4.7 to 1.5 sigma.

The divergence of every i is computed at once from prefix sums: with M_j the
mass of group j and n_j its non-empty bins, sum p log q = sum_j Mp_j log(M_j / n_j)
and sum p log p is a prefix sum, so each i costs O(levels), not O(i).
"""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import CalibrationDataError, QuantizationPolicyError

from .histogram import HistogramObserver

__all__ = ["KLObserver", "SearchObserver", "kl_best_bins", "kl_divergences"]

_EPS = 1e-4


def _xlogx(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)


def kl_divergences(hist: np.ndarray, levels: int, eps: float = _EPS) -> np.ndarray:
    """KL(P || Q) for i = levels .. len(hist) (1-D float64 array; empty if len(hist) < levels)."""
    h = np.asarray(hist, np.float64)
    n, levels = h.size, int(levels)
    if levels < 1 or n < levels:
        return np.empty(0)
    total = h.sum()
    cum = np.concatenate(([0.0], np.cumsum(h)))
    nonzero = np.concatenate(([0], np.cumsum(h > 0)))
    plogp_prefix = np.concatenate(([0.0], np.cumsum(_xlogx(h))))
    i = np.arange(levels, n + 1, dtype=np.int64)
    edges = (i[:, None] * np.arange(levels + 1, dtype=np.int64)[None, :]) // levels   # (K, levels + 1)
    mass = np.diff(cum[edges], axis=1)                  # Q's mass per group (without outliers)
    support = np.diff(nonzero[edges], axis=1)           # non-empty bins per group
    outliers = total - cum[i]
    last = h[i - 1]
    support[:, -1] += (last == 0) & (outliers > 0)      # bin i-1 joins P's support through the outliers
    pmass = mass.copy()
    pmass[:, -1] += outliers
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(support > 0, mass / np.maximum(support, 1), 0.0)
        log_q = np.log(np.where(q > 0, q, eps))
        cross = np.where(pmass > 0, pmass * log_q, 0.0).sum(axis=1)
        plogp = plogp_prefix[i - 1] + _xlogx(last + outliers)
        q_total = cum[i]
        kl = (plogp - cross) / total + np.log(np.where(q_total > 0, q_total, 1.0) / total)
    return np.where(q_total > 0, kl, np.inf)


def _is_discrete(hist: np.ndarray, levels: int) -> bool:
    """True for data of few, spread-out values (raw pixels, one-hot inputs).

    On such histograms a candidate P can hold all its in-range mass in one
    bin, where P and Q agree and KL reads 0 however much is clipped.  The test:
    fewer populated bins than ``levels``, covering under a quarter of the bins
    up to where 99.99% of the mass lies.
    """
    body = hist[1:]
    cumulative = np.cumsum(body)
    if cumulative.size == 0 or cumulative[-1] <= 0:
        return False
    end = int(np.searchsorted(cumulative, 0.9999 * cumulative[-1])) + 1
    populated = int(np.count_nonzero(body[:end]))
    return populated <= levels and populated * 4 < end


def kl_best_bins(hist: np.ndarray, levels: int) -> int | None:
    """The i (number of bins kept) of smallest KL divergence, or None when the histogram is shorter than ``levels``."""
    h = np.asarray(hist)
    nz = np.flatnonzero(h)
    if nz.size == 0:
        return None
    if _is_discrete(h, levels):
        return None
    h = h[: nz[-1] + 1]
    kl = kl_divergences(h, levels)
    if kl.size == 0 or not np.isfinite(kl).any():
        return None
    return int(levels + np.argmin(kl))


class KLObserver(HistogramObserver):
    """TensorRT-style entropy calibration (aliases ``kl``, ``entropy``); see the module docstring.

    The KL threshold t is computed on |x|.  Symmetric configs: range
    [max(min, -t), min(max, t)], which renders as [-t, t].  Asymmetric
    configs: the same range; for one-sided data (min >= 0, e.g. after ReLU,
    or max <= 0) the whole grid spans [0, t], so the search uses all
    qmax - qmin + 1 levels (256 for uint8) instead of half of them (see
    :meth:`HistogramObserver._levels`).  When the histogram has fewer
    non-empty bins than levels (16-bit grids, or discrete data such as raw
    pixel values), t is the absolute maximum.
    Per channel: one histogram and one search per channel.
    """

    algorithm = "kl"
    _kl_cache = None

    def kl_thresholds(self) -> np.ndarray:
        """The KL threshold t on |x| per channel (float64 (C,))."""
        self._require_data()
        key = self._cache_key()
        cached = getattr(self, "_kl_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1].copy()
        mags = self.magnitude_histogram()
        absmax = self.absmax()
        levels = self._levels((self._min >= 0) | (self._max <= 0))
        width = self.bin_width
        t = absmax.copy()
        if mags.shape[1] > 1:
            mags[:, 0] = mags[:, 1]           # the zero spike carries no information (module docstring)
        for c in range(mags.shape[0]):
            best = kl_best_bins(mags[c], int(levels[c]))
            if best is not None:
                t[c] = min((best + 0.5) * width[c], absmax[c])
        self._kl_cache = (key, t)
        return t.copy()

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._clip_symmetric(self.kl_thresholds())


class SearchObserver(KLObserver):
    """TPU-MLIR-style threshold tuning: KL first, then the caller picks among candidates.

    Per tensor only.  After observing, :meth:`candidates` gives
    ``num_candidates`` (default 20) thresholds evenly spread from the KL
    threshold to the absolute maximum (both included; one when they
    coincide).  The calibration pass measures each candidate's error on the
    op's output (after ``select(t)`` and ``render()``) and calls
    :meth:`select` with the best.  Until then, :meth:`thresholds` is the KL
    choice.  A threshold t gives the range [max(min, -t), min(max, t)].
    Observing or merging more data clears the selection.
    """

    algorithm = "search"

    def __init__(self, config, num_candidates: int = 20, bins: int = 2048):
        num_candidates = int(num_candidates)
        if num_candidates < 2:
            raise QuantizationPolicyError(f"search needs at least 2 candidates, got {num_candidates}")
        self.num_candidates = num_candidates
        self._selected: float | None = None
        super().__init__(config, bins)
        if self.per_channel:
            raise QuantizationPolicyError(f"{self._who()}: the search observer tunes per-tensor thresholds; "
                                          "use kl, mse or percentile for per-channel configs")

    def observe_viewed(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        super().observe_viewed(value, x3, lo, hi)
        self._selected = None

    def merge(self, other: "SearchObserver") -> None:
        super().merge(other)
        self._selected = None

    def candidates(self) -> list[float]:
        """Thresholds on |x| to try, ascending: the KL threshold first, the absolute maximum last."""
        start = float(self.kl_thresholds()[0])
        stop = float(self.absmax()[0])
        if not stop > start:
            return [stop]
        values = np.linspace(start, stop, self.num_candidates)
        values[-1] = stop
        return [float(v) for v in values]

    def select(self, threshold: float) -> None:
        """Use ``threshold`` (on |x|, > 0 and finite; normally one of :meth:`candidates`)."""
        self._require_data()
        t = float(threshold)
        if not (np.isfinite(t) and t > 0):
            raise CalibrationDataError(f"{self._who()}: search threshold must be finite and > 0, got {threshold!r}")
        self._selected = t

    def _thresholds_key(self) -> tuple:
        return (*self._cache_key(), self._selected)

    @property
    def selected(self) -> float | None:
        """The threshold chosen with :meth:`select`, or None (KL in use)."""
        return self._selected

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        if self._selected is None:
            return super()._thresholds()
        return self._clip_symmetric(np.array([self._selected]))
