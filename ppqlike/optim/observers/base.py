"""The observer interface and what every observer shares (DESIGN.md §5 step 4).

An observer watches one tensor during calibration.  It is fed the tensor's
values one batch at a time (:meth:`Observer.observe`), keeps a fixed-size
summary of them (running min/max, histograms; never the values), chooses a
range (:meth:`Observer.thresholds`) and writes the scale/offset of that range
into its config (:meth:`Observer.render`).  Observers of the same kind fed
different shards of the data can be folded together (:meth:`Observer.merge`).

Per-channel configs keep one summary per channel along ``config.channel_axis``;
the number of channels is fixed by the first non-empty batch.  Every batch is
checked: NaN or Inf raises :class:`CalibrationDataError` naming the tensor,
before any state changes.  Empty batches are ignored.
"""

from __future__ import annotations

import numpy as np

from ppqlike.core import numerics
from ppqlike.core.errors import CalibrationDataError, QuantizationPolicyError

__all__ = ["Observer", "as_float_array"]


def as_float_array(value) -> np.ndarray:
    """``value`` as a float32 or float64 array (float16 -> float32, ints/bools -> float64)."""
    x = np.asarray(value)
    if x.dtype == np.float32 or x.dtype == np.float64:
        return x
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype.kind in "biu":
        return x.astype(np.float64)
    raise CalibrationDataError(f"cannot observe values of dtype {x.dtype}")


class Observer:
    """Base class: batch checks, running min/max, per-channel layout, render().

    Subclasses set ``algorithm`` and override ``_allocate`` (create the
    fixed-size state for ``channels`` channels), ``_observe`` (fold one
    checked batch in), ``_merge`` (fold another observer's state in),
    ``_thresholds`` (the chosen range) and ``_state_arrays``.
    """

    algorithm: str = ""

    def __init__(self, config):
        self.config = config
        policy = config.policy
        self.per_channel: bool = bool(policy.per_channel)
        self.channel_axis: int | None = config.channel_axis if self.per_channel else None
        if self.per_channel and self.channel_axis is None:
            raise QuantizationPolicyError(f"{self._who()}: a per-channel observer needs a channel_axis")
        self._channels: int | None = None
        self._min: np.ndarray | None = None   # float64 (C,): running minimum per channel
        self._max: np.ndarray | None = None   # float64 (C,): running maximum per channel
        self.num_values = 0                   # values observed per channel
        self.num_batches = 0                  # non-empty batches observed (merges add up)
        self._version = 0                     # bumped whenever the state changes (keys the caches)
        self._cache = None                    # (key, lo, hi) of the last thresholds()
        if not self.per_channel:
            self._setup(1)

    # ------------------------------------------------------------ helpers --
    def _who(self) -> str:
        name = getattr(self.config, "name", "")
        return f"tensor {name!r}" if name else "unnamed tensor"

    def _setup(self, channels: int) -> None:
        self._channels = channels
        self._min = np.full(channels, np.inf)
        self._max = np.full(channels, -np.inf)
        self._allocate(channels)

    def _view(self, value) -> np.ndarray | None:
        """The batch as a 3-D array (pre, channels, post); None when it is empty."""
        x = as_float_array(value)
        if not self.per_channel:   # in memory order: a channels-last tensor handed over as NCHW is not copied
            return None if x.size == 0 else np.ravel(x, order="K").reshape(1, 1, -1)
        if x.ndim == 0:
            raise CalibrationDataError(f"{self._who()}: per-channel observer got a scalar")
        axis = self.channel_axis + x.ndim if self.channel_axis < 0 else self.channel_axis
        if not 0 <= axis < x.ndim:
            raise CalibrationDataError(f"{self._who()}: channel_axis {self.channel_axis} is out of range "
                                       f"for a batch of shape {x.shape}")
        channels = x.shape[axis]
        if self._channels is not None and channels != self._channels:
            raise CalibrationDataError(f"{self._who()}: batch of shape {x.shape} has {channels} channels on "
                                       f"axis {self.channel_axis}, earlier batches had {self._channels}")
        if x.size == 0:
            return None
        pre = int(np.prod(x.shape[:axis], dtype=np.int64))
        return x.reshape(pre, channels, -1)

    def _batch_minmax(self, x3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (min, max) of a batch as float64; NaN/Inf raise (NaN propagates through min/max)."""
        if x3.shape[1] == 1:
            flat = x3.reshape(-1)
            lo, hi = np.array([flat.min()], np.float64), np.array([flat.max()], np.float64)
        elif x3.shape[0] == 1:
            lo, hi = x3[0].min(axis=1).astype(np.float64), x3[0].max(axis=1).astype(np.float64)
        else:
            lo, hi = x3.min(axis=(0, 2)).astype(np.float64), x3.max(axis=(0, 2)).astype(np.float64)
        return self._checked_extremes(lo, hi)

    def _checked_extremes(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``lo``, ``hi`` (float64 per channel) when finite; NaN/Inf raise, naming the channels."""
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            bad = np.flatnonzero(~(np.isfinite(lo) & np.isfinite(hi)))
            where = f" (channels {bad[:8].tolist()})" if self.per_channel else ""
            raise CalibrationDataError(f"{self._who()}: a calibration batch holds NaN or Inf values{where}; "
                                       "clean the data or find the op that overflows")
        return lo, hi

    def _cache_key(self) -> tuple:
        """What derived results depend on: the state's version and the config's grid."""
        cfg = self.config
        return (self._version, cfg.policy, int(cfg.quant_min), int(cfg.quant_max))

    def _thresholds_key(self) -> tuple:
        return self._cache_key()

    def _require_data(self) -> None:
        if self.num_values == 0:
            raise CalibrationDataError(f"{self._who()}: the {self.algorithm} observer has seen no values "
                                       "(empty calibration data?)")

    # ------------------------------------------------------------ the API --
    def observe(self, value: np.ndarray) -> None:
        """Fold one batch of the tensor's values in (any shape; channels along ``channel_axis``)."""
        x3 = self._view(value)
        if x3 is None:
            return
        self.observe_viewed(value, x3, *self._batch_minmax(x3))

    def observe_viewed(self, value, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Fold in a batch :meth:`observe` has viewed as [pre, channels, post] (``x3``), with its per-channel
        extremes: the work :meth:`observe` shares among observers of one tensor (``choice``)."""
        if self._channels is None:
            self._setup(x3.shape[1])
        self._observe(x3, lo, hi)
        np.minimum(self._min, lo, out=self._min)
        np.maximum(self._max, hi, out=self._max)
        self.num_values += x3.shape[0] * x3.shape[2]
        self.num_batches += 1
        self._version += 1

    def merge(self, other: "Observer") -> None:
        """Fold ``other`` (same kind and settings, same channel count) into this observer."""
        if type(other) is not type(self):
            raise QuantizationPolicyError(f"{self._who()}: cannot merge a {type(other).__name__} into a "
                                          f"{type(self).__name__}")
        if other.per_channel != self.per_channel:
            raise QuantizationPolicyError(f"{self._who()}: cannot merge per-channel and per-tensor observers")
        self._check_mergeable(other)
        if other.num_values == 0:
            return
        if self._channels is None:
            self._setup(other._channels)
        elif other._channels != self._channels:
            raise CalibrationDataError(f"{self._who()}: cannot merge an observer of {other._channels} channels "
                                       f"into one of {self._channels}")
        self._merge(other)
        np.minimum(self._min, other._min, out=self._min)
        np.maximum(self._max, other._max, out=self._max)
        self.num_values += other.num_values
        self.num_batches += other.num_batches
        self._version += 1

    def thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        """The chosen (min, max) range as float64: 0-d arrays per tensor, 1-D per channel."""
        self._require_data()
        key = self._thresholds_key()
        if self._cache is None or self._cache[0] != key:
            lo, hi = self._thresholds()
            self._cache = (key, np.asarray(lo, np.float64), np.asarray(hi, np.float64))
        _, lo, hi = self._cache
        if not self.per_channel:
            return lo.reshape(()).copy(), hi.reshape(()).copy()
        return lo.copy(), hi.copy()

    def render(self) -> None:
        """Write the scale/offset of :meth:`thresholds` into the config (its state is left alone)."""
        lo, hi = self.thresholds()
        cfg = self.config
        policy = cfg.policy
        try:
            scale, offset = numerics.minmax_to_scale_offset(
                lo, hi, cfg.quant_min, cfg.quant_max, symmetric=policy.symmetric,
                power_of_2=policy.power_of_2, rounding=cfg.rounding)
        except CalibrationDataError as exc:
            raise CalibrationDataError(f"{self._who()}: {exc}") from None
        cfg.set_scale_offset(scale, offset)

    @property
    def state_nbytes(self) -> int:
        """Bytes of numpy state held; fixed once the channel count is known."""
        arrays = [self._min, self._max, *self._state_arrays()]
        return int(sum(a.nbytes for a in arrays if a is not None))

    @property
    def channels(self) -> int | None:
        """Number of channels (1 per tensor; None until a per-channel observer sees data)."""
        return self._channels

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self._who()} batches={self.num_batches} "
                f"channels={self._channels} state={self.state_nbytes}B>")

    # ------------------------------------------------------ for subclasses --
    def _allocate(self, channels: int) -> None:
        pass

    def _observe(self, x3: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        pass

    def _check_mergeable(self, other: "Observer") -> None:
        pass

    def _merge(self, other: "Observer") -> None:
        pass

    def _thresholds(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _state_arrays(self) -> list[np.ndarray]:
        return []

    # ---------------------------------------------------- shared utilities --
    def _clip_symmetric(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Range of a magnitude threshold ``t`` (C,): [max(min, -t), min(max, t)]."""
        t = np.asarray(t, np.float64)
        return np.maximum(self._min, -t), np.minimum(self._max, t)
