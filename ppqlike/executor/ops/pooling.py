"""Kernels of the pooling family: MaxPool, AveragePool, LpPool and the global pools.

Windowed pools are separable: the window is reduced one spatial axis at a
time with shifted strided slices (``kh + kw`` passes for a 2-D window instead
of ``kh * kw``), over an input padded once (with -inf for MaxPool, 0 for the
sums).  Any number of spatial axes; ``auto_pad``, ``ceil_mode`` and dilations
follow onnxruntime.  MaxPool's optional Indices output is computed too (row
major, or column major with ``storage_order=1``).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._conv_channels_last import is_channels_last
from ._threads import parallel_over
from .base import Kernel, attribute, unsupported

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _ints(value):
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


class _Window:
    """Window attributes of a pooling op, parsed once."""

    def __init__(self, op, opset: int):
        self.op = op
        self.kernel = _ints(attribute(op, "kernel_shape"))
        rank = len(self.kernel)
        self.strides = _ints(attribute(op, "strides", None)) or [1] * rank
        self.dilations = _ints(attribute(op, "dilations", None)) or [1] * rank
        pads = _ints(attribute(op, "pads", None)) or [0] * (2 * rank)
        self.ceil_mode = int(attribute(op, "ceil_mode", 0))
        mode = attribute(op, "auto_pad", "NOTSET")
        self.auto_pad = mode.decode() if isinstance(mode, bytes) else mode
        if self.auto_pad not in _AUTO_PADS:
            raise unsupported(op, f"auto_pad {self.auto_pad!r}")
        if len(self.strides) != rank or len(self.dilations) != rank or len(pads) != 2 * rank:
            raise unsupported(op, f"kernel_shape {self.kernel}, strides {self.strides}, dilations "
                                  f"{self.dilations} and pads {pads} disagree on the number of axes")
        if any(v < 1 for v in self.kernel + self.strides + self.dilations) or any(p < 0 for p in pads):
            raise unsupported(op, "kernel_shape, strides and dilations must be positive and pads non-negative")
        self.pads = pads

    def geometry(self, x: np.ndarray):
        """(begin pads, end pads, output sizes) for input ``x``."""
        rank = len(self.kernel)
        if x.ndim != rank + 2:
            raise unsupported(self.op, f"a {rank}-D window on an input of rank {x.ndim}")
        begin, end, outs = [], [], []
        for axis, size in enumerate(x.shape[2:]):
            k, s, d = self.kernel[axis], self.strides[axis], self.dilations[axis]
            extent = d * (k - 1) + 1
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-size // s)
                total = max(0, (out - 1) * s + extent - size)
                small = total // 2
                head = small if self.auto_pad == "SAME_UPPER" else total - small
                begin.append(head)
                end.append(total - head)
                outs.append(out)
                continue
            if self.auto_pad == "VALID":
                head = tail = 0
                out = (size - extent) // s + 1 if not self.ceil_mode else -(-(size - extent) // s) + 1
            else:
                head, tail = self.pads[axis], self.pads[axis + rank]
                span = size + head + tail - extent
                out = (span // s if not self.ceil_mode else -(-span // s)) + 1
                if self.ceil_mode and (out - 1) * s >= size + head:
                    out -= 1  # the last window would start in the end padding
            begin.append(head)
            end.append(tail)
            outs.append(max(out, 0))
        return begin, end, outs


def _padded(planes: np.ndarray, begin, outs, window: _Window, fill) -> np.ndarray:
    """``planes`` [P, *spatial, (C)] padded with ``fill`` on its spatial axes so that every window of every
    output lies inside."""
    rank = len(outs)
    widths = [(0, 0)]
    for axis, size in enumerate(planes.shape[1:1 + rank]):
        need = (outs[axis] - 1) * window.strides[axis] + window.dilations[axis] * (window.kernel[axis] - 1) + 1
        widths.append((begin[axis], max(0, need - begin[axis] - size)))
    widths += [(0, 0)] * (planes.ndim - 1 - rank)
    if not any(b or e for b, e in widths):
        return planes
    shape = [s + b + e for s, (b, e) in zip(planes.shape, widths)]
    padded = np.full(shape, fill, dtype=planes.dtype)
    padded[tuple(slice(b, b + s) for (b, _), s in zip(widths, planes.shape))] = planes
    return padded


_CHUNK = 1 << 18   # input elements per chunk of planes: the intermediate results stay in cache


def _reduce_windows(x: np.ndarray, begin, outs, window: _Window, ufunc, fill) -> np.ndarray:
    """Reduce every window of ``x`` (padded with ``fill``) with ``ufunc``, one spatial axis at a time.

    The planes are processed a chunk at a time, so that the partly reduced intermediate is still in
    cache for the next axis; the chunks are shared out among the kernel threads.  A channels-last
    ``x`` (see ``_conv_channels_last``) is reduced as [N, H, W, C] images, its result channels-last
    too; any other as [N*C, *spatial] planes.
    """
    n, c = x.shape[:2]
    channels_last = is_channels_last(x) and not x.flags.c_contiguous
    planes = x.transpose(0, 2, 3, 1) if channels_last else x.reshape((n * c,) + x.shape[2:])
    planes = _padded(planes, begin, outs, window, fill)
    count = planes.shape[0]
    trailing = planes.shape[1 + len(outs):]
    result = np.empty((count,) + tuple(outs) + trailing, x.dtype)
    step = max(1, _CHUNK // max(1, int(np.prod(planes.shape[1:]))))
    order = sorted(range(len(outs)), key=lambda a: -window.strides[a])  # shrink the most first
    parallel_over(lambda p0: _reduce_chunk(planes, result, p0, min(count, p0 + step), order, outs, window, ufunc),
                  range(0, count, step))
    return result.transpose(0, 3, 1, 2) if channels_last else result.reshape((n, c) + tuple(outs))


def _reduce_chunk(planes, result, p0, p1, order, outs, window: _Window, ufunc) -> None:
    """Planes [p0, p1) of ``_reduce_axes``, one spatial axis after the other, into ``result``."""
    current = planes[p0:p1]
    for number, axis in enumerate(order):
        k, s, d, out = window.kernel[axis], window.strides[axis], window.dilations[axis], outs[axis]
        index = [slice(None)] * current.ndim
        taps = []
        for j in range(k):
            index[axis + 1] = slice(j * d, j * d + (out - 1) * s + 1, s)
            taps.append(current[tuple(index)])
        target = result[p0:p1] if number == len(order) - 1 else None
        if k == 1:
            reduced = taps[0].copy() if target is None else target
            if target is not None:
                np.copyto(target, taps[0])
        else:
            reduced = ufunc(taps[0], taps[1], out=target)
            for tap in taps[2:]:
                ufunc(reduced, tap, out=reduced)
        current = reduced


def _check_float(op, x: np.ndarray):
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise unsupported(op, f"pooling of a {x.dtype} tensor")


# ------------------------------------------------------------------ MaxPool --
def _build_max_pool(op, opset: int) -> Kernel:
    window = _Window(op, opset)
    storage_order = int(attribute(op, "storage_order", 0))
    want_indices = len(op.outputs) > 1 and op.outputs[1] is not None

    def kernel(inputs):
        x = inputs[0]
        _check_float(op, x)
        begin, end, outs = window.geometry(x)
        fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        if not want_indices:
            return [_reduce_windows(x, begin, outs, window, np.maximum, fill)]
        x = np.ascontiguousarray(x)
        xp = _padded(x.reshape((-1,) + x.shape[2:]), begin, outs, window, fill)
        xp = xp.reshape(x.shape[:2] + xp.shape[1:])
        return [_reduce_windows(x, begin, outs, window, np.maximum, fill),
                _max_indices(x, xp, begin, outs, window, storage_order)]
    return kernel


def _max_indices(x, xp, begin, outs, window: _Window, storage_order: int) -> np.ndarray:
    """Flat input index of each window's maximum (the first one on ties)."""
    rank = len(outs)
    extents = [d * (k - 1) + 1 for k, d in zip(window.kernel, window.dilations)]
    views = sliding_window_view(xp, extents, axis=tuple(range(2, 2 + rank)))
    views = views[(slice(None), slice(None))
                  + tuple(slice(None, (o - 1) * s + 1, s) for o, s in zip(outs, window.strides))
                  + tuple(slice(None, None, d) for d in window.dilations)]
    flat = views.reshape(views.shape[:2 + rank] + (-1,))
    best = np.argmax(flat, axis=-1)                               # index inside the window
    offsets = np.unravel_index(best, window.kernel)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    coordinates = []
    for axis in range(rank):
        grid_shape = [1] * (2 + rank)
        grid_shape[2 + axis] = outs[axis]
        start = (np.arange(outs[axis]) * window.strides[axis] - begin[axis]).reshape(grid_shape)
        coordinates.append(start + offsets[axis] * window.dilations[axis])
    if storage_order:   # column major over the spatial axes
        index = np.zeros(best.shape, np.int64)
        for axis in reversed(range(rank)):
            index = index * spatial[axis] + coordinates[axis]
        plane = int(np.prod(spatial))
        index = index + (np.arange(n * c).reshape(n, c, *([1] * rank)) * plane)
        return index.astype(np.int64)
    index = np.arange(n * c, dtype=np.int64).reshape(n, c, *([1] * rank))
    for axis in range(rank):
        index = index * spatial[axis] + coordinates[axis]
    return index.astype(np.int64)


# -------------------------------------------------------------- AveragePool --
def _window_counts(x_shape, begin, end, outs, window: _Window, include_pad: bool, dtype) -> np.ndarray:
    """How many elements each window averages: real ones, or real + explicit padding."""
    counts = None
    for axis, size in enumerate(x_shape[2:]):
        k, s, d = window.kernel[axis], window.strides[axis], window.dilations[axis]
        starts = np.arange(outs[axis]) * s - begin[axis]
        taps = starts[:, None] + np.arange(k)[None, :] * d
        low, high = (-begin[axis], size + end[axis]) if include_pad else (0, size)
        count = ((taps >= low) & (taps < high)).sum(axis=1)
        shape = [1] * len(outs)
        shape[axis] = outs[axis]
        count = count.reshape(shape)
        counts = count if counts is None else counts * count
    return np.maximum(counts, 1).astype(dtype)


def _build_average_pool(op, opset: int) -> Kernel:
    window = _Window(op, opset)
    include_pad = bool(int(attribute(op, "count_include_pad", 0)))

    def kernel(inputs):
        x = inputs[0]
        if not np.issubdtype(x.dtype, np.floating):
            raise unsupported(op, f"AveragePool of a {x.dtype} tensor")
        begin, end, outs = window.geometry(x)
        y = _reduce_windows(x, begin, outs, window, np.add, 0)
        counts = _window_counts(x.shape, begin, end, outs, window, include_pad, x.dtype)
        np.divide(y, counts, out=y)
        return [y]
    return kernel


def _build_lp_pool(op, opset: int) -> Kernel:
    window = _Window(op, opset)
    p = float(attribute(op, "p", 2))

    def kernel(inputs):
        x = inputs[0]
        if not np.issubdtype(x.dtype, np.floating):
            raise unsupported(op, f"LpPool of a {x.dtype} tensor")
        begin, end, outs = window.geometry(x)
        powered = np.abs(x) ** x.dtype.type(p)
        y = _reduce_windows(powered, begin, outs, window, np.add, 0)
        return [np.power(y, x.dtype.type(1.0 / p), out=y)]
    return kernel


# ------------------------------------------------------------------- global --
def _global(reduce):
    def build(op, opset: int) -> Kernel:
        def kernel(inputs):
            x = inputs[0]
            if x.ndim < 3:
                raise unsupported(op, f"{op.type} of an input of rank {x.ndim} (need [N, C, spatial...])")
            if is_channels_last(x) and not x.flags.c_contiguous:   # reduce [N, H*W, C] over its middle axis
                flat = x.transpose(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1]).transpose(0, 2, 1)
            else:
                flat = x.reshape(x.shape[0], x.shape[1], -1)
            return [reduce(flat).reshape(x.shape[:2] + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False)]
        return kernel
    return build


def _global_lp_pool(op, opset: int) -> Kernel:
    p = float(attribute(op, "p", 2))
    return _global(lambda flat: (np.abs(flat) ** flat.dtype.type(p)).sum(axis=-1) ** flat.dtype.type(1 / p))(op, opset)


KERNELS: dict = {
    "MaxPool": _build_max_pool,
    "AveragePool": _build_average_pool,
    "LpPool": _build_lp_pool,
    "GlobalAveragePool": _global(lambda flat: flat.mean(axis=-1)),
    "GlobalMaxPool": _global(lambda flat: flat.max(axis=-1)),
    "GlobalLpPool": _global_lp_pool,
}
