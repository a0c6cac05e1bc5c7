"""GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"): block-quantize each MatMul/Gemm weight one input row at a time, pushing each row's rounding
error onto the rows not yet quantized through the inverse Hessian of the layer's calibration inputs.

For a weight W [K, N] read by inputs X [M, K], the layer's squared output error is tr(dW^T H dW) with
H = X^T X.  Rows are quantized in order k = 0 .. K-1 (the paper's column order for a PyTorch [N, K]
weight); with U the upper Cholesky factor of (H + damp I)^-1 (damp = ``damp`` x the mean diagonal of H),
quantizing row k with error e_k = (w_k - q_k) / U_kk updates the later rows w_j -= U_kj e_k, which is the
optimal correction of the remaining rows for that error (the Optimal Brain Surgeon step).  Updates run
lazily in batches of rows (the paper's "lazy batch" trick, exact) and each block's scale and zero point
are chosen from the rows as updated when the sweep reaches the block's first row (the paper's grouping).
Rows whose input was always zero on the calibration data keep their value and pass no error on.

Every layer's H comes from one FP32 forward over the calibration data (the layers are independent
problems here; the paper quantizes them in sequence with the already-quantized model's inputs).

Reads: the FP32 weights, the calibration data.  Writes: the weight-only configs of the targets
(``passes.weight_only``), method 'gptq'; the FP32 weights are not changed.
"""

from __future__ import annotations

import numpy as np

from ...core.quant_block import block_parameters, block_range
from ...executor import NumpyExecutor
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass
from .weight_only import rows_first, set_block_config, target_input_batches, weight_only_targets

__all__ = ["GPTQPass", "gptq_quantize", "input_hessians"]


def gptq_quantize(weight: np.ndarray, hessian: np.ndarray, block_size: int, bits: int, symmetric: bool,
                  damp: float = 0.01, batch_rows: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, zero, codes) of the [K, N] ``weight`` quantized in blocks of ``block_size`` along K with
    GPTQ's error feedback under the [K, K] input Hessian ``hessian`` (X^T X, any positive multiple)."""
    weight = np.array(weight, dtype=np.float64)
    rows, columns = weight.shape
    h = np.array(hessian, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    mean_diagonal = float(np.mean(np.diag(h)))
    h[np.diag_indices(rows)] += damp * mean_diagonal
    upper = _inverse_cholesky_upper(h)
    low, high = block_range(bits, symmetric)
    blocks = -(-rows // block_size)
    scale = np.ones((blocks, columns), np.float32)
    zero = np.zeros((blocks, columns), np.int64)
    codes = np.zeros((rows, columns), np.int64)
    step = max(block_size, batch_rows // block_size * block_size)   # batches hold whole blocks
    for first in range(0, rows, step):
        last = min(first + step, rows)
        part = weight[first:last].copy()
        errors = np.zeros_like(part)
        local = upper[first:last, first:last]
        for i in range(last - first):
            row = first + i
            if row % block_size == 0:
                block = row // block_size
                s, z = block_parameters(part[i:i + block_size], 0, block_size, bits, symmetric)
                scale[block], zero[block] = s[0], z[0]
            block = row // block_size
            s, z = scale[block], zero[block]
            q = np.clip(np.rint(part[i].astype(np.float32) / s).astype(np.int64) + z, low, high)
            codes[row] = q
            dequantized = (q - z).astype(np.float32) * s
            error = (part[i] - dequantized) / local[i, i]
            part[i + 1:] -= np.outer(local[i, i + 1:], error)
            errors[i] = error
        weight[last:] -= upper[first:last, last:].T @ errors
    return scale, zero, codes


def _inverse_cholesky_upper(h: np.ndarray) -> np.ndarray:
    """U upper triangular with U^T U = h^-1 (h symmetric positive definite), damping more if needed."""
    extra = 0.0
    mean_diagonal = float(np.mean(np.diag(h)))
    for _ in range(6):
        try:
            inverse = np.linalg.inv(h + extra * np.eye(len(h)))
            inverse = (inverse + inverse.T) / 2
            return np.linalg.cholesky(inverse).T
        except np.linalg.LinAlgError:
            extra = mean_diagonal * (0.01 if extra == 0 else extra * 10 / mean_diagonal)
    raise np.linalg.LinAlgError("the input Hessian stays singular after damping")


def input_hessians(graph, executor, targets, dataloader, calib_steps, collate_fn, verbose) -> tuple[dict, int]:
    """X^T X (float64) of each distinct target input over the calibration data, and the row count."""
    hessians: dict[str, np.ndarray] = {}
    count = 0
    for batch in target_input_batches(graph, executor, targets, dataloader, calib_steps, collate_fn, "gptq",
                                      verbose):
        for name, rows in batch.items():
            gram = (rows.T @ rows).astype(np.float64)
            hessians[name] = gram if name not in hessians else hessians[name] + gram
        count += len(next(iter(batch.values())))
    return hessians, count


class GPTQPass(QuantizationOptimizationPass):
    """Quantize every MatMul/Gemm weight with GPTQ (see the module docstring)."""

    name = "gptq"

    def __init__(self, bits: int = 4, block_size: int = 32, symmetric: bool = True, damp: float = 0.01,
                 calib_steps: int | None = None, platform: TargetPlatform | str = TargetPlatform.ORT_INT8,
                 verbose: bool = False):
        self.bits, self.block_size, self.symmetric, self.damp = bits, block_size, symmetric, damp
        self.steps, self.platform, self.verbose = calib_steps, TargetPlatform.parse(platform), verbose

    def optimize(self, graph, executor=None, dataloader=None, calib_steps=None, collate_fn=None, **kwargs) -> dict:
        targets = [t for t in weight_only_targets(graph) if t.operation.config is None]
        if not targets:
            return {"quantized": 0}
        executor = executor or NumpyExecutor(graph)
        steps = self.steps if self.steps is not None else calib_steps
        hessians, count = input_hessians(graph, executor, targets, dataloader, steps, collate_fn, self.verbose)
        layers = []
        for target in targets:
            weight = rows_first(np.asarray(target.weight.value), target.axis)
            hessian = hessians[target.source.name]
            scale, zero, codes = gptq_quantize(weight, hessian, self.block_size, self.bits, self.symmetric,
                                               self.damp)
            config = set_block_config(target, self.bits, self.block_size, self.symmetric, scale, zero, codes,
                                      "gptq", self.platform)
            layers.append({"op": target.operation.name,
                           "relative_output_error": _relative_error(weight, rows_first(config.baked_value,
                                                                                       target.axis), hessian)})
        return {"quantized": len(layers), "calibration_rows": count, "damp": self.damp, "layers": layers}


def _relative_error(weight: np.ndarray, quantized: np.ndarray, hessian: np.ndarray) -> float:
    """tr(dW^T H dW) / tr(W^T H W): the layer's squared output error relative to its output on the data."""
    delta = quantized.astype(np.float64) - weight
    total = float(np.sum(weight * (hessian @ weight)))
    return round(float(np.sum(delta * (hessian @ delta))) / total, 6) if total > 0 else 0.0
