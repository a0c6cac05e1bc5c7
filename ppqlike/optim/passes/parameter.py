"""Parameter quantization: weights get scale and offset from their own values.

Reads: INITIAL configs of parameter inputs (weights; constant operands).
Writes: scale/offset from min-max of the value (per channel along the
config's channel axis when the policy says), state ACTIVATED.

A channel whose weights are all zero has no range: min-max alone would give
it the smallest scale (2^-32), and a bias on the grid S_input x S_weight of
that channel would overflow int32.  Its weights are 0 on any grid, so it
takes the largest scale of the tensor's other channels instead.
"""

from __future__ import annotations

import numpy as np

from ...core import numerics
from ...core.errors import GraphError
from ...core.ir import Graph
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import configured_operations, input_config
from ..base import QuantizationOptimizationPass


def minmax_parameter(config: TensorQuantizationConfig, value: np.ndarray) -> None:
    """Set ``config``'s scale/offset from the min and max of ``value`` (per channel if configured)."""
    value = np.asarray(value, dtype=np.float64)
    if config.observer_algorithm == "unit":   # an unscaled float grid (FP16/BF16 casts): scale 1
        per_channel = config.policy.per_channel and config.channel_axis is not None and value.ndim
        config.set_scale_offset(np.ones(value.shape[config.channel_axis]) if per_channel else 1.0, 0)
        return
    if config.policy.per_channel and config.channel_axis is not None and value.ndim:
        axes = tuple(a for a in range(value.ndim) if a != config.channel_axis % value.ndim)
        low, high = value.min(axis=axes), value.max(axis=axes)
    else:
        low, high = np.array(value.min() if value.size else 0.0), np.array(value.max() if value.size else 0.0)
    empty = (low == 0) & (high == 0)
    if np.ndim(low) and np.any(empty) and not np.all(empty):  # all-zero channels borrow the widest range
        widest = int(np.argmax(high - low))
        low, high = np.where(empty, low[widest], low), np.where(empty, high[widest], high)
    scale, offset = numerics.minmax_to_scale_offset(
        low, high, config.quant_min, config.quant_max, symmetric=config.policy.symmetric,
        power_of_2=config.policy.power_of_2, rounding=config.rounding)
    config.set_scale_offset(scale, offset)


def check_finite_parameter(operation, variable) -> None:
    """GraphError naming the tensor and the op when a parameter holds NaN or Inf (the FP32 model is broken
    there: no scale can represent it, and the calibration data is not to blame)."""
    value = np.asarray(variable.value)
    if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
        bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
        raise GraphError(f"parameter {variable.name!r} of {operation.type} node {operation.name!r} holds {bad} "
                         f"NaN/Inf value(s) of {np.size(value)}: the FP32 model is broken there; fix or re-export "
                         "the model (its float outputs are not finite either)")


class ParameterQuantizePass(QuantizationOptimizationPass):
    """Quantize weights by min-max of their values."""

    name = "parameter"

    def optimize(self, graph: Graph, **kwargs) -> dict:
        count = 0
        for operation in configured_operations(graph):
            for index, variable in enumerate(operation.inputs):
                config = input_config(operation, index)
                if variable is None or not variable.is_parameter or config is None \
                        or config.state is not QuantizationStates.INITIAL:
                    continue
                check_finite_parameter(operation, variable)
                minmax_parameter(config, variable.value)
                config.state = QuantizationStates.ACTIVATED
                count += 1
        return {"parameters": count}
