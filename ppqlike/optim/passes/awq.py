"""AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration"):
protect the weight rows that meet large activations by scaling them up before block quantization and the
activation down by the same factor, then clip each block's range to what its inputs need.

For an activation X [M, K] read by MatMul/Gemm weights W [K, N] (several readers share one X: the
attention's Q, K and V), per input channel j:

    s_j = mean|X_j| ** alpha   (normalised by sqrt(max s * min s)),   X' = X / s,   W' = diag(s) W

``alpha`` in [0, 1] is searched on ``grid`` + 1 values (0 = no scaling, plain rounding, is always tried) by
the summed squared error ||X W - X' Q(W')||^2 over the readers on ``rows`` sampled calibration rows, Q
the block quantizer (nearest rounding).  The division by s goes where SmoothQuant puts it
(``passes.smooth_quant``): into the LayerNorm's gamma and beta when the LayerNorm feeds only these
readers, else into a float Mul written in front of them; the FP32 function is unchanged up to float
rounding.  Then each block's range is shrunk by the ratio in ``clip_ratios`` that minimises that block's
output error on the data, (dW_b)^T G_b (dW_b) with G_b the block's X'^T X' (the paper's clipping search,
per block and output column).  ``relative``: the scale search weighs each row's error by 1 / ||row of X W||^2,
so that a few tokens of huge activation do not decide alone (measured, AWQ scales without clipping: ViT-S
dev-map cosine mean / worst 0.99732 / 0.9698 -> 0.99739 / 0.9772; MiniLM-L6 with clipping 0.98108 -> 0.98011
mean); off by default, the paper's squared error.

Reads: the FP32 weights, gamma/beta, the calibration data.  Writes: the readers' weights and the
LayerNorms' gamma/beta (new float32 arrays), inserted Mul ops (platform FP32), and the weight-only configs
of the readers (method 'awq').
"""

from __future__ import annotations

import numpy as np

from ...core.quant_block import block_count, dequantize_blocks
from ...executor import NumpyExecutor
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass
from .smooth_quant import _apply as divide_into_source, _multiply_groups, smoothable_groups
from .weight_only import (WeightOnlyTarget, rows_first, rtn_codes, set_block_config, target_input_batches,
                          weight_only_targets)

__all__ = ["AWQPass", "search_awq_scales", "search_block_clipping"]

#: block range shrink ratios tried by the clipping search
CLIP_RATIOS = tuple(round(1.0 - 0.025 * i, 3) for i in range(13))   # 1.0 .. 0.7


def _rtn(weight_kn: np.ndarray, block_size: int, bits: int, symmetric: bool, ratio=1.0) -> np.ndarray:
    scale, zero, codes = rtn_codes(weight_kn, block_size, bits, symmetric, ratio)
    return dequantize_blocks(codes, scale, zero, 0, block_size)


def search_awq_scales(rows: np.ndarray, mean_magnitude: np.ndarray, weights: list[np.ndarray], block_size: int,
                      bits: int, symmetric: bool, grid: int = 20, relative: bool = False) -> tuple[float, np.ndarray]:
    """(alpha, per-channel scales s) minimising sum_W ||rows W - (rows / s) Q(diag(s) W)||^2 (module
    docstring); alpha 0 gives s = 1."""
    rows = rows.astype(np.float32)
    references = [rows @ w for w in weights]
    if relative:   # each row's error relative to its output's energy: a few huge-activation tokens do not rule
        row_weights = [1.0 / (np.sum(r.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-12) for r in references]
    else:
        row_weights = [1.0] * len(references)
    magnitude = np.maximum(mean_magnitude.astype(np.float64), 1e-8)
    best = (np.inf, 0.0, np.ones(len(magnitude)))
    for alpha in np.linspace(0.0, 1.0, grid + 1):
        scales = magnitude ** alpha
        scales = np.clip(scales / np.sqrt(scales.max() * scales.min()), 1e-4, 1e4)
        scaled_rows = (rows / scales.astype(np.float32)).astype(np.float32)
        error = 0.0
        for weight, reference, row_weight in zip(weights, references, row_weights):
            quantized = _rtn((weight * scales[:, None]).astype(np.float32), block_size, bits, symmetric)
            error += float(np.sum(row_weight * (scaled_rows @ quantized - reference) ** 2))
        if error < best[0]:
            best = (error, float(alpha), scales)
    return best[1], best[2]


def search_block_clipping(weight_kn: np.ndarray, block_grams: np.ndarray, block_size: int, bits: int,
                          symmetric: bool, ratios=CLIP_RATIOS) -> np.ndarray:
    """Per block and output column, the range ratio minimising (dW_b)^T G_b (dW_b); ``block_grams``
    [blocks, block_size, block_size] (the last block zero-padded)."""
    rows, columns = weight_kn.shape
    blocks = block_count(rows, block_size)
    padded = np.zeros((blocks * block_size, columns), np.float64)
    best_error = np.full((blocks, columns), np.inf)
    best_ratio = np.ones((blocks, columns))
    for ratio in ratios:
        padded[:rows] = _rtn(weight_kn, block_size, bits, symmetric, ratio) - weight_kn
        delta = padded.reshape(blocks, block_size, columns)
        error = np.einsum("bkn,bkn->bn", delta, np.einsum("bij,bjn->bin", block_grams, delta))
        better = error < best_error
        best_error[better], best_ratio[better] = error[better], ratio
    return best_ratio


def _block_grams(gram: np.ndarray, block_size: int) -> np.ndarray:
    """The diagonal blocks of a [K, K] Gram matrix, [blocks, block_size, block_size], zero-padded."""
    rows = len(gram)
    blocks = block_count(rows, block_size)
    padded = np.zeros((blocks * block_size, blocks * block_size))
    padded[:rows, :rows] = gram
    return np.stack([padded[b * block_size:(b + 1) * block_size, b * block_size:(b + 1) * block_size]
                     for b in range(blocks)])


class AWQPass(QuantizationOptimizationPass):
    """Activation-aware scaling and clipping of every MatMul/Gemm weight's blocks (module docstring)."""

    name = "awq"

    def __init__(self, bits: int = 4, block_size: int = 32, symmetric: bool = True, grid: int = 20,
                 rows: int = 512, clip: bool = True, relative: bool = False, calib_steps: int | None = None,
                 platform: TargetPlatform | str = TargetPlatform.ORT_INT8, verbose: bool = False):
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric
        self.grid, self.rows, self.clip, self.steps, self.relative = grid, rows, clip, calib_steps, relative
        self.platform, self.verbose = TargetPlatform.parse(platform), verbose

    def optimize(self, graph, executor=None, dataloader=None, calib_steps=None, collate_fn=None, **kwargs) -> dict:
        targets = [t for t in weight_only_targets(graph) if t.operation.config is None]
        if not targets:
            return {"quantized": 0}
        executor = executor or NumpyExecutor(graph)
        steps = self.steps if self.steps is not None else calib_steps
        magnitude, samples, grams = self._statistics(graph, executor, targets, dataloader, steps, collate_fn)
        sources = {id(t.operation): t.source.name for t in targets}   # (before Muls are put in front of them)
        groups, skipped = smoothable_groups(graph, insert_multiplies=True)
        taken = {group.source for group in groups}   # (without LayerNorms: a Mul in front of the readers)
        groups += [group for group in _multiply_groups(graph, taken) if group.source not in taken]
        by_weight = {id(t.weight): t for t in targets}
        scaled = []
        for group in groups:
            members = [by_weight.get(id(variable)) for variable, _ in group.weights]
            if any(m is None for m in members) or group.source not in magnitude:
                continue
            weights = [rows_first(np.asarray(m.weight.value), m.axis) for m in members]
            alpha, scales = search_awq_scales(samples[group.source], magnitude[group.source], weights,
                                              self.block_size, self.bits, self.symmetric, self.grid,
                                              self.relative)
            if alpha > 0:
                divide_into_source(graph, group, scales.astype(np.float32))
                inverse = 1.0 / scales
                grams[group.source] = grams[group.source] * inverse[:, None] * inverse[None, :]
            scaled.append({"activation": group.name, "alpha": alpha, "readers": len(members),
                           "into": "gamma/beta" if group.block is not None else "a Mul before its readers"})
        clipped = []
        for target in targets:
            weight = rows_first(np.asarray(target.weight.value), target.axis)
            ratio = 1.0
            if self.clip:
                ratio = search_block_clipping(weight, _block_grams(grams[sources[id(target.operation)]], self.block_size),
                                              self.block_size, self.bits, self.symmetric)
                clipped.append(float(np.mean(ratio)))
            scale, zero, codes = rtn_codes(weight, self.block_size, self.bits, self.symmetric, ratio)
            set_block_config(target, self.bits, self.block_size, self.symmetric, scale, zero, codes, "awq",
                             self.platform)
        return {"quantized": len(targets), "scaled_groups": scaled, "skipped": skipped,
                "mean_clip_ratio": round(float(np.mean(clipped)), 4) if clipped else None}

    def _statistics(self, graph, executor, targets: list[WeightOnlyTarget], dataloader, steps, collate_fn):
        """Per target input: mean |x| per channel, up to ``rows`` sampled rows, and X^T X (float64)."""
        rng = np.random.default_rng(0)
        sums: dict[str, np.ndarray] = {}
        grams: dict[str, np.ndarray] = {}
        samples: dict[str, list] = {}
        count = 0
        for batch in target_input_batches(graph, executor, targets, dataloader, steps, collate_fn, "awq",
                                          self.verbose):
            for name, rows in batch.items():
                absolute = np.abs(rows).sum(axis=0, dtype=np.float64)
                gram = (rows.T @ rows).astype(np.float64)
                sums[name] = absolute if name not in sums else sums[name] + absolute
                grams[name] = gram if name not in grams else grams[name] + gram
                chosen = rng.choice(len(rows), size=min(len(rows), self.rows), replace=False)
                samples.setdefault(name, []).append(rows[chosen])
            count += len(next(iter(batch.values())))
        picked = {}
        for name, parts in samples.items():
            rows = np.concatenate(parts)
            picked[name] = rows[rng.choice(len(rows), size=min(len(rows), self.rows), replace=False)]
        return {name: total / count for name, total in sums.items()}, picked, grams
