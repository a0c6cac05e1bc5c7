"""The bodies of If/Loop/Scan in the QDQ export (:mod:`ppqlike.export.qdq`).

A body whose ops carry quantization configs is written as its own QDQ graph (the same exporter,
with the enclosing scopes' names reserved so that no new tensor shadows one); a float body as it is.
Where the enclosing scope quantizes a value a body reads (a QuantizeLinear/DequantizeLinear pair after
its producer), the body reads the pair's result, as the executor hands it the quantized value: its
reads of that name are renamed.  Reads the graph; writes the NodeProto's attributes.
"""

from __future__ import annotations

from typing import Callable

import onnx
from onnx import helper

from ..core.ir import Graph, Operation
from ..core.subgraphs import walk


def names_in_bodies(onnx_graph: onnx.GraphProto) -> set[str]:
    """Every tensor name defined or read inside the subgraphs of ``onnx_graph``'s nodes, at any depth."""
    names: set[str] = set()
    for node in onnx_graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                sub = attribute.g
                names |= {i.name for i in sub.input} | {o.name for o in sub.output} | \
                    {t.name for t in sub.initializer} | {n for inner in sub.node for n in (*inner.input, *inner.output)}
                names |= names_in_bodies(sub)
    return names


def is_quantized(body: Graph) -> bool:
    """True when some op of ``body`` (or of a body inside it) carries a quantization config."""
    return any(operation.config is not None for _, operation in walk(body))


def rename_reads(onnx_graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Make ``onnx_graph`` (and the subgraphs in it) read ``renames[name]`` where it reads an enclosing
    ``name`` (names it defines itself are never renamed: they cannot be enclosing ones)."""
    renames = {old: new for old, new in renames.items() if old != new}
    if not renames:
        return
    for node in onnx_graph.node:
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                rename_reads(attribute.g, renames)
    for output in onnx_graph.output:
        if output.name in renames:   # a body output that is an enclosing value: read the renamed one
            source, output.name = renames[output.name], output.name
            identity = helper.make_node("Identity", [source], [output.name])
            onnx_graph.node.append(identity)


def write_bodies(node: onnx.NodeProto, operation: Operation, read: Callable[[str], str], reserved: set,
                 counts: dict, build: Callable[[Graph, set], tuple]) -> None:
    """Write the bodies of ``operation`` into ``node``: quantized bodies through ``build(body, reserved
    names)`` (the QDQ exporter), float ones as they are; then their reads of enclosing values renamed to
    ``read(name)``, the tensor holding its quantized value.  ``counts`` gains the counts of the bodies'
    reports; ``reserved`` the bodies' names."""
    renames = {v.name: read(v.name) for v in operation.inputs[len(node.input):] if v is not None}
    for attribute in node.attribute:
        if attribute.type != onnx.AttributeProto.GRAPH:
            continue
        body = operation.attributes.get(attribute.name)
        if isinstance(body, Graph) and is_quantized(body):
            model, report = build(body, set(reserved))
            attribute.g.CopyFrom(model.graph)
            for key, value in report.items():
                if isinstance(value, int) and not isinstance(value, bool) and key not in ("opset", "ir_version"):
                    counts[key] = counts.get(key, 0) + value
        rename_reads(attribute.g, renames)
        reserved |= names_in_bodies(helper.make_graph([node], "scope", [], []))
