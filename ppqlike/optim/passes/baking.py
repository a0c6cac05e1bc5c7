"""Baking: parameters are quantized once and stored.

Reads: ACTIVATED configs of parameter inputs and PASSIVE configs.
Writes: ``config.baked_value`` (the fake-quantized parameter, float32) and
state BAKED / PASSIVE_BAKED.  The FP32 value in ``Variable.value`` is kept,
so a DEQUANTIZED config (analysis) still sees the original.
"""

from __future__ import annotations

from ...core.ir import Graph
from ...core.quant import QuantizationStates
from ...core.quant_graph import configured_operations, input_config
from ..base import QuantizationOptimizationPass

S = QuantizationStates


class ParameterBakingPass(QuantizationOptimizationPass):
    """Quantize every parameter once and store the result."""

    name = "baking"

    def optimize(self, graph: Graph, **kwargs) -> dict:
        baked = 0
        for operation in configured_operations(graph):
            for index, variable in enumerate(operation.inputs):
                config = input_config(operation, index)
                if variable is None or not variable.is_parameter or config is None:
                    continue
                if config.state is S.ACTIVATED:
                    config.baked_value = config.fake_quantize(variable.value)
                    config.state = S.BAKED
                    baked += 1
                elif config.state is S.PASSIVE:
                    config.baked_value = config.fake_quantize(variable.value)
                    config.state = S.PASSIVE_BAKED
                    baked += 1
        return {"baked": baked}
