"""The blocks of transformers, recognised once so that platform policies speak of "LayerNorm", not of five ops.

:func:`find_transformer_blocks` reads the graph and writes nothing.  A :class:`Block` is one of

* ``LayerNorm`` — the ``LayerNormalization`` op, or any spelling of a LayerNorm or an RMSNorm written out
  (:mod:`ppqlike.core.block_norms`: ``x - mean`` squared or ``E[x^2] - E[x]^2``, ``/ sqrt``, ``* Reciprocal``,
  ``* Pow(-0.5)``, TensorFlow's ``x * k + (beta - mean * k)``...; ``form`` says which of the two).  An RMSNorm
  is a LayerNorm for the policies: every target that runs LayerNorm in float (or F16) runs RMSNorm so too;
* ``Gelu`` — the ``Gelu`` op, or any spelling of its erf, tanh or sigmoid (quick GELU) form
  (:mod:`ppqlike.core.block_gelu`);
* ``Activation`` — a pointwise activation written out as several ops: HardSwish, SiLU or Mish
  (:mod:`ppqlike.core.block_activation`; the single ops are ops like any other);
* ``Softmax`` — the ``Softmax`` op;
* ``AttentionMatMul`` — a MatMul of two activations (Q K^T);
* ``ProbabilityMatMul`` — a MatMul of two activations one of which is a Softmax's output, passed on by ops that
  keep its values (Reshape, Transpose, Gather, Concat, ...): the attention's probabilities x V;
* ``ResidualAdd`` — an Add of two activations on the residual stream: one of its inputs, or its result, is what
  a LayerNorm block reads (pre-norm and post-norm blocks; the skip connections of CNNs are not);
* ``Embedding`` — a Gather from a parameter table at activation indices.

A block has its ops in order, the activation it reads (``source``) and the variable it writes (``result``).
The written-out blocks are found by what they compute, on probe values (:mod:`ppqlike.core.block_regions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .block_activation import activation_match
from .block_gelu import gelu_match
from .block_norms import norm_match
from .ir import Graph, Operation, Variable

__all__ = ["Block", "BLOCK_KINDS", "find_transformer_blocks", "LAYER_NORM", "GELU", "ACTIVATION", "SOFTMAX",
           "ATTENTION_MATMUL", "PROBABILITY_MATMUL", "RESIDUAL_ADD", "EMBEDDING"]

LAYER_NORM, GELU, ACTIVATION, SOFTMAX = "LayerNorm", "Gelu", "Activation", "Softmax"
ATTENTION_MATMUL, PROBABILITY_MATMUL = "AttentionMatMul", "ProbabilityMatMul"
RESIDUAL_ADD, EMBEDDING = "ResidualAdd", "Embedding"
BLOCK_KINDS = (LAYER_NORM, GELU, ACTIVATION, SOFTMAX, ATTENTION_MATMUL, PROBABILITY_MATMUL, RESIDUAL_ADD, EMBEDDING)

#: ops that pass a Softmax's probabilities on to the MatMul that weighs the values with them (heads split or
#: merged, rows picked): the MatMul still reads probabilities
_PROBABILITY_CARRIERS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Concat", "Identity",
                                   "Dropout", "Cast"})


@dataclass(frozen=True)
class Block:
    """One transformer block: its ``kind``, its op names in order, what it reads and what it writes.

    ``form`` says how it is written: ``op`` (one ONNX op), ``layer_norm`` or ``rms_norm`` (a LayerNorm
    written out), ``erf``, ``tanh`` or ``sigmoid`` (a GELU written out), ``hard_swish``, ``silu`` or ``mish``
    (an activation written out), empty for single-op kinds.
    ``affine`` names the constants that scale a norm's result per channel (gamma and beta; gamma alone for an
    RMSNorm): dividing them all by s divides the result by s (what SmoothQuant needs).
    """

    kind: str
    operations: tuple[str, ...]
    source: str
    result: str
    form: str = ""
    affine: tuple[str, ...] = ()

    @property
    def tail(self) -> str:
        """The op that writes the block's result."""
        return self.operations[-1]


def find_transformer_blocks(graph: Graph) -> list[Block]:
    """Every block of ``graph``, in topological order of their tails; an op belongs to at most one block."""
    blocks: list[Block] = []
    taken: set[str] = set()
    order = graph.topological_sort()
    graph_outputs = {variable.name for variable in graph.outputs}
    for finder in (_layer_norm, _gelu, _activation):
        for operation in order:
            if operation.name not in taken:
                block = finder(operation, taken, graph_outputs)
                if block is not None and not taken.intersection(block.operations):
                    blocks.append(block)
                    taken.update(block.operations)
    normalised = {block.source for block in blocks if block.kind == LAYER_NORM}
    for operation in order:
        if operation.name in taken:
            continue
        kind = _single_op_kind(operation, normalised)
        if kind is not None:
            blocks.append(Block(kind, (operation.name,), operation.inputs[0].name, operation.outputs[0].name))
    position = {operation.name: index for index, operation in enumerate(order)}
    return sorted(blocks, key=lambda block: position[block.tail])


def _is_activation(variable: Variable | None) -> bool:
    return variable is not None and not variable.is_parameter and (
        variable.producer is None or variable.producer.type != "Constant")


def _written_out(kind: str, match) -> Block | None:
    if match is None:
        return None
    form, region, affine = match
    return Block(kind, tuple(op.name for op in region.operations), region.source.name,
                 region.result.outputs[0].name, form, affine)


def _layer_norm(operation: Operation, taken: set[str], graph_outputs: set[str]) -> Block | None:
    if operation.type == "LayerNormalization":
        present = [v for v in operation.inputs[1:3] if v is not None]
        affine = tuple(v.name for v in present) if present and all(v.is_parameter for v in present) else ()
        return Block(LAYER_NORM, (operation.name,), operation.inputs[0].name, operation.outputs[0].name, "op",
                     affine)
    return _written_out(LAYER_NORM, norm_match(operation, taken, graph_outputs))


def _gelu(operation: Operation, taken: set[str], graph_outputs: set[str]) -> Block | None:
    if operation.type == "Gelu":
        return Block(GELU, (operation.name,), operation.inputs[0].name, operation.outputs[0].name, "op")
    return _written_out(GELU, gelu_match(operation, taken, graph_outputs))


def _activation(operation: Operation, taken: set[str], graph_outputs: set[str]) -> Block | None:
    return _written_out(ACTIVATION, activation_match(operation, taken, graph_outputs))


# ------------------------------------------------------------------ single ops

def _single_op_kind(operation: Operation, normalised: set[str]) -> str | None:
    if operation.type == "Softmax":
        return SOFTMAX
    if operation.type == "MatMul" and all(_is_activation(v) for v in operation.inputs[:2]):
        return PROBABILITY_MATMUL if any(_reads_probabilities(v) for v in operation.inputs[:2]) else ATTENTION_MATMUL
    if operation.type == "Add" and len(operation.inputs) == 2 and all(_is_activation(v) for v in operation.inputs) \
            and any(v.name in normalised for v in (*operation.inputs, *operation.outputs)):
        return RESIDUAL_ADD
    if operation.type == "Gather" and operation.inputs[0].is_parameter and _is_activation(operation.inputs[1]):
        return EMBEDDING
    return None


def _reads_probabilities(variable: Variable) -> bool:
    """Whether ``variable`` is a Softmax's output, directly or through ops that only move its values."""
    producer = variable.producer
    while producer is not None and producer.type in _PROBABILITY_CARRIERS and producer.inputs \
            and producer.inputs[0] is not None:
        producer = producer.inputs[0].producer
    return producer is not None and producer.type == "Softmax"
