"""Choice observer ('auto'): several observers fed the same values; the calibration pass keeps one.

No single range estimator wins on every model.  Measured on calibration images held aside (logits
cosine): NNCF's mean over samples of per-sample extremes beats the MSE range on MobileNetV2 (ORT_INT8
0.9958 against 0.9892, TRT_INT8 0.9948 against 0.9893) and loses on EfficientNet-Lite0 (0.9914 against
0.9935).  So both are kept, and the plain min-max range beside them (it wins where every sample's extremes
matter: SLANet's table decoder, ORT_INT8 output cosine 0.987 with the better of the two, 0.996 with
min-max); the calibration pass renders the graph with each in turn and keeps the one whose outputs are
closest to FP32 on held-aside calibration samples (``select``).

State: one state per candidate (each mergeable exactly, so the choice merges too); ``chosen`` names the
candidate :meth:`thresholds` and :meth:`render` read (the first until the pass chooses).
"""

from __future__ import annotations

import numpy as np

from .base import Observer
from .mean_minmax import MeanMinMaxObserver
from .minmax import MinMaxObserver
from .mse import MSEObserver

__all__ = ["ChoiceObserver", "CANDIDATES"]

#: the candidates of 'auto', in the order they are tried (the first wins ties)
CANDIDATES = ("mean_minmax", "mse", "minmax")
_TYPES = {"mean_minmax": MeanMinMaxObserver, "mse": MSEObserver, "minmax": MinMaxObserver}


class ChoiceObserver(Observer):
    """Feeds every candidate observer; :meth:`choose` picks the one the others read from."""

    algorithm = "auto"

    def __init__(self, config, candidates=CANDIDATES):
        self.candidates = {name: _TYPES[name](config) for name in candidates}
        self.chosen = next(iter(self.candidates))
        super().__init__(config)

    def choose(self, name: str) -> None:
        """Read thresholds from candidate ``name`` from now on."""
        if name not in self.candidates:
            raise KeyError(f"{self._who()}: no candidate {name!r}; candidates are {list(self.candidates)}")
        self.chosen = name
        self._version += 1

    def observe(self, value) -> None:
        """:meth:`Observer.observe`; with the mean min-max candidate, the batch's extremes are those of its
        per-sample extremes (the same values, one pass over the batch fewer)."""
        mean = self.candidates.get("mean_minmax")
        if mean is None:
            return super().observe(value)
        x3 = self._view(value)
        if x3 is None:
            return
        extremes = mean.sample_extremes(value, x3)
        lo, hi = self._checked_extremes(extremes[0].min(axis=0).astype(np.float64),
                                        extremes[1].max(axis=0).astype(np.float64))
        self._fold_in(value, x3, lo, hi, extremes)

    def observe_viewed(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Every candidate folds in the batch as viewed here, its extremes computed once for all of them."""
        self._fold_in(value, x3, lo, hi, None)

    def _fold_in(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray, extremes: tuple | None) -> None:
        """:meth:`observe_viewed`, the mean min-max candidate handed its per-sample ``extremes`` when known."""
        for name, observer in self.candidates.items():
            if name == "mean_minmax" and extremes is not None:
                observer.observe_extremes(value, x3, lo, hi, extremes)
            else:
                observer.observe_viewed(value, x3, lo, hi)
        super().observe_viewed(value, x3, lo, hi)

    def _merge(self, other: "ChoiceObserver") -> None:
        for name, observer in self.candidates.items():
            observer.merge(other.candidates[name])

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.candidates[self.chosen].thresholds()

    @property
    def state_nbytes(self) -> int:
        return int(sum(observer.state_nbytes for observer in self.candidates.values()))
