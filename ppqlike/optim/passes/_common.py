"""Small helpers shared by the core passes."""

from __future__ import annotations

from typing import Iterator

from ...core.ir import Graph, Operation, Variable
from ...core.quant import QuantizationStates, TensorQuantizationConfig

S = QuantizationStates


def quantized_operations(graph: Graph) -> Iterator[Operation]:
    """Ops that carry a quantization config, in topological order."""
    for operation in graph.topological_sort():
        if operation.config is not None:
            yield operation


def input_config(operation: Operation, index: int) -> TensorQuantizationConfig | None:
    configs = operation.config.input_quantization_config if operation.config is not None else []
    return configs[index] if index < len(configs) else None


def output_config(operation: Operation, index: int = 0) -> TensorQuantizationConfig | None:
    configs = operation.config.output_quantization_config if operation.config is not None else []
    return configs[index] if index < len(configs) else None


def producer_config(variable: Variable) -> TensorQuantizationConfig | None:
    """The output config of the op producing ``variable`` (None if unquantized)."""
    producer = variable.producer
    if producer is None or producer.config is None:
        return None
    return output_config(producer, producer.outputs.index(variable))


def root(config: TensorQuantizationConfig) -> TensorQuantizationConfig:
    """The config at the end of ``config``'s OVERLAPPED/SLAVE chain (itself when ungoverned)."""
    while config.state in (S.OVERLAPPED, S.SLAVE) and config.master is not None:
        config = config.master
    return config


def same_grid(a: TensorQuantizationConfig, b: TensorQuantizationConfig) -> bool:
    """True when two configs would quantize identically (policy, bits, range, rounding)."""
    return (a.policy == b.policy and a.num_of_bits == b.num_of_bits and a.quant_min == b.quant_min
            and a.quant_max == b.quant_max and a.rounding == b.rounding)
