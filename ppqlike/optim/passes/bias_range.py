"""Int32 bias range: widen a weight channel's scale where its bias would not fit in int32.

An int32 bias is quantized with S_bias = S_input * S_weight.  A channel whose
weights are all tiny (a dead channel: EfficientNet-Lite0 has 82 in 26 convs)
gets a tiny weight scale, and then a bias of ordinary size needs a code past
2^31 - 1: it saturates, the channel computes with a wrong bias, and on
onnxruntime the int32 sum of that saturated code and the products wraps
around (the channel's outputs flip between the ends of the range).  As
onnxruntime's own quantizer does, such a channel's weight scale is raised
until the bias fits:

    S_weight[c] >= |b[c]| / (S_input * (2^31 - 1))   (rounded up to float32, or
                                                       to a power of two where the policy says)

The channel's weights, tiny against its bias, then quantize coarsely (mostly to
zero); every other channel keeps its scale.

Reads: computing ops with an applied 32-bit bias config (PASSIVE under
[input, weight]), the input's per-tensor scale, the weight's ACTIVATED
symmetric scale, the float bias.  Writes: the weight config's scale (no
state changes).  Runs after every pass that chooses scales, before bias
correction bakes biases (a baked bias, PASSIVE_BAKED, is left alone) and
before requantization and baking.
"""

from __future__ import annotations

import numpy as np

from ...core import numerics
from ...core.ir import Graph
from ...core.op_facts import BIAS_TYPES
from ...core.quant import QuantizationStates, is_applied
from ...core.quant_graph import configured_operations, input_config
from ...core.quant_policy import QuantizationProperty
from ..base import QuantizationOptimizationPass

S = QuantizationStates
_MARGIN = 1.0001   # as onnxruntime: the float32 roundings of the scales never push a code past the limit


def bias_fitting_scale(bias: np.ndarray, input_scale: float, weight_scale: np.ndarray, limit: float,
                       power_of_2: bool = False) -> np.ndarray:
    """The weight scale (float32, the shape of ``weight_scale``) with each channel raised where needed so
    that |bias| / float32(S_input * S_weight) <= ``limit``; channels that already fit keep their scale."""
    weight_scale = np.asarray(weight_scale, np.float32)
    needed = np.abs(np.asarray(bias, np.float64).reshape(-1)) / (np.float64(input_scale) * limit) * _MARGIN
    if weight_scale.size == 1:
        needed = np.max(needed, initial=0.0)
    needed = np.broadcast_to(needed, weight_scale.shape)
    raise_to = needed > weight_scale
    if not np.any(raise_to):
        return weight_scale
    wider = numerics.power_of_2_scale(needed) if power_of_2 else needed
    wider = np.asarray(wider, np.float64).astype(np.float32)
    wider = np.where(wider < needed, np.nextafter(wider, np.float32(np.inf)), wider)   # rounded up
    return np.where(raise_to, wider, weight_scale).astype(np.float32)


class Int32BiasRangePass(QuantizationOptimizationPass):
    """Raise the weight scales of channels whose int32 bias codes would saturate."""

    name = "bias_range"

    def optimize(self, graph: Graph, **kwargs) -> dict:
        ops = channels = 0
        for operation in configured_operations(graph):
            if operation.type not in BIAS_TYPES or len(operation.inputs) < 3:
                continue
            data, weight, bias = (input_config(operation, index) for index in range(3))
            variable = operation.inputs[2]
            if bias is None or not is_applied(bias.state) or bias.num_of_bits != 32 or variable is None \
                    or variable.value is None or data is None or weight is None:
                continue
            if weight.state is not S.ACTIVATED or data.scale is None or np.size(data.scale) != 1 \
                    or weight.scale is None or np.any(np.asarray(weight.offset) != 0) \
                    or np.size(weight.scale) not in (1, np.size(variable.value)):
                continue   # asymmetric weights would need new offsets; baked ones keep theirs
            old = np.asarray(weight.scale, np.float32)
            new = bias_fitting_scale(variable.value, float(np.asarray(data.scale).reshape(())), old,
                                     float(bias.quant_max),
                                     weight.policy.has_property(QuantizationProperty.POWER_OF_2))
            changed = int(np.count_nonzero(new != old))
            if changed:
                weight.scale = new
                ops, channels = ops + 1, channels + changed
        return {"ops": ops, "channels": channels}
