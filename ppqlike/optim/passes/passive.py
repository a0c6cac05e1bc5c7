"""Passive parameters: bias, Clip bounds and Pad values take their scales from their masters.

Reads: PASSIVE_INIT configs.
Writes: bias of Conv/ConvTranspose/Gemm → PASSIVE governed by [input, weight]
(scale = S_input x S_weight, offset 0, int32); Clip min/max and the Pad
value → PASSIVE governed by the op's input config.
"""

from __future__ import annotations

from ...core.ir import Graph
from ...core.op_facts import COMPUTING_TYPES
from ...core.quant import QuantizationStates
from ...core.quant_graph import configured_operations, input_config
from ..base import QuantizationOptimizationPass

S = QuantizationStates


class PassiveParameterQuantizePass(QuantizationOptimizationPass):
    """Link passive configs to the configs their scales derive from."""

    name = "passive"

    def optimize(self, graph: Graph, **kwargs) -> dict:
        linked = deactivated = 0
        for operation in configured_operations(graph):
            for index in range(len(operation.inputs)):
                config = input_config(operation, index)
                if config is None or config.state is not S.PASSIVE_INIT:
                    continue
                data = input_config(operation, 0)
                if operation.type in COMPUTING_TYPES:
                    weight = input_config(operation, 1)
                    masters = [data, weight]
                else:
                    masters = [data]
                if any(m is None or m.scale is None for m in masters):
                    config.state = S.FP32  # no master to take a scale from: stays float
                    deactivated += 1
                    continue
                if len(masters) == 1 and (config.quant_min, config.quant_max) != (masters[0].quant_min,
                                                                                  masters[0].quant_max):
                    config.set_range(masters[0].quant_min, masters[0].quant_max)   # the master's grid (an
                    # unsigned one included: a Clip bound of 6 on [-128, 127] at a [0, 255] scale would be ~3)
                config.dominated_by(masters if len(masters) > 1 else masters[0], S.PASSIVE)
                linked += 1
        return {"passive": linked, "left_float": deactivated}
