"""Rounding policies and the one function that applies them (DESIGN.md §2).

Every place in ppqlike that rounds (quantize, requantize shifts, bias, zero
points) takes a :class:`RoundingPolicy` and goes through :func:`round_values`
(or, for integers, :func:`ppqlike.core.numerics.rounding_right_shift`).

Ties are detected exactly: ``r = rint(x)`` is exact and so is ``d = x - r``
(Sterbenz), with ``|d| <= 0.5``; ``x`` is a tie iff ``|d| == 0.5``.  No
``floor(x + 0.5)``, which is wrong for x = 0.49999999999999994 (x + 0.5 rounds up
to 1).  Half up is floor(x + b) with b the float just below 0.5: x + b rounds up
to the next integer exactly where x + 0.5 reaches it (a tie's sum lies halfway
between two floats and rounds to the even one, the integer), except at x = -0.5,
where -0.5 + b is a tiny negative number; that one value is set apart.  (An
exhaustive check over the float32s in [-2^22, 2^22] found no other.)
"""

from __future__ import annotations

import enum

import numpy as np

from ppqlike.core.errors import QuantizationPolicyError

__all__ = ["RoundingPolicy", "NEAREST_POLICIES", "round_values", "round_inplace", "floor_half_up"]


class RoundingPolicy(enum.Enum):
    """How a real value becomes an integer; values are the policy names (JSON).

    ======================== ======================= ==== =====
    policy                   rule                    2.5  -2.5
    ======================== ======================= ==== =====
    ROUND_HALF_EVEN          ties to even            2    -2
    ROUND_HALF_AWAY_FROM_ZERO sign(x)*floor(|x|+.5)  3    -3
    ROUND_HALF_TOWARDS_ZERO  sign(x)*ceil(|x|-.5)    2    -2
    ROUND_HALF_UP            floor(x+.5)             3    -2
    ROUND_HALF_DOWN          ceil(x-.5)              2    -3
    ROUND_UP                 ceil(x)                 3    -2
    ROUND_DOWN               floor(x)                2    -3
    ROUND_TO_ZERO            trunc(x)                2    -2
    ======================== ======================= ==== =====
    """

    ROUND_HALF_EVEN = "ROUND_HALF_EVEN"
    ROUND_HALF_AWAY_FROM_ZERO = "ROUND_HALF_AWAY_FROM_ZERO"
    ROUND_HALF_TOWARDS_ZERO = "ROUND_HALF_TOWARDS_ZERO"
    ROUND_HALF_UP = "ROUND_HALF_UP"
    ROUND_HALF_DOWN = "ROUND_HALF_DOWN"
    ROUND_UP = "ROUND_UP"
    ROUND_DOWN = "ROUND_DOWN"
    ROUND_TO_ZERO = "ROUND_TO_ZERO"

    @classmethod
    def parse(cls, value: "RoundingPolicy | str") -> "RoundingPolicy":
        """A policy from itself or its name; QuantizationPolicyError otherwise."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value))
        except ValueError:
            names = ", ".join(p.name for p in cls)
            raise QuantizationPolicyError(f"unknown rounding policy {value!r}; expected one of {names}") from None


_P = RoundingPolicy


def round_inplace(t: np.ndarray, policy: RoundingPolicy) -> np.ndarray:
    """Round the floating array ``t`` in place under ``policy`` and return it.

    ``t`` must be a writeable floating ndarray (0-d allowed).  NaN and inf pass
    through unchanged.
    """
    if policy in _DIRECT:
        return _DIRECT[policy](t, out=t)
    r = round_into(t, np.empty_like(t), policy)
    t[...] = r
    return t


def round_into(t: np.ndarray, out: np.ndarray, policy: RoundingPolicy) -> np.ndarray:
    """``out`` = ``t`` rounded under ``policy``; ``t`` (writeable, the same shape) is used as scratch.

    Half-way policies: r = rint(t) is the answer except on ties, where
    d = t - r is exactly +0.5 (r is the lower neighbour) or -0.5 (upper); a
    block without ties (the usual case) needs no fix-up pass.
    """
    if policy in _DIRECT:
        return _DIRECT[policy](t, out=out)
    if policy is _P.ROUND_HALF_UP and t.dtype in _BELOW_HALF:   # two passes and a compare (see the module)
        floor_half_up(t, out)
        wrong = t == -0.5
        if wrong.any():
            np.copyto(out, 0.0, where=wrong)
        return out
    r = np.rint(t, out=out)
    with np.errstate(invalid="ignore"):  # inf - inf = nan: compares False, r stays inf
        d = np.subtract(t, r, out=t)  # t now holds d (exact); r the candidate
        # rint took the even neighbour: half up differs from it only where d = +0.5, half down only
        # where d = -0.5 (one reduction each); the others on either side
        up = policy is not _P.ROUND_HALF_DOWN and d.size and np.fmax.reduce(d, axis=None) >= 0.5
        down = policy is not _P.ROUND_HALF_UP and d.size and np.fmin.reduce(d, axis=None) <= -0.5
        if d.size and not (up or down):
            return r  # no tie to fix (NaN, from inf or NaN inputs, is none and is skipped by fmax/fmin)
    if policy is _P.ROUND_HALF_UP:
        r += d == 0.5
    elif policy is _P.ROUND_HALF_DOWN:
        r -= d == -0.5
    elif policy is _P.ROUND_HALF_AWAY_FROM_ZERO:
        r += (d == 0.5) & (r >= 0)   # x = r + .5 > 0 -> up
        r -= (d == -0.5) & (r <= 0)  # x = r - .5 < 0 -> down
    elif policy is _P.ROUND_HALF_TOWARDS_ZERO:
        r += (d == 0.5) & (r < 0)    # x = r + .5 < 0 -> up (towards 0)
        r -= (d == -0.5) & (r > 0)   # x = r - .5 > 0 -> down
    else:  # pragma: no cover - the enum is closed
        raise QuantizationPolicyError(f"unknown rounding policy {policy!r}")
    return r


#: the policies that round to the nearest integer (they differ only on ties)
NEAREST_POLICIES = frozenset({_P.ROUND_HALF_EVEN, _P.ROUND_HALF_AWAY_FROM_ZERO, _P.ROUND_HALF_TOWARDS_ZERO,
                              _P.ROUND_HALF_UP, _P.ROUND_HALF_DOWN})

#: the float just below 0.5 of each dtype: half up is floor(t + it) for every t but -0.5
_BELOW_HALF = {np.dtype(np.float32): np.nextafter(np.float32(0.5), np.float32(0)),
               np.dtype(np.float64): np.nextafter(0.5, 0.0)}


def floor_half_up(t: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out`` = floor(t + b), b the float32 or float64 just below 0.5: ``t`` rounded half up for every value
    but t = -0.5, which gives -1 (see the module; ``round_into`` sets it apart, and codes >= 0 never hold it)."""
    return np.floor(np.add(t, _BELOW_HALF[t.dtype], out=out), out=out)

_DIRECT = {_P.ROUND_HALF_EVEN: np.rint, _P.ROUND_UP: np.ceil, _P.ROUND_DOWN: np.floor, _P.ROUND_TO_ZERO: np.trunc}


def round_values(x, policy: RoundingPolicy | str = RoundingPolicy.ROUND_HALF_EVEN):
    """Round ``x`` to integral values under ``policy``.

    Arrays give an array of the same floating dtype (integer arrays come back
    unchanged); Python and numpy scalars give a Python ``float``.  Both paths
    run the same code, so they agree on every tie, negative ties included.
    """
    policy = RoundingPolicy.parse(policy)
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
                return x
            x = x.astype(np.float64)
        return round_inplace(np.array(x, copy=True), policy)
    # Python / numpy scalars (and sequences, which become float64 arrays).
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    else:
        arr = arr.copy()
    out = round_inplace(arr, policy)
    return float(out) if out.ndim == 0 else out
