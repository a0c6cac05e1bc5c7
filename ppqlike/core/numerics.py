"""Quantization arithmetic as small pure numpy functions (DESIGN.md §2).

    q = clamp(round(x / S) + Z, qmin, qmax)        r = S * (q - Z)

Precision rules (so the simulation equals onnxruntime's QuantizeLinear /
DequantizeLinear bit for bit):

* ``x / S`` is a true division, never ``x * (1/S)``.  It runs in float32 when
  ``x`` is float32 (or float16) and ``scale`` is a float32 array/scalar and the
  integer range fits float32's exact integers (|qmin|, |qmax| <= 2^24);
  otherwise in float64 (Python float scales, float64 data, 32-bit bias).
* Dequantization runs in float32 when ``scale`` is float32 (float32(q - Z) * S,
  like onnxruntime), otherwise in float64; the result is always float32.
* Integer results are int32 when [qmin, qmax] fits int32, else int64.

Bad parameters (scale <= 0 or not finite, qmin >= qmax, a per-channel scale
whose length is not the channel count) raise QuantizationStateError.
"""

from __future__ import annotations

import numpy as np

from ppqlike.core.errors import CalibrationDataError, QuantizationStateError
from ppqlike.core.layout import empty_like_dense, flat_view, memory_axes, same_layout
from ppqlike.core.quantization_parameters import along_channel_axis, check_range, integer_dtype, offset_array
from ppqlike.core.requantization import requantize, rounding_right_shift, scale_to_multiplier_shift  # (re-exported)
from ppqlike.core.rounding import RoundingPolicy, round_inplace, round_into, round_values

__all__ = [
    "RoundingPolicy", "round_values", "quantize", "dequantize", "fake_quantize",
    "minmax_to_scale_offset", "power_of_2_scale", "scale_to_multiplier_shift",
    "rounding_right_shift", "requantize", "integer_dtype",
]

_F32_EXACT = 1 << 24


def _scale_array(scale, dtype, ndim, shape, channel_axis) -> np.ndarray:
    s = np.asarray(scale, dtype=dtype)
    if not np.all(np.isfinite(s) & (s > 0)):
        raise QuantizationStateError(f"scale must be finite and > 0, got {np.asarray(scale)!r}")
    return along_channel_axis(s, ndim, shape, channel_axis, "scale")


def _is_f32(a) -> bool:
    return isinstance(a, (np.ndarray, np.generic)) and a.dtype == np.float32


def _quant_dtype(x: np.ndarray, scale, qmin: int, qmax: int) -> type:
    small = -_F32_EXACT <= qmin and qmax <= _F32_EXACT
    if small and x.dtype in (np.float32, np.float16) and _is_f32(scale):
        return np.float32
    return np.float64


def _quantize_float(x, scale, offset, qmin, qmax, rounding, channel_axis):
    """clamp(round(x / S) + Z) as floats in the compute dtype, plus (S, Z) broadcastable."""
    x = np.asarray(x)
    rounding = RoundingPolicy.parse(rounding)
    dt = _quant_dtype(x, scale, qmin, qmax)
    s = _scale_array(scale, dt, x.ndim, x.shape, channel_axis)
    z = offset_array(offset, dt, x.ndim, x.shape, channel_axis)
    t = np.divide(x, s, dtype=dt)
    if t.ndim == 0:
        t = np.array(t)
    round_inplace(t, rounding)
    if z is not None:
        t += z
    np.clip(t, qmin, qmax, out=t)
    return t, s, z


def quantize(x, scale, offset, quant_min: int, quant_max: int,
             rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN, channel_axis: int | None = None):
    """q = clamp(round(x / scale) + offset, quant_min, quant_max) as int32 (int64 if the range needs it).

    Per tensor: scalar ``scale``/``offset``; per channel: 1-D arrays laid
    along ``channel_axis``.  NaN inputs give unspecified integers.
    """
    qmin, qmax = check_range(quant_min, quant_max)
    t, _, _ = _quantize_float(x, scale, offset, qmin, qmax, rounding, channel_axis)
    with np.errstate(invalid="ignore"):
        return t.astype(integer_dtype(qmin, qmax))


def dequantize(q, scale, offset, channel_axis: int | None = None) -> np.ndarray:
    """r = scale * (q - offset) as float32 (computed in float32 when scale is float32)."""
    q = np.asarray(q)
    dt = np.float32 if _is_f32(scale) else np.float64
    s = _scale_array(scale, dt, q.ndim, q.shape, channel_axis)
    z = offset_array(offset, np.int64, q.ndim, q.shape, channel_axis)
    diff = q.astype(np.int64) if np.issubdtype(q.dtype, np.integer) else np.rint(q).astype(np.int64)
    if z is not None:
        diff = diff - z
    r = diff.astype(dt)
    r *= s
    return r if dt is np.float32 else r.astype(np.float32)


def fake_quantize(x, scale, offset, quant_min: int, quant_max: int,
                  rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN,
                  channel_axis: int | None = None, out: np.ndarray | None = None,
                  map_blocks=None) -> np.ndarray:
    """dequantize(quantize(x)) in float32, the two-step path's values bit for bit, but for the sign of a
    zero: where x / S rounds to -0.0 a zero code may come out -0.0 (which path runs decides it).

    One new array (or ``out``, which may be ``x`` itself), rounded, clamped and
    rescaled in place; a per-tensor float32 one block at a time, so that the
    passes run in cache (its blocks through ``map_blocks``, see ``_quantize_flat``).
    """
    qmin, qmax = check_range(quant_min, quant_max)
    x = np.asarray(x)
    if _blockwise_applies(x, scale, offset, qmin, qmax, channel_axis, out):
        return _fake_quantize_blocks(x, scale, offset, qmin, qmax, RoundingPolicy.parse(rounding), out,
                                     map_blocks=map_blocks)
    t, s, z = _quantize_float(x, scale, offset, qmin, qmax, rounding, channel_axis)
    if z is not None:
        t -= z  # exact: integers below 2^53 (2^24 in float32)
    dt = np.float32 if _is_f32(scale) else np.float64
    if t.dtype != dt:  # float32 scale but float64 quantization (float64 x or a 32-bit range)
        t = t.astype(dt)
        s = s.astype(dt)
    t *= s
    result = t if t.dtype == np.float32 else t.astype(np.float32)
    if out is None:
        return result
    out[...] = result
    return out


def quantize_codes(x, scale, offset, quant_min: int, quant_max: int,
                   rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN,
                   channel_axis: int | None = None, map_blocks=None) -> np.ndarray | None:
    """The codes q - Z of a per-tensor float32 quantization as integer-valued float32 (what
    ``fake_quantize`` computes before its last multiplication by S; S * codes is its result, bit for
    bit), block by block; None where ``fake_quantize`` does not take that path."""
    qmin, qmax = check_range(quant_min, quant_max)
    x = np.asarray(x)
    if not _blockwise_applies(x, scale, offset, qmin, qmax, channel_axis, None):
        return None
    return _fake_quantize_blocks(x, scale, offset, qmin, qmax, RoundingPolicy.parse(rounding), None,
                                 dequantize=False, map_blocks=map_blocks)


QUANTIZE_BLOCK = 1 << 17   # elements per block of the per-tensor path (512 KiB of float32): the passes stay in L2;
#                         a fused kernel cutting its blocks at the same multiples gets the same bytes


def _blockwise_applies(x, scale, offset, qmin, qmax, channel_axis, out) -> bool:
    """Per-tensor float32 quantization of a dense array (any memory order, see ``layout``) with a float32
    scale (the activations); ``out``, if given, laid out as ``x``."""
    if x.dtype != np.float32 or x.ndim == 0 or not _is_f32(scale) or memory_axes(x) is None:
        return False
    if np.size(scale) != 1 or np.size(offset) != 1 or not (-_F32_EXACT <= qmin and qmax <= _F32_EXACT):
        return False
    if out is not None and (out.dtype != np.float32 or not same_layout(out, x) or not out.flags.writeable):
        return False
    return True


def _fake_quantize_blocks(x, scale, offset, qmin, qmax, rounding, out, dequantize: bool = True,
                          map_blocks=None) -> np.ndarray:
    """The float32 per-tensor fake quantization, block by block, into ``out`` (new when None); without
    ``dequantize``, the codes q - z.

    With z the offset, clamp(round(x / S) + z) - z is computed as clamp(round(x / S), qmin - z, qmax - z):
    the same integers (exact in float32), two passes fewer.
    """
    s, low, high = _block_parameters(scale, offset, qmin, qmax)
    result = empty_like_dense(x) if out is None else out
    _quantize_flat(flat_view(x), flat_view(result), s, low, high, rounding, dequantize, map_blocks)
    return result


def _block_parameters(scale, offset, qmin: int, qmax: int) -> tuple:
    """(S, qmin - z, qmax - z) as float32 scalars for the per-tensor block path (checked)."""
    s = _scale_array(np.asarray(scale).reshape(()), np.float32, 0, (), None)
    z = np.asarray(offset).reshape(())
    if not np.issubdtype(z.dtype, np.integer) and z != np.round(z):
        raise QuantizationStateError(f"offset must be integer-valued, got {z!r}")
    z = int(z)
    return s, np.float32(qmin - z), np.float32(qmax - z)


def _quantize_flat(source: np.ndarray, target: np.ndarray, s, low, high, rounding, dequantize: bool,
                   map_blocks=None) -> None:
    """The block loop of the per-tensor path over flat (1-D) ``source`` and ``target`` (may be the same).

    ``map_blocks(work, count, scratch)``, when given, runs ``work(index, local)`` for every block index, with
    ``local`` made by ``scratch()`` once per thread (the executor's kernel threads); the blocks are the same
    either way, so are the bits."""
    count = -(-source.size // QUANTIZE_BLOCK)

    def scratch():   # x / S, then its distance to rint
        return np.empty(min(QUANTIZE_BLOCK, source.size), np.float32)

    def work(index, local):
        start = index * QUANTIZE_BLOCK
        block = target[start:start + QUANTIZE_BLOCK]
        steps = local[:block.size]
        np.divide(source[start:start + QUANTIZE_BLOCK], s, out=steps)
        round_into(steps, block, rounding)
        block.clip(low, high, out=block)
        if dequantize:
            np.multiply(block, s, out=block)
    if map_blocks is not None and count > 1:
        map_blocks(work, count, scratch)
        return
    local = scratch()
    for index in range(count):
        work(index, local)


def fake_quantizer(scale, offset, quant_min: int, quant_max: int,
                   rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN):
    """``fake_quantize`` with these parameters as a function ``(x, out)``, its checks made once: a kernel's
    epilogue calls it block after block.  C-ordered float32 blocks take the per-tensor block path
    directly (the same blocks, so the same bits); anything else goes through ``fake_quantize``."""
    qmin, qmax = check_range(quant_min, quant_max)
    rounding = RoundingPolicy.parse(rounding)

    def general(x, out):
        return fake_quantize(x, scale, offset, qmin, qmax, rounding, out=out)
    if not (_is_f32(scale) and np.size(scale) == 1 and np.size(offset) == 1 and -_F32_EXACT <= qmin
            and qmax <= _F32_EXACT):
        return general
    s, low, high = _block_parameters(scale, offset, qmin, qmax)

    def run(x, out):
        if isinstance(x, np.ndarray) and x.dtype == np.float32 and out.dtype == np.float32 and x.ndim \
                and x.shape == out.shape and x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable:
            _quantize_flat(x.reshape(-1), out.reshape(-1), s, low, high, rounding, True)
            return out
        return general(x, out)
    return run


def power_of_2_scale(scale, rounding: RoundingPolicy = RoundingPolicy.ROUND_UP):
    """2^round(log2(scale)); ROUND_UP (the default) never shrinks the scale.

    ROUND_UP/ROUND_DOWN are exact (via frexp); other policies round log2.
    Scalars give a float, arrays a float64 array.
    """
    rounding = RoundingPolicy.parse(rounding)
    s = np.asarray(scale, dtype=np.float64)
    if not np.all(np.isfinite(s) & (s > 0)):
        raise QuantizationStateError(f"power-of-2 scale needs finite positive scales, got {scale!r}")
    m, e = np.frexp(s)  # s = m * 2^e, m in [0.5, 1)
    exact = m == 0.5
    if rounding is RoundingPolicy.ROUND_UP:
        ex = np.where(exact, e - 1, e)
    elif rounding is RoundingPolicy.ROUND_DOWN:
        ex = e - 1
    else:
        ex = np.where(exact, e - 1, round_values(np.log2(s), rounding))
    out = np.ldexp(1.0, np.asarray(ex, dtype=np.int64))
    return float(out) if np.ndim(scale) == 0 else out


def minmax_to_scale_offset(min_val, max_val, quant_min: int, quant_max: int, symmetric: bool,
                           power_of_2: bool = False,
                           rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN,
                           eps: float = 2.0 ** -32):
    """Scale and offset that map [min_val, max_val] (widened to hold 0) onto [qmin, qmax].

    * asymmetric: S = (max - min) / (qmax - qmin), Z = round(qmin - min / S)
      (under ``rounding``) clamped into [qmin, qmax].
    * symmetric: T = max(|min|, |max|), S = T / ((qmax - qmin) / 2); that is
      T/127 for narrow [-127, 127], T/127.5 for [-128, 127] (as onnxruntime; +T
      then clamps to 127), T/127.5 for unsigned [0, 255].  Z = 0 for a signed
      range (qmin < 0), Z = (qmin + qmax + 1) // 2 (128 for [0, 255]) otherwise.
    * power_of_2: S becomes 2^ceil(log2 S), so the range stays covered.
    * S is at least ``eps`` (a zero range never gives 0 or NaN), then rounded
      to float32 (what exported models store); Z is computed from that S.

    Elementwise for per-channel arrays.  Scalars in: ``(float, int)``;
    arrays in: ``(float32 array, int64 array)``.
    """
    qmin, qmax = check_range(quant_min, quant_max)
    rounding = RoundingPolicy.parse(rounding)
    scalar = np.ndim(min_val) == 0 and np.ndim(max_val) == 0
    lo = np.asarray(min_val, dtype=np.float64)
    hi = np.asarray(max_val, dtype=np.float64)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise CalibrationDataError(f"min/max must be finite, got min={min_val!r} max={max_val!r}")
    if np.any(lo > hi):
        raise CalibrationDataError(f"min {min_val!r} is above max {max_val!r}")
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if symmetric:
        scale = np.maximum(-lo, hi) / ((qmax - qmin) / 2.0)
    else:
        scale = (hi - lo) / float(qmax - qmin)
    scale = np.maximum(scale, float(eps))
    if power_of_2:
        scale = np.asarray(power_of_2_scale(scale, RoundingPolicy.ROUND_UP))
    with np.errstate(over="ignore"):
        scale = scale.astype(np.float32)
    if not np.all(np.isfinite(scale)):
        raise CalibrationDataError(f"range min={min_val!r} max={max_val!r} is too wide for a float32 scale")
    if symmetric:
        offset = np.full(scale.shape, 0 if qmin < 0 else (qmin + qmax + 1) // 2, dtype=np.int64)
    else:
        z = round_values(np.asarray(qmin - lo / scale.astype(np.float64)), rounding)
        offset = np.clip(z, qmin, qmax).astype(np.int64)
    if scalar:
        return float(scale), int(offset)
    return scale, offset
