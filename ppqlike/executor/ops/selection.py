"""Kernels of the selection family: OneHot, Compress, ReverseSequence, CenterCropPad and Unique.

Ops that pick, reorder, crop or encode elements by position; values are never computed, only
moved (OneHot writes its two given values).  Index outputs are int64.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, normalize_axis, unsupported


def _scalar_int(array) -> int:
    return int(np.asarray(array).reshape(-1)[0])


def _build_one_hot(op, opset: int) -> Kernel:
    """OneHot: values[1] where the index along the new ``axis`` equals ``indices`` (negative ones count
    from ``depth``), values[0] elsewhere; indices out of range select nothing."""
    axis_attr = int(attribute(op, "axis", -1))

    def kernel(inputs):
        indices, depth_input, values = inputs[0], inputs[1], inputs[2]
        depth = int(np.asarray(depth_input).reshape(-1)[0])
        if depth < 1:
            raise unsupported(op, f"depth {depth} (must be positive)")
        rank = indices.ndim + 1
        if not -rank <= axis_attr < rank:
            raise unsupported(op, f"axis {axis_attr} for an output of rank {rank}")
        axis = normalize_axis(axis_attr, rank)
        index = np.asarray(indices).astype(np.int64)
        index = np.where(index < 0, index + depth, index)
        positions = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - 1 - axis))
        hot = np.expand_dims(index, axis) == positions
        off, on = np.asarray(values).reshape(-1)[:2]
        return [np.where(hot, on, off).astype(values.dtype, copy=False)]
    return kernel


def _build_compress(op, opset: int) -> Kernel:
    """Compress: the slices along ``axis`` (the flattened input without it) where ``condition`` is true;
    a condition shorter than the axis selects from its first entries only."""
    axis_attr = attribute(op, "axis", None)

    def kernel(inputs):
        x, condition = inputs[0], np.asarray(inputs[1]).reshape(-1).astype(bool)
        if axis_attr is None:
            return [np.compress(condition, x.reshape(-1))]
        axis = int(axis_attr)
        if not -x.ndim <= axis < x.ndim:
            raise unsupported(op, f"axis {axis} for an input of rank {x.ndim}")
        axis = normalize_axis(axis, x.ndim)
        if condition.size > x.shape[axis]:
            raise unsupported(op, f"a condition of {condition.size} entries for an axis of {x.shape[axis]}")
        return [np.compress(condition, x, axis=axis)]
    return kernel


def _build_reverse_sequence(op, opset: int) -> Kernel:
    """ReverseSequence: per batch entry b, the first sequence_lens[b] steps along the time axis reversed,
    the others left in place."""
    batch_axis = int(attribute(op, "batch_axis", 1))
    time_axis = int(attribute(op, "time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise unsupported(op, f"batch_axis {batch_axis} and time_axis {time_axis} (need 0 and 1)")

    def kernel(inputs):
        x, lengths = inputs[0], np.asarray(inputs[1]).astype(np.int64).reshape(-1)
        steps = x.shape[time_axis]
        if lengths.size != x.shape[batch_axis] or (lengths < 0).any() or (lengths > steps).any():
            raise unsupported(op, f"sequence_lens {lengths.tolist()} for {x.shape[batch_axis]} sequences "
                                  f"of {steps} steps")
        t = np.arange(steps, dtype=np.int64)[:, None]                      # [time, batch]
        source = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
        if batch_axis == 0:
            source = source.T
        source = source.reshape(source.shape + (1,) * (x.ndim - 2))
        return [np.take_along_axis(x, np.broadcast_to(source, x.shape), axis=time_axis)]
    return kernel


def _build_center_crop_pad(op, opset: int) -> Kernel:
    """CenterCropPad: each listed axis cropped (start at (size - target) // 2) or zero-padded (before:
    (target - size) // 2) to the target size."""
    axes_attr = attribute(op, "axes", None)

    def kernel(inputs):
        x, shape = inputs[0], [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        axes = list(range(x.ndim)) if axes_attr is None else [normalize_axis(int(a), x.ndim) for a in axes_attr]
        if len(axes) != len(shape):
            raise unsupported(op, f"shape {shape} for {len(axes)} axes")
        crop = [slice(None)] * x.ndim
        pads = [(0, 0)] * x.ndim
        for axis, target in zip(axes, shape):
            size = x.shape[axis]
            if target < size:
                start = (size - target) // 2
                crop[axis] = slice(start, start + target)
            elif target > size:
                before = (target - size) // 2
                pads[axis] = (before, target - size - before)
        y = x[tuple(crop)]
        return [np.pad(y, pads) if any(p != (0, 0) for p in pads) else y]
    return kernel


def _build_unique(op, opset: int) -> Kernel:
    """Unique: the distinct elements (or slices along ``axis``), sorted ascending or in order of first
    appearance, with the index of each one's first appearance, each input's position among them
    (inverse_indices) and the counts."""
    sort = bool(attribute(op, "sorted", 1))
    axis_attr = attribute(op, "axis", None)

    def kernel(inputs):
        x = inputs[0]
        axis = None if axis_attr is None else normalize_axis(int(axis_attr), x.ndim)
        data = x.reshape(-1) if axis is None else x
        values, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True,
                                                   return_counts=True, axis=axis if axis is not None else None)
        inverse = inverse.reshape(-1)
        if not sort:  # order of first appearance
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            values = np.take(values, order, axis=0 if axis is None else axis)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        return [values.astype(x.dtype, copy=False), first.astype(np.int64), inverse.astype(np.int64),
                counts.astype(np.int64)]
    return kernel


KERNELS: dict = {
    "OneHot": _build_one_hot,
    "Compress": _build_compress,
    "ReverseSequence": _build_reverse_sequence,
    "CenterCropPad": _build_center_crop_pad,
    "Unique": _build_unique,
}
