"""Kernels of the detection family: NonMaxSuppression, RoiAlign (opsets 10 and 16), MaxRoiPool and
MaxUnpool.

NonMaxSuppression's output is an index list ([selected, 3] int64: batch, class, box); it is computed
in float32 like onnxruntime so that IoUs at the threshold decide alike.  RoiAlign follows
onnxruntime's sampling (adaptive grids, samples beyond one pixel outside the map count as zero) and
its max mode (the largest of the four weighted corner values of each sample).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, attribute, by_opset, unsupported


def _optional(inputs, index):
    return inputs[index] if index < len(inputs) else None


# ------------------------------------------------------------ NonMaxSuppression --
def _corners(boxes: np.ndarray, center_point_box: int):
    """(y_min, x_min, y_max, x_max, area) float32 arrays of [N, 4] boxes."""
    if center_point_box:
        xc, yc, w, h = (boxes[:, i] for i in range(4))
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        return yc - half_h, xc - half_w, yc + half_h, xc + half_w, w * h
    y_min, y_max = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
    x_min, x_max = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
    return y_min, x_min, y_max, x_max, (y_max - y_min) * (x_max - x_min)


def _select(corners, order: np.ndarray, limit: int, iou_threshold: np.float32) -> list[int]:
    """Greedy selection along ``order`` (best first): a box is kept unless its IoU with a kept box
    exceeds the threshold; at most ``limit`` boxes."""
    y0, x0, y1, x1, area = corners
    kept: list[int] = []
    remaining = order
    with np.errstate(all="ignore"):
        while remaining.size and len(kept) < limit:
            best, rest = remaining[0], remaining[1:]
            kept.append(int(best))
            width = np.minimum(x1[best], x1[rest]) - np.maximum(x0[best], x0[rest])
            height = np.minimum(y1[best], y1[rest]) - np.maximum(y0[best], y0[rest])
            intersection = width * height
            overlapping = (width > 0) & (height > 0) & (intersection > 0)
            iou = intersection / (area[best] + area[rest] - intersection)
            remaining = rest[~(overlapping & (iou > iou_threshold))]
    return kept


def _build_non_max_suppression(op, opset: int) -> Kernel:
    """NonMaxSuppression: per batch and class, the boxes kept by greedy IoU suppression in descending
    score order (ties: lower index first), at most max_output_boxes_per_class (0 or absent: none)."""
    center_point_box = int(attribute(op, "center_point_box", 0))
    if center_point_box not in (0, 1):
        raise unsupported(op, f"center_point_box {center_point_box} (0 or 1)")

    def kernel(inputs):
        boxes, scores = inputs[0].astype(np.float32), inputs[1].astype(np.float32)
        limit, iou, threshold = (_optional(inputs, i) for i in (2, 3, 4))
        limit = 0 if limit is None or np.size(limit) == 0 else max(int(np.asarray(limit).reshape(-1)[0]), 0)
        iou = np.float32(0) if iou is None or np.size(iou) == 0 else np.float32(np.asarray(iou).reshape(-1)[0])
        if not 0 <= iou <= 1:
            raise unsupported(op, f"iou_threshold {iou} (must be in [0, 1])")
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
                or scores.shape[2] != boxes.shape[1]:
            raise unsupported(op, f"boxes {list(boxes.shape)} and scores {list(scores.shape)} (need [B, N, 4] "
                                  "and [B, C, N])")
        selected = []
        for batch in range(boxes.shape[0] if limit else 0):
            corners = _corners(boxes[batch], center_point_box)
            for cls in range(scores.shape[1]):
                score = scores[batch, cls]
                candidates = np.arange(score.size)
                if threshold is not None and np.size(threshold):
                    candidates = candidates[score > np.float32(np.asarray(threshold).reshape(-1)[0])]
                order = candidates[np.argsort(-score[candidates], kind="stable")]
                selected += [(batch, cls, box) for box in _select(corners, order, limit, iou)]
        return [np.array(selected, dtype=np.int64).reshape(-1, 3)]
    return kernel


# --------------------------------------------------------------------- RoiAlign --
def _sample_axis(start, bin_size, pooled: int, grid: int, size: int, dtype):
    """Per sample along one axis ([pooled * grid]): low and high pixel, the weight of the high one,
    and whether the sample lies inside [-1, size]."""
    p = np.repeat(np.arange(pooled), grid).astype(dtype)
    i = np.tile(np.arange(grid), pooled).astype(dtype)
    position = (start + p * bin_size + (i + dtype(0.5)) * bin_size / dtype(grid)).astype(dtype)
    inside = (position >= -1.0) & (position <= size)
    position = np.maximum(position, dtype(0))
    low = np.floor(position).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    fraction = np.where(at_edge, dtype(0), position - low.astype(dtype)).astype(dtype)
    return low, high, fraction, inside


def _roi_align(op, half_pixel: bool) -> Kernel:
    mode = attribute(op, "mode", "avg")
    if mode not in ("avg", "max"):
        raise unsupported(op, f"mode {mode!r} ('avg' or 'max')")
    out_h, out_w = int(attribute(op, "output_height", 1)), int(attribute(op, "output_width", 1))
    sampling_ratio = int(attribute(op, "sampling_ratio", 0))
    spatial_scale = float(attribute(op, "spatial_scale", 1.0))

    def kernel(inputs):
        x, rois, batch_indices = inputs[0], inputs[1], np.asarray(inputs[2]).astype(np.int64).reshape(-1)
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or rois.shape[0] != batch_indices.size:
            raise unsupported(op, f"X {list(x.shape)}, rois {list(rois.shape)}, batch_indices "
                                  f"{batch_indices.size} (need [N, C, H, W], [R, 4], [R])")
        dtype = x.dtype.type
        height, width = x.shape[2:]
        y = np.zeros((rois.shape[0], x.shape[1], out_h, out_w), x.dtype)
        offset = dtype(0.5) if half_pixel else dtype(0)
        for r, (roi, b) in enumerate(zip(rois.astype(x.dtype), batch_indices)):
            x0, y0, x1, y1 = (roi * dtype(spatial_scale) - offset).astype(x.dtype)
            roi_w, roi_h = x1 - x0, y1 - y0
            if not half_pixel:   # malformed rois forced to 1 x 1
                roi_w, roi_h = max(roi_w, dtype(1)), max(roi_h, dtype(1))
            bin_h, bin_w = dtype(roi_h / dtype(out_h)), dtype(roi_w / dtype(out_w))
            grid_h = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_h / dtype(out_h)))
            grid_w = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_w / dtype(out_w)))
            if grid_h < 1 or grid_w < 1:
                continue   # no samples: zeros (onnxruntime's empty average)
            ylo, yhi, ly, yin = _sample_axis(y0, bin_h, out_h, grid_h, height, dtype)
            xlo, xhi, lx, xin = _sample_axis(x0, bin_w, out_w, grid_w, width, dtype)
            hy, hx = (dtype(1) - ly) * yin, (dtype(1) - lx) * xin
            ly, lx = ly * yin, lx * xin
            plane = x[b]
            terms = [(hy[:, None] * hx[None, :]) * plane[:, ylo[:, None], xlo[None, :]],
                     (hy[:, None] * lx[None, :]) * plane[:, ylo[:, None], xhi[None, :]],
                     (ly[:, None] * hx[None, :]) * plane[:, yhi[:, None], xlo[None, :]],
                     (ly[:, None] * lx[None, :]) * plane[:, yhi[:, None], xhi[None, :]]]
            shape = (x.shape[1], out_h, grid_h, out_w, grid_w)
            if mode == "avg":
                total = (terms[0] + terms[1] + terms[2] + terms[3]).reshape(shape)
                y[r] = total.sum(axis=(2, 4)) / dtype(grid_h * grid_w)
            else:
                y[r] = np.maximum(np.maximum(terms[0], terms[1]), np.maximum(terms[2], terms[3])) \
                    .reshape(shape).max(axis=(2, 4))
        return [y]
    return kernel


def _build_roi_align_10(op, opset: int) -> Kernel:
    """RoiAlign before opset 16: pixel-corner coordinates ('output_half_pixel')."""
    return _roi_align(op, half_pixel=False)


def _build_roi_align_16(op, opset: int) -> Kernel:
    """RoiAlign since opset 16: coordinate_transformation_mode, 'half_pixel' by default."""
    mode = attribute(op, "coordinate_transformation_mode", "half_pixel")
    if mode not in ("half_pixel", "output_half_pixel"):
        raise unsupported(op, f"coordinate_transformation_mode {mode!r}")
    return _roi_align(op, half_pixel=mode == "half_pixel")


# ------------------------------------------------------------------- MaxRoiPool --
def _build_max_roi_pool(op, opset: int) -> Kernel:
    """MaxRoiPool: the maximum of each of pooled_shape bins of each roi ([batch, x1, y1, x2, y2], scaled
    and rounded half away from zero, at least 1 x 1); empty bins give 0."""
    pooled_h, pooled_w = (int(v) for v in attribute(op, "pooled_shape"))
    scale = float(attribute(op, "spatial_scale", 1.0))

    def kernel(inputs):
        x, rois = inputs[0], inputs[1]
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
            raise unsupported(op, f"X {list(x.shape)} and rois {list(rois.shape)} (need [N, C, H, W], [R, 5])")
        height, width = x.shape[2:]
        y = np.zeros((rois.shape[0], x.shape[1], pooled_h, pooled_w), x.dtype)
        for r, roi in enumerate(rois.astype(np.float32)):
            batch = int(roi[0])
            if not 0 <= batch < x.shape[0]:
                raise unsupported(op, f"roi {r} names batch {batch} of {x.shape[0]}")
            x0, y0, x1, y1 = (int(np.sign(v) * np.floor(abs(v) + 0.5)) for v in roi[1:] * np.float32(scale))
            bin_h = np.float32(max(y1 - y0 + 1, 1)) / np.float32(pooled_h)
            bin_w = np.float32(max(x1 - x0 + 1, 1)) / np.float32(pooled_w)
            for ph in range(pooled_h):
                h0 = min(max(int(np.floor(np.float32(ph) * bin_h)) + y0, 0), height)
                h1 = min(max(int(np.ceil(np.float32(ph + 1) * bin_h)) + y0, 0), height)
                for pw in range(pooled_w):
                    w0 = min(max(int(np.floor(np.float32(pw) * bin_w)) + x0, 0), width)
                    w1 = min(max(int(np.ceil(np.float32(pw + 1) * bin_w)) + x0, 0), width)
                    if h1 > h0 and w1 > w0:
                        y[r, :, ph, pw] = x[batch, :, h0:h1, w0:w1].max(axis=(1, 2))
        return [y]
    return kernel


# -------------------------------------------------------------------- MaxUnpool --
def _build_max_unpool(op, opset: int) -> Kernel:
    """MaxUnpool: zeros with each value of X written at its flat index (over the whole output, as
    MaxPool's Indices count) in an output of output_shape or of the size MaxPool came from."""
    kernel_shape = [int(k) for k in attribute(op, "kernel_shape")]
    spatial = len(kernel_shape)
    pads = [int(p) for p in attribute(op, "pads", [0] * 2 * spatial)]
    strides = [int(s) for s in attribute(op, "strides", [1] * spatial)]

    def kernel(inputs):
        x, indices, shape = inputs[0], np.asarray(inputs[1]).astype(np.int64), _optional(inputs, 2)
        if shape is not None and np.size(shape):
            out_shape = [int(d) for d in np.asarray(shape).reshape(-1)]
        else:
            out_shape = list(x.shape[:2]) + [(d - 1) * s + k - pads[i] - pads[i + spatial]
                                             for i, (d, s, k) in enumerate(zip(x.shape[2:], strides, kernel_shape))]
        y = np.zeros(int(np.prod(out_shape)), x.dtype)
        if indices.size and (indices.min() < 0 or indices.max() >= y.size):
            raise unsupported(op, f"indices outside an output of {y.size} elements")
        y[indices.reshape(-1)] = x.reshape(-1)
        return [y.reshape(out_shape)]
    return kernel


KERNELS: dict = {
    "NonMaxSuppression": _build_non_max_suppression,
    "RoiAlign": by_opset({10: _build_roi_align_10, 16: _build_roi_align_16}),
    "MaxRoiPool": _build_max_roi_pool,
    "MaxUnpool": _build_max_unpool,
}
