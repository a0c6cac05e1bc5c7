"""Min-max observer: the range is the running minimum and maximum."""

from __future__ import annotations

import numpy as np

from .base import Observer

__all__ = ["MinMaxObserver", "UnitScaleObserver"]


class MinMaxObserver(Observer):
    """Running min/max, per tensor or per channel; merging is exact.

    thresholds() is the observed (min, max); render() widens it to hold 0
    and makes it symmetric where the policy says (numerics does both).
    """

    algorithm = "minmax"

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._min.copy(), self._max.copy()


class UnitScaleObserver(MinMaxObserver):
    """Scale 1, offset 0: a float grid used unscaled (FP16/BF16 as a plain cast, the way those platforms and
    TPU-MLIR's F16/BF16 modes run); it watches min/max only to report them."""

    algorithm = "unit"

    def render(self) -> None:
        cfg = self.config
        ones = np.ones(self._channels) if self.per_channel else 1.0
        cfg.set_scale_offset(ones, 0)
