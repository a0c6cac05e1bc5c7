"""Kernels of the activation family: Relu, Clip, the sigmoid/tanh family,
Softmax/LogSoftmax/Hardmax, Gelu and Shrink.

Outputs keep the input dtype.  Chains of numpy calls write into one fresh
buffer (``out=``) so that each kernel allocates about one array.
"""

from __future__ import annotations

import math

import numpy as np

from ._threads import num_threads, parallel_over
from .arithmetic import _erf_fast, blockwise, erfc
from .base import Kernel, attribute, by_opset, normalize_axis, unary, unsupported

_QUIET = dict(all="ignore")
_ROWS_BLOCK = 1 << 17   # elements per block of Softmax rows on the threads (fewer, longer numpy calls:
                         # ViT-S attention 13.9 -> 9.5 ms a layer against 2^15)


def _optional(inputs, index: int):
    """Input ``index`` or None when it is omitted (empty name or past the end)."""
    return inputs[index] if len(inputs) > index else None


def _relu(x: np.ndarray) -> np.ndarray:
    """Relu: max(x, 0); numpy's clip with two bounds is ~2x faster than maximum."""
    top = np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max
    return np.clip(x, x.dtype.type(0), x.dtype.type(top), out=np.empty_like(x))


def _build_clip_6(op, opset: int) -> Kernel:
    """Clip before opset 11: min(max(x, min), max) with the bounds as attributes."""
    low, high = attribute(op, "min", None), attribute(op, "max", None)
    return lambda inputs: [_clip(inputs[0], low, high)]


def _build_clip_11(op, opset: int) -> Kernel:
    """Clip since opset 11: the bounds are optional inputs."""
    return lambda inputs: [_clip(inputs[0], _optional(inputs, 1), _optional(inputs, 2))]


def _clip(x: np.ndarray, low, high) -> np.ndarray:
    if low is None and high is None:
        return x.copy()
    # bounds become scalars of x's dtype so that the result keeps it
    low = None if low is None else x.dtype.type(np.asarray(low).item())
    high = None if high is None else x.dtype.type(np.asarray(high).item())
    if low is not None and high is not None and low > high:
        low = high  # onnxruntime: min(max(x, low), high) is high everywhere
    return np.clip(x, low, high, out=np.empty_like(x))


def _build_leaky_relu(op, opset: int) -> Kernel:
    """LeakyRelu: x if x >= 0 else alpha * x."""
    alpha = float(attribute(op, "alpha", 0.01))

    def kernel(inputs):
        x = inputs[0]
        scaled = np.multiply(x, alpha, out=np.empty_like(x))
        if 0.0 <= alpha <= 1.0:  # then max(x, alpha x) picks the right branch
            return [np.maximum(x, scaled, out=scaled)]
        if alpha > 1.0:
            return [np.minimum(x, scaled, out=scaled)]
        return [np.where(x >= 0, x, scaled)]
    return kernel


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """PRelu: x if x >= 0 else slope * x, slope broadcast to x (branch-free, no np.where)."""
    out = np.multiply(x, slope, out=np.empty_like(x))
    if slope.size and 0 <= slope.min() and slope.max() <= 1:
        return np.maximum(x, out, out=out)  # slope x >= x exactly where x < 0
    # min(x, 0) * slope + max(x, 0): each term is exact, the other one is zero
    np.minimum(x, 0, out=out)
    out *= slope
    out += np.maximum(x, 0)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Sigmoid, block by block on the kernel threads (``blockwise``: the same values; a written-out SiLU's
    Sigmoid was 11% of a YOLOv8n's quantization time)."""
    return blockwise(x, _sigmoid_block, x.dtype)


def _sigmoid_block(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); exp overflowing to inf gives the right 0."""
    with np.errstate(**_QUIET):
        out = np.negative(x, out=np.empty_like(x))
        np.exp(out, out=out)
        out += 1
        return np.reciprocal(out, out=out)


def _build_hard_sigmoid(op, opset: int) -> Kernel:
    """HardSigmoid: clip(alpha * x + beta, 0, 1), alpha 0.2 and beta 0.5 by default."""
    alpha, beta = float(attribute(op, "alpha", 0.2)), float(attribute(op, "beta", 0.5))
    return lambda inputs: [_hard_sigmoid(inputs[0], alpha, beta)]


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    out = np.multiply(x, alpha, out=np.empty_like(x))
    out += beta
    return np.clip(out, 0, 1, out=out)


def _hard_swish(x: np.ndarray) -> np.ndarray:
    """HardSwish: x * HardSigmoid(x) with alpha 1/6, beta 0.5."""
    out = _hard_sigmoid(x, 1.0 / 6.0, 0.5)
    return np.multiply(out, x, out=out)


def _checked_axis(op, x: np.ndarray, axis: int) -> int:
    if not -x.ndim <= axis < max(x.ndim, 1):
        raise unsupported(op, f"axis {axis} is out of range for rank {x.ndim}")
    return normalize_axis(axis, x.ndim)


def _build_softmax_1(op, opset: int) -> Kernel:
    """(Log)Softmax before opset 13: x coerced to 2-D at ``axis`` (default 1), normalized over every axis
    from ``axis`` on."""
    axis = int(attribute(op, "axis", 1))
    return _softmax_kernel(op, lambda x: tuple(range(_checked_axis(op, x, axis), x.ndim)))


def _build_softmax_13(op, opset: int) -> Kernel:
    """(Log)Softmax since opset 13: normalized over the single ``axis`` (default -1)."""
    axis = int(attribute(op, "axis", -1))
    return _softmax_kernel(op, lambda x: _checked_axis(op, x, axis))


def _softmax_kernel(op, axes_of) -> Kernel:
    if op.type == "Hardmax":
        return _hardmax_kernel(axes_of)
    """exp(x - max) / sum(exp(x - max)) over ``axes_of(x)``; LogSoftmax: x - max - log(sum(exp(x - max)))."""
    log = op.type == "LogSoftmax"

    def normalize(x, out, axes):
        with np.errstate(**_QUIET):
            shifted = np.subtract(x, np.max(x, axis=axes, keepdims=True), out=out)
            if log:
                total = np.sum(np.exp(shifted), axis=axes, keepdims=True)
                shifted -= np.log(total, out=total)
                return
            np.exp(shifted, out=shifted)
            shifted /= np.sum(shifted, axis=axes, keepdims=True)

    def kernel(inputs):
        x = inputs[0]
        axes = axes_of(x)
        out = np.empty_like(x)
        last = axes in (x.ndim - 1, -1, (x.ndim - 1,))
        if not last or x.size < 2 * _ROWS_BLOCK or num_threads() < 2 or not x.flags.c_contiguous:
            normalize(x, out, axes)
            return [out]
        # rows along the last axis are independent: blocks of them on the kernel threads, in cache
        rows, flat_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
        step = max(1, _ROWS_BLOCK // max(x.shape[-1], 1))
        parallel_over(lambda start: normalize(rows[start:start + step], flat_out[start:start + step], -1),
                      range(0, rows.shape[0], step))
        return [out]
    return kernel


def _hardmax_kernel(axes_of) -> Kernel:
    """Hardmax: 1 at the first largest value over ``axes_of(x)`` (trailing axes, or one axis), 0 elsewhere."""

    def kernel(inputs):
        x = inputs[0]
        axes = axes_of(x)
        axes = tuple(axes) if isinstance(axes, tuple) else (axes,)
        moved = np.moveaxis(x, axes, range(x.ndim - len(axes), x.ndim))
        flat = moved.reshape(*moved.shape[:x.ndim - len(axes)], -1)
        result = np.zeros_like(flat)
        if flat.size:
            np.put_along_axis(result, np.argmax(flat, axis=-1)[..., None], 1, axis=-1)
        return [np.moveaxis(result.reshape(moved.shape), range(x.ndim - len(axes), x.ndim), axes)]
    return kernel


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _build_gelu(op, opset: int) -> Kernel:
    """Gelu: 0.5 x (1 + erf(x / sqrt 2)); 'tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    approximate = attribute(op, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise unsupported(op, f"approximate={approximate!r} (expected 'none' or 'tanh')")
    return lambda inputs: [_gelu_tanh(inputs[0]) if approximate == "tanh" else _gelu(inputs[0])]


def _gelu(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float64:  # 0.5 x erfc(-x / sqrt 2): no cancellation for x << 0
        out = erfc(x * -math.sqrt(0.5))
        out *= x
        out *= 0.5
        return out
    return blockwise(x, _gelu_block, x.dtype)


def _gelu_block(x: np.ndarray) -> np.ndarray:
    out = _erf_fast(x, math.sqrt(0.5))
    out += 1.0
    out *= x
    out *= 0.5
    return out


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    out = np.multiply(x, x, out=np.empty_like(x))
    out *= x
    out *= 0.044715
    out += x
    out *= _SQRT_2_OVER_PI
    np.tanh(out, out=out)
    out += 1
    out *= x
    out *= 0.5
    return out


def _build_elu(op, opset: int) -> Kernel:
    """Elu: x if x > 0 else alpha (exp(x) - 1); Selu scales it by gamma."""
    selu = op.type == "Selu"
    alpha = float(attribute(op, "alpha", 1.67326319217681884765625 if selu else 1.0))
    gamma = float(attribute(op, "gamma", 1.05070102214813232421875)) if selu else 1.0
    return lambda inputs: [_elu(inputs[0], alpha, 1.0, gamma)]


def _elu(x: np.ndarray, alpha: float, divisor: float, gamma: float) -> np.ndarray:
    """max(x, 0) + alpha expm1(min(x, 0) / divisor), times gamma: branch-free, each term exact."""
    out = np.minimum(x, 0, out=np.empty_like(x))
    if divisor != 1.0:
        out /= divisor
    np.expm1(out, out=out)
    out *= alpha
    out += np.maximum(x, 0)
    if gamma != 1.0:
        out *= gamma
    return out


def _build_celu(op, opset: int) -> Kernel:
    """Celu: max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    alpha = float(attribute(op, "alpha", 1.0))
    return lambda inputs: [_elu(inputs[0], alpha, alpha, 1.0)]


def _softplus(x: np.ndarray) -> np.ndarray:
    """Softplus: log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), which cannot overflow."""
    out = np.abs(x, out=np.empty_like(x))
    np.negative(out, out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)
    out += np.maximum(x, 0)
    return out


def _mish(x: np.ndarray) -> np.ndarray:
    """Mish: x tanh(softplus(x))."""
    out = _softplus(x)
    np.tanh(out, out=out)
    return np.multiply(out, x, out=out)


def _softsign(x: np.ndarray) -> np.ndarray:
    """Softsign: x / (1 + |x|)."""
    out = np.abs(x, out=np.empty_like(x))
    out += 1
    return np.divide(x, out, out=out)


def _build_thresholded_relu(op, opset: int) -> Kernel:
    """ThresholdedRelu: x if x > alpha else 0."""
    alpha = float(attribute(op, "alpha", 1.0))
    return lambda inputs: [np.where(inputs[0] > alpha, inputs[0], np.zeros((), inputs[0].dtype))]


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=np.empty_like(x))


def _build_shrink(op, opset: int) -> Kernel:
    """Shrink: x - bias where x > lambd, x + bias where x < -lambd, 0 elsewhere (integers computed in
    float64 and converted back)."""
    lambd, bias = float(attribute(op, "lambd", 0.5)), float(attribute(op, "bias", 0.0))

    def kernel(inputs):
        x = inputs[0]
        xs = x if x.dtype.kind == "f" else x.astype(np.float64)
        y = np.where(xs < -lambd, xs + bias, np.where(xs > lambd, xs - bias, 0))
        return [np.asarray(y).astype(x.dtype, copy=False)]
    return kernel


def _build_prelu(op, opset: int) -> Kernel:
    return lambda inputs: [_prelu(inputs[0], inputs[1])]


KERNELS: dict = {
    "Relu": unary(_relu),
    "Clip": by_opset({6: _build_clip_6, 11: _build_clip_11}),
    "LeakyRelu": _build_leaky_relu,
    "PRelu": _build_prelu,
    "Sigmoid": unary(_sigmoid),
    "HardSigmoid": _build_hard_sigmoid,
    "HardSwish": unary(_hard_swish),
    "Tanh": unary(_tanh),
    "Softmax": by_opset({1: _build_softmax_1, 13: _build_softmax_13}),
    "LogSoftmax": by_opset({1: _build_softmax_1, 13: _build_softmax_13}),
    "Hardmax": by_opset({1: _build_softmax_1, 13: _build_softmax_13}),
    "Gelu": _build_gelu,
    "Elu": _build_elu,
    "Selu": _build_elu,
    "Celu": _build_celu,
    "Softplus": unary(_softplus),
    "Softsign": unary(_softsign),
    "Mish": unary(_mish),
    "ThresholdedRelu": _build_thresholded_relu,
    "Shrink": _build_shrink,
}
