"""Kernels of the indexing family: Gather, GatherElements, GatherND, ScatterND,
ScatterElements, NonZero (OneHot is in selection.py).  Negative indices count from the end of their axis."""

from __future__ import annotations

import numpy as np

from .base import attribute, normalize_axis, unsupported

_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _positive(indices: np.ndarray, dims) -> np.ndarray:
    """Indices with negative entries wrapped (``dims`` broadcasts against ``indices``)."""
    indices = np.asarray(indices, dtype=np.int64)
    return np.where(indices < 0, indices + np.asarray(dims, dtype=np.int64), indices)


def _reduction(op, opset):
    reduction = attribute(op, "reduction", "none") if opset >= 16 else "none"
    if reduction != "none" and (reduction not in _REDUCTIONS
                                or reduction in ("max", "min") and opset < 18):
        raise unsupported(op, f"reduction {reduction!r} at opset {opset}")
    return None if reduction == "none" else _REDUCTIONS[reduction]


def _gather(op, opset):
    axis = int(attribute(op, "axis", 0))

    def kernel(inputs):
        data, indices = inputs[0], inputs[1]
        a = normalize_axis(axis, data.ndim)
        indices = _positive(indices, data.shape[a])
        if indices.ndim == 0:  # a scalar index: a view that drops the axis
            position = int(indices)
            if not 0 <= position < data.shape[a]:
                raise IndexError(f"index {position} is out of range for axis {a} of size {data.shape[a]}")
            return [data[(slice(None),) * a + (position, Ellipsis)]]
        return [np.take(data, indices, axis=a)]
    return kernel


def _gather_elements(op, opset):
    axis = int(attribute(op, "axis", 0))

    def kernel(inputs):
        data, indices = inputs[0], inputs[1]
        a = normalize_axis(axis, data.ndim)
        return [np.take_along_axis(data, _positive(indices, data.shape[a]), axis=a)]
    return kernel


def _gather_nd(op, opset):
    batch_dims = int(attribute(op, "batch_dims", 0))

    def kernel(inputs):
        data, indices = inputs[0], inputs[1]
        depth = indices.shape[-1]
        batch = data.shape[:batch_dims]
        count = int(np.prod(batch, dtype=np.int64))
        flat = data.reshape((count,) + data.shape[batch_dims:])
        index = _positive(indices.reshape(count, -1, depth), data.shape[batch_dims:batch_dims + depth])
        rows = np.arange(count).reshape(count, 1)
        gathered = flat[(rows,) + tuple(np.moveaxis(index, -1, 0))]
        return [gathered.reshape(indices.shape[:-1] + data.shape[batch_dims + depth:])]
    return kernel


def _scatter_nd(op, opset):
    ufunc = _reduction(op, opset)

    def kernel(inputs):
        data, indices, updates = inputs
        depth = indices.shape[-1]
        index = _positive(indices.reshape(-1, depth), data.shape[:depth])
        index = tuple(index.T)
        values = updates.reshape((-1,) + data.shape[depth:])
        output = data.copy()
        if ufunc is None:
            output[index] = values
        else:
            ufunc.at(output, index, values)
        return [output]
    return kernel


def _scatter_elements(op, opset):
    axis = int(attribute(op, "axis", 0))
    ufunc = _reduction(op, opset)

    def kernel(inputs):
        data, indices, updates = inputs
        a = normalize_axis(axis, data.ndim)
        index = list(np.indices(indices.shape, sparse=True))
        index[a] = _positive(indices, data.shape[a])
        index = tuple(index)
        output = data.copy()
        if ufunc is None:
            output[index] = updates
        else:
            ufunc.at(output, index, updates)
        return [output]
    return kernel


def _nonzero(op, opset):
    def kernel(inputs):
        x = np.asarray(inputs[0])
        if x.ndim == 0:
            x = x.reshape(1)
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]
    return kernel


KERNELS: dict = {
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "ScatterND": _scatter_nd,
    "ScatterElements": _scatter_elements,
    "NonZero": _nonzero,
}
