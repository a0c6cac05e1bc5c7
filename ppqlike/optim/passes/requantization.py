"""Integer requantization (TPU-MLIR style): computing ops rescale their int32 accumulator by M0 >> rshift.

Reads: resolved scales of the input, weight and output configs of every
quantized Conv/ConvTranspose/Gemm/MatMul (after calibration, alignment and
passive).
Writes: ``detail['requantization']`` on the op's output config: per output
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
from ...platforms.slots import COMPUTING_TYPES
from ..base import QuantizationOptimizationPass
from ._common import input_config, output_config, quantized_operations


def _output_channel_axis(op_type: str, rank_hint: int | None) -> int:
    return 1 if op_type in ("Conv", "ConvTranspose") else -1


class IntegerRequantizationPass(QuantizationOptimizationPass):
    """Store each computing op's integer multiplier and shift on its output config."""

    name = "integer_requantization"

    def __init__(self, multiplier_bits: int = 32):
        self.multiplier_bits = multiplier_bits

    def optimize(self, graph: Graph, **kwargs) -> dict:
        count = 0
        for operation in quantized_operations(graph):
            if operation.type not in COMPUTING_TYPES:
                continue
            data, weight, output = input_config(operation, 0), input_config(operation, 1), output_config(operation)
            if data is None or weight is None or output is None:
                continue
            if any(c.scale is None for c in (data, weight, output)) or np.ndim(output.scale) or np.ndim(data.scale):
                continue
            if np.any(np.asarray(data.offset) != 0) or np.any(np.asarray(weight.offset) != 0):
                continue  # the integer path here is for symmetric inputs and weights
            accumulator_scale = np.asarray(data.scale, np.float64) * np.asarray(weight.scale, np.float64)
            multiplier = accumulator_scale / np.float64(output.scale)
            m0, shift = numerics.scale_to_multiplier_shift(np.atleast_1d(multiplier), self.multiplier_bits)
            output.detail["requantization"] = {
                "multiplier": np.asarray(m0).tolist(), "right_shift": np.asarray(shift).tolist(),
                "accumulator_scale": np.atleast_1d(accumulator_scale).astype(np.float64).tolist(),
                "channel_axis": _output_channel_axis(operation.type, None),
                "multiplier_bits": self.multiplier_bits}
            count += 1
        return {"requantized_ops": count}
