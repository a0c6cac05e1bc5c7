"""LayerNorm and RMSNorm in whatever ops they are written with (the finder :mod:`ppqlike.core.patterns` uses).

A norm region (:mod:`ppqlike.core.block_regions`) is anchored at its square root: a Sqrt, or a Pow by 0.5 or
-0.5.  It is a **LayerNorm** when, on probe rows of varied mean and spread, it computes
``(x - E[x]) / sqrt(Var[x]) * gamma + beta`` over the axes its ReduceMean/ReduceSum ops reduce, for some constant
gamma and beta per position of those axes (fitted on the probe), and an **RMSNorm** when it computes
``x / sqrt(E[x^2]) * gamma (+ beta)``.  That covers, with no pattern per spelling: ``x - mean`` squared by Pow 2
or Mul, ``E[x^2] - E[x]^2`` (with or without a Max(0, .) guard), means as ReduceMean or ReduceSum times 1/n,
``/ sqrt``, ``* Reciprocal(sqrt)`` and ``* Pow(., -0.5)``, gamma before or after, and TensorFlow's
``x * k + (beta - mean * k)`` with ``k = gamma / sqrt(var + eps)``; eps up to about 1e-2 passes (the probe rows
have variances of 4 to 16).

A norm's *affine* constants are those whose division by a positive factor per position divides its result by
that factor (gamma and beta of a LayerNorm, gamma of an RMSNorm; checked on the probe): what SmoothQuant scales.
"""

from __future__ import annotations

import numpy as np

from .block_regions import ProbeError, Region, constant_value, evaluate, find_region, reduction_axes
from .ir import Operation

__all__ = ["norm_match", "LAYER_NORM_FORM", "RMS_NORM_FORM"]

LAYER_NORM_FORM, RMS_NORM_FORM = "layer_norm", "rms_norm"
_ROWS, _DEFAULT_SIZE, _TOLERANCE = 24, 8, 2e-3


def norm_match(anchor: Operation, taken: set[str], graph_outputs: set[str]):
    """(form, region, affine constant names) of the norm whose square root is ``anchor``, or None."""
    if anchor.type == "Sqrt" or anchor.type == "Pow" and _exponent(anchor) in (0.5, -0.5):
        return find_region(anchor, _accept, taken, graph_outputs)
    return None


def _exponent(operation: Operation) -> float | None:
    value = constant_value(operation.inputs[1]) if len(operation.inputs) > 1 else None
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def _layout(region: Region) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(probe shape, reduced axes) of a norm region: the smallest rank at which every reduction reduces the
    same axes and every constant of more than one value varies along those axes only."""
    reductions = region.reductions()
    if not reductions:
        return None
    raw = [reduction_axes(op) for op in reductions]
    if any(axes is None for axes in raw):
        return None
    wide = [value for value in (constant_value(v) for v in region.constants()) if value.size > 1]
    lowest = max([2, *(a + 1 for axes in raw for a in axes), *(-a for axes in raw for a in axes),
                  *(value.ndim for value in wide)])
    for rank in range(lowest, lowest + 3):
        reduced = {tuple(sorted(a % rank for a in axes)) for axes in raw}
        if len(reduced) != 1:
            continue
        (axes,) = reduced
        sizes = {}
        if len(axes) == rank or not all(_varies_along(value, rank, axes, sizes) for value in wide):
            continue
        rows_axis = next(a for a in range(rank) if a not in axes)
        shape = tuple(sizes.get(a, _DEFAULT_SIZE) if a in axes else _ROWS if a == rows_axis else 1
                      for a in range(rank))
        return shape, axes
    return None


def _varies_along(value: np.ndarray, rank: int, axes: tuple[int, ...], sizes: dict) -> bool:
    """Whether ``value`` (right-aligned to ``rank``) varies along ``axes`` only, recording their sizes."""
    offset = rank - value.ndim
    for index, size in enumerate(value.shape):
        if size == 1:
            continue
        axis = index + offset
        if axis not in axes or sizes.setdefault(axis, size) != size:
            return False
    return True


def _probe(shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """Rows of varied mean (-3 to 3) and spread (2 to 4) along the reduced axes."""
    rng = np.random.default_rng(20240)
    row_shape = tuple(1 if a in axes else s for a, s in enumerate(shape))
    return rng.uniform(-3, 3, row_shape) + rng.uniform(2, 4, row_shape) * rng.standard_normal(shape)


def _positions_last(array: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """[rows, positions]: the reduced axes flattened last."""
    moved = np.moveaxis(array, axes, tuple(range(array.ndim - len(axes), array.ndim)))
    return moved.reshape(-1, int(np.prod([array.shape[a] for a in axes])))


def _fits(result: np.ndarray, normalised: np.ndarray) -> bool:
    """Whether ``result = normalised * gamma + beta`` per position (column), for fitted gamma and beta."""
    centred_n = normalised - normalised.mean(axis=0)
    centred_r = result - result.mean(axis=0)
    gamma = (centred_n * centred_r).sum(axis=0) / np.maximum((centred_n ** 2).sum(axis=0), 1e-30)
    spread = np.abs(centred_r).max()
    residual = np.abs(centred_r - centred_n * gamma).max()
    return bool(np.isfinite(residual) and spread > 1e-9 and residual <= _TOLERANCE * spread)


def _accept(region: Region):
    try:
        layout = _layout(region)
        if layout is None:
            return None
        shape, axes = layout
        probe = _probe(shape, axes)
        result = evaluate(region, probe, axes)
    except ProbeError:
        return None
    if result.shape != probe.shape:
        return None
    mean = probe.mean(axis=axes, keepdims=True)
    references = {LAYER_NORM_FORM: (probe - mean) / np.sqrt(((probe - mean) ** 2).mean(axis=axes, keepdims=True)),
                  RMS_NORM_FORM: probe / np.sqrt((probe ** 2).mean(axis=axes, keepdims=True))}
    flat = _positions_last(result, axes)
    form = next((name for name, reference in references.items() if _fits(flat, _positions_last(reference, axes))),
                None)
    if form is None:
        return None
    return form, region, _affine(region, probe, axes, result)


def _affine(region: Region, probe: np.ndarray, axes: tuple[int, ...], result: np.ndarray) -> tuple[str, ...]:
    """The names of the per-position constants that scale the result (see the module docstring), or ()."""
    positions = int(np.prod([probe.shape[a] for a in axes]))
    candidates = [v for v in region.constants() if v.is_parameter and positions > 1 and v.value.size == positions]
    if not candidates:
        return ()
    factors = np.random.default_rng(7).uniform(0.5, 2.0, positions)
    overrides = {v.name: np.asarray(v.value, np.float64) / factors.reshape(v.value.shape) for v in candidates}
    try:
        scaled = evaluate(region, probe, axes, overrides)
    except ProbeError:
        return ()
    expected = result / factors.reshape(tuple(probe.shape[a] if a in axes else 1 for a in range(probe.ndim)))
    if scaled.shape != expected.shape or np.abs(scaled - expected).max() > 1e-6 * np.abs(result).max():
        return ()
    return tuple(v.name for v in candidates)
