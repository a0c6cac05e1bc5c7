"""Mean min-max observer: the range is the mean over samples of each sample's minimum and maximum.

NNCF's default activation range estimator (``MEAN_MINMAX``): an outlier that one image produces moves the
range by 1/N of its excess instead of all of it, at the cost of a min and a max per sample.

Samples are the rows of the batch's leading axis.  The sums are kept exactly (each float32 extreme is an
integer number of 2^-149, summed as Python integers), so shards merge to the same range in any order.
"""

from __future__ import annotations

import numpy as np

from .base import Observer

__all__ = ["MeanMinMaxObserver"]

_UNIT = 149   # every finite float32 is an integer multiple of 2^-149


def _exact_sum(values: np.ndarray) -> list[int]:
    """Per column of ``values`` [samples, C] (float32-representable), the exact sum in units of 2^-149."""
    scaled = np.ldexp(values.astype(np.float32).astype(np.float64), _UNIT)   # integers, exact in float64
    return [sum(int(v) for v in column) for column in scaled.T]


class MeanMinMaxObserver(Observer):
    """Mean over samples of per-sample (min, max), per tensor or per channel; merging is exact."""

    algorithm = "mean_minmax"
    _extremes = None   # each sample's (min, max) of the batch being folded in, when computed already

    def _allocate(self, channels: int) -> None:
        self._sum_min = [0] * channels
        self._sum_max = [0] * channels
        self._samples = 0

    def observe_viewed(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Fold one batch in; its leading axis is the samples (a 0-d or 1-D value is one sample)."""
        self._batch = np.asarray(value)
        try:
            super().observe_viewed(value, x3, lo, hi)
        finally:
            self._batch = None

    def sample_extremes(self, value, x3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's (min, max) per channel, [samples, channels] in the batch's dtype: what this observer
        folds in, and, reduced over the samples, the batch's extremes (``choice`` computes them once)."""
        samples = self._samples_of(x3, np.asarray(value))
        return samples.min(axis=2), samples.max(axis=2)

    def observe_extremes(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray, extremes: tuple) -> None:
        """:meth:`observe_viewed` with the batch's :meth:`sample_extremes` already computed."""
        self._extremes = extremes
        try:
            self.observe_viewed(value, x3, lo, hi)
        finally:
            self._extremes = None

    def _observe(self, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        low, high = self._extremes or self.sample_extremes(self._batch, x3)
        self._sum_min = [a + b for a, b in zip(self._sum_min, _exact_sum(low))]
        self._sum_max = [a + b for a, b in zip(self._sum_max, _exact_sum(high))]
        self._samples += low.shape[0]

    def _samples_of(self, x3: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """The batch as [samples, channels, values of one sample]: per channel, the axes before the channel
        axis are the samples (x3 as it is); per tensor, the leading axis of the batch."""
        if self.per_channel:
            return x3
        if batch.ndim < 2:
            return x3
        count = batch.shape[0]
        outermost = batch.strides[0] == max(abs(stride) for stride in batch.strides) and batch.strides[0] > 0
        return (x3 if outermost else batch).reshape(count, 1, -1)

    def _merge(self, other: "MeanMinMaxObserver") -> None:
        self._sum_min = [a + b for a, b in zip(self._sum_min, other._sum_min)]
        self._sum_max = [a + b for a, b in zip(self._sum_max, other._sum_max)]
        self._samples += other._samples

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        count = max(self._samples, 1)
        lo = np.array([np.ldexp(float(total) / count, -_UNIT) for total in self._sum_min])
        hi = np.array([np.ldexp(float(total) / count, -_UNIT) for total in self._sum_max])
        return lo, hi

    def _state_arrays(self) -> list[np.ndarray]:
        return []
