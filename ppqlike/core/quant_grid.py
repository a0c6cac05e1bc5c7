"""Base of TensorQuantizationConfig: the integer grid and the config's own scale/offset.

The grid is policy, rounding, num_of_bits, [quant_min, quant_max] and
channel_axis.  Subclasses decide, through ``_grid()``, whose grid applies (a
governed config may use its master's) and, through ``_grid_owned()``, whether
it may be changed.  Not public: use :mod:`ppqlike.core.quant`.
"""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import QuantizationPolicyError, QuantizationStateError
from ppqlike.core.float_formats import FloatFormat, float_format as parse_float_format
from ppqlike.core.quant_policy import QuantizationPolicy
from ppqlike.core.rounding import RoundingPolicy

__all__ = ["QuantGridBase", "default_quant_range"]


def default_quant_range(num_of_bits: int, signed: bool, narrow: bool = False) -> tuple[int, int]:
    """[-2^(b-1), 2^(b-1)-1] (narrow: lower bound +1) when signed, else [0, 2^b-1]."""
    if signed:
        return -(1 << (num_of_bits - 1)) + int(narrow), (1 << (num_of_bits - 1)) - 1
    return 0, (1 << num_of_bits) - 1


def as_policy(policy) -> QuantizationPolicy:
    """A QuantizationPolicy from a policy or a flag combination."""
    if isinstance(policy, QuantizationPolicy):
        return policy
    return QuantizationPolicy(policy)


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` made read-only (stored scales/offsets cannot be edited in place)."""
    a.flags.writeable = False
    return a


class QuantGridBase:
    """Grid fields and own scale/offset storage with validation; see TensorQuantizationConfig."""

    def _init_grid(self, name, policy, rounding, num_of_bits, quant_min, quant_max, channel_axis,
                   float_format=None) -> None:
        self.name = name
        self._policy = as_policy(policy)
        self._rounding = RoundingPolicy.parse(rounding)
        self._float_format = parse_float_format(float_format)
        if self._float_format is not None:   # a float grid: its width, and [-max, max] as the observers' range
            num_of_bits = self._float_format.num_of_bits
            if quant_min is None:
                quant_min, quant_max = self._float_format.quant_range
        self._bits = int(num_of_bits)
        if not 2 <= self._bits <= 32:
            raise QuantizationPolicyError(f"{self._who()}: num_of_bits must be in [2, 32], got {num_of_bits}")
        if (quant_min is None) != (quant_max is None):
            raise QuantizationStateError(f"{self._who()}: give both quant_min and quant_max, or neither")
        if quant_min is None:
            quant_min, quant_max = default_quant_range(self._bits, signed=self._policy.symmetric)
        self._qmin, self._qmax = self._check_range(self._bits, quant_min, quant_max)
        self._channel_axis = None if channel_axis is None else int(channel_axis)
        if self._policy.per_channel and self._channel_axis is None:
            raise QuantizationPolicyError(f"{self._who()}: a PER_CHANNEL policy needs a channel_axis")
        self._scale: np.ndarray | None = None
        self._offset: np.ndarray | None = None

    def _who(self) -> str:
        return f"tensor {self.name!r}" if self.name else "unnamed tensor config"

    def _grid(self) -> "QuantGridBase":
        """The config whose grid applies (overridden)."""
        return self

    def _grid_owned(self, what: str) -> None:
        """Raise unless this config's own grid applies (overridden)."""

    def _check_range(self, bits: int, qmin, qmax) -> tuple[int, int]:
        qmin, qmax = int(qmin), int(qmax)
        wide = getattr(self, "_float_format", None) is not None   # a float grid's range is [-max, max]
        if qmin >= qmax or (qmax - qmin > (1 << bits) - 1 and not wide):
            raise QuantizationStateError(f"{self._who()}: range [{qmin}, {qmax}] does not fit {bits} bits")
        return qmin, qmax

    @property
    def baked_value(self) -> np.ndarray | None:
        """BAKED / PASSIVE_BAKED parameters: the value quantized once (as float), used instead of the FP32
        original, which stays untouched in Variable.value (DEQUANTIZED reads that again).  Stored as a
        read-only array of its own: a kernel may keep what it derives from it (``executor.ops._prepared``)."""
        return self._baked_value

    @baked_value.setter
    def baked_value(self, value) -> None:
        self._baked_value = None if value is None else readonly(np.array(value))

    def _store(self, scale, offset) -> None:
        """Validate and store own scale/offset (either may be None to keep the current one)."""
        policy = self._policy
        if scale is None:
            s = self._scale
        else:
            s = np.asarray(scale, dtype=np.float32)
            if s.ndim > 1 or not np.all(np.isfinite(s) & (s > 0)):
                raise QuantizationStateError(f"{self._who()}: scale must be finite, > 0 (in float32), "
                                             f"scalar or 1-D, got {scale!r}")
            if not policy.per_channel:
                if s.size != 1:
                    raise QuantizationStateError(f"{self._who()}: per-tensor policy but {s.size} scales")
                s = s.reshape(())
            elif s.ndim == 0:
                s = s.reshape((1,))
        z = self._offset if offset is None else np.asarray(offset)
        if z is None and s is not None:
            z = np.zeros((), dtype=np.int64)
        if z is not None:
            if not np.issubdtype(z.dtype, np.integer) and not np.all(z == np.round(z)):
                raise QuantizationStateError(f"{self._who()}: offset must be integer-valued, got {offset!r}")
            z = z.astype(np.int64)
            if np.any((z < self._qmin) | (z > self._qmax)):
                raise QuantizationStateError(f"{self._who()}: offset {offset!r} outside [{self._qmin}, {self._qmax}]")
            if s is not None:
                if z.size not in (1, s.size) or z.ndim > 1:
                    raise QuantizationStateError(f"{self._who()}: {z.size} offsets for {s.size} scales")
                z = np.broadcast_to(z.reshape(-1)[0] if z.size == 1 else z, s.shape)
        self._scale = None if s is None else readonly(s.copy())
        self._offset = None if z is None else readonly(np.array(z, dtype=np.int64))

    # -------------------------------------------------------------- the grid
    @property
    def policy(self) -> QuantizationPolicy:
        """Quantization policy (the master's when OVERLAPPED/SLAVE)."""
        return self._grid()._policy

    @policy.setter
    def policy(self, value) -> None:
        value = as_policy(value)
        self._grid_owned("policy")
        if value.per_channel and self._channel_axis is None:
            raise QuantizationPolicyError(f"{self._who()}: a PER_CHANNEL policy needs a channel_axis")
        if self._scale is not None and value.per_channel != self._policy.per_channel:
            raise QuantizationStateError(f"{self._who()}: cannot change granularity while it holds a scale")
        self._policy = value

    @property
    def rounding(self) -> RoundingPolicy:
        """Rounding policy (always the config's own)."""
        return self._rounding

    @rounding.setter
    def rounding(self, value) -> None:
        self._rounding = RoundingPolicy.parse(value)

    @property
    def float_format(self) -> FloatFormat | None:
        """The floating-point format of a float grid (FP8 E4M3FN/E5M2, FP16, BF16; the master's when
        OVERLAPPED/SLAVE), or None for an integer grid.  A float grid quantizes q = cast(x / S), r = q * S
        (``ppqlike.core.float_formats``), offset 0, rounding half to even."""
        return self._grid()._float_format

    @float_format.setter
    def float_format(self, value) -> None:
        self._grid_owned("float_format")
        fmt = parse_float_format(value)
        if fmt is None:
            self._float_format = None
            self._bits, (self._qmin, self._qmax) = 8, default_quant_range(8, self._policy.symmetric)
            return
        self._float_format, self._bits = fmt, fmt.num_of_bits
        self._qmin, self._qmax = fmt.quant_range

    @property
    def num_of_bits(self) -> int:
        """Bit width (the master's when OVERLAPPED/SLAVE)."""
        return self._grid()._bits

    @num_of_bits.setter
    def num_of_bits(self, bits: int) -> None:
        """Change the width keeping the kind of range: signed, narrow signed or unsigned.

        The own scale is kept (recalibrate); an own offset outside the new range raises.
        """
        self._grid_owned("num_of_bits")
        if self._float_format is not None:
            raise QuantizationPolicyError(f"{self._who()}: a {self._float_format.name} grid has "
                                          f"{self._float_format.num_of_bits} bits; set float_format instead")
        bits = int(bits)
        if not 2 <= bits <= 32:
            raise QuantizationPolicyError(f"{self._who()}: num_of_bits must be in [2, 32], got {bits}")
        signed, narrow = self._qmin < 0, self._qmin == -self._qmax
        qmin, qmax = default_quant_range(bits, signed, narrow)
        self._check_offset(qmin, qmax)
        self._qmin, self._qmax, self._bits = qmin, qmax, bits

    @property
    def quant_min(self) -> int:
        """Lowest integer (the master's when OVERLAPPED/SLAVE)."""
        return self._grid()._qmin

    @property
    def quant_max(self) -> int:
        """Highest integer (the master's when OVERLAPPED/SLAVE)."""
        return self._grid()._qmax

    def set_range(self, quant_min: int, quant_max: int) -> None:
        """Set [quant_min, quant_max]; it must fit num_of_bits."""
        self._grid_owned("the integer range")
        qmin, qmax = self._check_range(self._bits, quant_min, quant_max)
        self._check_offset(qmin, qmax)
        self._qmin, self._qmax = qmin, qmax

    def _check_offset(self, qmin: int, qmax: int) -> None:
        """The own offset must stay inside a new range (the scale is the caller's to redo)."""
        if self._offset is not None and np.any((self._offset < qmin) | (self._offset > qmax)):
            raise QuantizationStateError(
                f"{self._who()}: its offset {self._offset.tolist()} falls outside the new range [{qmin}, {qmax}]")

    @property
    def channel_axis(self) -> int | None:
        """Channel axis (the master's when OVERLAPPED/SLAVE)."""
        return self._grid()._channel_axis

    @channel_axis.setter
    def channel_axis(self, axis: int | None) -> None:
        self._grid_owned("channel_axis")
        if axis is None and self._policy.per_channel:
            raise QuantizationPolicyError(f"{self._who()}: a PER_CHANNEL policy needs a channel_axis")
        self._channel_axis = None if axis is None else int(axis)
