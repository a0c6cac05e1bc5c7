"""Refine: correct the quantizer's configs op by op from each op's semantics (the first pass).

The platform quantizer writes configs from the policy alone.  This pass reads
the op and its tensors and corrects them:

* shape, size, index, roi and scale inputs (slot kind ``none``) become SOI;
* integer and boolean tensors become FP32 (never quantized);
* the bias of Conv/ConvTranspose/Gemm becomes a PASSIVE_INIT int32 config when
  the platform keeps int32 biases and both its masters (input and weight) are
  quantized, FP32 otherwise;
* Clip bounds and the Pad value become PASSIVE_INIT (the grid of input 0);
* the tail of a decomposed transformer block (LayerNorm, GELU: :mod:`ppqlike.core.patterns`) keeps only its
  output config: its inputs are computed inside the block, in float (FP32).

Reads: INITIAL configs.  Writes: SOI, FP32 and PASSIVE_INIT states, and the bias configs.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Graph, Variable
from ...core.op_facts import output_is_non_float
from ...core.patterns import find_transformer_blocks
from ...core.quant import QuantizationStates
from ...platforms import slots
from ...platforms.quantizer import PlatformPolicy, PlatformQuantizer
from ..base import QuantizationOptimizationPass

S = QuantizationStates


def is_float_tensor(variable: Variable) -> bool:
    """A floating-point tensor, or one whose type is unknown and that its producer does not make integer or
    boolean by definition (an index, a mask, a code: ``op_facts.output_is_non_float``)."""
    dtype = variable.dtype if variable.value is None else variable.value.dtype
    if dtype is None:
        producer = variable.producer
        return producer is None or not any(output is variable and output_is_non_float(producer, index)
                                           for index, output in enumerate(producer.outputs))
    return np.issubdtype(dtype, np.floating)


class QuantizeRefinePass(QuantizationOptimizationPass):
    """Turn the policy's INITIAL configs into what each op's semantics allows."""

    name = "refine"

    def __init__(self, policy: PlatformPolicy):
        self.quantizer = PlatformQuantizer(policy)

    def optimize(self, graph: Graph, **kwargs) -> dict:
        counts = {"soi": 0, "non_float": 0, "bias": 0, "float_bias": 0, "passive": 0, "block_inside": 0}
        tails = {block.tail for block in find_transformer_blocks(graph) if len(block.operations) > 1}
        for operation in graph.topological_sort():
            if operation.name in tails and operation.config is not None:
                for tqc in operation.config.input_quantization_config:
                    if tqc is not None and tqc.state is S.INITIAL:
                        tqc.state = S.FP32
                        counts["block_inside"] += 1
            self.refine_operation(operation, counts)
        return counts

    def refine_operation(self, operation, counts: dict | None = None) -> dict:
        """Refine one op's INITIAL configs (see the class); adds what changed to ``counts``."""
        counts = {"soi": 0, "non_float": 0, "bias": 0, "float_bias": 0, "passive": 0} if counts is None else counts
        config = operation.config
        if config is None:
            return counts
        inputs = config.input_quantization_config
        for index, (variable, kind) in enumerate(zip(operation.inputs, slots.input_slots(operation))):
            tqc = inputs[index] if index < len(inputs) else None
            if tqc is None or tqc.state is not S.INITIAL:
                continue
            if kind == slots.NONE:
                tqc.state = S.SOI
                counts["soi"] += 1
            elif not is_float_tensor(variable):
                tqc.state = S.FP32
                counts["non_float"] += 1
            elif kind == slots.PASSIVE:
                inputs[index] = self.quantizer.passive_config(variable.name)
                counts["passive"] += 1
            elif kind == slots.BIAS:
                masters = inputs[:2]
                if self.quantizer.policy.bias_int32 and len(masters) == 2 and all(
                        m is not None and m.state is S.INITIAL for m in masters):
                    inputs[index] = self.quantizer.bias_config(variable.name)
                    counts["bias"] += 1
                else:
                    tqc.state = S.FP32
                    counts["float_bias"] += 1
        for variable, tqc in zip(operation.outputs, config.output_quantization_config):
            if tqc is not None and tqc.state is S.INITIAL and not is_float_tensor(variable):
                tqc.state = S.FP32
                counts["non_float"] += 1
        return counts
