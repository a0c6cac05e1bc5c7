"""Weight-only block quantization (W4A16 / W8A16): which weights, their configs, and nearest rounding (RTN).

Every MatMul whose second input is a constant rank-2 float32 weight [K, N], and every Gemm with a constant
float32 B ([K, N], or [N, K] with transB), has its weight cut into blocks of ``block_size`` along K
(``ppqlike.core.quant_block``); activations, biases and every other op stay float.  The op gets an
OperationQuantizationConfig whose only config is the weight's BlockQuantizationConfig (BAKED: the
simulation reads its dequantized value), every other slot None.

:class:`WeightOnlyQuantizePass` rounds each weight not yet quantized to nearest with its blocks' min-max
scales (RTN); GPTQ (``passes.gptq``) and AWQ (``passes.awq``) quantize their weights before it.  This module
also holds what those passes share: the targets, the config maker, and the calibration statistics of the
targets' inputs (rows of K values).

Reads: the FP32 weights.  Writes: ``Operation.config`` and ``Operation.platform`` of the targets (every
other op: config None, platform FP32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from ...core.ir import Graph, Operation, Variable
from ...core.quant_operation import OperationQuantizationConfig
from ...core.quant_block import BlockQuantizationConfig, block_parameters, quantize_blocks
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass, iterate_calibration

__all__ = ["WeightOnlyTarget", "weight_only_targets", "set_block_config", "WeightOnlyQuantizePass",
           "target_input_batches", "rows_first"]


@dataclass(frozen=True)
class WeightOnlyTarget:
    """A MatMul/Gemm with a constant weight: the op, its weight and the weight's input axis K."""

    operation: Operation
    weight: Variable
    axis: int

    @property
    def source(self) -> Variable:
        """The activation multiplied by the weight."""
        return self.operation.inputs[0]


def weight_only_targets(graph: Graph) -> list[WeightOnlyTarget]:
    """The MatMul/Gemm ops of ``graph`` with a constant rank-2 float32 weight, in topological order."""
    targets = []
    for operation in graph.topological_sort():
        if operation.type not in ("MatMul", "Gemm") or len(operation.inputs) < 2:
            continue
        weight = operation.inputs[1]
        if weight is None or not weight.is_parameter or weight.value is None:
            continue
        value = np.asarray(weight.value)
        if value.ndim != 2 or value.dtype != np.float32 or operation.inputs[0] is None \
                or operation.inputs[0].is_parameter:
            continue
        if operation.type == "Gemm" and operation.attributes.get("transA", 0):
            continue   # the activation is transposed: its K is its first axis, kept simple (left float)
        axis = 1 if operation.type == "Gemm" and operation.attributes.get("transB", 0) else 0
        targets.append(WeightOnlyTarget(operation, weight, axis))
    return targets


def rows_first(weight: np.ndarray, axis: int) -> np.ndarray:
    """``weight`` as [K, N] (its input axis first)."""
    return weight if axis == 0 else weight.T


def set_block_config(target: WeightOnlyTarget, bits: int, block_size: int, symmetric: bool,
                     scale: np.ndarray, zero: np.ndarray, codes: np.ndarray, method: str,
                     platform: TargetPlatform, detail: dict | None = None) -> BlockQuantizationConfig:
    """Give ``target``'s op its weight-only config (arrays in the [K, N] orientation, transposed back for a
    transB Gemm); returns the weight's config."""
    if target.axis == 1:
        scale, zero, codes = scale.T, zero.T, codes.T
    config = BlockQuantizationConfig(target.weight.name, bits, symmetric, target.axis, block_size, scale, zero,
                                     codes, method)
    config.detail.update(detail or {})
    inputs = [None] * len(target.operation.inputs)
    inputs[1] = config
    target.operation.config = OperationQuantizationConfig(inputs, [None] * len(target.operation.outputs))
    target.operation.platform = platform
    return config


def rtn_codes(weight_kn: np.ndarray, block_size: int, bits: int, symmetric: bool,
              ratio: float | np.ndarray = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, zero, codes) of a [K, N] weight rounded to nearest in blocks along K."""
    scale, zero = block_parameters(weight_kn, 0, block_size, bits, symmetric, ratio)
    return scale, zero, quantize_blocks(weight_kn, scale, zero, 0, block_size, bits, symmetric)


def target_input_batches(graph: Graph, executor, targets: list[WeightOnlyTarget], dataloader: Iterable,
                         calib_steps: int | None, collate_fn: Callable | None, what: str,
                         verbose: bool) -> Iterator[dict[str, np.ndarray]]:
    """Per calibration batch (FP32 forward): each distinct target input, as float32 rows [M, K]."""
    names = list(dict.fromkeys(target.source.name for target in targets))
    widths = {target.source.name: target.weight.value.shape[target.axis] for target in targets}
    for batch in iterate_calibration(dataloader, calib_steps, collate_fn, what, verbose):
        values = executor.forward(batch, output_names=names)
        yield {name: np.asarray(value, np.float32).reshape(-1, widths[name]) for name, value in zip(names, values)}


class WeightOnlyQuantizePass(QuantizationOptimizationPass):
    """Block-quantize every MatMul/Gemm weight not quantized yet by rounding to nearest (see the module
    docstring); mark every other op FP32."""

    name = "weight_only_quantize"

    def __init__(self, bits: int = 4, block_size: int = 32, symmetric: bool = True,
                 platform: TargetPlatform | str = TargetPlatform.ORT_INT8):
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric
        self.platform = TargetPlatform.parse(platform)

    def optimize(self, graph: Graph, executor=None, dataloader=None, calib_steps=None, collate_fn=None,
                 **kwargs) -> dict:
        targets = weight_only_targets(graph)
        chosen = {id(target.operation) for target in targets}
        for operation in graph.operations.values():
            if id(operation) not in chosen:
                operation.config, operation.platform = None, TargetPlatform.FP32
        rounded, kept, error = 0, 0, 0.0
        for target in targets:
            if target.operation.config is not None:   # quantized by GPTQ / AWQ before this pass
                kept += 1
                continue
            weight = rows_first(np.asarray(target.weight.value), target.axis)
            scale, zero, codes = rtn_codes(weight, self.block_size, self.bits, self.symmetric)
            config = set_block_config(target, self.bits, self.block_size, self.symmetric, scale, zero, codes,
                                      "rtn", self.platform)
            error = max(error, float(np.abs(config.baked_value - target.weight.value).max()))
            rounded += 1
        parameters = sum(int(t.weight.value.size) for t in targets)
        return {"weights": len(targets), "rounded_to_nearest": rounded, "quantized_before": kept,
                "bits": self.bits, "block_size": self.block_size, "symmetric": self.symmetric,
                "quantized_parameters": parameters, "max_abs_rounding_error": round(error, 6)}
