"""MSE calibration: the range whose quantization error, estimated from the histogram, is smallest."""

from __future__ import annotations

import numpy as np

from ppqlike.core import numerics
from ppqlike.core.errors import QuantizationPolicyError
from ppqlike.core.float_formats import float_fake_quantize

from .histogram import HistogramObserver

__all__ = ["MSEObserver"]


class MSEObserver(HistogramObserver):
    """Range minimising the expected squared quantization error (streaming, histogram-based).

    Candidates scale the observed range by alpha = k / n, k = 1..n (n = 100
    by default): symmetric configs try thresholds alpha * absmax (range
    [max(min, -t), min(max, t)]), asymmetric ones [alpha * min, alpha * max].
    Each candidate is turned into the scale/offset that :meth:`render` would
    write (numerics.minmax_to_scale_offset: power-of-2 scales, offset
    rounding, the integer range), and its error is estimated over the
    non-empty histogram bins, each represented by its centre (clamped into
    the observed [min, max]) times its count: values inside the grid's range
    [S (qmin - Z), S (qmax - Z)] cost the rounding noise S^2 / 12, except
    those within S / 2 of zero, which round to the exact 0 and cost x^2 (so
    the spike of zeros after a ReLU is not charged noise it does not have);
    values outside cost their squared distance to the nearest end (clipping).  The
    candidate of smallest error wins (the smallest alpha on ties).
    """

    algorithm = "mse"

    def __init__(self, config, num_candidates: int = 100, bins: int = 2048):
        num_candidates = int(num_candidates)
        if num_candidates < 1:
            raise QuantizationPolicyError(f"mse needs at least 1 candidate, got {num_candidates}")
        self.num_candidates = num_candidates
        super().__init__(config, bins)

    def candidate_errors(self, channel: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidate lows, candidate highs, estimated total squared error) of one channel."""
        self._require_data()
        cfg = self.config
        policy = cfg.policy
        qmin, qmax = int(cfg.quant_min), int(cfg.quant_max)
        alphas = np.arange(1, self.num_candidates + 1, dtype=np.float64) / self.num_candidates
        lo_c, hi_c = float(self._min[channel]), float(self._max[channel])
        if policy.symmetric:
            a = max(-lo_c, hi_c)
            cand_lo, cand_hi = -alphas * a, alphas * a
        else:
            cand_lo, cand_hi = alphas * min(lo_c, 0.0), alphas * max(hi_c, 0.0)
        scale, offset = numerics.minmax_to_scale_offset(
            cand_lo, cand_hi, qmin, qmax, symmetric=policy.symmetric,
            power_of_2=policy.power_of_2, rounding=cfg.rounding)
        s = scale.astype(np.float64)[:, None]
        z = offset.astype(np.float64)[:, None]
        hist = self._hist[channel]
        if cfg.float_format is not None:   # a float grid: the error of the format's own rounding of each centre
            return cand_lo, cand_hi, self._float_errors(scale, channel, lo_c, hi_c, hist)
        grid_lo, grid_hi = s * (qmin - z), s * (qmax - z)
        nz = np.flatnonzero(hist)
        counts = hist[nz].astype(np.float64)
        centres = np.clip((nz - self.bins + 0.5) * float(self.bin_width[channel]), lo_c, hi_c)[None, :]
        below = np.maximum(grid_lo - centres, 0.0)
        above = np.maximum(centres - grid_hi, 0.0)
        inside = (below == 0) & (above == 0)
        noise = np.where(np.abs(centres) < s / 2, centres * centres, s * s / 12.0)
        err = np.where(inside, noise, below * below + above * above) @ counts
        if policy.symmetric:
            cand_lo, cand_hi = np.maximum(lo_c, cand_lo), np.minimum(hi_c, cand_hi)
        return cand_lo, cand_hi, err

    def _float_errors(self, scales: np.ndarray, channel: int, lo_c: float, hi_c: float, hist) -> np.ndarray:
        """Per candidate scale, the squared error of a float grid (FP8: values past S * max saturate) over the
        histogram's non-empty bins, each at its centre."""
        nz = np.flatnonzero(hist)
        counts = hist[nz].astype(np.float64)
        centres = np.clip((nz - self.bins + 0.5) * float(self.bin_width[channel]), lo_c, hi_c).astype(np.float32)
        values = np.broadcast_to(centres, (scales.size, centres.size))
        rounded = float_fake_quantize(values, scales.astype(np.float32), self.config.float_format, channel_axis=0)
        return ((rounded.astype(np.float64) - centres) ** 2) @ counts

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        channels = self._channels
        lo, hi = np.empty(channels), np.empty(channels)
        for c in range(channels):
            cand_lo, cand_hi, err = self.candidate_errors(c)
            k = int(np.argmin(err))
            lo[c], hi[c] = cand_lo[k], cand_hi[k]
        return lo, hi
