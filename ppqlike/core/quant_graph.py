"""Which quantization configs are in effect on a graph: one place for the master chain and the slot lookups.

Vocabulary (DESIGN.md §3):

* *applied*: ACTIVATED, SLAVE, PASSIVE: the executor fake-quantizes the value;
* *baked*: BAKED, PASSIVE_BAKED: the executor reads ``config.baked_value``;
* every other state passes the value through.

The simulation (``ppqlike.executor.simulation``), the passes and the exporters
read these rules from here; none walks a master chain of its own.
"""

from __future__ import annotations

from typing import Iterator

from .ir import Graph, Operation, Variable
from .quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked

S = QuantizationStates


def configured_operations(graph: Graph) -> Iterator[Operation]:
    """Ops that carry a quantization config (any state), in topological order."""
    for operation in graph.topological_sort():
        if operation.config is not None:
            yield operation


def quantizing_operations(graph: Graph) -> list[Operation]:
    """Ops (topological order) with at least one config in effect: applied or baked.

    An op whose configs are all OVERLAPPED (Reshape, Flatten after simplify) quantizes nothing
    itself: its tensors' quantization belongs to the op owning the master config.
    """
    return [operation for operation in configured_operations(graph)
            if any(is_applied(c.state) or is_baked(c.state) for c in operation.config.all_configs())]


def input_config(operation: Operation, index: int) -> TensorQuantizationConfig | None:
    """The config of input slot ``index`` (None when the op has no config or the slot none)."""
    configs = operation.config.input_quantization_config if operation.config is not None else []
    return configs[index] if index < len(configs) else None


def output_config(operation: Operation, index: int = 0) -> TensorQuantizationConfig | None:
    """The config of output slot ``index`` (None when the op has no config or the slot none)."""
    configs = operation.config.output_quantization_config if operation.config is not None else []
    return configs[index] if index < len(configs) else None


def producer_config(variable: Variable) -> TensorQuantizationConfig | None:
    """The output config of the op producing ``variable`` (None if unquantized or a graph input)."""
    producer = variable.producer
    if producer is None or producer.config is None:
        return None
    return output_config(producer, producer.outputs.index(variable))


def iter_tensor_configs(graph: Graph) -> Iterator[tuple[Operation, str, int, Variable, TensorQuantizationConfig]]:
    """Every (op, 'input'|'output', slot, variable, config) of the graph's configured ops."""
    for operation in graph.operations.values():
        config = operation.config
        if config is None:
            continue
        for index, tqc in enumerate(config.input_quantization_config):
            if tqc is not None and index < len(operation.inputs):
                yield operation, "input", index, operation.inputs[index], tqc
        for index, tqc in enumerate(config.output_quantization_config):
            if tqc is not None and index < len(operation.outputs):
                yield operation, "output", index, operation.outputs[index], tqc


def master_chain(config: TensorQuantizationConfig) -> Iterator[TensorQuantizationConfig]:
    """The configs ``config`` reads its scale from through OVERLAPPED/SLAVE links, nearest first (not itself)."""
    seen = {id(config)}
    while config.state in (S.OVERLAPPED, S.SLAVE) and config.master is not None:
        config = config.master
        if id(config) in seen:
            return
        seen.add(id(config))
        yield config


def master_root(config: TensorQuantizationConfig) -> TensorQuantizationConfig:
    """The end of ``config``'s OVERLAPPED/SLAVE chain (``config`` itself when ungoverned)."""
    for config in master_chain(config):
        pass
    return config


def overlapped_root(config: TensorQuantizationConfig) -> TensorQuantizationConfig:
    """The end of ``config``'s chain of OVERLAPPED links only (``config`` itself when not OVERLAPPED)."""
    while config.state is S.OVERLAPPED and config.master is not None:
        config = config.master
    return config


def governing_config(config: TensorQuantizationConfig | None) -> TensorQuantizationConfig | None:
    """The config whose grid a tensor carries: itself when applied or baked, the end of its OVERLAPPED chain
    when overlapped (a SLAVE carries its own, shared, grid), None when the tensor is not quantized
    (FP32, SOI, INITIAL, DEACTIVATED, ...)."""
    if config is None:
        return None
    root = overlapped_root(config)
    if root.state in (S.ACTIVATED, S.PASSIVE, S.BAKED, S.PASSIVE_BAKED, S.SLAVE) and \
            (root.state is not S.SLAVE or root.master is not None):
        return root
    return None


def awaits_master(config: TensorQuantizationConfig) -> bool:
    """A SLAVE whose master is not calibrated yet (during calibration): it has nothing to apply."""
    return config.state is S.SLAVE and config.master.state is S.INITIAL


def quantizes(config: TensorQuantizationConfig | None, side: str) -> bool:
    """Whether the executor quantizes an activation through ``config`` at run time.

    Applied states do; so does an output config carrying an integer requantization (TPU style)
    while it is OVERLAPPED by a master that is itself applied (not while the graph runs
    dequantized).  The exporters use this same rule, so the exported model quantizes exactly where
    the simulation does.
    """
    if config is None:
        return False
    if is_applied(config.state):
        return True
    if side != "output" or config.state is not S.OVERLAPPED or config.requantization is None:
        return False
    return is_applied(overlapped_root(config).state)


def requantized(config: TensorQuantizationConfig | None, side: str) -> bool:
    """An output config the executor requantizes with an integer multiplier and shift."""
    return config is not None and config.requantization is not None and quantizes(config, side)


def same_grid(a: TensorQuantizationConfig, b: TensorQuantizationConfig) -> bool:
    """True when two configs would quantize identically (policy, bits, range, rounding)."""
    return (a.policy == b.policy and a.num_of_bits == b.num_of_bits and a.quant_min == b.quant_min
            and a.quant_max == b.quant_max and a.rounding == b.rounding and a.float_format is b.float_format)
