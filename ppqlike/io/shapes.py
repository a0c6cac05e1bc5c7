"""Static shapes of a graph's tensors, from onnx.shape_inference.

Used by graph formatting (constant folding of Shape ops, BN folding after
MatMul) and by anything that wants shapes without running the graph.  Reads
the graph; only :func:`set_input_shapes` writes (the graph inputs' shapes).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from ..core.errors import GraphError
from ..core.ir import Graph
from .onnx_export import export_onnx_model
from .onnx_graphs import _dims

#: Parameters with more elements than this are handed to shape inference as typed inputs, without values.
_VALUE_LIMIT = 1024


def is_static(shape: Sequence | None) -> bool:
    """True when ``shape`` is known and every dimension is an int."""
    return shape is not None and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape)


def set_input_shapes(graph: Graph, input_shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Fix the shapes of graph inputs to the given static shapes; returns one note per input changed.

    A name that is no graph input, a non-positive dimension, a rank or a
    static dimension that contradicts the declared shape is a GraphError.
    """
    by_name = {v.name: v for v in graph.inputs}
    notes = []
    for name, shape in input_shapes.items():
        if name not in by_name:
            raise GraphError(f"input_shapes names {name!r}, which is not an input of graph {graph.name!r} "
                             f"(inputs: {sorted(by_name)})")
        shape = [int(d) for d in shape]
        if any(d <= 0 for d in shape):
            raise GraphError(f"input_shapes[{name!r}] = {shape}: every dimension must be a positive int")
        variable = by_name[name]
        declared = variable.shape
        if declared is not None:
            if len(declared) != len(shape):
                raise GraphError(f"input_shapes[{name!r}] = {shape} has rank {len(shape)}, but input "
                                 f"{name!r} is declared with shape {declared}")
            for given, known in zip(shape, declared):
                if isinstance(known, (int, np.integer)) and int(known) != given:
                    raise GraphError(f"input_shapes[{name!r}] = {shape} contradicts the declared shape {declared}")
        if declared != shape:
            notes.append(f"input {name!r}: shape {declared} -> {shape}")
            variable.shape = shape
    return notes


def infer_shapes(graph: Graph) -> dict[str, list]:
    """Shapes of every tensor onnx.shape_inference can tell, by name (dims are int, str or None).

    The graph inputs' declared shapes are the starting point (make them
    static with :func:`set_input_shapes` first).  Parameters report their
    value's shape.  Inference faults give a partial answer, never an error.
    """
    shapes: dict[str, list] = {name: list(v.value.shape) for name, v in graph.variables.items() if v.is_parameter}
    shapes.update({v.name: list(v.shape) for v in graph.inputs if v.shape is not None})
    try:
        model = export_onnx_model(graph)
    except Exception:  # an unexportable attribute: no inference, only what is declared
        return shapes
    # Large weights travel as typed inputs: inference needs their shapes, not their values.
    kept = []
    for tensor in model.graph.initializer:
        size = int(np.prod(tensor.dims, dtype=np.int64))
        if size > _VALUE_LIMIT and tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                                        onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16):
            model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            kept.append(tensor)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inconsistent declared shapes, unknown ops in strict places
        return shapes
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = _dims(info.type)
        if dims is not None:
            shapes[info.name] = dims
    return shapes
