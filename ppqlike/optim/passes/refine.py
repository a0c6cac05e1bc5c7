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
  output config: its inputs are computed inside the block, in float (FP32);
* a tensor read where zero gives inf or NaN (Log, Reciprocal, a divisor, the base of a negative power:
  :func:`ppqlike.core.op_facts.zero_sensitive_inputs`) is on no grid: every config that would quantize it
  goes FP32 (see :func:`keep_off_grid`).

Reads: INITIAL configs.  Writes: SOI, FP32 and PASSIVE_INIT states, and the bias configs.
"""

from __future__ import annotations

import numpy as np

from ...core.ir import Graph, Operation, Variable
from ...core.op_facts import output_is_non_float, zero_keeping_inputs, zero_sensitive_inputs
from ...core.patterns import find_transformer_blocks
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import input_config
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
        kept_float = keep_off_grid(graph)
        if kept_float:
            counts["kept_off_grid"] = kept_float
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


def keep_off_grid(graph: Graph) -> list[str]:
    """Keep float every tensor a zero-sensitive read would see on a grid; returns their names (graph order).

    A grid rounds whatever is under half a step to an exact zero: quiet audio into ``Clip(min=1e-10) -> Log``
    became ``-inf``, then NaN, because the Clip's result was quantized after the guard.  The tensor read at a
    slot of :func:`~ppqlike.core.op_facts.zero_sensitive_inputs` gets no grid: the reader's input config, the
    producer's output config (a fused computing op before it follows, through the fusion pass) and its bounds
    (a Clip's ``min`` would round to zero on its input's grid) go FP32; and so, upstream, through the ops that
    keep zeros (:func:`~ppqlike.core.op_facts.zero_keeping_inputs`: reshapes, Relu, Sqrt, Mul...), up to a
    guard, a computing op, a reduction or a graph input.

    Refusing the point, rather than keeping the grid off zero (a clamp after the DequantizeLinear), is what
    deploys faithfully: the exported model then has no Q/DQ pair there, which every runtime computes as
    simulated, whereas no runtime clamps a dequantized value.  It is a property of the graph, the same on every
    platform.  Reads and writes INITIAL configs only (FP32 is written once, before the other refinements).
    """
    refused: dict[str, None] = {}
    for reader in graph.topological_sort():
        for slot in zero_sensitive_inputs(reader):
            variable = reader.inputs[slot]
            if variable is None or not is_float_tensor(variable):
                continue
            _refuse(input_config(reader, slot))
            _refuse_upstream(variable, refused)
    return list(refused)


def _refuse(config: TensorQuantizationConfig | None) -> None:
    if config is not None and config.state is S.INITIAL:
        config.state = S.FP32


def _refuse_upstream(variable: Variable, refused: dict) -> None:
    """No grid on ``variable``, nor on the values whose zeros it carries (see :func:`keep_off_grid`)."""
    stack = [variable]
    while stack:
        variable = stack.pop()
        if variable.name in refused or variable.is_parameter:
            continue
        refused[variable.name] = None
        producer: Operation | None = variable.producer
        if producer is None:
            continue
        if producer.config is not None:
            _refuse(producer.config.output_quantization_config[producer.outputs.index(variable)])
            for slot, kind in enumerate(slots.input_slots(producer)):
                if kind == slots.PASSIVE:
                    _refuse(input_config(producer, slot))
        for slot in zero_keeping_inputs(producer):
            _refuse(input_config(producer, slot))
            stack.append(producer.inputs[slot])
