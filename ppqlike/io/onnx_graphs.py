"""ONNX graphs (the model's and its subgraphs) -> Graph: nodes, attributes, Constants, bodies.

Used by :mod:`ppqlike.io.onnx_import` once the model is read and checked.  A subgraph of If, Loop
or Scan becomes a Graph of the same IR in the op's attributes (:mod:`ppqlike.core.subgraphs`): a
name it reads from an enclosing scope becomes a capture of the body and an implicit input of the op
(and of every body between), except constants, which the body holds as its own parameters (the
same array).  Reads the protos; writes only the graphs it builds.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..core.errors import GraphError, ModelLoadError
from ..core.ir import Graph, Variable
from ..core.subgraphs import BODY_ATTRIBUTES, captures
from .tensor_data import sparse_to_dense, tensor_value

DEFAULT_DOMAINS = ("", "ai.onnx")


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


def _constant_value(node: onnx.NodeProto, label: str, where: str, stored: dict) -> np.ndarray:
    """The value of a Constant node, whichever of its attribute forms it uses (``stored``: the node's
    tensors read from external data, by attribute key)."""
    if len(node.attribute) != 1:
        raise ModelLoadError(f"{where}: {label} must have exactly one attribute, it has "
                             f"{[a.name for a in node.attribute]}")
    attribute = node.attribute[0]
    value = helper.get_attribute_value(attribute)
    if attribute.name == "value":
        return tensor_value(value, where, stored.get(("value",)))
    if attribute.name == "sparse_value":
        return sparse_to_dense(value, where, (stored.get(("sparse_value", "values")),
                                               stored.get(("sparse_value", "indices"))))
    forms = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}
    if attribute.name in forms:
        return np.array(list(value) if isinstance(value, (list, tuple)) else value, dtype=forms[attribute.name])
    if attribute.name == "value_string":
        return np.array(value.decode("utf-8"), dtype=object)
    if attribute.name == "value_strings":
        return np.array([v.decode("utf-8") for v in value], dtype=object)
    raise ModelLoadError(f"{where}: {label} has attribute {attribute.name!r}, which is not an ONNX Constant form")


def _attributes(node: onnx.NodeProto, label: str, where: str, stored: dict, body_of) -> dict:
    """The node's attributes as Python values (numpy arrays for tensors; ``stored`` as for Constant;
    ``body_of(attribute name, GraphProto)``: the Graph of a subgraph)."""
    attributes = {}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            if node.op_type not in BODY_ATTRIBUTES or node.domain not in DEFAULT_DOMAINS:
                raise ModelLoadError(f"{where}: {label} has a subgraph ({attribute.name!r}); ppqlike reads the "
                                     f"subgraphs of {', '.join(sorted(BODY_ATTRIBUTES))} only")
            attributes[attribute.name] = body_of(attribute.name, attribute.g)
            continue
        if attribute.type == onnx.AttributeProto.GRAPHS:
            raise ModelLoadError(f"{where}: {label} has a list of subgraphs ({attribute.name!r}), which ppqlike "
                                 "does not read")
        value = helper.get_attribute_value(attribute)
        if attribute.type == onnx.AttributeProto.TENSOR:
            value = tensor_value(value, where, stored.get((attribute.name,)))
        elif isinstance(value, bytes):
            value = value.decode("utf-8")
        elif attribute.type == onnx.AttributeProto.STRINGS:
            value = [v.decode("utf-8") for v in value]
        elif attribute.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
            value = list(value)
        attributes[attribute.name] = value
    return attributes


def _operation_names(nodes) -> list[str]:
    """Unique operation names: the node's own where it has a unique one, a generated one otherwise."""
    explicit = [node.name for node in nodes]
    counts: dict[str, int] = {}
    for name in explicit:
        counts[name] = counts.get(name, 0) + 1
    taken = {name for name in explicit if name and counts[name] == 1}
    names = []
    for index, node in enumerate(nodes):
        name = node.name
        if not name or counts[name] > 1:
            base = node.name or node.op_type
            name, suffix = f"{base}_{index}", index
            while name in taken:
                suffix += 1
                name = f"{base}_{index}_{suffix}"
        taken.add(name)
        names.append(name)
    return names


class Scope:
    """How a graph being built resolves a name it does not define: through the graphs around it."""

    def __init__(self, graph: Graph, parent: "Scope | None" = None):
        self.graph, self.parent = graph, parent

    def resolve(self, name: str) -> Variable | None:
        """The variable ``name`` denotes here (a new capture when an enclosing graph computes it, the
        enclosing parameter itself when it is a constant), or None when no scope defines it."""
        variable = self.graph.variables.get(name)
        if variable is not None:
            return variable
        found = self.parent.resolve(name) if self.parent is not None else None
        if found is None or found.is_parameter:
            return found
        return self.graph.create_variable(name, shape=found.shape, dtype=found.dtype)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names the node's subgraphs read from the scopes around the node (at any depth)."""
    reads: set[str] = set()
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else \
            list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else []
        for sub in graphs:
            defined = {i.name for i in sub.input} | {t.name for t in sub.initializer} | \
                {t.values.name for t in sub.sparse_initializer} | {o for n in sub.node for o in n.output}
            used = {name for n in sub.node for name in n.input if name} | {o.name for o in sub.output}
            used |= {name for n in sub.node for name in subgraph_reads(n)}
            reads |= used - defined
    return reads


def fill_graph(graph: Graph, onnx_graph: onnx.GraphProto, where: str, scope: Scope,
               arrays: dict | None = None, by_node: dict | None = None) -> None:
    """Build ``graph`` (empty, or holding the parameters made so far) from ``onnx_graph``: initializers,
    inputs, nodes and outputs; ``scope``: this graph's (its parent resolves outer names); ``arrays``:
    external initializer data by ("initializer", index); ``by_node``: external Constant data by node index."""
    arrays, by_node = arrays or {}, by_node or {}
    value_info = {info.name: info for info in list(onnx_graph.value_info) + list(onnx_graph.output)}
    initializers = {tensor.name: (index, tensor) for index, tensor in enumerate(onnx_graph.initializer)}
    for name, (index, tensor) in initializers.items():
        graph.create_variable(name, value=tensor_value(tensor, where, arrays.get(("initializer", index))))
    for index, sparse in enumerate(onnx_graph.sparse_initializer):
        if sparse.values.name in graph.variables:
            raise GraphError(f"{where}: tensor {sparse.values.name!r} is initialized twice")
        stored = (arrays.get(("sparse", index, "values")), arrays.get(("sparse", index, "indices")))
        graph.create_variable(sparse.values.name, value=sparse_to_dense(sparse, where, stored))
        initializers[sparse.values.name] = (index, sparse)
    for graph_input in onnx_graph.input:
        if graph_input.name in initializers:
            continue  # an input with a default value: treated as a parameter
        variable = graph.create_variable(graph_input.name, shape=_dims(graph_input.type),
                                         dtype=_elem_dtype(graph_input.type))
        graph.inputs.append(variable)

    def variable_for(name: str) -> Variable:
        if name not in graph.variables:
            found = scope.parent.resolve(name) if scope.parent is not None else None
            if found is not None and found.is_parameter:   # an enclosing constant: the body's own
                return graph.create_variable(name, value=found.value)
            info = value_info.get(name)
            shape = found.shape if found is not None else None if info is None else _dims(info.type)
            dtype = found.dtype if found is not None else None if info is None else _elem_dtype(info.type)
            graph.create_variable(name, shape=shape, dtype=dtype)
        return graph.variables[name]

    for index, (node, name) in enumerate(zip(onnx_graph.node, _operation_names(onnx_graph.node))):
        label = f"{node.op_type} node {name!r}"
        stored = by_node.get(index, {})
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            output = node.output[0]
            if output in graph.variables:
                raise GraphError(f"{where}: tensor {output!r} is produced twice")
            graph.create_variable(output, value=_constant_value(node, label, where, stored))
            continue

        def body_of(key: str, proto: onnx.GraphProto, label=label) -> Graph:
            body = Graph(name=proto.name or f"{name}_{key}", opset=graph.opset)
            fill_graph(body, proto, f"{where}, {label} {key}", Scope(body, scope))
            return body

        attributes = _attributes(node, label, where, stored, body_of)
        inputs = [variable_for(n) if n else None for n in node.input]
        bodies = [value for value in attributes.values() if isinstance(value, Graph)]
        if bodies:   # the ONNX inputs as they are, then the values the bodies read from this scope
            count = 1 if node.op_type == "If" else len(bodies[0].inputs)
            if len(inputs) > count:
                raise GraphError(f"{where}: {label} has {len(inputs)} inputs, its body {count}")
            inputs += [None] * (count - len(inputs))
            outer = dict.fromkeys(v.name for body in bodies for v in captures(body))
            inputs += [variable_for(n) for n in outer]
        else:
            while inputs and inputs[-1] is None:
                inputs.pop()
        output_names = list(node.output)
        while output_names and not output_names[-1]:
            output_names.pop()  # trailing optional outputs left out
        outputs = []
        for output_name in output_names:
            if not output_name:
                output_name = graph.unique_name(f"{name}_unused_output")
            variable = variable_for(output_name)
            if variable.producer is not None or variable.is_parameter or variable in graph.inputs:
                raise GraphError(f"{where}: tensor {output_name!r} is produced twice "
                                 f"(by node {name!r} and another)")
            outputs.append(variable)
        graph.create_operation(node.op_type, inputs, outputs, attributes=attributes, name=name, domain=node.domain)
    for graph_output in onnx_graph.output:
        variable = variable_for(graph_output.name) if scope.parent is not None else \
            graph.variables.get(graph_output.name)
        if variable is None:
            raise GraphError(f"{where}: graph output {graph_output.name!r} is not produced by any node")
        if variable.shape is None:
            variable.shape = _dims(graph_output.type)
        if variable.dtype is None:
            variable.dtype = _elem_dtype(graph_output.type)
        graph.outputs.append(variable)
    if scope.parent is None:   # the model's graph: nothing may be read from outside it
        for variable in captures(graph):
            if variable.consumers or variable in graph.outputs:
                readers = [op.name for op in variable.consumers]
                raise GraphError(f"{where}: tensor {variable.name!r} (read by {readers}) is not produced by any "
                                 "node, nor a graph input or initializer")
