"""Kernels of the normalization family: BatchNormalization (inference),
LayerNormalization and InstanceNormalization.

BatchNormalization folds its four parameters into one scale and one shift per
channel (computed in float64, then cast) and makes two passes over the data.
Training mode is not supported: the executor only runs inference.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, normalize_axis, unsupported


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


KERNELS: dict = {
    "BatchNormalization": _build_batch_normalization,
    "LayerNormalization": _build_layer_normalization,
    "InstanceNormalization": _build_instance_normalization,
}
