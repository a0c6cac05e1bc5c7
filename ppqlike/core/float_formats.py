"""Floating-point quantization grids (FP8 E4M3FN and E5M2, FP16, BF16) as small pure numpy functions.

A float grid replaces the integer grid of affine quantization:

    q = cast_to_format(x / S)        r = q * S

with ``x / S`` a float32 division and the cast rounding to nearest, ties to
even, on the format's significand (subnormals included), as ONNX
QuantizeLinear (opset 19+, ``saturate=1``) and Cast do and onnxruntime's CPU
kernels compute them.  Rounding is integer manipulation of the float32 bits.
Special values: NaN stays NaN (its sign kept), -0 stays -0, a value that
rounds past the largest finite number saturates to it in the FP8 formats
(+-448 for E4M3FN, +-57344 for E5M2; +-Inf too, as ``saturate=1`` does) and
becomes +-Inf in FP16 and BF16 (a Cast does not saturate).

Reads and writes no state; arrays in, new arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppqlike.core.errors import QuantizationPolicyError

__all__ = ["FloatFormat", "FLOAT_FORMATS", "float_format", "round_to_format", "float_quantize",
           "float_dequantize", "float_fake_quantize", "encode_format", "decode_format"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: sign bit, ``exponent_bits``, ``mantissa_bits``, exponent ``bias``.

    ``max_value`` is its largest finite magnitude; ``saturate``: values beyond it become +-max_value
    (FP8 QuantizeLinear, saturate=1), else +-Inf; ``onnx_type``: its onnx.TensorProto data type;
    ``storage``: the numpy unsigned type holding one code.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_value: float
    saturate: bool
    onnx_type: int
    storage: type

    @property
    def num_of_bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def quant_range(self) -> tuple[int, int]:
        """(-max, max) as integers: the range a symmetric observer maps its threshold onto (scale = T / max);
        capped at 2^62 (BF16's max does not fit an int64)."""
        top = min(int(self.max_value), 1 << 62)
        return -top, top

    @property
    def smallest_subnormal(self) -> float:
        return float(2.0 ** (1 - self.bias - self.mantissa_bits))


# onnx.TensorProto: FLOAT16 = 10, BFLOAT16 = 16, FLOAT8E4M3FN = 17, FLOAT8E5M2 = 19
FLOAT_FORMATS = {
    "E4M3FN": FloatFormat("E4M3FN", 4, 3, 7, 448.0, True, 17, np.uint8),
    "E5M2": FloatFormat("E5M2", 5, 2, 15, 57344.0, True, 19, np.uint8),
    "FP16": FloatFormat("FP16", 5, 10, 15, 65504.0, False, 10, np.uint16),
    "BF16": FloatFormat("BF16", 8, 7, 127, float(np.float32(3.3895313892515355e38)), False, 16, np.uint16),
}
_ALIASES = {"E4M3": "E4M3FN", "FP8": "E4M3FN", "FP8_E4M3": "E4M3FN", "FP8_E4M3FN": "E4M3FN", "FLOAT8E4M3FN": "E4M3FN",
            "FP8_E5M2": "E5M2", "FLOAT8E5M2": "E5M2", "F16": "FP16", "FLOAT16": "FP16", "HALF": "FP16",
            "BFLOAT16": "BF16"}


def float_format(name: "str | FloatFormat | None") -> FloatFormat | None:
    """The FloatFormat called ``name`` (any case; E4M3, FP8, F16, BFLOAT16 ... accepted), None for None."""
    if name is None or isinstance(name, FloatFormat):
        return name
    key = str(name).strip().upper().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in FLOAT_FORMATS:
        raise QuantizationPolicyError(f"unknown floating-point format {name!r}; choose one of {sorted(FLOAT_FORMATS)}")
    return FLOAT_FORMATS[key]


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def round_to_format(x, fmt: "FloatFormat | str") -> np.ndarray:
    """``x`` (float32) rounded to the nearest value of ``fmt`` (ties to even), as float32 (module docstring).
    Integer operations on the float32 bits, in place where they can be (this runs on every activation of a
    float-format model in the simulation)."""
    fmt = float_format(fmt)
    x = _f32(x)
    bits = x.reshape(-1).view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    shift = 23 - fmt.mantissa_bits
    # normal range: round the magnitude's bits at the format's last mantissa bit (a carry moves the exponent)
    rounded = mag >> np.uint32(shift)
    rounded &= np.uint32(1)
    rounded += np.uint32((1 << (shift - 1)) - 1)
    rounded += mag
    rounded &= ~np.uint32((1 << shift) - 1)
    # below the format's smallest normal number: a multiple of its smallest subnormal
    min_normal = 128 - fmt.bias            # float32 biased exponent of the format's smallest normal number
    below = mag < np.uint32(min_normal << 23)
    if np.any(below):
        sub = mag[below].astype(np.int64)
        exponent = sub >> 23
        e = np.maximum(exponent, 1)
        significand = (sub & 0x7FFFFF) | np.where(exponent > 0, 0x800000, 0)
        s = np.minimum(shift + (min_normal - e), 40)
        kept = significand >> s
        rest = significand & ((np.int64(1) << s) - 1)
        half = np.int64(1) << (s - 1)
        kept += (rest > half) | ((rest == half) & ((kept & 1) == 1))
        value = kept.astype(np.float32) * np.float32(fmt.smallest_subnormal)
        rounded[below] = value.view(np.uint32)
    max_bits = np.uint32(np.float32(fmt.max_value).view(np.uint32))
    if fmt.saturate:                        # past the largest finite value (Inf included): the largest
        np.minimum(rounded, max_bits, out=rounded)
    else:                                   # past it: Inf
        rounded[rounded > max_bits] = np.uint32(0x7F800000)
    nan = mag > np.uint32(0x7F800000)       # NaN stays NaN
    if np.any(nan):
        rounded[nan] = np.uint32(0x7FC00000)
    rounded |= bits & np.uint32(0x80000000)
    return rounded.view(np.float32).reshape(x.shape)


def _scale(scale, shape, channel_axis) -> np.ndarray:
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim == 0 or channel_axis is None:
        return s.reshape(()) if s.size == 1 else s
    axis = channel_axis % len(shape)
    if s.size != shape[axis]:
        raise QuantizationPolicyError(f"{s.size} scales for {shape[axis]} channels on axis {axis}")
    view = [1] * len(shape)
    view[axis] = s.size
    return s.reshape(view)


def float_quantize(x, scale, fmt: "FloatFormat | str", channel_axis: int | None = None) -> np.ndarray:
    """The format's values ``cast(x / scale)`` (float32 division), as float32 numbers on the grid."""
    x = _f32(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return round_to_format(np.divide(x, _scale(scale, x.shape, channel_axis), dtype=np.float32), fmt)


def float_dequantize(q, scale, channel_axis: int | None = None) -> np.ndarray:
    """``q * scale`` in float32 (DequantizeLinear of a float8 input: zero point 0)."""
    q = _f32(q)
    return np.multiply(q, _scale(scale, q.shape, channel_axis), dtype=np.float32)


def float_fake_quantize(x, scale, fmt: "FloatFormat | str", channel_axis: int | None = None) -> np.ndarray:
    """DequantizeLinear(QuantizeLinear(x)) on the format's grid, as onnxruntime computes it."""
    return float_dequantize(float_quantize(x, scale, fmt, channel_axis), scale, channel_axis)


def encode_format(values, fmt: "FloatFormat | str") -> np.ndarray:
    """The format's bit codes (uint8 for FP8, uint16 for FP16/BF16) of float32 ``values`` already on its
    grid (``round_to_format``'s results); what an ONNX initializer of that type stores."""
    fmt = float_format(fmt)
    x = _f32(values)
    exact = round_to_format(x, fmt)
    same = (exact.view(np.uint32) == x.view(np.uint32)) | np.isnan(x)
    if not np.all(same):
        raise QuantizationPolicyError(f"{int(np.size(x) - np.count_nonzero(same))} value(s) are not on the "
                                      f"{fmt.name} grid; round them with round_to_format first")
    bits = x.view(np.uint32).astype(np.int64)
    sign = (bits >> 31) << (fmt.exponent_bits + fmt.mantissa_bits)
    mag = bits & 0x7FFFFFFF
    exponent = (mag >> 23) - 127 + fmt.bias
    normal = exponent >= 1
    code = np.where(normal, (np.maximum(exponent, 0) << fmt.mantissa_bits) | ((mag & 0x7FFFFF) >> (23 - fmt.mantissa_bits)),
                    0)
    subnormal = ~normal & (mag != 0)
    if np.any(subnormal):
        magnitude = np.abs(x.astype(np.float64))[subnormal]
        code[subnormal] = np.rint(magnitude / fmt.smallest_subnormal).astype(np.int64)
    all_ones = (1 << (fmt.exponent_bits + fmt.mantissa_bits)) - 1
    infinity = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
    code = np.where(np.isinf(x), infinity, code)
    code = np.where(np.isnan(x), all_ones if fmt.name == "E4M3FN" else infinity | (1 << (fmt.mantissa_bits - 1)), code)
    return (code | sign).astype(fmt.storage)


def decode_format(codes, fmt: "FloatFormat | str") -> np.ndarray:
    """float32 values of the format's bit codes (the inverse of :func:`encode_format`)."""
    fmt = float_format(fmt)
    c = np.asarray(codes).astype(np.int64)
    width = fmt.exponent_bits + fmt.mantissa_bits
    negative = (c >> width) & 1
    exponent = (c >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    mantissa = c & ((1 << fmt.mantissa_bits) - 1)
    top = (1 << fmt.exponent_bits) - 1
    with np.errstate(over="ignore"):
        value = np.where(exponent == 0, mantissa * fmt.smallest_subnormal,
                         (1.0 + mantissa / (1 << fmt.mantissa_bits)) * np.exp2(exponent - fmt.bias))
        if fmt.name == "E4M3FN":
            value = np.where((exponent == top) & (mantissa == (1 << fmt.mantissa_bits) - 1), np.nan, value)
        else:
            value = np.where(exponent == top, np.where(mantissa == 0, np.inf, np.nan), value)
        value = np.where(negative == 1, -value, value)
    return value.astype(np.float32)
