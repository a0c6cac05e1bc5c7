"""Error measures between a reference tensor ``a`` and a measured one ``b`` (DESIGN.md §8).

Definitions (``a`` the reference: float graph, FP32 model; ``b`` the quantized
or later stage), sums over every element:

* ``snr`` — signal-to-quantization-noise ratio in dB,
  ``10 * log10(sum(a**2) / sum((a - b)**2))``; higher is better, +inf when
  ``a == b``.  This is the SQNR TPU-MLIR reports, except that TPU-MLIR's
  ``sqnr_similarity`` first drops the positions where ``b == 0`` and subtracts
  each tensor's mean (a variance ratio); ours is the plain power ratio, the
  one PPQ's SNR inverts (PPQ prints ``sum((a-b)**2) / sum(a**2)`` unscaled:
  ``ours = -10 * log10(ppq)``).
* ``cosine`` — ``sum(a*b) / sqrt(sum(a**2) * sum(b**2))``; 1 is best.  Two
  all-zero tensors have cosine 1, one all-zero tensor 0.
* ``mse`` — ``mean((a - b)**2)``; 0 is best.
* ``euclidean`` — TPU-MLIR's Euclidean similarity,
  ``1 - ||a - b|| / ||(a + b) / 2||``; 1 is best (it goes negative when the
  tensors disagree badly).

:class:`ErrorStats` accumulates the four sums streaming (in float64), batch by
batch, so a measure over many batches is the measure of their concatenation
and no activation is kept.
"""

from __future__ import annotations

import math

import numpy as np

#: method name -> True when a larger value is better.
METHODS = {"snr": True, "cosine": True, "mse": False, "noise_ratio": False}


def check_method(method: str) -> str:
    """The method's canonical name ('sqnr' is an alias of 'snr'); ValueError listing the valid ones."""
    name = str(method).strip().lower()
    name = "snr" if name == "sqnr" else name
    if name not in METHODS:
        raise ValueError(f"unknown error method {method!r}; choose one of {sorted(METHODS)} ('sqnr' = 'snr')")
    return name


#: Elements per chunk of :meth:`ErrorStats.update` (256 KiB of float32: the operands stay in L2).
CHUNK = 1 << 16


class ErrorStats:
    """Running sums of a reference ``a`` and a measured ``b``: sum a², sum b², sum ab, sum (a-b)², count."""

    __slots__ = ("aa", "bb", "ab", "dd", "count")

    def __init__(self):
        self.aa = self.bb = self.ab = self.dd = 0.0
        self.count = 0

    def update(self, a, b) -> "ErrorStats":
        """Add one pair of same-shaped arrays.

        float32 pairs are summed in chunks of :data:`CHUNK` elements (BLAS dot products on
        operands that stay in cache, each chunk's sum added in float64: relative error about
        1e-7, 30x faster than converting whole activations to float64); anything else in float64.
        """
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"cannot compare arrays of shapes {list(a.shape)} and {list(b.shape)}")
        dtype = np.float32 if a.dtype == np.float32 and b.dtype == np.float32 else np.float64
        a = np.ascontiguousarray(a, dtype=dtype).ravel()
        b = np.ascontiguousarray(b, dtype=dtype).ravel()
        buffer = np.empty(min(CHUNK, a.size), dtype=dtype)
        aa = bb = ab = dd = 0.0
        for start in range(0, a.size, CHUNK):
            x, y = a[start:start + CHUNK], b[start:start + CHUNK]
            d = np.subtract(x, y, out=buffer[:x.size])
            aa += float(np.dot(x, x))
            bb += float(np.dot(y, y))
            ab += float(np.dot(x, y))
            dd += float(np.dot(d, d))
        self.aa += aa
        self.bb += bb
        self.ab += ab
        self.dd += dd
        self.count += a.size
        return self

    def merge(self, other: "ErrorStats") -> "ErrorStats":
        for name in ("aa", "bb", "ab", "dd", "count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    # ------------------------------------------------------------ measures
    def snr(self) -> float:
        """10 log10(signal power / noise power) in dB (+inf without noise)."""
        if self.dd == 0.0:
            return math.inf
        if self.aa == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.aa / self.dd)

    def noise_ratio(self) -> float:
        """Noise power / signal power, sum (a-b)² / sum a² (PPQ's 'snr': 0.1 = 10 % noise); 10^(-snr/10)."""
        if self.dd == 0.0:
            return 0.0
        return math.inf if self.aa == 0.0 else self.dd / self.aa

    def cosine(self) -> float:
        if self.aa == 0.0 and self.bb == 0.0:
            return 1.0
        if self.aa == 0.0 or self.bb == 0.0:
            return 0.0
        # float32 chunk sums are good to about 1e-7: keep the Cauchy-Schwarz bound |cos| <= 1 exactly
        return max(-1.0, min(1.0, self.ab / math.sqrt(self.aa * self.bb)))

    def mse(self) -> float:
        return self.dd / self.count if self.count else 0.0

    def euclidean(self) -> float:
        """TPU-MLIR's 1 - ||a-b|| / ||(a+b)/2||, with ||a+b||² = aa + bb + 2ab."""
        half = 0.5 * math.sqrt(max(self.aa + self.bb + 2.0 * self.ab, 0.0))
        if half == 0.0:
            return 1.0 if self.dd == 0.0 else 0.0
        return 1.0 - math.sqrt(self.dd) / half

    def value(self, method: str) -> float:
        return getattr(self, check_method(method))()

    def as_dict(self) -> dict:
        """Every measure: {'snr', 'cosine', 'mse', 'euclidean', 'noise_ratio', 'elements'}."""
        return {"snr": self.snr(), "cosine": self.cosine(), "mse": self.mse(), "euclidean": self.euclidean(),
                "noise_ratio": self.noise_ratio(), "elements": self.count}


def snr(a, b) -> float:
    """SNR (= SQNR) of ``b`` against the reference ``a``, in dB."""
    return ErrorStats().update(a, b).snr()


sqnr = snr


def cosine_similarity(a, b) -> float:
    return ErrorStats().update(a, b).cosine()


def mse(a, b) -> float:
    return ErrorStats().update(a, b).mse()


def euclidean_similarity(a, b) -> float:
    """TPU-MLIR's Euclidean similarity 1 - ||a-b|| / ||(a+b)/2||."""
    return ErrorStats().update(a, b).euclidean()


def compare(a, b) -> dict:
    """All measures of ``b`` against ``a`` in one dict."""
    return ErrorStats().update(a, b).as_dict()


def worse_first_key(method: str):
    """Sort key putting the worst value first for ``method`` (NaN last)."""
    larger_is_better = METHODS[check_method(method)]

    def key(value: float):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return (1, 0.0)
        return (0, value if larger_is_better else -value)
    return key
