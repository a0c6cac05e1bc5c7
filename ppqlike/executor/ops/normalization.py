"""Kernels of the normalization family: BatchNormalization (inference),
LayerNormalization, InstanceNormalization, GroupNormalization, RMSNormalization,
LpNormalization, MeanVarianceNormalization and LRN.

BatchNormalization folds its four parameters into one scale and one shift per
channel (computed in float64, then cast) and makes two passes over the data.
Training mode is not supported: the executor only runs inference.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, by_opset, normalize_axis, unsupported


def _channel_shape(x: np.ndarray) -> tuple:
    return (x.shape[1],) + (1,) * (x.ndim - 2)


def _build_batch_normalization(op, opset: int) -> Kernel:
    epsilon = float(attribute(op, "epsilon", 1e-5))
    if int(attribute(op, "training_mode", 0)):
        raise unsupported(op, "training_mode=1 (the executor runs inference only)")
    if int(attribute(op, "spatial", 1)) != 1:
        raise unsupported(op, "spatial=0 (per-element statistics)")
    if sum(1 for v in op.outputs[1:] if v is not None) > 0:
        raise unsupported(op, "running mean/variance outputs (training mode)")

    def kernel(inputs):
        x, scale, bias, mean, var = inputs[:5]
        if x.ndim < 2:
            raise unsupported(op, f"an input of rank {x.ndim} (need [N, C, ...])")
        shape = _channel_shape(x)
        factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
        shift = bias.astype(np.float64) - mean.astype(np.float64) * factor
        y = np.multiply(x, factor.astype(x.dtype).reshape(shape))
        np.add(y, shift.astype(x.dtype).reshape(shape), out=y)
        return [y]
    return kernel


def _build_layer_normalization(op, opset: int) -> Kernel:
    axis_attr = int(attribute(op, "axis", -1))
    epsilon = float(attribute(op, "epsilon", 1e-5))
    stash_type = int(attribute(op, "stash_type", 1))
    if stash_type not in (1, 11):
        raise unsupported(op, f"stash_type {stash_type} (float or double statistics only)")
    n_outputs = len(op.outputs)

    def kernel(inputs):
        x, scale = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        axis = normalize_axis(axis_attr, x.ndim)
        if not 0 <= axis < x.ndim:
            raise unsupported(op, f"axis {axis_attr} for an input of rank {x.ndim}")
        axes = tuple(range(axis, x.ndim))
        stash = np.float64 if (stash_type == 11 or x.dtype == np.float64) else np.float32
        xs = x.astype(stash, copy=False)
        mean = xs.mean(axis=axes, keepdims=True)
        centered = xs - mean
        variance = np.mean(np.square(centered), axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(variance + stash(epsilon))
        y = centered
        np.multiply(y, inv_std, out=y)
        np.multiply(y, scale.astype(stash, copy=False), out=y)
        if bias is not None:
            np.add(y, bias.astype(stash, copy=False), out=y)
        outputs = [y.astype(x.dtype, copy=False)]
        statistic_type = np.float32 if stash_type == 1 else np.float64
        if n_outputs > 1:
            outputs.append(mean.astype(statistic_type, copy=False))
        if n_outputs > 2:
            outputs.append(inv_std.astype(statistic_type, copy=False))
        return outputs
    return kernel


def _build_instance_normalization(op, opset: int) -> Kernel:
    epsilon = float(attribute(op, "epsilon", 1e-5))

    def kernel(inputs):
        x, scale, bias = inputs[:3]
        if x.ndim < 3:
            raise unsupported(op, f"an input of rank {x.ndim} (need [N, C, spatial...])")
        compute = np.float64 if x.dtype == np.float64 else np.float32
        axes = tuple(range(2, x.ndim))
        xs = x.astype(compute, copy=False)
        mean = xs.mean(axis=axes, keepdims=True)
        centered = xs - mean
        variance = np.mean(np.square(centered), axis=axes, keepdims=True)
        shape = _channel_shape(x)
        factor = scale.astype(compute).reshape(shape) / np.sqrt(variance + compute(epsilon))
        np.multiply(centered, factor, out=centered)
        np.add(centered, bias.astype(compute).reshape(shape), out=centered)
        return [centered.astype(x.dtype, copy=False)]
    return kernel


def _stash_dtype(op, x: np.ndarray, stash_type: int):
    """The dtype statistics are computed in: float32 (stash_type 1) or float64 (11, or float64 data)."""
    if stash_type not in (1, 11):
        raise unsupported(op, f"stash_type {stash_type} (float or double statistics only)")
    return np.float64 if (stash_type == 11 or x.dtype == np.float64) else np.float32


def _group_normalization(op, per_group: bool) -> Kernel:
    """GroupNormalization: channels split into ``num_groups`` groups, each normalised over its channels
    and spatial positions; scale and bias per group (opset 18) or per channel (opset 21)."""
    groups = int(attribute(op, "num_groups"))
    epsilon = float(attribute(op, "epsilon", 1e-5))
    stash_type = int(attribute(op, "stash_type", 1))

    def kernel(inputs):
        x, scale, bias = inputs[:3]
        if x.ndim < 2 or x.shape[1] % groups:
            raise unsupported(op, f"an input of shape {list(x.shape)} for {groups} groups "
                                  "(need [N, C, ...] with C a multiple of num_groups)")
        stash = _stash_dtype(op, x, stash_type)
        n, channels = x.shape[:2]
        grouped = x.astype(stash, copy=False).reshape(n, groups, -1)
        mean = grouped.mean(axis=2, keepdims=True)
        centered = grouped - mean
        variance = np.mean(np.square(centered), axis=2, keepdims=True)
        centered /= np.sqrt(variance + stash(epsilon))
        y = centered.reshape(x.shape)
        if per_group:
            scale = np.repeat(scale.reshape(-1), channels // groups)
            bias = np.repeat(bias.reshape(-1), channels // groups)
        shape = _channel_shape(x)
        y = y * scale.astype(stash).reshape(shape) + bias.astype(stash).reshape(shape)
        return [y.astype(x.dtype, copy=False)]
    return kernel


def _build_group_normalization_18(op, opset: int) -> Kernel:
    return _group_normalization(op, per_group=True)


def _build_group_normalization_21(op, opset: int) -> Kernel:
    return _group_normalization(op, per_group=False)


def _build_rms_normalization(op, opset: int) -> Kernel:
    """RMSNormalization: x / sqrt(mean(x^2) + epsilon) * scale over the axes from ``axis`` on."""
    axis_attr = int(attribute(op, "axis", -1))
    epsilon = float(attribute(op, "epsilon", 1e-5))
    stash_type = int(attribute(op, "stash_type", 1))

    def kernel(inputs):
        x, scale = inputs[0], inputs[1]
        if not -x.ndim <= axis_attr < x.ndim:
            raise unsupported(op, f"axis {axis_attr} for an input of rank {x.ndim}")
        stash = _stash_dtype(op, x, stash_type)
        axes = tuple(range(normalize_axis(axis_attr, x.ndim), x.ndim))
        xs = x.astype(stash, copy=False)
        mean_square = np.mean(np.square(xs), axis=axes, keepdims=True)
        y = xs / np.sqrt(mean_square + stash(epsilon))
        y *= scale.astype(stash, copy=False)
        return [y.astype(x.dtype, copy=False)]
    return kernel


def _build_lp_normalization(op, opset: int) -> Kernel:
    """LpNormalization: x divided by its L1 or L2 norm along ``axis`` (a zero norm leaves zeros)."""
    axis = int(attribute(op, "axis", -1))
    p = int(attribute(op, "p", 2))
    if p not in (1, 2):
        raise unsupported(op, f"p={p} (1 or 2)")

    def kernel(inputs):
        x = inputs[0]
        a = normalize_axis(axis, x.ndim)
        if p == 1:
            norm = np.sum(np.abs(x), axis=a, keepdims=True)
        else:
            norm = np.sqrt(np.sum(np.square(x), axis=a, keepdims=True))
        with np.errstate(all="ignore"):
            y = np.divide(x, norm, out=np.zeros_like(x), where=norm != 0)
        return [y]
    return kernel


def _build_mean_variance_normalization(op, opset: int) -> Kernel:
    """MeanVarianceNormalization: (x - mean) / std over ``axes`` (default N and the spatial axes).

    As onnxruntime: no epsilon (the spec's function adds 1e-9 to std), so a constant slice gives NaN,
    and axes out of range are left out."""
    axes_attr = [int(a) for a in attribute(op, "axes", [0, 2, 3])]

    def kernel(inputs):
        x = inputs[0]
        axes = tuple(sorted({normalize_axis(a, x.ndim) for a in axes_attr if -x.ndim <= a < x.ndim}))
        compute = np.float64 if x.dtype == np.float64 else np.float32
        xs = x.astype(compute, copy=False)
        centered = xs - xs.mean(axis=axes, keepdims=True)
        std = np.sqrt(np.mean(np.square(centered), axis=axes, keepdims=True))
        with np.errstate(all="ignore"):
            return [(centered / std).astype(x.dtype, copy=False)]
    return kernel


def _build_lrn(op, opset: int) -> Kernel:
    """LRN: x / (bias + alpha / size * sum of x^2 over the ``size`` neighbouring channels) ** beta."""
    size = int(attribute(op, "size"))
    alpha = float(attribute(op, "alpha", 1e-4))
    beta = float(attribute(op, "beta", 0.75))
    bias = float(attribute(op, "bias", 1.0))
    if size < 1:
        raise unsupported(op, f"size {size} (must be positive)")
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2

    def kernel(inputs):
        x = inputs[0]
        if x.ndim < 3:
            raise unsupported(op, f"an input of rank {x.ndim} (need [N, C, spatial...])")
        compute = np.float64 if x.dtype == np.float64 else np.float32
        square = np.square(x.astype(compute))
        padded = np.pad(square, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
        running = np.cumsum(padded, axis=1, dtype=np.float64)
        running = np.concatenate([np.zeros_like(running[:, :1]), running], axis=1)
        window = (running[:, size:] - running[:, :-size]).astype(compute)
        scale = bias + (alpha / size) * window
        return [(x / np.power(scale, beta)).astype(x.dtype, copy=False)]
    return kernel


KERNELS: dict = {
    "BatchNormalization": _build_batch_normalization,
    "LayerNormalization": _build_layer_normalization,
    "InstanceNormalization": _build_instance_normalization,
    "GroupNormalization": by_opset({18: _build_group_normalization_18, 21: _build_group_normalization_21}),
    "RMSNormalization": _build_rms_normalization,
    "LpNormalization": _build_lp_normalization,
    "MeanVarianceNormalization": _build_mean_variance_normalization,
    "LRN": _build_lrn,
}
