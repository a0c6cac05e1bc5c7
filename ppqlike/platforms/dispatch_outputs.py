"""The ops that write the model's outputs: dispatched FP32 where the recipe keeps the outputs float.

An *output writer* is a TARGET op each of whose results reaches the graph's outputs and nothing else that
computes on it in 8 bits: every use of the result is a graph output, or an op that passes values through
(:data:`~ppqlike.platforms.dispatch.PASSTHROUGH_TYPES`: Reshape, Flatten, Concat, ...), an Add/Sub/Mul/Div
of constants (a classifier's bias), a pointwise activation of it alone (a detector's Sigmoid:
:data:`~ppqlike.core.op_facts.POINTWISE_ACTIVATIONS`), or an op already labelled FP32 (a final Softmax),
whose own results reach the outputs in the same way.  So the last computation before the outputs moves:
the Conv under a detector's Sigmoid, the GlobalAveragePool under a classifier's Softmax (an average is not
passed through: the Conv before it stays quantized).  Found on the labels a strategy gave, once (labelling
a writer FP32 does not make the op before it a writer).  A model whose every quantized Conv/Gemm/MatMul would
be a writer (a single layer) has none: it is its last layer, and stays quantized.

Why (measured in docs/BENCHMARKS.md, round 8): an output quantized to 8 bits ties close values on its grid
and rounds small ones to zero.  SqueezeNet's averaged logits (read by the float Softmax) tied at the top
code in 16 of 300 dev images on ORT_INT8 (8 of them then disagreed with FP32); a text detector's
probability map of a crop without text (values below half a step of 1/255) became exactly zero, cosine 0.
NNCF and ModelOpt leave a model's outputs unquantized too.  In float, the writer reads its inputs from the
quantized op before it (the boundary of DESIGN.md section 4) and computes what the FP32 model does.

Reads the graph's structure and the labels; writes nothing.
"""

from __future__ import annotations

from typing import Mapping

from ..core.ir import Graph, Operation, Variable
from ..core.op_facts import AFFINE_TYPES, COMPUTING_TYPES, POINTWISE_ACTIVATIONS
from .dispatch_soi import soi_input_indices, value_uses
from .target import TargetPlatform

__all__ = ["output_writers"]

_FP32, _SOI = TargetPlatform.FP32, TargetPlatform.SOI


def _live_outputs(operation: Operation, outputs: set[str]) -> list[Variable]:
    """The results of ``operation`` something reads, or that are graph outputs."""
    return [variable for variable in operation.outputs
            if variable is not None and (variable.name in outputs or variable.consumers)]


def output_writers(graph: Graph, order: list[Operation], labels: Mapping[str, TargetPlatform],
                   target: TargetPlatform, passthrough: frozenset) -> list[str]:
    """Names of the output writers (see the module docstring), in ``order``."""
    outputs = {variable.name for variable in graph.outputs}
    reaches: dict[str, bool] = {}

    def carries_out(reader: Operation, variable: Variable) -> bool:
        """Whether ``reader`` hands ``variable``'s values on to the outputs without computing on them in 8 bits."""
        alone = all(value is None or value is variable or value.is_parameter for value in reader.inputs)
        if not (labels.get(reader.name) is _FP32 or reader.type in passthrough
                or (alone and (reader.type in AFFINE_TYPES or reader.type in POINTWISE_ACTIVATIONS))):
            return False
        live = _live_outputs(reader, outputs)
        return bool(live) and all(reaches_outputs(result) for result in live)

    def reaches_outputs(variable: Variable) -> bool:
        if variable.name not in reaches:
            reaches[variable.name] = False   # (a DAG: no cycle comes back here)
            readers = dict.fromkeys(reader for reader, index in value_uses(variable)
                                    if index not in soi_input_indices(reader) and labels.get(reader.name) is not _SOI)
            reaches[variable.name] = (variable.name in outputs or bool(readers)) and all(
                carries_out(reader, variable) for reader in readers)
        return reaches[variable.name]

    writers = []
    for operation in order:
        if labels.get(operation.name) is not target:
            continue
        live = _live_outputs(operation, outputs)
        if live and all(reaches_outputs(variable) for variable in live):
            writers.append(operation.name)
    computing = [op.name for op in order if labels.get(op.name) is target and op.type in COMPUTING_TYPES]
    if computing and set(computing) <= set(writers):   # a model that is its last layer stays quantized
        return []
    return writers
