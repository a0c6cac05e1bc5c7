"""Min-max observer: the range is the running minimum and maximum."""

from __future__ import annotations

import numpy as np

from .base import Observer

__all__ = ["MinMaxObserver"]


class MinMaxObserver(Observer):
    """Running min/max, per tensor or per channel; merging is exact.

    thresholds() is the observed (min, max); render() widens it to hold 0
    and makes it symmetric where the policy says (numerics does both).
    """

    algorithm = "minmax"

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._min.copy(), self._max.copy()
