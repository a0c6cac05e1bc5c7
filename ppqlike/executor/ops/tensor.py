"""Kernels of the tensor (layout) family: Reshape, Transpose, Slice, Pad, Shape, ...

Layout kernels return numpy views wherever numpy allows; kernels never write
into their inputs, so a view of a parameter is safe.
"""

from __future__ import annotations

import numpy as np

from ._conv_channels_last import is_channels_last
from .base import attribute, by_opset, normalize_axis, unsupported


def optional(inputs, index):
    """Input ``index``, or None when it is omitted (trailing omitted inputs are dropped)."""
    return inputs[index] if index < len(inputs) else None


def ints(array) -> list:
    """A 1-D integer array (or scalar) as a list of Python ints."""
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _axis_slice(rank: int, axis: int, index) -> tuple:
    return (slice(None),) * axis + (index,) + (slice(None),) * (rank - axis - 1)


# ---------------------------------------------------------------- reshaping --
def _reshape(op, opset):
    allowzero = int(attribute(op, "allowzero", 0))

    def kernel(inputs):
        data = inputs[0]
        shape = ints(inputs[1])
        if not allowzero:
            shape = [data.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return [data.reshape(shape)]
    return kernel


def _flatten(op, opset):
    axis = int(attribute(op, "axis", 1))

    def kernel(inputs):
        data = inputs[0]
        a = normalize_axis(axis, data.ndim)
        outer = int(np.prod(data.shape[:a], dtype=np.int64))
        inner = int(np.prod(data.shape[a:], dtype=np.int64))
        return [data.reshape(outer, inner)]
    return kernel


def _transpose(op, opset):
    perm = attribute(op, "perm", None)
    perm = None if perm is None else [int(p) for p in perm]
    return lambda inputs: [np.transpose(inputs[0], perm)]


def _axes_attribute(op, inputs):
    """Squeeze/Unsqueeze before opset 13: axes from the attribute (None when absent)."""
    axes = attribute(op, "axes", None)
    return None if axes is None else ints(axes)


def _axes_input(op, inputs):
    """Squeeze/Unsqueeze since opset 13: axes from the optional second input (None when absent)."""
    axes = optional(inputs, 1)
    return None if axes is None else ints(axes)


def _squeeze_with(axes_of):
    def build(op, opset):
        def kernel(inputs):
            data = inputs[0]
            axes = axes_of(op, inputs)
            if axes is None:
                axes = [i for i, d in enumerate(data.shape) if d == 1]
            return [np.squeeze(data, tuple(normalize_axis(a, data.ndim) for a in axes))]
        return kernel
    return build


def _unsqueeze_with(axes_of):
    def build(op, opset):
        def kernel(inputs):
            data, axes = inputs[0], axes_of(op, inputs)
            rank = data.ndim + len(axes)
            return [np.expand_dims(data, tuple(normalize_axis(a, rank) for a in axes))]
        return kernel
    return build


_squeeze_1, _squeeze_13 = _squeeze_with(_axes_attribute), _squeeze_with(_axes_input)
_unsqueeze_1, _unsqueeze_13 = _unsqueeze_with(_axes_attribute), _unsqueeze_with(_axes_input)


# ----------------------------------------------------------- joining/splitting --
def _concat(op, opset):
    axis = int(attribute(op, "axis"))

    def kernel(inputs):
        arrays = [a for a in inputs if a is not None]
        along = normalize_axis(axis, arrays[0].ndim)
        if arrays[0].ndim == 4 and along == 1 and all(is_channels_last(a) and a.shape[1] > 1 for a in arrays):
            # channels-last inputs (conv outputs): joined along their innermost axis, result channels-last
            joined = np.concatenate([a.transpose(0, 2, 3, 1) for a in arrays], axis=3)
            return [joined.transpose(0, 3, 1, 2)]
        return [np.concatenate(arrays, axis=along)]
    return kernel


def _split_2(op, opset):
    """Split before opset 13: sizes from the ``split`` attribute, else equal parts, one per output."""
    static = attribute(op, "split", None)
    return _split_kernel(op, lambda inputs: static, len(op.outputs))


def _split_13(op, opset):
    """Split since opset 13: sizes from the optional second input, else equal parts, one per output."""
    return _split_kernel(op, lambda inputs: optional(inputs, 1), len(op.outputs))


def _split_18(op, opset):
    """Split since opset 18: as 13, with ``num_outputs`` parts (the last one smaller) without sizes."""
    return _split_kernel(op, lambda inputs: optional(inputs, 1),
                         int(attribute(op, "num_outputs", len(op.outputs))))


def _split_kernel(op, sizes_of, parts):
    axis = int(attribute(op, "axis", 0))

    def kernel(inputs):
        data = inputs[0]
        a = normalize_axis(axis, data.ndim)
        dim = data.shape[a]
        sizes = sizes_of(inputs)
        if sizes is not None and np.size(sizes):
            sizes = ints(sizes)
        else:
            chunk = -(-dim // parts)
            sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return [data[_axis_slice(data.ndim, a, slice(bounds[i], bounds[i + 1]))]
                for i in range(len(sizes))]
    return kernel


def _slice(op, opset):
    def kernel(inputs):
        data = inputs[0]
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = optional(inputs, 3)
        axes = list(range(len(starts))) if axes is None else ints(axes)
        steps = optional(inputs, 4)
        steps = [1] * len(starts) if steps is None else ints(steps)
        index = [slice(None)] * data.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps):
            axis = normalize_axis(axis, data.ndim)
            dim = data.shape[axis]
            if step == 0:
                raise unsupported(op, "a step of 0")
            start = start + dim if start < 0 else start
            end = end + dim if end < 0 else end
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
                if dim == 0:
                    start, end = 0, 0
                elif end < 0:
                    end = None
            index[axis] = slice(start, end, step)
        return [data[tuple(index)]]
    return kernel


def _expand(op, opset):
    def kernel(inputs):
        data = inputs[0]
        shape = np.broadcast_shapes(data.shape, tuple(ints(inputs[1])))
        return [np.broadcast_to(data, shape)]
    return kernel


def _tile(op, opset):
    return lambda inputs: [np.tile(inputs[0], ints(inputs[1]))]


# ---------------------------------------------------------------------- Pad --
def pad_widths(inputs, rank: int) -> list[list[int]]:
    """[begin, end] per axis of a Pad's inputs (data, pads[, constant_value[, axes]])."""
    pads = ints(inputs[1])
    axes = optional(inputs, 3)
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in ints(axes)]
    widths = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(axes):
        widths[axis] = [pads[i], pads[i + len(axes)]]
    return widths


def zero_spatial_pads(inputs) -> list[int] | None:
    """A Pad's amounts as Conv pads (spatial begins, then ends) when it pads with zeros, only spatial axes,
    and never crops; None otherwise (a Pad a convolution's own pads cannot do)."""
    data, value = inputs[0], optional(inputs, 2)
    if data.ndim < 3 or (value is not None and np.size(value) and np.asarray(value).reshape(-1)[0] != 0):
        return None
    widths = pad_widths(inputs, data.ndim)
    if any(b or e for b, e in widths[:2]) or any(b < 0 or e < 0 for b, e in widths):
        return None
    return [b for b, _ in widths[2:]] + [e for _, e in widths[2:]]


def _pad(op, opset):
    mode = attribute(op, "mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("constant", "reflect", "edge", "wrap") or (mode == "wrap" and opset < 19):
        raise unsupported(op, f"mode {mode!r} at opset {opset}")

    def kernel(inputs):
        data = inputs[0]
        widths = pad_widths(inputs, data.ndim)
        value = optional(inputs, 2)
        if any(b < 0 or e < 0 for b, e in widths):  # negative pads crop first
            data = data[tuple(slice(-min(b, 0), d + min(e, 0))
                              for (b, e), d in zip(widths, data.shape))]
            widths = [[max(b, 0), max(e, 0)] for b, e in widths]
        if not any(b or e for b, e in widths):
            return [data]
        if mode == "constant":
            fill = 0 if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]
            return [np.pad(data, widths, mode="constant", constant_values=fill)]
        return [np.pad(data, widths, mode=mode)]
    return kernel


# ----------------------------------------------------------- shape queries --
def _shape(op, opset):
    start = int(attribute(op, "start", 0)) if opset >= 15 else 0
    end = attribute(op, "end", None) if opset >= 15 else None
    end = None if end is None else int(end)
    return lambda inputs: [np.array(inputs[0].shape, dtype=np.int64)[start:end]]


def _size(op, opset):
    return lambda inputs: [np.array(inputs[0].size, dtype=np.int64)]


def _identity(op, opset):
    return lambda inputs: [inputs[0]]


def _dropout(op, opset):
    with_mask = len(op.outputs) > 1
    keep = opset >= 12  # onnxruntime's opset 10-11 Dropout writes an all-False mask

    def kernel(inputs):
        data = inputs[0]
        training = optional(inputs, 2)
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            raise unsupported(op, "training_mode=True (the executor runs inference only)")
        if with_mask:
            return [data, np.full(data.shape, keep, dtype=bool)]
        return [data]
    return kernel


# ------------------------------------------------------ depth <-> space --
def _depth_to_space(op, opset):
    block = int(attribute(op, "blocksize"))
    mode = attribute(op, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise unsupported(op, f"mode {mode!r}")

    def kernel(inputs):
        x = inputs[0]
        b, c, h, w = x.shape
        depth = c // (block * block)
        if mode == "DCR":
            y = x.reshape(b, block, block, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(b, depth, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
        return [y.reshape(b, depth, h * block, w * block)]
    return kernel


def _space_to_depth(op, opset):
    block = int(attribute(op, "blocksize"))

    def kernel(inputs):
        x = inputs[0]
        b, c, h, w = x.shape
        y = x.reshape(b, c, h // block, block, w // block, block).transpose(0, 3, 5, 1, 2, 4)
        return [y.reshape(b, c * block * block, h // block, w // block)]
    return kernel


KERNELS: dict = {
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Squeeze": by_opset({1: _squeeze_1, 13: _squeeze_13}),
    "Unsqueeze": by_opset({1: _unsqueeze_1, 13: _unsqueeze_13}),
    "Concat": _concat,
    "Split": by_opset({2: _split_2, 13: _split_13, 18: _split_18}),
    "Slice": _slice,
    "Expand": _expand,
    "Tile": _tile,
    "Pad": _pad,
    "Shape": _shape,
    "Size": _size,
    "Identity": _identity,
    "Dropout": _dropout,
    "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
}
