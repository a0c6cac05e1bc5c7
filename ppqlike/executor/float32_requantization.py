"""Where float32 requantizes exactly: a per-channel proof over every accumulator an op can reach.

An integer requantization q = clamp(round((P + B) * M0 * 2^-shift), low, high)
(``requantizing_kernels``) needs more than float32's 24 bits in general.  For one
channel, with its products' sums P bounded by |P| <= bound and its bias B fixed,
the float32 computation

    q32 = clamp(rint(fl32(acc * r)), low, high),  acc = P + B (exact in float32), or
    q32 = clamp(rint(fl32(fl32(P * r) + c)), low, high)  (the bias apart, c = fl32(B * M0 * 2^-shift))

is a monotone function of P, and so is q.  Between two consecutive rounding
boundaries (t = h + 1/2, h in the clamp range) q is constant; so q32 equals q for
every reachable P when it does at the reachable P next to each boundary (the
integers around (h + 1/2) / ratio - B) and at both ends of the range: by
monotonicity every P between two of those checked points lies between their two
equal codes.  Here that check runs for every channel, r taken as float32(M0 *
2^-shift) or one of its nearest float32 neighbours (a different r moves fl32's
rounding errors); a channel that none of them serves is not proven.  The check
compares with ``numerics.requantize`` (int64, the config's rounding policy), so
ties and every policy are covered.  Pure functions of the requantization facts
and the bounds; the kernels keep the result per op (``ops._prepared``).
"""

from __future__ import annotations

import numpy as np

from ..core import numerics
from ..core.rounding import RoundingPolicy

_F32 = np.float32
_NEIGHBOURS = 4   # float32 ratios tried on each side of float32(M0 * 2^-shift)


def float32_ratios(multipliers: np.ndarray, shifts: np.ndarray, bounds: np.ndarray, bias: np.ndarray,
                   low: float, high: float, rounding: RoundingPolicy, bias_apart: bool) -> tuple:
    """(float32 ratio per channel, float32 bias term per channel or None, per channel whether the float32
    computation of the module is proven exact with them).  ``bounds``: max |P| per channel (below 2^24);
    ``bias``: B per channel (integers; with B the accumulators stay below 2^24 unless ``bias_apart``)."""
    channels = multipliers.size
    ratio = np.ldexp(multipliers.astype(np.float64), -shifts)
    products = _checked_products(ratio, np.floor(bounds), bias, low, high)   # [channels, points]
    accumulators = products.astype(np.int64) + bias.astype(np.int64)[:, None]
    expected = numerics.requantize(accumulators, multipliers, shifts, 0, int(low), int(high), rounding,
                                   channel_axis=0).astype(_F32)
    offset = (bias * ratio).astype(_F32) if bias_apart else None
    source = (products if bias_apart else accumulators).astype(_F32)   # exact: below 2^24
    chosen, proven = ratio.astype(_F32), np.zeros(channels, bool)
    for step in [0] + [s for k in range(1, _NEIGHBOURS + 1) for s in (k, -k)]:
        trial = _neighbour(ratio.astype(_F32), step)
        left = ~proven
        codes = _float32_codes(source[left], trial[left], None if offset is None else offset[left], low, high)
        good = np.all(codes == expected[left], axis=1)
        index = np.flatnonzero(left)[good]
        chosen[index], proven[index] = trial[index], True
        if proven.all():
            break
    return chosen, offset, proven


def _checked_products(ratio: np.ndarray, bounds: np.ndarray, bias: np.ndarray, low: float, high: float) -> np.ndarray:
    """Per channel, the reachable P (|P| <= bound) next to each rounding boundary of the clamp range and the
    two ends, as float64 integers [channels, points] (rows padded with an end)."""
    halves = np.arange(low - 0.5, high + 1.0)   # h + 1/2 for h in [low - 1, high]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        centres = halves[None, :] / ratio[:, None] - bias[:, None]
    centres = np.where(np.isfinite(centres), np.clip(centres, -2.0 ** 40, 2.0 ** 40), 2.0 ** 40)
    around = np.floor(centres)[:, :, None] + np.arange(-1, 3)[None, None, :]   # float64 slack on both sides
    points = np.concatenate([around.reshape(ratio.size, -1), -bounds[:, None], bounds[:, None]], axis=1)
    reachable = np.abs(points) <= bounds[:, None]
    return np.where(reachable, points, bounds[:, None])


def _neighbour(values: np.ndarray, step: int) -> np.ndarray:
    """float32 ``values`` moved by ``step`` representable numbers (towards +inf when positive)."""
    moved = values.copy()
    for _ in range(abs(step)):
        moved = np.nextafter(moved, _F32(np.inf) if step > 0 else _F32(-np.inf))
    return moved


def _float32_codes(source: np.ndarray, ratio: np.ndarray, offset: np.ndarray | None, low: float,
                   high: float) -> np.ndarray:
    """The module's float32 computation, as ``Requantize`` runs it, on rows of channels."""
    t = np.multiply(source, ratio[:, None])
    if offset is not None:
        np.add(t, offset[:, None], out=t)
    np.rint(t, out=t)
    return t.clip(_F32(low), _F32(high), out=t)
