"""Graph → ONNX.

Writes the graph back as a ModelProto: parameters become initializers (in
first-use order), optional inputs left out become empty names, dynamic
dimensions keep their names.  Files are written atomically, with external data when over 2 GB
(``io.onnx_files``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.ir import Graph, Operation, Variable
from ..core.subgraphs import explicit_input_count, separate_scopes, walk
from .files import MAX_IR_VERSION
from .onnx_files import write_onnx_model


def _value_info(variable: Variable) -> onnx.ValueInfoProto:
    if variable.dtype is None:   # an untyped value (a body output the model leaves to inference)
        return onnx.ValueInfoProto(name=variable.name)
    elem = helper.np_dtype_to_tensor_dtype(variable.dtype)
    shape = None if variable.shape is None else [d if d is None or isinstance(d, (int, str)) else int(d)
                                                  for d in variable.shape]
    return helper.make_tensor_value_info(variable.name, elem, shape)


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    """An AttributeProto from the Python value the importer made (ndarray for tensors, Graph for bodies)."""
    if isinstance(value, Graph):
        return helper.make_attribute(name, body_to_proto(value))
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple)):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
        if not value:  # the type of an empty list is lost on import: INTS is by far the most common
            return helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS)
    return helper.make_attribute(name, value)


def operation_to_node(operation: Operation) -> onnx.NodeProto:
    """The NodeProto of one operation (omitted optional inputs become empty names)."""
    explicit = operation.inputs[:explicit_input_count(operation)]   # implicit inputs are read by name
    node = helper.make_node(operation.type, ["" if v is None else v.name for v in explicit],
                            [v.name for v in operation.outputs], name=operation.name,
                            domain=operation.domain or None)
    node.attribute.extend(_attribute(k, v) for k, v in operation.attributes.items())
    return node


def _fill_tensor(tensor: onnx.TensorProto, array: np.ndarray, name: str) -> None:
    """Write ``array`` into ``tensor`` as numpy_helper.from_array does, without an intermediate proto."""
    if array.dtype.kind not in "biufc":  # strings and onnx's own types (bfloat16, float8, 4-bit)
        tensor.CopyFrom(numpy_helper.from_array(array, name))
        return
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.raw_data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def body_to_proto(body: Graph) -> onnx.GraphProto:
    """The GraphProto of a body (If branch, Loop/Scan body): its parameters as its initializers, its
    inputs and outputs typed where known; the names it reads from enclosing scopes stay plain reads."""
    nodes, initializers = _nodes_and_initializers(body)
    onnx_graph = helper.make_graph(nodes, body.name, [_value_info(v) for v in body.inputs],
                                   [_value_info(v) for v in body.outputs])
    for variable in initializers:
        _fill_tensor(onnx_graph.initializer.add(), np.asarray(variable.value), variable.name)
    return onnx_graph


def _nodes_and_initializers(graph: Graph) -> tuple[list, list]:
    """The graph's nodes in topological order and the parameters they read (first use first; graph
    inputs excluded), then parameters that are graph outputs."""
    nodes, initializers, written = [], [], set()
    interface = {v.name for v in graph.inputs}
    for operation in graph.topological_sort():
        for variable in operation.inputs:
            if variable is not None and variable.is_parameter and variable.name not in written \
                    and variable.name not in interface:
                initializers.append(variable)
                written.add(variable.name)
        nodes.append(operation_to_node(operation))
    for variable in graph.outputs:  # a graph output that is a constant
        if variable.is_parameter and variable.name not in written:
            initializers.append(variable)
            written.add(variable.name)
    return nodes, initializers


def export_onnx_model(graph: Graph, opset: int | None = None, extra_opsets: dict | None = None,
                      keep_value_info: bool = False) -> onnx.ModelProto:
    """Build a ModelProto from ``graph`` (bodies of If/Loop/Scan as their GraphProto attributes; a
    body-local name an enclosing scope also defines is renamed first: ``subgraphs.separate_scopes``).

    ``opset`` overrides the default-domain opset (the graph's by default);
    ``extra_opsets`` adds imports of other domains.
    """
    separate_scopes(graph)
    nodes, initializers = _nodes_and_initializers(graph)
    value_info = []
    if keep_value_info:
        value_info = [_value_info(v) for v in graph.variables.values()
                      if not v.is_parameter and v.shape is not None and v not in graph.inputs
                      and v not in graph.outputs and v.producer is not None]
    onnx_graph = helper.make_graph(nodes, graph.name, [_value_info(v) for v in graph.inputs],
                                   [_value_info(v) for v in graph.outputs], value_info=value_info)
    imports = dict(graph.metadata.get("opset_imports", {}))
    imports.pop("ai.onnx", None)
    imports[""] = opset or graph.opset
    imports.update(extra_opsets or {})
    for _, operation in walk(graph):
        if operation.domain and operation.domain not in imports:
            imports[operation.domain] = 1
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports.items()],
                              producer_name="ppqlike")
    for variable in initializers:  # written into the model's own graph: one copy of the weights
        _fill_tensor(model.graph.initializer.add(), np.asarray(variable.value), variable.name)
    # Keep the source's IR version where it can express the opsets, else the lowest that can.
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    source_ir = int(graph.metadata.get("ir_version") or MAX_IR_VERSION)
    model.ir_version = min(max(source_ir, needed, 7), MAX_IR_VERSION)
    for key, value in graph.metadata.get("metadata_props", {}).items():
        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, key: value})
    return model


def save_onnx_graph(graph: Graph, path: str | os.PathLike, opset: int | None = None,
                    protect: tuple = (), external_data: bool | None = None) -> onnx.ModelProto:
    """Export ``graph`` and write it to ``path`` atomically; returns the ModelProto.

    ``external_data`` (None: only for models over 2 GB): weights in ``<file name>.data`` beside it,
    see :func:`ppqlike.io.onnx_files.write_onnx_model`.
    """
    model = export_onnx_model(graph, opset=opset)
    write_onnx_model(path, model, protect=protect, external_data=external_data)
    return model
