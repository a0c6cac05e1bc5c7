"""The blocks of transformers, recognised once so that platform policies speak of "LayerNorm", not of five ops.

:func:`find_transformer_blocks` reads the graph and writes nothing.  A :class:`Block` is one of

* ``LayerNorm`` — the ``LayerNormalization`` op, or the decomposed form exporters write:
  ``d = x - ReduceMean(x)``, ``ReduceMean(d^2)`` (Pow or Mul) ``+ eps``, Sqrt, ``d / std`` (Div, or Mul by
  Reciprocal), then optionally ``* gamma`` and ``+ beta``;
* ``Gelu`` — the ``Gelu`` op, or ``x * (1 + Erf(x / sqrt 2)) * 0.5`` in any order of the two Muls (the
  scaling by 1/sqrt 2 as Div or Mul);
* ``Softmax`` — the ``Softmax`` op;
* ``AttentionMatMul`` — a MatMul of two activations (Q K^T, probabilities x V);
* ``ResidualAdd`` — an Add of two activations on the residual stream: one of its inputs, or its result, is what
  a LayerNorm block reads (pre-norm and post-norm blocks; the skip connections of CNNs are not);
* ``Embedding`` — a Gather from a parameter table at activation indices.

A block has its ops in order, the activation it reads (``source``) and the variable it writes (``result``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Graph, Operation, Variable

__all__ = ["Block", "BLOCK_KINDS", "find_transformer_blocks", "LAYER_NORM", "GELU", "SOFTMAX",
           "ATTENTION_MATMUL", "RESIDUAL_ADD", "EMBEDDING"]

LAYER_NORM, GELU, SOFTMAX = "LayerNorm", "Gelu", "Softmax"
ATTENTION_MATMUL, RESIDUAL_ADD, EMBEDDING = "AttentionMatMul", "ResidualAdd", "Embedding"
BLOCK_KINDS = (LAYER_NORM, GELU, SOFTMAX, ATTENTION_MATMUL, RESIDUAL_ADD, EMBEDDING)


@dataclass(frozen=True)
class Block:
    """One transformer block: its ``kind``, its op names in order, what it reads and what it writes."""

    kind: str
    operations: tuple[str, ...]
    source: str
    result: str

    @property
    def tail(self) -> str:
        """The op that writes the block's result."""
        return self.operations[-1]


def find_transformer_blocks(graph: Graph) -> list[Block]:
    """Every block of ``graph``, in topological order of their tails; an op belongs to at most one block."""
    blocks: list[Block] = []
    taken: set[str] = set()
    order = graph.topological_sort()
    for finder in (_layer_norm, _gelu):
        for operation in order:
            if operation.name not in taken:
                block = finder(operation)
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


# ------------------------------------------------------------------ helpers

def _is_activation(variable: Variable | None) -> bool:
    return variable is not None and not variable.is_parameter and (
        variable.producer is None or variable.producer.type != "Constant")


def _constant(variable: Variable | None) -> np.ndarray | None:
    """The value of a parameter or a Constant op's output (None for activations)."""
    if variable is None:
        return None
    if variable.is_parameter:
        return np.asarray(variable.value)
    producer = variable.producer
    if producer is not None and producer.type == "Constant" and "value" in producer.attributes:
        return np.asarray(producer.attributes["value"])
    return None


def _is_scalar(variable: Variable | None, value: float | None = None, tolerance: float = 1e-3) -> bool:
    array = _constant(variable)
    if array is None or array.size != 1:
        return False
    return value is None or abs(float(array.reshape(())) - value) <= tolerance * max(1.0, abs(value))


def _only_consumer(variable: Variable, op_type: str | tuple[str, ...]) -> Operation | None:
    types = (op_type,) if isinstance(op_type, str) else op_type
    consumers = list(dict.fromkeys(variable.consumers))
    return consumers[0] if len(consumers) == 1 and consumers[0].type in types else None


def _other_input(operation: Operation, variable: Variable) -> Variable | None:
    """The other input of a binary op (None when both are ``variable`` or the op is not binary)."""
    others = [v for v in operation.inputs[:2] if v is not variable]
    return others[0] if len(others) == 1 else None


def _with_scalar(operation: Operation | None, op_type: str, value: float | None = None) -> bool:
    return operation is not None and operation.type == op_type and any(
        _is_scalar(v, value) for v in operation.inputs[:2])


# ------------------------------------------------------------------ LayerNorm

def _layer_norm(operation: Operation) -> Block | None:
    if operation.type == "LayerNormalization":
        return Block(LAYER_NORM, (operation.name,), operation.inputs[0].name, operation.outputs[0].name)
    if operation.type != "Sub" or len(operation.inputs) != 2:
        return None
    source, mean = operation.inputs
    if mean.producer is None or mean.producer.type != "ReduceMean" or mean.producer.inputs[0] is not source:
        return None
    centred = operation.outputs[0]
    square = next((c for c in centred.consumers if c.type == "Pow" and _is_scalar(c.inputs[1], 2.0)
                   or c.type == "Mul" and c.inputs[0] is centred and c.inputs[1] is centred), None)
    if square is None:
        return None
    variance = _only_consumer(square.outputs[0], "ReduceMean")
    add_epsilon = variance and _only_consumer(variance.outputs[0], "Add")
    if not _with_scalar(add_epsilon, "Add"):
        return None
    root = _only_consumer(add_epsilon.outputs[0], "Sqrt")
    if root is None:
        return None
    ops = [mean.producer, operation, square, variance, add_epsilon, root]
    divide = _only_consumer(root.outputs[0], ("Div", "Reciprocal"))
    if divide is not None and divide.type == "Reciprocal":
        ops.append(divide)
        divide = _only_consumer(divide.outputs[0], "Mul")
    if divide is None or centred not in divide.inputs:
        return None
    ops.append(divide)
    last = divide
    for op_type in ("Mul", "Add"):  # gamma, then beta
        following = _only_consumer(last.outputs[0], op_type)
        if following is None or not any(v is not None and v.is_parameter for v in following.inputs[:2]):
            break
        ops.append(following)
        last = following
    return Block(LAYER_NORM, tuple(op.name for op in ops), source.name, last.outputs[0].name)


# ------------------------------------------------------------------ GELU

def _gelu(operation: Operation) -> Block | None:
    if operation.type == "Gelu":
        return Block(GELU, (operation.name,), operation.inputs[0].name, operation.outputs[0].name)
    if operation.type != "Erf":
        return None
    scaling = operation.inputs[0].producer
    if not (_with_scalar(scaling, "Div", np.sqrt(2.0)) or _with_scalar(scaling, "Mul", 1 / np.sqrt(2.0))):
        return None
    source = next((v for v in scaling.inputs[:2] if _is_activation(v)), None)
    if source is None:
        return None
    plus_one = _only_consumer(operation.outputs[0], "Add")
    if not _with_scalar(plus_one, "Add", 1.0):
        return None
    product = _only_consumer(plus_one.outputs[0], "Mul")
    if product is None:
        return None
    other = _other_input(product, plus_one.outputs[0])
    ops = [scaling, operation, plus_one]
    if other is source:  # x * (1 + erf) * 0.5
        half = _only_consumer(product.outputs[0], "Mul")
        if not _with_scalar(half, "Mul", 0.5):
            return None
        ops += [product, half]
    elif other is not None and _with_scalar(other.producer, "Mul", 0.5) and source in other.producer.inputs:
        half = other.producer  # (x * 0.5) * (1 + erf)
        ops = [half, *ops, product]
    else:
        return None
    return Block(GELU, tuple(op.name for op in ops), source.name, ops[-1].outputs[0].name)


# ------------------------------------------------------------------ single ops

def _single_op_kind(operation: Operation, normalised: set[str]) -> str | None:
    if operation.type == "Softmax":
        return SOFTMAX
    if operation.type == "MatMul" and all(_is_activation(v) for v in operation.inputs[:2]):
        return ATTENTION_MATMUL
    if operation.type == "Add" and len(operation.inputs) == 2 and all(_is_activation(v) for v in operation.inputs) \
            and any(v.name in normalised for v in (*operation.inputs, *operation.outputs)):
        return RESIDUAL_ADD
    if operation.type == "Gather" and operation.inputs[0].is_parameter and _is_activation(operation.inputs[1]):
        return EMBEDDING
    return None
