"""Where an ONNX model keeps its tensors: every initializer, sparse initializer part and node tensor attribute."""

from __future__ import annotations

import onnx


def tensor_slots(model: onnx.ModelProto):
    """``(key, tensor)`` for every initializer, sparse initializer part and node tensor attribute; the key
    names the tensor's place in the graph (stable while the graph is not edited)."""
    graph = model.graph
    for index, tensor in enumerate(graph.initializer):
        yield ("initializer", index), tensor
    for index, sparse in enumerate(graph.sparse_initializer):
        yield ("sparse", index, "values"), sparse.values
        yield ("sparse", index, "indices"), sparse.indices
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield ("node", index, attribute.name), attribute.t
            elif attribute.type == onnx.AttributeProto.SPARSE_TENSOR:
                yield ("node", index, attribute.name, "values"), attribute.sparse_tensor.values
                yield ("node", index, attribute.name, "indices"), attribute.sparse_tensor.indices
            elif attribute.type == onnx.AttributeProto.TENSORS:
                for position, tensor in enumerate(attribute.tensors):
                    yield ("node", index, attribute.name, position), tensor
