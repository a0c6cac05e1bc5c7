"""The blocks the block reconstruction (``block_reconstruction.py``) trains: BRECQ's residual blocks found in
a graph without modules.

The ops are swept in topological order, counting which tensors are live (made and not yet read by all their
readers; a graph output stays live).  Where one tensor alone is live, the graph can be cut: what lies between two
cuts is a piece (a residual branch is one piece with its skip).  Consecutive pieces are joined until a block holds
``block_layers`` of the layers to learn; a piece with an op whose gradient is unknown (``block_gradients``), or
more layers than a block may hold, ends the block before it and belongs to none.  Shape computations (Shape and
what reads only shapes and constants) are in no block and do not keep their input live: the walk runs them.

Reads: the graph's structure.  Writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.ir import Graph, Operation
from .block_gradients import gradient_unsupported


@dataclass
class Block:
    """Consecutive ops (topological order) trained together; ``layers``: the names of those whose weight
    rounding is learned."""
    operations: list[Operation]
    layers: list[str]
    inputs: list[str] = field(default_factory=list)    # tensors read here and made before the block
    outputs: list[str] = field(default_factory=list)   # tensors made here and read after it (or graph outputs)


def partition(graph: Graph, order: list[Operation], layers: set[str], block_layers: int) -> list[Block]:
    """The trainable blocks of ``order``: pieces between single live tensors joined until ``block_layers`` of
    ``layers`` are in one; a piece with an op of unknown gradient, or one reading a shape the graph computes,
    ends the block before it and is not one.  Shape computations belong to no block (the walk runs them)."""
    shapes = shape_computations(order)
    shaped = {variable.name for op in order if op.name in shapes for variable in op.outputs}
    consumers_left = {name: sum(reader.name not in shapes for reader in variable.consumers) +
                      (variable in graph.outputs) for name, variable in graph.variables.items()}
    live = {variable.name for variable in graph.inputs if consumers_left.get(variable.name)}
    pieces, piece = [], []
    for operation in order:
        if operation.name in shapes:
            continue
        piece.append(operation)
        for variable in operation.inputs:
            if variable is not None and variable.name in live:
                consumers_left[variable.name] -= 1
                if consumers_left[variable.name] <= 0:
                    live.discard(variable.name)
        for variable in operation.outputs:
            if consumers_left.get(variable.name):
                live.add(variable.name)
        if len(live) <= 1:
            pieces.append(piece)
            piece = []
    if piece:
        pieces.append(piece)
    blocks, current = [], []

    def close():
        if any(op.name in layers for op in current):
            blocks.append(_block_of(graph, list(current), layers))
        current.clear()

    for piece in pieces:
        count = sum(op.name in layers for op in piece)
        if count > block_layers or any(gradient_unsupported(op) or any(v is not None and v.name in shaped
                                                                       for v in op.inputs) for op in piece):
            close()
            continue
        current.extend(piece)
        if sum(op.name in layers for op in current) >= block_layers:
            close()
    close()
    return blocks


def shape_computations(order: list[Operation]) -> set[str]:
    """The ops that compute shapes (Shape, and ops reading only shapes and constants): in no block (the walk runs
    them), and their readers in none either."""
    shaped, names = set(), set()
    for operation in order:
        inputs = [v for v in operation.inputs if v is not None]
        if operation.type == "Shape" or (inputs and all(v.value is not None or v.name in shaped for v in inputs)
                                         and any(v.name in shaped for v in inputs)):
            names.add(operation.name)
            shaped.update(v.name for v in operation.outputs)
    return names


def _block_of(graph: Graph, operations: list[Operation], layers: set[str]) -> Block:
    made = {variable.name for op in operations for variable in op.outputs}
    names = {op.name for op in operations}
    inputs = []
    for op in operations:
        for variable in op.inputs:
            if variable is not None and variable.name not in made and variable.value is None and \
                    variable.name not in inputs:
                inputs.append(variable.name)
    outputs = [variable.name for op in operations for variable in op.outputs
               if variable in graph.outputs or any(reader.name not in names for reader in variable.consumers)]
    return Block(operations, [op.name for op in operations if op.name in layers], inputs, outputs)
