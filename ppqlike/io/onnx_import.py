"""ONNX → Graph.

Reads a model (a path, bytes or a ModelProto) of opsets 11-23 in the default domain:
initializers and Constant nodes become parameters, external data is read
from beside the file straight into arrays, dynamic dimensions are kept as names (or None), a weight
shared by several ops stays one variable, and a graph input that is also an
initializer becomes a parameter.  Every fault is a ModelLoadError or
GraphError naming the file and what is wrong; nothing is ever written.
"""

from __future__ import annotations

import os
from typing import Any

import networkx as nx
import onnx

from ..core.errors import GraphError, ModelLoadError
from ..core.ir import Graph
from .onnx_files import check_onnx_model
from .onnx_graphs import Scope, fill_graph, subgraph_reads
from .tensor_data import check_external_data, has_external_data, read_external_data

MIN_OPSET, MAX_OPSET = 11, 23
DEFAULT_DOMAINS = ("", "ai.onnx")


def describe_source(source: Any) -> str:
    """How errors name ``source``: the file's path, or "the given model"/"the given bytes"."""
    if isinstance(source, (str, os.PathLike)):
        return f"model {os.fspath(source)!r}"
    return "the given bytes" if isinstance(source, (bytes, bytearray)) else "the given model"


def read_model(source: Any, arrays: dict | None = None) -> onnx.ModelProto:
    """Load and check a ModelProto from a path, bytes or a ModelProto (ModelLoadError, GraphError).

    Checks, in order: the bytes parse, external data files are inside the model's folder and long
    enough, the default-domain opset is one ppqlike reads (11-23), every node
    of the default domain is a known ONNX operator, every node input is
    produced, the nodes form no cycle, then ``onnx.checker``; then external data is read: into
    ``arrays`` when given (for :func:`graph_from_model`; the proto keeps its references), else into
    the proto.  Nodes out of topological order (but acyclic) are reordered on a copy.  Never writes.
    """
    where = describe_source(source)
    folder = None
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), where)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelLoadError(f"{where}: no such file")
        if not os.path.isfile(path):
            raise ModelLoadError(f"{where} is not a file (a folder?); pass the path of an .onnx file")
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise ModelLoadError(f"{where} cannot be read: {error.strerror}") from None
        model = _parse(data, where)
        del data
        if model.HasField("graph") and has_external_data(model):
            folder = os.path.dirname(os.path.abspath(path))
            check_external_data(model, folder, where)
    else:
        raise ModelLoadError(f"cannot load a model from a {type(source).__name__}; pass a path or an onnx.ModelProto")
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise ModelLoadError(f"{where}: the file parsed but holds no graph; is it an ONNX model?")
    if folder is None and has_external_data(model):
        raise ModelLoadError(f"{where} refers to external weight data that was not loaded; "
                             "pass the model's path instead of a ModelProto")
    _default_opset(model, where)
    model = _check_structure(model, where)
    try:
        check_onnx_model(model)  # external tensors are checked without their values: read below
    except Exception as error:  # ValidationError, or ValueError for oversized protos
        message = " ".join(str(error).split()) or type(error).__name__
        raise ModelLoadError(f"{where} fails onnx.checker: {message[:400]}") from None
    if folder is not None:
        read_external_data(model, folder, where, arrays)
    return model


def _default_opset(model: onnx.ModelProto, where: str) -> int:
    """The model's default-domain opset; a ModelLoadError when missing or outside 11-23."""
    opset = None
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            opset = entry.version
    if opset is None:
        raise ModelLoadError(f"{where} imports no default-domain opset")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelLoadError(f"{where} uses opset {opset}; ppqlike reads opsets {MIN_OPSET}-{MAX_OPSET}. "
                             "Convert it with onnx.version_converter first")
    return opset


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index} (unnamed)"


def _check_structure(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Our own checks, with messages naming the node; returns the model, sorted if it was not."""
    graph = model.graph
    imports = {("" if e.domain == "ai.onnx" else e.domain): e.version for e in model.opset_import}
    for index, node in enumerate(graph.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain == "" and "" in imports:
            try:
                onnx.defs.get_schema(node.op_type, imports[""], "")
            except onnx.defs.SchemaError:
                raise ModelLoadError(
                    f"{where}: {_node_label(node, index)} has op type {node.op_type!r}, which is not an "
                    f"ONNX operator of the default domain at opset {imports['']}") from None
    available = {t.name for t in graph.initializer} | {i.name for i in graph.input} | \
        {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in producer or name in available:
                raise GraphError(f"{where}: tensor {name!r} is written twice (by "
                                 f"{_node_label(node, index)} and by another node, input or initializer)")
            producer[name] = index
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(graph.node)))
    for index, node in enumerate(graph.node):
        for name in list(node.input) + sorted(subgraph_reads(node)):
            if not name or name in available:
                continue
            if name not in producer:
                raise GraphError(f"{where}: input {name!r} of {_node_label(node, index)} is not produced "
                                 "by any node, nor a graph input or initializer")
            dag.add_edge(producer[name], index)
    for output in graph.output:
        if output.name not in producer and output.name not in available:
            raise GraphError(f"{where}: graph output {output.name!r} is not produced by any node")
    try:
        order = list(nx.lexicographical_topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = [_node_label(graph.node[u], u) for u, _ in nx.find_cycle(dag)]
        raise GraphError(f"{where}: the nodes form a cycle: {' -> '.join(cycle)}") from None
    if order != list(range(len(graph.node))):
        model = _copy_with_nodes(model, [graph.node[i] for i in order])
    return model


def _copy_with_nodes(model: onnx.ModelProto, nodes: list) -> onnx.ModelProto:
    """A copy of ``model`` whose graph has ``nodes`` in that order."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    return result


def _looks_like(data: bytes) -> str:
    """A hint at what a file that is not ONNX is."""
    if data[:3] == b"\xff\xd8\xff":
        return "; it looks like a JPEG image"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "; it looks like a PNG image"
    if data[:2] == b"PK":
        return "; it looks like a zip archive"
    head = data[:512]
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "; it looks like a text file"
    return ""


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # protobuf raises DecodeError and others
        raise ModelLoadError(f"{where} is not an ONNX model, or the file is truncated "
                             f"(protobuf {type(error).__name__} after reading {len(data)} bytes"
                             f"{_looks_like(data)})") from None
    return model


def load_onnx_graph(onnx_import_file: Any) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a :class:`Graph` (PPQ's keyword
    ``onnx_import_file`` names it).

    Raises ModelLoadError for unreadable or invalid models (including op
    types the default ONNX domain does not define) and GraphError for
    structural faults (an input nothing produces, a cycle).  Ops of other
    domains load; the executor rejects them when it plans.
    """
    arrays: dict = {}
    model = read_model(onnx_import_file, arrays)
    return graph_from_model(model, describe_source(onnx_import_file), arrays)


def graph_from_model(model: onnx.ModelProto, where: str, arrays: dict | None = None) -> Graph:
    """The :class:`Graph` of a model :func:`read_model` has checked; ``where`` names it in errors;
    ``arrays``: the external tensors ``read_model`` read."""
    arrays = arrays or {}
    by_node: dict[int, dict] = {}
    for key, value in arrays.items():
        if key[0] == "node":
            by_node.setdefault(key[1], {})[key[2:]] = value
    opset = _default_opset(model, where)
    onnx_graph = model.graph
    graph = Graph(name=onnx_graph.name or "graph", opset=opset)
    graph.metadata.update(ir_version=model.ir_version, producer_name=model.producer_name,
                          producer_version=model.producer_version, model_version=model.model_version,
                          doc_string=model.doc_string,
                          opset_imports={e.domain: e.version for e in model.opset_import},
                          metadata_props={p.key: p.value for p in model.metadata_props})
    fill_graph(graph, onnx_graph, where, Scope(graph), arrays, by_node)
    try:
        graph.topological_sort()
    except GraphError as error:
        raise GraphError(f"{where}: {error}") from None
    return graph
