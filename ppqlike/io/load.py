"""Loading a model whatever it holds: a float model, or one already quantized (its scales imported)."""

from __future__ import annotations

from typing import Any

from ..core.ir import Graph
from .import_quantized import graph_from_quantized_model, is_quantized_model
from .onnx_import import describe_source, graph_from_model, read_model
from .tensor_data import embed_arrays


def load_graph(source: Any) -> Graph:
    """The graph of ``source`` (path, bytes or ModelProto), read and checked once.

    A QDQ/QOperator model comes back with its scales imported (``graph.metadata['quantization']['imported']``
    says so); a float model comes back unquantized.
    """
    arrays: dict = {}  # external weights, read straight into arrays
    model = read_model(source, arrays)
    if is_quantized_model(model):
        return graph_from_quantized_model(embed_arrays(model, arrays), source)
    return graph_from_model(model, describe_source(source), arrays)


def is_imported(graph: Graph) -> bool:
    """Whether ``graph`` came from an already quantized file (:func:`load_graph` imported its scales)."""
    return "imported" in (graph.metadata.get("quantization") or {})
