"""A Relu/Clip and the per-tensor fake quantization after it, in one pass fewer.

fake_quantize(clip(x, lo, hi)) = S * clamp(round(clip(x, lo, hi) / S), A, B) with A = qmin - z,
B = qmax - z.  Division by S > 0 is monotone, so clip(x, lo, hi) / S = clip(x / S, lo / S, hi / S)
(float32, bit for bit), and when the activation's code range [l, h] = [lo / S, hi / S] starts at or
above A (or A is not 0) the clamp moves before the rounding and joins the clip:

    S * round(clip(x / S, max(l, A), min(h, B)))

the same values, +0.0 and -0.0 included (``code_bounds`` says where this holds; elsewhere the clip runs
first).  When the clipped codes are >= 0 (a Relu before), half-up and half-away rounding are both
floor(t + (0.5 - 2^-25)) in float32: two passes instead of rint's and the tie fix-up's five; an exhaustive
check over every float32 in [0, 2^22] finds it equal to half-up rounding (t + 0.5 itself would round
0.5 - 2^-25 up to 1).  A -0.0 code then comes out +0.0, as the tie fix-up already made it in every block
holding a tie.  Pure functions; they write only ``out``.
"""

from __future__ import annotations

import numpy as np

from .numerics import fake_quantizer
from .rounding import RoundingPolicy, floor_half_up, round_into

_BLOCK = 1 << 18   # elements per block: x / S in a scratch buffer before it is rounded into ``out`` (fewer, larger
                   # numpy calls measured faster than blocks that stay in L2)


#: the policies that round codes >= 0 half up (``rounding.floor_half_up`` does it there)
_HALF_UP_ON_POSITIVES = frozenset({RoundingPolicy.ROUND_HALF_UP, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO})
_CHECKED = 2.0 ** 22   # the codes the exhaustive check covered


def code_bounds(scale, offset, quant_min: int, quant_max: int, low, high) -> tuple | None:
    """(L, H), the bounds of x / S that do both the clip to [low, high] (None: unbounded) and the clamp
    of the codes, or None where that would change a value:

    * S a float32 scalar at most 1 (so x / S is 0 only for x = 0: a tiny negative x never gives -0.0
      where clip(x, 0, ..) gives +0.0), ``low`` / ``high`` float32 numbers;
    * not (A = 0 and l < 0): there rounding first turns x / S in (-0.5, 0) into -0.0, which the clamp to
      0 keeps, where clipping first gives +0.0;
    * L <= H.
    """
    scale, offset = np.asarray(scale), np.asarray(offset)
    if scale.dtype != np.float32 or scale.size != 1 or offset.size != 1 or not 0 < float(scale) <= 1:
        return None
    bounds = []
    for bound, missing in ((low, -np.inf), (high, np.inf)):
        value = np.float32(missing) if bound is None else np.asarray(bound)
        if value.size != 1 or np.float32(value.reshape(())) != value.reshape(()) or np.isnan(value):
            return None
        bounds.append(np.float32(value.reshape(())) / scale.reshape(()))   # the float32 quotient x / S gives
    step_low, step_high = bounds
    first, last = int(quant_min) - int(offset), int(quant_max) - int(offset)
    if first == 0 and step_low < 0:
        return None
    lower, upper = max(step_low, np.float32(first)), min(step_high, np.float32(last))
    return (lower, upper) if lower <= upper else None


def fake_quantize_clipped(x: np.ndarray, scale, offset, quant_min: int, quant_max: int, rounding: RoundingPolicy,
                          low, high, out: np.ndarray) -> np.ndarray:
    """fake_quantize(clip(x, low, high)) written into ``out`` (float32, ``x``'s shape, any layout; may be
    ``x``): blocks along the first axis, four passes each where ``code_bounds`` allows, else the clip and
    then ``numerics.fake_quantize``."""
    return clipped_fake_quantizer(scale, offset, quant_min, quant_max, rounding, low, high)(x, out)


def clipped_fake_quantizer(scale, offset, quant_min: int, quant_max: int, rounding: RoundingPolicy, low, high):
    """``fake_quantize_clipped`` with these parameters as a function ``(x, out)``, the bounds worked out once
    (a kernel's epilogue calls it block after block)."""
    bounds = code_bounds(scale, offset, quant_min, quant_max, low, high)
    plain = fake_quantizer(scale, offset, quant_min, quant_max, rounding)
    clip_low, clip_high = -np.inf if low is None else low, np.inf if high is None else high

    def clip_first(x, out):
        np.clip(x, clip_low, clip_high, out=out)
        return plain(out, out)
    if bounds is None:
        return clip_first
    step = np.asarray(scale).reshape(()).astype(np.float32)
    policy = RoundingPolicy.parse(rounding)
    half_up = policy in _HALF_UP_ON_POSITIVES and bounds[0] >= 0 and bounds[1] <= _CHECKED

    def run(x, out):
        if x.dtype != np.float32 or out.dtype != np.float32 or not x.ndim:
            return clip_first(x, out)
        rows = max(1, _BLOCK // max(1, x[0].size))
        scratch = np.empty((min(rows, x.shape[0]),) + x.shape[1:], np.float32)
        for start in range(0, x.shape[0], rows):
            target = out[start:start + rows]
            steps = scratch[:target.shape[0]]
            np.divide(x[start:start + rows], step, out=steps)
            steps.clip(bounds[0], bounds[1], out=steps)
            if half_up:
                floor_half_up(steps, target)
            else:
                round_into(steps, target, policy)   # steps: its scratch
            np.multiply(target, step, out=target)
        return out
    return run
