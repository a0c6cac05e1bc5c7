"""The graph's ONNX model raised to the opset a QDQ export needs (per-axis Q/DQ: 13; 16-bit types: 21).

onnx's version converter rewrites ops whose semantics changed to the same computation: attributes that
became inputs (Squeeze/Unsqueeze/ReduceSum/Split axes at 13, the other Reduce ops at 18) get Constant
inputs; Softmax, LogSoftmax and Hardmax before 13 normalise over the input flattened to 2-D at ``axis``,
so they are wrapped as Shape + Flatten -> op(axis=-1) -> Reshape (here: the converter forgets Hardmax,
and it ignores an axis that is already the last).  Such a wrapped op reads and
writes a *view* of its graph tensors (same values, other shape).  :func:`tensor_views` finds those views
so that the exporter puts the op's Q/DQ pairs on the tensors it really reads and writes: a per-tensor
pair commutes with a reshape, so the model still computes what the executor simulates.
"""

from __future__ import annotations

import onnx
from onnx import helper, version_converter

from ..core.errors import ExportError
from ..core.ir import Graph
from ..io.onnx_export import export_onnx_model

__all__ = ["upgraded_model", "tensor_views", "is_converter_node", "VIEW_TYPES"]

#: Ops the converter may put between a graph tensor and the op that uses it without changing any value.
VIEW_TYPES = frozenset({"Flatten", "Reshape", "Identity"})


def upgraded_model(graph: Graph, opset: int) -> onnx.ModelProto:
    """The ONNX model of ``graph`` at default-domain ``opset`` (unchanged when the graph's is not lower)."""
    model = export_onnx_model(graph)
    if graph.opset >= opset:
        return model
    if graph.opset < 13 <= opset:
        _wrap_flattening_ops(model, graph)
    try:
        return version_converter.convert_version(model, opset)
    except Exception as error:  # the converter raises bare RuntimeErrors
        raise ExportError(f"cannot upgrade graph {graph.name!r} from opset {graph.opset} to {opset}: "
                          f"{error}; export it with opset={graph.opset} if its configs allow") from None


def tensor_views(model: onnx.ModelProto, graph: Graph) -> dict[tuple[str, str, int], str]:
    """``(operation name, 'input' | 'output', slot) -> tensor`` for every slot of a graph operation that the
    converter rewired to a view of the graph's tensor (through :data:`VIEW_TYPES` ops it added).

    Raises ExportError for a slot rewired any other way, or an operation the converter replaced.
    """
    added = [node for node in model.graph.node if is_converter_node(node, graph)]
    producer = {output: node for node in added for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in added:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    views: dict[tuple[str, str, int], str] = {}
    seen = set()
    for node in model.graph.node:
        if is_converter_node(node, graph):
            continue
        operation = graph.operations[node.name]
        seen.add(operation.name)
        for slot, variable in enumerate(operation.inputs[:len(node.input)]):   # (then what bodies read)
            if variable is None or node.input[slot] == variable.name:
                continue
            tensor = node.input[slot]
            while tensor in producer and producer[tensor].op_type in VIEW_TYPES:
                tensor = producer[tensor].input[0]
            if tensor != variable.name:
                raise _changed(graph, operation, "inputs")
            views[(operation.name, "input", slot)] = node.input[slot]
        for slot, variable in enumerate(operation.outputs):
            if node.output[slot] == variable.name:
                continue
            tensor = node.output[slot]
            while len(consumers.get(tensor, ())) == 1 and consumers[tensor][0].op_type in VIEW_TYPES \
                    and consumers[tensor][0].input[0] == tensor:
                tensor = consumers[tensor][0].output[0]
            if tensor != variable.name:
                raise _changed(graph, operation, "outputs")
            views[(operation.name, "output", slot)] = node.output[slot]
    missing = [name for name in graph.operations if name not in seen]
    if missing:
        operation = graph.operations[missing[0]]
        raise ExportError(f"the opset converter replaced {operation.type} {operation.name!r} of graph "
                          f"{graph.name!r} (and {len(missing) - 1} other ops) while upgrading opset {graph.opset}; "
                          "export it at its own opset (opset=...) if its configs allow")
    return views


#: Ops that, before opset 13, normalise over the input flattened to 2-D at ``axis`` (default 1).
FLATTENING_TYPES = frozenset({"Softmax", "LogSoftmax", "Hardmax"})


def _wrap_flattening_ops(model: onnx.ModelProto, graph: Graph) -> None:
    """Rewrite each :data:`FLATTENING_TYPES` node whose axis is not known to be the last as
    Shape, Flatten(axis) -> op(axis=-1) -> Reshape back: the same computation at every opset."""
    nodes = []
    for node in model.graph.node:
        operation = graph.operations.get(node.name)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = operation.inputs[0].shape if operation is not None else None
        if node.op_type not in FLATTENING_TYPES or axis == -1 or (shape is not None and axis == len(shape) - 1):
            nodes.append(node)
            continue
        source, result = node.input[0], node.output[0]
        shape_name, flat, normalised = (f"{node.name}_opset13_{part}" for part in ("shape", "flat", "result"))
        nodes.append(helper.make_node("Shape", [source], [shape_name], name=shape_name))
        nodes.append(helper.make_node("Flatten", [source], [flat], axis=axis, name=flat))
        nodes.append(helper.make_node(node.op_type, [flat], [normalised], axis=-1, name=node.name))
        nodes.append(helper.make_node("Reshape", [normalised, shape_name], [result], name=f"{node.name}_opset13_reshape"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def is_converter_node(node: onnx.NodeProto, graph: Graph) -> bool:
    """Whether ``node`` was added by the upgrade (no graph operation of its name and type)."""
    operation = graph.operations.get(node.name)
    return operation is None or operation.type != node.op_type


def _changed(graph: Graph, operation, what: str) -> ExportError:
    return ExportError(f"opset conversion of graph {graph.name!r} changed the {what} of {operation.type} "
                       f"{operation.name!r} beyond a reshape; export it at its own opset (opset={graph.opset})")
