"""Fusion: a computing op followed by a fusable activation is quantized once, after the activation.

Reads: configs in INITIAL of chains Conv/ConvTranspose/Gemm/MatMul -> activation
where the computing op's output is read by the activation alone.
Writes: the computing op's output config and the activation's input config
become OVERLAPPED by the activation's output config.
"""

from __future__ import annotations

from ...core.ir import Graph
from ...core.op_facts import COMPUTING_TYPES, FUSABLE_ACTIVATIONS
from ...core.quant import QuantizationStates
from ...core.quant_graph import input_config, output_config
from ..base import QuantizationOptimizationPass


class FusionPass(QuantizationOptimizationPass):
    """Overlap computing-op outputs by the fusable activation that follows them."""

    name = "fusion"

    def __init__(self, activation_types=FUSABLE_ACTIVATIONS, computing_types=COMPUTING_TYPES):
        self.activation_types = frozenset(activation_types)
        self.computing_types = frozenset(computing_types)

    def optimize(self, graph: Graph, **kwargs) -> dict:
        fused = 0
        for computing, activation in graph.find_chains(
                [lambda op: op.type in self.computing_types, lambda op: op.type in self.activation_types]):
            if computing.config is None or activation.config is None:
                continue
            master = output_config(activation)
            overlapped = [output_config(computing), input_config(activation, 0)]
            if master is None or any(c is None or c.state is not QuantizationStates.INITIAL for c in overlapped):
                continue
            for config in overlapped:
                config.dominated_by(master, QuantizationStates.OVERLAPPED)
            fused += 1
        return {"fused": fused}
