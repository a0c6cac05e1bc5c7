"""Memory-order views of dense arrays: elementwise work, block by block and in place, in any layout.

The executor stores some activations channels-last ([N, H, W, C] in memory, seen NCHW-shaped; see
``executor/ops/_conv_channels_last``).  ``reshape`` of such an array silently copies it, and writes
through the copy are lost; the numerics that walk an array a block at a time use these views instead.
An array is *dense* when its elements fill one block of memory without gaps, in some order of its axes.
"""

from __future__ import annotations

import numpy as np


def memory_axes(x: np.ndarray) -> tuple | None:
    """The axes of ``x`` from outermost to innermost in memory when ``x`` is dense (C order: 0, 1, ...);
    None otherwise."""
    if x.flags.c_contiguous:
        return tuple(range(x.ndim))
    axes = tuple(sorted(range(x.ndim), key=lambda axis: (-x.strides[axis], axis)))
    return axes if x.transpose(axes).flags.c_contiguous else None


def dense(x: np.ndarray) -> np.ndarray:
    """``x`` itself when it is dense, else a C-ordered copy."""
    return x if memory_axes(x) is not None else np.ascontiguousarray(x)


def flat_view(x: np.ndarray) -> np.ndarray | None:
    """The elements of a dense ``x`` as a 1-D view in memory order (writes reach ``x``); None if not dense."""
    axes = memory_axes(x)
    return None if axes is None else x.transpose(axes).reshape(-1)


def channel_view(x: np.ndarray, axis: int | None) -> np.ndarray | None:
    """A dense ``x`` as a 3-D view [outer, channels, inner] in memory order, the channels of ``axis`` in
    the middle (None: one channel, [size, 1, 1]); None if ``x`` is not dense."""
    axes = memory_axes(x)
    if axes is None:
        return None
    ordered = x.transpose(axes)
    if axis is None:
        return ordered.reshape(-1, 1, 1)
    position = axes.index(axis % x.ndim)
    shape = ordered.shape
    outer = int(np.prod(shape[:position], dtype=np.int64))
    inner = int(np.prod(shape[position + 1:], dtype=np.int64))
    return ordered.reshape(outer, shape[position], inner)


def empty_like_dense(x: np.ndarray, dtype=None) -> np.ndarray:
    """A new array shaped as a dense ``x`` with its memory order (C order if ``x`` is not dense): the flat
    views of the two correspond element for element."""
    axes = memory_axes(x) or tuple(range(x.ndim))
    ordered = np.empty(tuple(x.shape[axis] for axis in axes), x.dtype if dtype is None else dtype)
    return ordered.transpose(np.argsort(axes))


def same_layout(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` lie in memory alike (same shape and strides): their flat views correspond."""
    return a.shape == b.shape and a.strides == b.strides
