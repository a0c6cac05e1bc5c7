"""Quantization point reduction: every tensor is quantized once.

Reads: INITIAL configs.
Writes OVERLAPPED and SLAVE:
* a consumer's input config whose tensor its producer's output config already
  quantizes on the same grid is OVERLAPPED by that config;
* for a tensor that no quantized op produces (a graph input, an FP32 op's
  output), later readers' input configs become SLAVE of the first reader's:
  each reader applies the same grid, so the value is quantized identically;
* the output config of a value-preserving op (Reshape, MaxPool, Pad, ...) is
  OVERLAPPED by its input config: its output keeps the input's scale (unless
  its input stays float: then its output is quantized on its own).
"""

from __future__ import annotations

from ...core.ir import Graph
from ...core.quant import QuantizationStates
from ...core.op_facts import VALUE_PRESERVING_TYPES
from ...core.quant_graph import configured_operations, input_config, output_config, producer_config, same_grid
from ..base import QuantizationOptimizationPass

S = QuantizationStates


class QuantizationSimplifyPass(QuantizationOptimizationPass):
    """Overlap repeated quantization of the same tensor."""

    name = "simplify"

    def optimize(self, graph: Graph, **kwargs) -> dict:
        overlapped = 0
        first_reader: dict[str, object] = {}
        for operation in configured_operations(graph):
            for index, variable in enumerate(operation.inputs):
                config = input_config(operation, index)
                if variable is None or variable.is_parameter or config is None or config.state is not S.INITIAL:
                    continue
                master = producer_config(variable)
                # A tensor no quantized op produces (a graph input, an FP32 op's output) is quantized
                # at its readers' inputs: the first reader's config is calibrated, and every later
                # reader applies the same grid as its SLAVE (applied, unlike OVERLAPPED).
                state = S.OVERLAPPED
                if master is None or master.state in (S.FP32, S.SOI, S.DEACTIVATED):
                    master, state = first_reader.get(variable.name), S.SLAVE
                if master is None or master is config or not same_grid(master, config):
                    first_reader.setdefault(variable.name, config)
                    continue
                config.dominated_by(master, state)
                overlapped += 1
            if operation.type in VALUE_PRESERVING_TYPES:
                source, target = input_config(operation, 0), output_config(operation)
                if source is not None and target is not None and target.state is S.INITIAL \
                        and source.state not in (S.FP32, S.SOI, S.DEACTIVATED) and same_grid(source, target):
                    target.dominated_by(source, S.OVERLAPPED)
                    overlapped += 1
        return {"overlapped": overlapped}
