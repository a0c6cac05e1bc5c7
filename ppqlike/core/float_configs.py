"""How a TensorQuantizationConfig on a float grid (``float_format`` set) quantizes: the checks and the calls
into :mod:`ppqlike.core.float_formats`.  Pure functions of the config's resolved values; no state."""

from __future__ import annotations

import numpy as np

from ppqlike.core import float_formats
from ppqlike.core.errors import QuantizationPolicyError, QuantizationStateError
from ppqlike.core.rounding import RoundingPolicy

__all__ = ["checked_float_format", "float_call", "float_fake_quantizer"]


def checked_float_format(fmt, rounding: RoundingPolicy, offset, who: str):
    """``fmt`` (or None) after checking what a float grid needs: rounding half to even, offset 0."""
    if fmt is not None:
        if rounding is not RoundingPolicy.ROUND_HALF_EVEN:
            raise QuantizationPolicyError(f"{who}: a {fmt.name} grid rounds half to even (as the format's casts "
                                          f"do), not {rounding.name}")
        if offset is not None and np.any(offset != 0):
            raise QuantizationStateError(f"{who}: a {fmt.name} grid has offset 0, got {offset.tolist()}")
    return fmt


def _into(result: np.ndarray, out):
    if out is None:
        return result
    out[...] = result
    return out


def float_call(kind: str, fmt, values, scale, axis, out=None):
    """``kind`` ('quantize', 'dequantize', 'fake_quantize' or 'quantize_codes': None, no integer codes) on the
    float grid ``fmt`` with ``scale`` (per channel along ``axis``)."""
    if kind == "quantize_codes":
        return None
    if kind == "dequantize":
        return float_formats.float_dequantize(values, scale, axis)
    if kind == "quantize":
        return float_formats.float_quantize(values, scale, fmt, axis)
    return _into(float_formats.float_fake_quantize(values, scale, fmt, axis), out)


def float_fake_quantizer(fmt, scale, low=None, high=None, clipped: bool = False):
    """A per-tensor float grid's fake quantization as a function ``(x, out=None)`` (``clipped``: of clip(x))."""
    def quantizer(x, out=None):
        return _into(float_formats.float_fake_quantize(np.clip(x, low, high) if clipped else x, scale, fmt), out)
    return quantizer
