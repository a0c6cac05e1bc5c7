"""Placement: which tensors a platform quantizes at all, before any config is linked or calibrated.

Two placements (``PlatformPolicy.placement``, and ``transformer_placement`` for a graph with LayerNorms):

* ``every_output`` (PPQ's, and what integer-only hardware runs: TPU-MLIR, onnxruntime's integer kernels):
  every op on the platform quantizes its outputs; nothing changes here.
* ``compute_inputs`` (TensorRT's explicit quantization): a tensor is quantized only where an int8 kernel
  reads it - the activation inputs of Conv, ConvTranspose, Gemm and MatMul, and of a recurrent op the
  platform quantizes (``setting.recurrent='quantize'``) - and at the skip input of a
  residual Add whose other input a computing op writes (possibly through a Relu/Clip) for that Add alone:
  TensorRT then fuses the Add, and the activation, into that op's epilogue, which reads the skip input in
  int8 and adds it to the float accumulator.  Everything else runs in float: a computing op's result is not
  rounded to 8 bits before the next op that needs it quantized (TensorRT fuses the requantization into the
  kernel that writes it), and the graph's outputs stay float.

Reads: the INITIAL configs the refine pass left.  Writes: FP32 on the activation configs (inputs and
outputs) of tensors the placement does not quantize, and on the constant operands of ops other than the
computing ones (they run in float); weights, biases and passive configs of computing ops are left to the
passes that follow (a Clip bound whose data input is float stays float, see the passive pass); an op left
with nothing quantized is dispatched FP32 (what its platform runs in float: TPU-MLIR's quantize table
lists it as F32).
"""

from __future__ import annotations

from ...core.errors import PlatformError
from ...core.ir import Graph, Operation, Variable
from ...core.patterns import LAYER_NORM, find_transformer_blocks
from ...core.op_facts import COMPUTING_TYPES, FUSABLE_ACTIVATIONS, RECURRENT_TYPES
from ...core.quant import QuantizationStates
from ...platforms import slots
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass

S = QuantizationStates
PLACEMENTS = ("every_output", "compute_inputs")


def _activation_inputs(operation: Operation) -> list[Variable]:
    return [variable for variable, kind in zip(operation.inputs, slots.input_slots(operation))
            if variable is not None and kind == slots.ACTIVATION and not variable.is_parameter]


def _fused_producer(variable: Variable) -> Operation | None:
    """The computing op whose epilogue can take an Add reading ``variable``: it writes ``variable`` directly or
    through fusable activations, each result read by the next op alone; None otherwise."""
    while True:
        producer = variable.producer
        if producer is None or producer.config is None or len(variable.consumers) != 1:
            return None
        if producer.type in COMPUTING_TYPES:
            return producer
        if producer.type not in FUSABLE_ACTIVATIONS:
            return None
        variable = producer.inputs[0]


def compute_input_tensors(graph: Graph) -> set[str]:
    """The tensors TensorRT's placement quantizes (see the module docstring), by name."""
    order = {operation.name: index for index, operation in enumerate(graph.topological_sort())}
    quantized: set[str] = set()
    for operation in graph.operations.values():
        if operation.config is None:
            continue
        if operation.type in COMPUTING_TYPES or operation.type in RECURRENT_TYPES:
            quantized.update(variable.name for variable in _activation_inputs(operation))
        elif operation.type == "Add" and len(operation.inputs) == 2:
            data = _activation_inputs(operation)
            if len(data) != 2 or data[0] is data[1]:
                continue
            producers = [_fused_producer(variable) for variable in data]
            fusable = [index for index in (0, 1) if producers[index] is not None]
            if fusable:   # the Add fuses into the later of the ops that may take it; the other input is read in int8
                fused = max(fusable, key=lambda index: order[producers[index].name])
                quantized.add(data[1 - fused].name)
    return quantized


def graph_placement(graph: Graph, placement: str, transformer_placement: str | None) -> str:
    """The placement ``graph`` gets: ``transformer_placement`` when it is set and the graph has LayerNorms."""
    if transformer_placement is not None and any(block.kind == LAYER_NORM for block in find_transformer_blocks(graph)):
        return transformer_placement
    return placement


class QuantizationPlacementPass(QuantizationOptimizationPass):
    """Leave in float the tensors the platform's placement does not quantize (see the module docstring)."""

    name = "placement"

    def __init__(self, placement: str = "every_output", transformer_placement: str | None = None):
        for value in (placement, transformer_placement or placement):
            if value not in PLACEMENTS:
                raise PlatformError(f"placement {value!r} is not one of {', '.join(PLACEMENTS)}")
        self.placement, self.transformer_placement = placement, transformer_placement

    def optimize(self, graph: Graph, **kwargs) -> dict:
        placement = graph_placement(graph, self.placement, self.transformer_placement)
        if placement == "every_output":
            return {"placement": placement, "left_float": 0}
        quantized = compute_input_tensors(graph)
        left_float = set()
        for operation in graph.operations.values():
            if operation.config is None:
                continue
            pairs = [(variable, config) for variable, config, kind in zip(
                operation.inputs, operation.config.input_quantization_config, slots.input_slots(operation))
                if kind == slots.ACTIVATION] + list(zip(operation.outputs, operation.config.output_quantization_config))
            computing = operation.type in COMPUTING_TYPES
            for variable, config in pairs:
                if variable is None or config is None or config.state is not S.INITIAL:
                    continue
                if variable.is_parameter and computing:
                    continue
                if variable.is_parameter or variable.name not in quantized:   # a constant operand of a float op
                    config.state = S.FP32
                    left_float.add(variable.name)
        floated = []
        for operation in graph.operations.values():   # nothing of it quantized: it runs in float (TPU-MLIR's
            if operation.config is not None and operation.platform is not TargetPlatform.FP32 and all(
                    config.state in (S.FP32, S.SOI) for config in operation.config.all_configs()):
                operation.platform = TargetPlatform.FP32   # quantize table lists it as F32)
                floated.append(operation.name)
        return {"placement": placement, "quantized": len(quantized), "left_float": len(left_float),
                "float_ops": len(floated)}
