"""ONNX → Graph.

Reads a model (a path or a ModelProto) of opsets 11-21 in the default domain:
initializers and Constant nodes become parameters, external data is loaded
from beside the file, dynamic dimensions are kept as names (or None), a weight
shared by several ops stays one variable, and a graph input that is also an
initializer becomes a parameter.  Every fault is a ModelLoadError or
GraphError naming the file and what is wrong; nothing is ever written.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.errors import GraphError, ModelLoadError
from ..core.ir import Graph

MIN_OPSET, MAX_OPSET = 11, 21
DEFAULT_DOMAINS = ("", "ai.onnx")


def _describe(source: Any) -> str:
    return f"model {os.fspath(source)!r}" if isinstance(source, (str, os.PathLike)) else "the given model"


def read_model(source: Any) -> onnx.ModelProto:
    """Load and check a ModelProto from a path, bytes or a ModelProto."""
    if isinstance(source, onnx.ModelProto):
        model = source
        where = "the given model"
    elif isinstance(source, (bytes, bytearray)):
        where = "the given bytes"
        model = _parse(bytes(source), where)
    elif isinstance(source, (str, os.PathLike)):
        where = _describe(source)
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ModelLoadError(f"{where}: no such file")
        with open(path, "rb") as handle:
            data = handle.read()
        model = _parse(data, where)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(model)):
            try:
                onnx.external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
            except (OSError, ValueError) as error:
                raise ModelLoadError(f"{where}: its external weight data could not be read ({error}); "
                                     "keep the data files beside the model") from error
    else:
        raise ModelLoadError(f"cannot load a model from a {type(source).__name__}; pass a path or an onnx.ModelProto")
    if len(model.graph.node) == 0 and len(model.graph.output) == 0:
        raise ModelLoadError(f"{where}: the file parsed but holds no graph; is it an ONNX model?")
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "unknown reason"
        raise ModelLoadError(f"{where} fails onnx.checker: {first}") from None
    return model


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # protobuf raises DecodeError and others
        raise ModelLoadError(f"{where} is not an ONNX model, or the file is truncated ({type(error).__name__})") from None
    return model


def _all_tensors(model: onnx.ModelProto):
    yield from model.graph.initializer
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t


def _dims(type_proto: onnx.TypeProto) -> list | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in type_proto.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def _elem_dtype(type_proto: onnx.TypeProto):
    if not type_proto.HasField("tensor_type"):
        return None
    elem = type_proto.tensor_type.elem_type
    return None if elem == 0 else helper.tensor_dtype_to_np_dtype(elem)


def _constant_value(node: onnx.NodeProto, where: str) -> np.ndarray:
    attribute = node.attribute[0] if len(node.attribute) == 1 else None
    if attribute is None:
        raise ModelLoadError(f"{where}: Constant node {node.name!r} must have exactly one attribute")
    if attribute.name == "value":
        return numpy_helper.to_array(attribute.t)
    scalars = {"value_float": np.float32, "value_int": np.int64}
    lists = {"value_floats": np.float32, "value_ints": np.int64}
    value = helper.get_attribute_value(attribute)
    if attribute.name in scalars:
        return np.array(value, dtype=scalars[attribute.name])
    if attribute.name in lists:
        return np.array(list(value), dtype=lists[attribute.name])
    raise ModelLoadError(f"{where}: Constant node {node.name!r} uses attribute {attribute.name!r}, "
                         "which ppqlike does not read (sparse or string constants)")


def _attributes(node: onnx.NodeProto, where: str) -> dict:
    attributes = {}
    for attribute in node.attribute:
        if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            raise ModelLoadError(f"{where}: node {node.name!r} ({node.op_type}) has a subgraph; "
                                 "control flow (If/Loop/Scan) is not supported")
        value = helper.get_attribute_value(attribute)
        if attribute.type == onnx.AttributeProto.TENSOR:
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8")
        elif attribute.type == onnx.AttributeProto.STRINGS:
            value = [v.decode("utf-8") for v in value]
        elif attribute.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
            value = list(value)
        attributes[attribute.name] = value
    return attributes


def load_onnx_graph(source: Any) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a :class:`Graph`.

    Raises ModelLoadError for unreadable or invalid models and GraphError for
    structural faults (an input nothing produces, a cycle).  Unknown op types
    are not rejected here: the executor rejects them when it plans.
    """
    model = read_model(source)
    where = _describe(source)
    opset = None
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            opset = entry.version
    if opset is None:
        raise ModelLoadError(f"{where} imports no default-domain opset")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelLoadError(f"{where} uses opset {opset}; ppqlike reads opsets {MIN_OPSET}-{MAX_OPSET}. "
                             "Convert it with onnx.version_converter first")
    onnx_graph = model.graph
    graph = Graph(name=onnx_graph.name or "graph", opset=opset)
    graph.metadata.update(ir_version=model.ir_version, producer_name=model.producer_name,
                          producer_version=model.producer_version, model_version=model.model_version,
                          doc_string=model.doc_string,
                          opset_imports={e.domain: e.version for e in model.opset_import},
                          metadata_props={p.key: p.value for p in model.metadata_props})
    value_info = {info.name: info for info in list(onnx_graph.value_info) + list(onnx_graph.output)}

    initializers = {tensor.name: tensor for tensor in onnx_graph.initializer}
    for name, tensor in initializers.items():
        graph.create_variable(name, value=numpy_helper.to_array(tensor))
    for graph_input in onnx_graph.input:
        if graph_input.name in initializers:
            continue  # an input with a default value: treated as a parameter
        variable = graph.create_variable(graph_input.name, shape=_dims(graph_input.type),
                                         dtype=_elem_dtype(graph_input.type))
        graph.inputs.append(variable)

    def variable_for(name: str):
        if name not in graph.variables:
            info = value_info.get(name)
            graph.create_variable(name, shape=None if info is None else _dims(info.type),
                                  dtype=None if info is None else _elem_dtype(info.type))
        return graph.variables[name]

    produced = {v.name for v in graph.variables.values()}
    for node in onnx_graph.node:
        produced.update(o for o in node.output if o)
    used_names: set[str] = set()
    for index, node in enumerate(onnx_graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if name in used_names:
            name = f"{name}_{index}"
        used_names.add(name)
        for input_name in node.input:
            if input_name and input_name not in produced:
                raise GraphError(f"{where}: input {input_name!r} of {node.op_type} node {name!r} is not "
                                 "produced by any node, nor a graph input or initializer")
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            output = node.output[0]
            if output in graph.variables:
                raise GraphError(f"{where}: tensor {output!r} is produced twice")
            graph.create_variable(output, value=_constant_value(node, where))
            continue
        inputs = [variable_for(n) if n else None for n in node.input]
        while inputs and inputs[-1] is None:
            inputs.pop()
        outputs = []
        for output_name in node.output:
            if not output_name:
                output_name = graph.unique_name(f"{name}_unused_output")
            variable = variable_for(output_name)
            if variable.producer is not None or variable.is_parameter or variable in graph.inputs:
                raise GraphError(f"{where}: tensor {output_name!r} is produced twice "
                                 f"(by node {name!r} and another)")
            outputs.append(variable)
        graph.create_operation(node.op_type, inputs, outputs, attributes=_attributes(node, where),
                               name=name, domain=node.domain)
    for graph_output in onnx_graph.output:
        if graph_output.name not in graph.variables:
            raise GraphError(f"{where}: graph output {graph_output.name!r} is not produced by any node")
        variable = graph.variables[graph_output.name]
        if variable.shape is None:
            variable.shape = _dims(graph_output.type)
        if variable.dtype is None:
            variable.dtype = _elem_dtype(graph_output.type)
        graph.outputs.append(variable)
    try:
        graph.topological_sort()
    except GraphError as error:
        raise GraphError(f"{where}: {error}") from None
    return graph
