"""Kernels of the tensor-algebra family: Einsum, Det, CumSum and Trilu.

Outputs keep the input dtype.  Einsum contracts with numpy's optimised paths
(BLAS for float data); Det factorises in float64 and rounds once.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel, attribute, normalize_axis, unsupported


def _build_einsum(op, opset: int) -> Kernel:
    """Einsum: numpy's einsum on the same equation (explicit or implicit output, '...' broadcasting)."""
    equation = str(attribute(op, "equation")).replace(" ", "")

    def kernel(inputs):
        operands = [a for a in inputs if a is not None]
        try:
            result = np.einsum(equation, *operands, optimize=len(operands) > 1)
        except ValueError as error:
            raise unsupported(op, f"equation {equation!r} on shapes {[a.shape for a in operands]}: {error}") \
                from None
        return [np.asarray(result, dtype=operands[0].dtype)]
    return kernel


def _build_det(op, opset: int) -> Kernel:
    """Det: the determinant of each square matrix in the last two axes ([*, M, M] -> [*])."""
    def kernel(inputs):
        x = inputs[0]
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise unsupported(op, f"an input of shape {list(x.shape)} (need [..., M, M])")
        return [np.asarray(np.linalg.det(x.astype(np.float64)), dtype=x.dtype)]
    return kernel


def cumulative_sum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Running sums of ``x`` along ``axis`` in its own dtype; ``exclusive`` leaves each element out,
    ``reverse`` sums from the end."""
    data = np.flip(x, axis) if reverse else x
    total = np.cumsum(data, axis=axis, dtype=x.dtype)
    if exclusive:
        shifted = np.zeros_like(total)
        body = [slice(None)] * x.ndim
        head = [slice(None)] * x.ndim
        body[axis], head[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(body)] = total[tuple(head)]
        total = shifted
    return np.flip(total, axis) if reverse else total


def _build_cumsum(op, opset: int) -> Kernel:
    exclusive = bool(attribute(op, "exclusive", 0))
    reverse = bool(attribute(op, "reverse", 0))

    def kernel(inputs):
        x = inputs[0]
        axis = int(np.asarray(inputs[1]).reshape(-1)[0])
        if not -x.ndim <= axis < max(x.ndim, 1):
            raise unsupported(op, f"axis {axis} for an input of rank {x.ndim}")
        return [cumulative_sum(x, normalize_axis(axis, x.ndim), exclusive, reverse)]
    return kernel


def _build_trilu(op, opset: int) -> Kernel:
    """Trilu: the upper (or lower) triangle of the last two axes from diagonal k on; the rest zeros."""
    upper = bool(attribute(op, "upper", 1))

    def kernel(inputs):
        x = inputs[0]
        k = 0 if len(inputs) < 2 or inputs[1] is None else int(np.asarray(inputs[1]).reshape(-1)[0])
        if x.ndim < 2:
            raise unsupported(op, f"an input of rank {x.ndim} (need rank 2 or more)")
        return [np.triu(x, k) if upper else np.tril(x, k)]
    return kernel


KERNELS: dict = {
    "Einsum": _build_einsum,
    "Det": _build_det,
    "CumSum": _build_cumsum,
    "Trilu": _build_trilu,
}
