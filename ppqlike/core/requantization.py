"""Integer requantization (TPU style, DESIGN.md §2): what the integer-requantization pass hands to the
simulation and the exporters (``IntegerRequantization``), and the integer formula itself,
y = clamp(round(acc * M0 / 2^rshift) + Z, qmin, qmax) in exact int64 arithmetic (``requantize``; also
re-exported by ``numerics``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ppqlike.core.errors import QuantizationStateError
from ppqlike.core.quantization_parameters import along_channel_axis, check_range, integer_dtype, offset_array
from ppqlike.core.rounding import RoundingPolicy

#: ``TensorQuantizationConfig.runtime_kernel`` of ops simulated as onnxruntime's CPU integer kernels
RUNTIME_KERNEL_ONNXRUNTIME = "onnxruntime"


@dataclass(frozen=True)
class IntegerRequantization:
    """A computing op's output requantized from its int32 accumulator: q_y = (acc * M0) >> rshift + Z_y.

    One (multiplier, right_shift) pair per output channel (one pair per tensor: tuples of length 1);
    ``accumulator_scale`` = S_input * S_weight per channel; ``channel_axis`` is the output's channel axis.
    """

    multiplier: tuple[int, ...]
    right_shift: tuple[int, ...]
    accumulator_scale: tuple[float, ...]
    channel_axis: int
    multiplier_bits: int = 32

    @classmethod
    def from_arrays(cls, multiplier, right_shift, accumulator_scale, channel_axis: int,
                    multiplier_bits: int = 32) -> "IntegerRequantization":
        def ints(values):
            return tuple(int(v) for v in np.atleast_1d(values))
        return cls(ints(multiplier), ints(right_shift),
                   tuple(float(v) for v in np.atleast_1d(np.asarray(accumulator_scale, np.float64))),
                   int(channel_axis), int(multiplier_bits))

    def __hash__(self) -> int:
        """The fields' hash, computed once: the executor's caches key on this every forward."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.multiplier, self.right_shift, self.accumulator_scale, self.channel_axis,
                           self.multiplier_bits))
            object.__setattr__(self, "_hash", cached)
        return cached

    @property
    def per_channel(self) -> bool:
        return len(self.accumulator_scale) > 1

    def ties_possible(self, reach: int) -> bool:
        """Whether t = acc * M0 * 2^-rshift can lie exactly halfway between two integers with |t| < ``reach``
        for some integer accumulator, in some channel.  With M0 = m * 2^v (m odd) and v < rshift, a tie is
        acc = odd * 2^(rshift - 1 - v), the smallest |t| of which is m / 2; so ties in range need
        m < 2 * reach (a multiplier of few significant bits: a power-of-two ratio, say)."""
        return _ties_possible(self.multiplier, self.right_shift, int(reach))

    def to_dict(self) -> dict:
        return {"multiplier": list(self.multiplier), "right_shift": list(self.right_shift),
                "accumulator_scale": list(self.accumulator_scale), "channel_axis": self.channel_axis,
                "multiplier_bits": self.multiplier_bits}

    @classmethod
    def from_dict(cls, data: dict | None) -> "IntegerRequantization | None":
        if data is None:
            return None
        return cls.from_arrays(data["multiplier"], data["right_shift"], data["accumulator_scale"],
                               data["channel_axis"], data.get("multiplier_bits", 32))


@lru_cache(maxsize=256)
def _ties_possible(multipliers: tuple, shifts: tuple, reach: int) -> bool:
    for multiplier, shift in zip(multipliers, shifts):
        if multiplier == 0:
            continue
        twos = (multiplier & -multiplier).bit_length() - 1   # v: the multiplier's factor 2^v
        if twos < shift and (abs(multiplier) >> twos) < 2 * reach:
            return True
    return False


# ------------------------------------------------------------- the integer formula
_MAX_RSHIFT = 62


def scale_to_multiplier_shift(scale, multiplier_bits: int = 32):
    """M ~= M0 / 2^rshift with M0 in [2^(bits-2), 2^(bits-1)) (signed, normalised).

    M0 = rint(m * 2^(bits-1)) where scale = m * 2^e, m in [0.5, 1), and
    rshift = bits - 1 - e; relative error <= 2^-(bits-1).  Example:
    0.1234 with 32 bits -> (2119995857, 34).

    * scale 0 -> (0, 0).
    * scale >= 2^(bits-1) would need a left shift: QuantizationStateError.
    * rshift is capped at 62 (int64 requantize): for scales that tiny M0 is
      rint(scale * 2^62), no longer normalised (and (0, 0) if that is 0).

    Scalars in: Python ints out; arrays in: int64 arrays out.
    """
    bits = int(multiplier_bits)
    if not 2 <= bits <= 32:
        raise QuantizationStateError(f"multiplier_bits must be in [2, 32], got {multiplier_bits}")
    s = np.asarray(scale, dtype=np.float64)
    if not np.all(np.isfinite(s) & (s >= 0)):
        raise QuantizationStateError(f"multiplier scale must be finite and >= 0, got {scale!r}")
    m, e = np.frexp(s)
    m0 = np.rint(np.ldexp(m, bits - 1))
    carry = m0 == 2.0 ** (bits - 1)  # m rounded up to 1.0: renormalise
    m0 = np.where(carry, m0 / 2, m0)
    rshift = (bits - 1) - (e.astype(np.int64) + carry)
    if np.any((rshift < 0) & (s > 0)):
        raise QuantizationStateError(
            f"scale {scale!r} >= 2^{bits - 1} cannot be a {bits}-bit multiplier with a right shift")
    tiny = rshift > _MAX_RSHIFT
    if np.any(tiny):
        m0 = np.where(tiny, np.rint(np.ldexp(s, _MAX_RSHIFT)), m0)
        rshift = np.where(tiny, _MAX_RSHIFT, rshift)
    zero = m0 == 0
    m0 = np.where(zero, 0, m0).astype(np.int64)
    rshift = np.where(zero, 0, rshift).astype(np.int64)
    if np.ndim(scale) == 0:
        return int(m0), int(rshift)
    return m0, rshift


def rounding_right_shift(value, shift, rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN):
    """round(value / 2^shift) under ``rounding`` in exact int64 arithmetic (0 <= shift <= 62)."""
    rounding = RoundingPolicy.parse(rounding)
    p = np.asarray(value, dtype=np.int64)
    s = np.asarray(shift, dtype=np.int64)
    if np.any((s < 0) | (s > _MAX_RSHIFT)):
        raise QuantizationStateError(f"right shift must be in [0, {_MAX_RSHIFT}], got {shift!r}")
    q = p >> s                      # floor(p / 2^s)
    rem = p - (q << s)              # in [0, 2^s)
    half = (np.int64(1) << s) >> 1  # 2^(s-1), 0 when s == 0
    P = RoundingPolicy
    if rounding is P.ROUND_DOWN:
        return q
    if rounding is P.ROUND_UP:
        return q + (rem > 0)
    if rounding is P.ROUND_TO_ZERO:
        return q + ((rem > 0) & (q < 0))
    above = rem > half
    tie = (rem == half) & (rem != 0)
    if rounding is P.ROUND_HALF_UP:
        up = above | tie
    elif rounding is P.ROUND_HALF_DOWN:
        up = above
    elif rounding is P.ROUND_HALF_EVEN:
        up = above | (tie & ((q & 1) == 1))
    elif rounding is P.ROUND_HALF_AWAY_FROM_ZERO:
        up = above | (tie & (q >= 0))
    else:  # ROUND_HALF_TOWARDS_ZERO
        up = above | (tie & (q < 0))
    return q + up


def requantize(acc, multiplier, right_shift, offset, quant_min: int, quant_max: int,
               rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN, channel_axis: int | None = None):
    """y = clamp(round((acc * M0) / 2^rshift) + Z, qmin, qmax) in int64, no floats.

    ``multiplier``/``right_shift``/``offset`` are scalars or 1-D per-channel
    arrays along ``channel_axis``.  |acc| * |M0| must stay below 2^63.
    Returns int32 (int64 if the range needs it).
    """
    qmin, qmax = check_range(quant_min, quant_max)
    acc = np.asarray(acc)
    if not np.issubdtype(acc.dtype, np.integer):
        raise QuantizationStateError(f"requantize needs an integer accumulator, got {acc.dtype}")
    acc = acc.astype(np.int64)
    shape = acc.shape
    m = along_channel_axis(np.asarray(multiplier, dtype=np.int64), acc.ndim, shape, channel_axis, "multiplier")
    s = along_channel_axis(np.asarray(right_shift, dtype=np.int64), acc.ndim, shape, channel_axis, "right_shift")
    if acc.size and m.size:
        bound = int(np.max(np.abs(acc))) * int(np.max(np.abs(m)))
        if bound >= 1 << 63:
            raise QuantizationStateError(f"requantize overflow: |acc| * |multiplier| reaches {bound} >= 2^63")
    y = rounding_right_shift(acc * m, s, rounding)
    z = offset_array(offset, np.int64, acc.ndim, shape, channel_axis)
    if z is not None:
        y = y + z
    np.clip(y, qmin, qmax, out=y)
    return y.astype(integer_dtype(qmin, qmax))
