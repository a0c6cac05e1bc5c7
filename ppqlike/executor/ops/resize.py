"""Kernel of Resize (opsets 11-21): nearest, n-linear and cubic interpolation.

Interpolation is separable: each axis whose size or scale changes is resampled
in turn by gathering a few taps (precomputed index arrays) and summing them
with precomputed weights.  Coordinates are computed in float32 in the same
order as onnxruntime, so nearest-neighbour picks the same pixels.  As in
onnxruntime, axes with scale 1 are left alone (roi included) and an unchanged
shape returns the input.
"""

from __future__ import annotations

import numpy as np

from .base import attribute, normalize_axis, unsupported

_COORDINATE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                     "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_TIE_TOLERANCE = 1e-6


def _optional(inputs, index):
    """Input ``index``; None when omitted or an empty tensor."""
    value = inputs[index] if index < len(inputs) else None
    return None if value is None or np.size(value) == 0 else np.asarray(value)


def _original_coordinates(mode, out_len, in_len, scale, roi_start, roi_end):
    """Input-space coordinate (float32) of every output position along one axis."""
    x = np.arange(out_len, dtype=np.float32)
    s, length_out, length_in = np.float32(scale), np.float32(out_len), np.float32(in_len)
    if mode == "half_pixel":
        return (x + 0.5) / s - 0.5
    if mode == "asymmetric":
        return x / s
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / s - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / s
    if mode == "align_corners":
        return x * (length_in - 1) / (length_out - 1) if out_len > 1 else np.zeros_like(x)
    if mode == "half_pixel_symmetric":
        adjustment = length_out / (s * length_in)
        offset = length_in / 2 * (1 - adjustment)
        return offset + ((x + 0.5) / s - 0.5)
    # tf_crop_and_resize
    start, end = np.float32(roi_start), np.float32(roi_end)
    if out_len > 1:
        return start * (length_in - 1) + (x * (end - start) * (length_in - 1)) / (length_out - 1)
    return np.full_like(x, np.float32(0.5 * (float(start) + float(end)) * (in_len - 1)))


def _nearest_taps(original, in_len, nearest_mode):
    v = original.astype(np.float64)
    if nearest_mode in ("floor", "ceil"):
        index = np.floor(v) if nearest_mode == "floor" else np.ceil(v)
    else:
        # onnxruntime treats coordinates within 1e-6 of a half-integer as ties
        low = np.floor(v)
        tie = np.abs(v - low - 0.5) < _TIE_TOLERANCE
        index = np.where(tie, low + (nearest_mode == "round_prefer_ceil"), np.floor(v + 0.5))
    return np.clip(index, 0, in_len - 1).astype(np.int64)[None], None


def _linear_taps(original, in_len):
    x = np.clip(original, np.float32(0), np.float32(in_len - 1))
    low = np.minimum(x.astype(np.int64), in_len - 1)
    high = np.minimum(low + 1, in_len - 1)
    w_high = np.abs(x - low.astype(np.float32))
    w_low = np.abs(x - high.astype(np.float32))
    same = low == high
    w_low[same] = w_high[same] = 0.5
    return np.stack([low, high]), np.stack([w_low, w_high])


def _cubic_taps(original, in_len, a, exclude_outside):
    base = np.floor(original)
    s = (original - base).astype(np.float32)  # coefficients in float32, as onnxruntime computes them
    a = np.float32(a)
    weights = np.stack([
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a + 2) * (1 - s) - (a + 3)) * (1 - s) * (1 - s) + 1,
        ((a * (2 - s) - 5 * a) * (2 - s) + 8 * a) * (2 - s) - 4 * a])
    taps = base.astype(np.int64)[None] + np.arange(-1, 3)[:, None]
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= in_len), np.float32(0), weights)
        weights = weights / weights.sum(axis=0, keepdims=True)
    return np.clip(taps, 0, in_len - 1), weights


def _resample(y, axis, taps, weights):
    """Sum over taps of ``y`` gathered along ``axis`` times the tap weights."""
    if weights is None:
        return np.take(y, taps[0], axis=axis)
    shape = [1] * y.ndim
    shape[axis] = -1
    total = None
    for index, weight in zip(taps, weights):
        term = np.take(y, index, axis=axis) * weight.reshape(shape)
        total = term if total is None else total + term
    return total


def _bilinear_axes(scale):
    """The two axes onnxruntime's bilinear kernel runs on, or None (then it is not bilinear)."""
    rank = len(scale)
    if rank == 2:
        return 0, 1
    if rank == 3 and scale[0] == 1:
        return 1, 2
    if rank == 4 and scale[0] == 1 and (scale[1] == 1 or scale[3] == 1):
        return (2, 3) if scale[1] == 1 else (1, 2)
    return None


def _bilinear(x, rows, cols):
    """Bilinear in float32 summed in onnxruntime's order (exact for integer inputs)."""
    (ay, y_taps, y_weights), (ax, x_taps, x_weights) = rows, cols
    shape_y, shape_x = [1] * x.ndim, [1] * x.ndim
    shape_y[ay], shape_x[ax] = -1, -1
    total = None
    for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)):
        weight = x_weights[j].reshape(shape_x) * y_weights[i].reshape(shape_y)
        picked = np.take(np.take(x, y_taps[i], axis=ay), x_taps[j], axis=ax).astype(np.float32)
        total = weight * picked if total is None else total + weight * picked
    return total


def _geometry(in_shape, axes, scales, sizes, policy):
    """Output shape and float32 per-axis scales, computed as onnxruntime does."""
    out_shape, scale = list(in_shape), [np.float32(1.0)] * len(in_shape)
    if sizes is not None:
        sizes = [int(v) for v in sizes.reshape(-1)]
        if policy != "stretch":
            ratios = [np.float32(s) / np.float32(in_shape[a]) for a, s in zip(axes, sizes)]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(np.floor(float(common * np.float32(in_shape[a])) + 0.5)) for a in axes]
        for a, size in zip(axes, sizes):
            out_shape[a] = size
            scale[a] = common if policy != "stretch" else np.float32(size) / np.float32(in_shape[a])
    else:
        for a, value in zip(axes, scales.astype(np.float32).reshape(-1)):
            out_shape[a], scale[a] = int(value * np.float32(in_shape[a])), value
    return out_shape, scale


def _build_resize(op, opset):
    mode = attribute(op, "mode", "nearest")
    coordinate_mode = attribute(op, "coordinate_transformation_mode", "half_pixel")
    nearest_mode = attribute(op, "nearest_mode", "round_prefer_floor")
    cubic_a = float(attribute(op, "cubic_coeff_a", -0.75))
    exclude_outside = int(attribute(op, "exclude_outside", 0))
    extrapolation = float(attribute(op, "extrapolation_value", 0.0))
    antialias = int(attribute(op, "antialias", 0)) if opset >= 18 else 0
    policy = attribute(op, "keep_aspect_ratio_policy", "stretch") if opset >= 18 else "stretch"
    axes_attribute = attribute(op, "axes", None) if opset >= 18 else None
    if mode not in ("nearest", "linear", "cubic"):
        raise unsupported(op, f"mode {mode!r}")
    if coordinate_mode not in _COORDINATE_MODES or (coordinate_mode == "half_pixel_symmetric" and opset < 19):
        raise unsupported(op, f"coordinate_transformation_mode {coordinate_mode!r} at opset {opset}")
    if mode == "nearest" and nearest_mode not in _NEAREST_MODES:
        raise unsupported(op, f"nearest_mode {nearest_mode!r}")
    if antialias:
        raise unsupported(op, "antialias=1 is not implemented")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise unsupported(op, f"keep_aspect_ratio_policy {policy!r}")

    def kernel(inputs):
        x = inputs[0]
        rank = x.ndim
        roi, scales, sizes = (_optional(inputs, i) for i in (1, 2, 3))
        axes = list(range(rank)) if axes_attribute is None else \
            [normalize_axis(int(a), rank) for a in axes_attribute]
        if sizes is None and scales is None:
            raise unsupported(op, "needs either non-empty scales or sizes")
        out_shape, scale = _geometry(x.shape, axes, scales, sizes, policy)
        roi_start, roi_end = [0.0] * rank, [1.0] * rank
        if roi is not None and coordinate_mode == "tf_crop_and_resize":
            roi = roi.astype(np.float32).reshape(-1)
            n = len(axes)
            for i, a in enumerate(axes):
                roi_start[a], roi_end[a] = roi[i], roi[i + n]
        if out_shape == list(x.shape):
            return [x]  # onnxruntime copies the input whenever the shape is unchanged
        plans, mask = [], None
        for a in range(rank):
            if scale[a] == 1:
                continue
            original = _original_coordinates(coordinate_mode, out_shape[a], x.shape[a], scale[a],
                                             roi_start[a], roi_end[a])
            if mode == "nearest":
                plans.append((a, *_nearest_taps(original, x.shape[a], nearest_mode)))
            elif mode == "linear":
                plans.append((a, *_linear_taps(original, x.shape[a])))
            else:
                plans.append((a, *_cubic_taps(original, x.shape[a], cubic_a, exclude_outside)))
            if coordinate_mode == "tf_crop_and_resize":
                shape = [1] * rank
                shape[a] = -1
                outside = ((original < 0) | (original > x.shape[a] - 1)).reshape(shape)
                mask = outside if mask is None else mask | outside
        floating = np.issubdtype(x.dtype, np.floating)
        pair = _bilinear_axes(scale) if mode == "linear" and not floating else None
        if pair is not None:  # integers: replicate onnxruntime's bilinear rounding exactly
            by_axis = {a: (a, taps, weights) for a, taps, weights in plans}
            y = _bilinear(x, *(by_axis.get(a) or (a, *_linear_taps(np.arange(x.shape[a], dtype=np.float32),
                                                                     x.shape[a])) for a in pair))
        else:
            y = x if mode == "nearest" or floating else x.astype(np.float32)
            for a, taps, weights in plans:
                y = _resample(y, a, taps, weights)
        if mask is not None and mask.any():
            y = np.where(mask, np.asarray(extrapolation).astype(y.dtype), y)
        if y.dtype != x.dtype:
            if not floating:
                info = np.iinfo(x.dtype)
                y = np.clip(np.trunc(y), info.min, info.max)  # onnxruntime truncates
            y = y.astype(x.dtype)
        return [y]
    return kernel


KERNELS: dict = {
    "Resize": _build_resize,
}
