"""Fixed-size streaming histograms, and the percentile observer built on them.

Layout
------
Each channel keeps one signed histogram of ``2 * bins`` int64 counts over
``[-R, R)``, bin width ``w = R / bins``; bin ``b`` holds the values in
``[(b - bins) * w, (b - bins + 1) * w)``.  Folding the negative half onto the
positive one gives the ``bins``-bin histogram of ``|x|`` over ``[0, R)`` that
the KL and MSE observers use (``bins`` = 2048 by default, as TensorRT).

The range is a power of two
---------------------------
``R = 2^e`` is the smallest power of two strictly above the absolute maximum
seen so far (floored at 2^-100).  When a batch exceeds it, ``e`` grows by
``d`` and every group of ``2^d`` adjacent bins merges into one: the range
doubles ``d`` times, old bins merge exactly (no bin ever straddles a new
edge, nor zero), and the state keeps its size.  Because ``bins / R`` is a
power of two, ``x * bins / R`` is exact in floating point, so a value's bin
is ``floor(x * bins / R)`` exactly; re-binning computes
``floor(floor(y) / 2^d) = floor(y / 2^d)``.  Hence the histogram does not
depend on the order of the batches nor on how they were sharded: observing
batches one by one, or in two observers that are then merged, gives exactly
the counts of observing the concatenated data at once.

The price is resolution: the data's absolute maximum lies in [R/2, R), so
between ``bins/2`` and ``bins`` bins cover it (TensorRT stretches exactly
``bins`` bins over [0, absmax], which cannot be re-binned exactly).  Pass a
larger ``bins`` for finer histograms.

Large tensors are sampled
-------------------------
A per-tensor histogram bins at most ``SAMPLED_VALUES`` values of each
observed batch: every ``p``-th value of the flattened tensor, ``p`` the
smallest prime with ``size / p <= SAMPLED_VALUES`` that does not divide the
size (so it divides no dimension, and the sample walks every row, column,
channel and image instead of striding in step with one), each count
standing for ``p`` values.  Not the tail: from the bin edge above which the
sample holds its largest 1/64 magnitudes, every value of the batch is
binned, so the rare large values that decide a clipping range (MSE, KL,
percentiles) are counted, not estimated from a few (sampling them too
moved SqueezeNet's MSE ranges: dev agreement 0.970 -> 0.963, ORT_INT8).
The extremes that fix ``R`` stay exact.  Counts still merge exactly, batch
by batch, so a run sharded by whole batches (Ray) gives the local counts.

Binning is vectorised: ``y = floor(x * bins / R) + bins`` in the input's
float dtype, in chunks of 2^18 values that stay in cache, cast to intp and
counted with ``np.bincount`` (about 3x faster than ``np.histogram``).
"""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import QuantizationPolicyError
from ppqlike.executor.ops._threads import parallel_items

from .base import Observer

__all__ = ["HistogramObserver", "PercentileObserver", "histogram_quantile", "sample_stride"]

E_MIN = -100          # ranges are at least 2^-100 (values below land in the bins next to 0)
_CHUNK = 1 << 18      # values binned per step (float buffer ~1 MiB, index buffer ~2 MiB)
SAMPLED_VALUES = 1 << 18   # a per-tensor histogram bins at most this many values of a batch, besides its tail
TAIL_SHARE = 64            # ... the tail: the largest 1/TAIL_SHARE of the sample's magnitudes, every value binned


def _range_exponent(absmax: np.ndarray) -> np.ndarray:
    """Smallest e >= E_MIN with absmax < 2^e (int64, elementwise)."""
    absmax = np.asarray(absmax, np.float64)
    _, e = np.frexp(absmax)        # absmax = m * 2^e, m in [0.5, 1): absmax < 2^e
    e = np.where(absmax > 0, e, E_MIN)
    return np.maximum(e, E_MIN).astype(np.int64)


def sample_stride(size: int, limit: int = SAMPLED_VALUES) -> int:
    """1 when ``size <= limit``; else the smallest prime p >= size / limit that does not divide ``size``."""
    if size <= limit:
        return 1
    p = max(2, -(-size // limit))
    while size % p == 0 or any(p % d == 0 for d in range(2, int(p ** 0.5) + 1)):
        p += 1
    return p


def histogram_quantile(hist: np.ndarray, start, width, q: float, data_min=None, data_max=None) -> np.ndarray:
    """The ``q`` quantile (0..1) of each row of ``hist`` (C, nb), as ``np.quantile`` (linear) would give.

    numpy interpolates between the order statistics of ranks floor(r) and
    floor(r) + 1, r = q * (N - 1).  Each of them is estimated inside the bin
    that holds it (the counts of a bin spread evenly over it), so it is less
    than one bin width from the true value, and so is their interpolation.
    With ``data_min``/``data_max`` (the exact extremes per row) the ranks
    0 and N - 1 are exact and every estimate stays within them.  Rows with
    no counts give ``start`` (or ``data_min``).
    """
    hist = np.asarray(hist)
    rows, nb = hist.shape
    cum = np.cumsum(hist, axis=1)
    last = np.maximum(cum[:, -1] - 1, 0)
    rank = q * last.astype(np.float64)
    k0 = np.minimum(np.floor(rank).astype(np.int64), last)
    k1 = np.minimum(k0 + 1, last)
    start = np.asarray(start, np.float64)
    width = np.asarray(width, np.float64)
    idx = np.arange(rows)

    def position(k):
        b = np.minimum((cum <= k[:, None]).sum(axis=1), nb - 1)   # first bin whose cumulative count exceeds k
        before = np.where(b > 0, cum[idx, np.maximum(b - 1, 0)], 0)
        count = np.maximum(hist[idx, b], 1)
        value = start + (b + (k - before + 0.5) / count) * width
        if data_min is not None:
            value = np.where(k == 0, data_min, np.maximum(value, data_min))
        if data_max is not None:
            value = np.where(k == last, data_max, np.minimum(value, data_max))
        return value

    v0, v1 = position(k0), position(k1)
    return v0 + (rank - k0) * (v1 - v0)


class HistogramObserver(Observer):
    """Base of the histogram observers: signed power-of-2-range histograms per channel."""

    algorithm = ""

    def __init__(self, config, bins: int = 2048):
        bins = int(bins)
        if bins < 2 or bins & (bins - 1) or bins > 1 << 20:
            raise QuantizationPolicyError(f"histogram bins must be a power of two in [2, 2^20], got {bins}")
        self.bins = bins
        self._log2bins = bins.bit_length() - 1
        self._hist: np.ndarray | None = None   # int64 (C, 2*bins)
        self._exp: np.ndarray | None = None    # int64 (C,): range R = 2^exp per channel
        super().__init__(config)

    def _allocate(self, channels: int) -> None:
        self._hist = np.zeros((channels, 2 * self.bins), np.int64)
        self._exp = np.full(channels, E_MIN, np.int64)

    def _state_arrays(self) -> list[np.ndarray]:
        return [self._hist, self._exp]

    # ----------------------------------------------------------- binning --
    def _observe(self, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        need = _range_exponent(np.maximum(-lo, hi))
        grow = need > self._exp
        if grow.any():
            self._grow(self._hist, self._exp, np.maximum(need, self._exp))
        self._bin(x3)

    def _grow(self, hist: np.ndarray, exp: np.ndarray, new_exp: np.ndarray) -> None:
        """Re-bin ``hist`` rows (in place) from ranges 2^exp to 2^new_exp (>= exp); update ``exp``."""
        bins = self.bins
        delta = new_exp - exp
        for d in np.unique(delta[delta > 0]):
            rows = np.flatnonzero(delta == d)
            factor = 1 << int(min(d, self._log2bins))
            merged = hist[rows].reshape(len(rows), 2 * bins // factor, factor).sum(axis=2)
            hist[rows] = 0
            hist[rows, bins - bins // factor: bins + bins // factor] = merged
        exp[:] = new_exp

    def _bin(self, x3: np.ndarray) -> None:
        """Add ``x3``'s (pre, C, post) values to the counts (a large per-tensor batch: :meth:`_sampled_counts`)."""
        channels = x3.shape[1]
        stride = sample_stride(x3.size) if channels == 1 else 1
        counts = self._counts(x3) if stride == 1 else self._sampled_counts(x3.reshape(-1), stride)
        self._hist += counts.reshape(channels, 2 * self.bins)

    def _sampled_counts(self, flat: np.ndarray, stride: int) -> np.ndarray:
        """Counts of a large per-tensor batch: every ``stride``-th value binned, each count standing for
        ``stride`` values, except the tail - the magnitude bins holding the largest 1/TAIL_SHARE of the sample -,
        where every value of the batch is binned: the rare large values a clipping range is chosen by are
        counted, not estimated.  The tail starts on a bin edge m * w, so a value is in it exactly when its bin
        is: x >= m * w or x < -m * w."""
        bins = self.bins
        counts = self._counts(flat[::stride].reshape(1, 1, -1))
        magnitude = counts[bins:] + counts[bins - 1::-1]
        at_or_above = np.cumsum(magnitude[::-1])[::-1]            # sampled values in magnitude bins >= m
        small = at_or_above <= -(-at_or_above[0] // TAIL_SHARE)
        first = int(np.argmax(small)) if small.any() else bins
        if first == 0:                                            # the sample is all tail: bin every value
            return self._counts(flat.reshape(1, 1, -1))
        counts[bins + first:] = 0
        counts[:bins - first] = 0
        counts *= stride
        if first < bins:
            edge = flat.dtype.type(np.ldexp(float(first), int(self._exp[0]) - self._log2bins))   # m * w, exact
            starts = range(0, flat.size, _CHUNK)
            tail = [None] * len(starts)

            def gather(index: int, _) -> None:   # (chunk by chunk on the kernel threads; in order)
                chunk = flat[starts[index]:starts[index] + _CHUNK]
                tail[index] = chunk[(chunk >= edge) | (chunk < -edge)]
            parallel_items(gather, len(starts))
            tail = np.concatenate(tail)
            if tail.size:
                counts += self._counts(tail.reshape(1, 1, -1))
        return counts

    def _counts(self, x3: np.ndarray) -> np.ndarray:
        """Counts (C * 2 * bins) of ``x3``'s (pre, C, post) values: chunks of about _CHUNK values (one channel's
        slice, or whole channels' planes) binned on the kernel threads, each thread counting into its own
        array; integer sums, so the counts do not depend on the thread count."""
        pre, channels, post = x3.shape
        bins = self.bins
        scale = np.ldexp(1.0, self._log2bins - self._exp).astype(x3.dtype)  # bins / R, exact powers of 2
        nb = 2 * bins
        if channels == 1:
            flat = x3.reshape(-1)
            step = max(1, min(flat.size, _CHUNK))
            chunks = [(flat[start:start + step], scale[0], bins) for start in range(0, flat.size, step)]
        else:
            target = max(_CHUNK, channels * nb)
            if channels * post <= target:
                bp, bq = max(1, target // (channels * post)), post
            else:
                bp, bq = 1, max(1, target // channels)
            factor = scale.reshape(1, channels, 1)
            offset = (np.arange(channels, dtype=np.intp) * nb + bins).reshape(1, channels, 1)
            chunks = [(x3[p0:p0 + bp, :, q0:q0 + bq], factor, offset)
                      for p0 in range(0, pre, bp) for q0 in range(0, post, bq)]
        largest = max(values.size for values, _, _ in chunks)
        totals: list[np.ndarray] = []

        def count(index: int, work: tuple) -> None:
            counts, floats, indices = work
            values, factor, offset = chunks[index]
            y = floats[:values.size].reshape(values.shape)
            np.multiply(values, factor, out=y)
            np.floor(y, out=y)
            index_array = indices[:values.size].reshape(values.shape)
            np.copyto(index_array, y, casting="unsafe")
            index_array += offset                         # exact: integers below 2^24
            counts += np.bincount(index_array.reshape(-1), minlength=counts.size)

        def state() -> tuple:
            counts = np.zeros(channels * nb, np.int64)
            totals.append(counts)
            return counts, np.empty(largest, x3.dtype), np.empty(largest, np.intp)
        parallel_items(count, len(chunks), state)
        return np.sum(totals, axis=0)

    # ----------------------------------------------------------- merging --
    def _check_mergeable(self, other: "HistogramObserver") -> None:
        if other.bins != self.bins:
            raise QuantizationPolicyError(f"{self._who()}: cannot merge histograms of {other.bins} and "
                                          f"{self.bins} bins")

    def _merge(self, other: "HistogramObserver") -> None:
        new_exp = np.maximum(self._exp, other._exp)
        self._grow(self._hist, self._exp, new_exp)
        theirs, their_exp = other._hist.copy(), other._exp.copy()
        self._grow(theirs, their_exp, new_exp)
        self._hist += theirs

    # ------------------------------------------------------------- views --
    @property
    def bin_width(self) -> np.ndarray:
        """Bin width R / bins per channel (float64 (C,))."""
        return np.ldexp(1.0, self._exp - self._log2bins)

    @property
    def range_max(self) -> np.ndarray:
        """Histogram range R = 2^e per channel (float64 (C,)): bins cover [-R, R)."""
        return np.ldexp(1.0, self._exp)

    def signed_histogram(self) -> np.ndarray:
        """Counts (C, 2*bins) over [-R, R) (a copy)."""
        return self._hist.copy()

    def magnitude_histogram(self) -> np.ndarray:
        """Counts of |x| (C, bins) over [0, R): the negative half folded onto the positive one."""
        bins = self.bins
        return self._hist[:, bins:] + self._hist[:, bins - 1::-1]

    def absmax(self) -> np.ndarray:
        """Observed max(|min|, |max|) per channel (float64 (C,))."""
        return np.maximum(-self._min, self._max)

    def _levels(self, one_sided: np.ndarray) -> np.ndarray:
        """Quantization levels on one side of zero per channel, from the config's integer range.

        Two-sided data, or any symmetric grid: (qmax - qmin + 1) // 2 (128 for
        int8, 2^(bits-1)).  One-sided data (min >= 0 or max <= 0) on an
        asymmetric grid: the whole grid spans [0, t], so qmax - qmin + 1
        (256 for uint8).
        """
        cfg = self.config
        full = int(cfg.quant_max) - int(cfg.quant_min) + 1
        if cfg.policy.symmetric:
            return np.full(one_sided.shape, full // 2, np.int64)
        return np.where(one_sided, full, full // 2).astype(np.int64)


class PercentileObserver(HistogramObserver):
    """Range at a percentile of the values (default 99.99), from fixed-size histograms.

    Symmetric configs: threshold t = the ``percentile`` of |x|, range
    [max(min, -t), min(max, t)].  Asymmetric: [the (100 - p) percentile,
    the p percentile] of x.  Results are within one bin width of
    ``np.percentile`` and never outside the observed [min, max].
    """

    algorithm = "percentile"

    def __init__(self, config, percentile: float = 99.99, bins: int = 2048):
        percentile = float(percentile)
        if not 50.0 <= percentile <= 100.0:
            raise QuantizationPolicyError(f"percentile must be in [50, 100], got {percentile}")
        self.percentile = percentile
        super().__init__(config, bins)

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        q = self.percentile / 100.0
        width = self.bin_width
        if self.config.policy.symmetric:
            t = histogram_quantile(self.magnitude_histogram(), 0.0, width, q, data_max=self.absmax())
            return self._clip_symmetric(t)
        start = -self.range_max
        lo = histogram_quantile(self._hist, start, width, 1.0 - q, self._min, self._max)
        hi = histogram_quantile(self._hist, start, width, q, self._min, self._max)
        return lo, np.maximum(hi, lo)
