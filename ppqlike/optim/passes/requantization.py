"""Integer requantization (TPU-MLIR style): computing ops rescale their int32 accumulator by M0 >> rshift.

Reads: resolved scales of the input, weight and output configs of every
quantized Conv/ConvTranspose/Gemm/MatMul (after calibration, alignment and
passive).
Writes: ``requantization`` (an IntegerRequantization) on the op's output config: per output
channel, the integer multiplier M0 and right shift with
M0 / 2^rshift ~= S_input * S_weight / S_output, the accumulator scale, and
the axis of the output channels.  No state changes.  The executor then
simulates the op's output as the hardware computes it:
acc = round(y / (S_input * S_weight)) (the int32 accumulator, bias included),
q = clamp(((acc * M0) >> rshift) + Z_output) with the config's rounding.
"""

from __future__ import annotations

import numpy as np

from ...core import numerics
from ...core.ir import Graph
from ...core.requantization import IntegerRequantization
from ...core.op_facts import COMPUTING_TYPES, output_channel_axis
from ...core.quant_graph import configured_operations, input_config, output_config
from ..base import QuantizationOptimizationPass


class IntegerRequantizationPass(QuantizationOptimizationPass):
    """Store each computing op's integer multiplier and shift on its output config."""

    name = "integer_requantization"

    def __init__(self, multiplier_bits: int = 32):
        self.multiplier_bits = multiplier_bits

    def optimize(self, graph: Graph, **kwargs) -> dict:
        count = 0
        for operation in configured_operations(graph):
            if operation.type not in COMPUTING_TYPES:
                continue
            data, weight, output = input_config(operation, 0), input_config(operation, 1), output_config(operation)
            if data is None or weight is None or output is None:
                continue
            if any(c.scale is None for c in (data, weight, output)) or np.ndim(output.scale) or np.ndim(data.scale):
                continue
            if any(c.float_format is not None for c in (data, weight, output)):
                continue  # a layer moved to F16/BF16 computes in float
            if np.any(np.asarray(data.offset) != 0) or np.any(np.asarray(weight.offset) != 0):
                continue  # the integer path here is for symmetric inputs and weights
            accumulator_scale = np.asarray(data.scale, np.float64) * np.asarray(weight.scale, np.float64)
            multiplier = accumulator_scale / np.float64(output.scale)
            m0, shift = numerics.scale_to_multiplier_shift(np.atleast_1d(multiplier), self.multiplier_bits)
            output.requantization = IntegerRequantization.from_arrays(
                m0, shift, accumulator_scale, output_channel_axis(operation), self.multiplier_bits)
            count += 1
        return {"requantized_ops": count}
