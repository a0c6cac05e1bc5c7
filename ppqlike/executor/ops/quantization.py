"""Kernels of the quantization op family, for models that carry them: QuantizeLinear and
DequantizeLinear (per tensor, per axis and blocked; integer, int4 and float8 codes),
DynamicQuantizeLinear, QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger.

These run the ops as onnxruntime does: quantization divides in float32 and rounds half to even,
integer products accumulate exactly (float64 sums of integers) and requantization multiplies the
float32 accumulator by the float32 combined scale.  They are not ppqlike's own quantization
simulation (which lives in the executor's quantization support), only ops of the model.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from . import conv
from .base import Kernel, attribute, normalize_axis, unsupported

_FLOAT_CODE_LARGEST = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
                       "float8_e5m2fnuz": 57344.0, "float4_e2m1fn": 6.0}
_INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                   "int32": (-2 ** 31, 2 ** 31 - 1), "int4": (-8, 7), "uint4": (0, 15)}


def _optional(inputs, index):
    value = inputs[index] if index < len(inputs) else None
    return None if value is None or np.size(value) == 0 else value


def _onnx_dtype(op, code: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))
    except Exception:
        raise unsupported(op, f"ONNX element type {code}") from None


def _is_float_code(dtype: np.dtype) -> bool:
    """float8 / float4 codes (ml_dtypes types, which numpy does not call floating)."""
    return dtype.name.startswith(("float8", "float4"))


def _broadcast(op, parameter, shape, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point laid out to broadcast against data of ``shape``: per tensor (one value),
    per axis (1-D along ``axis``) or blocked (each value repeated ``block_size`` times along ``axis``)."""
    p = np.asarray(parameter)
    if p.size == 1 and not block_size:
        return p.reshape(())
    a = normalize_axis(axis, len(shape))
    if block_size:
        if p.ndim != len(shape):
            raise unsupported(op, f"blocked parameters of shape {list(p.shape)} for data of shape {list(shape)}")
        return np.repeat(p, block_size, axis=a)[tuple(slice(0, d) for d in shape)]
    if p.ndim != 1 or p.size != shape[a]:
        raise unsupported(op, f"a parameter of shape {list(p.shape)} for axis {a} of data {list(shape)}")
    return p.reshape([-1 if i == a else 1 for i in range(len(shape))])


def _saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    low, high = _INTEGER_RANGES[dtype.name]
    return np.clip(values, low, high).astype(dtype)


def _build_quantize_linear(op, opset: int) -> Kernel:
    """QuantizeLinear: saturate(round(x / scale) + zero_point), half to even; float8 codes: x / scale cast
    to the type (saturating at its largest finite value unless saturate=0)."""
    axis = int(attribute(op, "axis", 1))
    block_size = int(attribute(op, "block_size", 0))
    saturate = bool(attribute(op, "saturate", 1))
    code = int(attribute(op, "output_dtype", 0))

    def kernel(inputs):
        x, scale, zero_point = inputs[0], inputs[1], _optional(inputs, 2)
        target = zero_point.dtype if zero_point is not None else \
            (_onnx_dtype(op, code) if code else np.dtype(np.uint8))
        compute = np.float64 if np.float64 in (x.dtype, scale.dtype) else np.float32
        s = _broadcast(op, scale, x.shape, axis, block_size).astype(compute)
        with np.errstate(all="ignore"):
            scaled = x.astype(compute) / s
        if _is_float_code(target):
            if saturate or target.name.startswith("float4"):   # to the largest finite code (NaN stays NaN)
                largest = _FLOAT_CODE_LARGEST[target.name]
                scaled = np.clip(scaled, -largest, largest)
            return [scaled.astype(target)]
        if target.name not in _INTEGER_RANGES:
            raise unsupported(op, f"quantizing to {target}")
        q = np.rint(scaled)
        if zero_point is not None:
            q = q + _broadcast(op, zero_point, x.shape, axis, block_size).astype(np.float64)
        return [_saturate(q, target)]
    return kernel


def _build_dequantize_linear(op, opset: int) -> Kernel:
    """DequantizeLinear: (x - zero_point) * scale, in float32, output in the scale's type (or output_dtype)."""
    axis = int(attribute(op, "axis", 1))
    block_size = int(attribute(op, "block_size", 0))
    code = int(attribute(op, "output_dtype", 0))

    def kernel(inputs):
        x, scale, zero_point = inputs[0], inputs[1], _optional(inputs, 2)
        target = _onnx_dtype(op, code) if code else scale.dtype
        compute = np.float64 if scale.dtype == np.float64 else np.float32
        s = _broadcast(op, scale, x.shape, axis, block_size).astype(compute)
        if _is_float_code(x.dtype):
            values = x.astype(compute)
        else:
            values = x.astype(np.int64)
            if zero_point is not None:
                values = values - _broadcast(op, zero_point, x.shape, axis, block_size).astype(np.int64)
            values = values.astype(compute)
        return [(values * s).astype(target)]
    return kernel


def _build_dynamic_quantize_linear(op, opset: int) -> Kernel:
    """DynamicQuantizeLinear: uint8 codes of x with the scale and zero point of its range widened to 0."""
    def kernel(inputs):
        x = inputs[0].astype(np.float32)
        low = np.float32(min(0.0, float(x.min()) if x.size else 0.0))
        high = np.float32(max(0.0, float(x.max()) if x.size else 0.0))
        scale = np.float32((high - low) / np.float32(255)) if high > low else np.float32(1)   # as onnxruntime
        zero_point = np.clip(np.rint(np.float32(0) - low / scale), 0, 255)
        q = np.rint(x / scale) + zero_point
        return [_saturate(q, np.dtype(np.uint8)), np.asarray(scale, np.float32),
                np.asarray(zero_point).astype(np.uint8)]
    return kernel


def _centered(values: np.ndarray, zero_point, shape) -> np.ndarray:
    """values - zero_point as float64 (exact for 8-bit codes)."""
    centered = values.astype(np.float64)
    if zero_point is not None:
        centered = centered - np.asarray(zero_point).astype(np.float64).reshape(shape)
    return centered


def _requantize(accumulator: np.ndarray, scale: np.ndarray, zero_point) -> np.ndarray:
    """saturate(round(float32(acc) * scale) + zero_point) in the zero point's type (uint8 without one)."""
    target = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    q = np.rint(accumulator.astype(np.float32) * scale.astype(np.float32)).astype(np.float64)
    if zero_point is not None:
        q += np.asarray(zero_point).astype(np.float64)
    return _saturate(q, target)


def _integer_convolution(op, opset: int):
    """(x - x_zero_point) convolved with (w - w_zero_point) (per output channel), exactly, as float64."""
    float_conv = conv.KERNELS["Conv"](op, opset)

    def convolve(x, x_zero_point, w, w_zero_point):
        channel = (-1,) + (1,) * (w.ndim - 1)
        x_zero_point = None if x_zero_point is None else np.asarray(x_zero_point).reshape(())
        return float_conv([_centered(x, x_zero_point, ()), _centered(w, w_zero_point, channel if
                                                                     np.size(w_zero_point) > 1 else ())])[0]
    return convolve


def _build_conv_integer(op, opset: int) -> Kernel:
    """ConvInteger: the int32 convolution of (x - x_zero_point) and (w - w_zero_point)."""
    convolve = _integer_convolution(op, opset)

    def kernel(inputs):
        x, w = inputs[0], inputs[1]
        y = convolve(x, _optional(inputs, 2), w, _optional(inputs, 3))
        return [y.astype(np.int32)]
    return kernel


def _build_qlinear_conv(op, opset: int) -> Kernel:
    """QLinearConv: the integer convolution plus the int32 bias, requantized by x_scale * w_scale / y_scale
    (per output channel when w_scale is)."""
    convolve = _integer_convolution(op, opset)

    def kernel(inputs):
        x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale = inputs[:7]
        y_zero_point, bias = _optional(inputs, 7), _optional(inputs, 8)
        accumulator = convolve(x, x_zero_point, w, w_zero_point)
        if bias is not None:
            accumulator = accumulator + bias.astype(np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))
        scale = (np.float32(np.asarray(x_scale).reshape(())) * np.asarray(w_scale, np.float32).reshape(-1)
                 / np.float32(np.asarray(y_scale).reshape(())))
        scale = scale.reshape((1, -1) + (1,) * (x.ndim - 2)) if scale.size > 1 else scale.reshape(())
        return [_requantize(accumulator, scale, y_zero_point)]
    return kernel


def _row_parameter(value, a: np.ndarray):
    """A per-tensor or per-row parameter of the left operand, shaped to broadcast against it."""
    if value is None or np.size(value) == 1:
        return None if value is None else np.asarray(value).reshape(())
    return np.asarray(value).reshape(np.asarray(value).shape + (1,)) if a.ndim >= 2 else np.asarray(value)


def _integer_product(a, a_zero_point, b, b_zero_point) -> np.ndarray:
    """(a - a_zero_point) @ (b - b_zero_point) exactly, as float64 (row / column zero points broadcast)."""
    left = _centered(a, _row_parameter(a_zero_point, a), ())
    right = b.astype(np.float64)
    if b_zero_point is not None:
        right = right - np.asarray(b_zero_point).astype(np.float64)
    return np.matmul(left, right)


def _build_matmul_integer(op, opset: int) -> Kernel:
    """MatMulInteger: int32 (A - a_zero_point) @ (B - b_zero_point)."""
    def kernel(inputs):
        return [_integer_product(inputs[0], _optional(inputs, 2), inputs[1], _optional(inputs, 3)).astype(np.int32)]
    return kernel


def _build_qlinear_matmul(op, opset: int) -> Kernel:
    """QLinearMatMul: the integer product requantized by a_scale * b_scale / y_scale (row / column scales)."""
    def kernel(inputs):
        a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale = inputs[:7]
        y_zero_point = _optional(inputs, 7)
        if _is_float_code(a.dtype) or _is_float_code(b.dtype):
            raise unsupported(op, "float8 operands (integer codes only)")
        accumulator = _integer_product(a, a_zero_point, b, b_zero_point)
        left = _row_parameter(np.asarray(a_scale, np.float32), a)
        scale = left * np.asarray(b_scale, np.float32) / np.float32(np.asarray(y_scale).reshape(()))
        return [_requantize(accumulator, np.asarray(scale, np.float32), y_zero_point)]
    return kernel


KERNELS: dict = {
    "QuantizeLinear": _build_quantize_linear,
    "DequantizeLinear": _build_dequantize_linear,
    "DynamicQuantizeLinear": _build_dynamic_quantize_linear,
    "ConvInteger": _build_conv_integer,
    "QLinearConv": _build_qlinear_conv,
    "MatMulInteger": _build_matmul_integer,
    "QLinearMatMul": _build_qlinear_matmul,
}
