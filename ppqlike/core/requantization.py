"""What the integer-requantization pass hands to the simulation and the exporters (TPU style, DESIGN.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

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
