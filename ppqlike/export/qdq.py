"""QDQ ONNX export: the quantized graph as an ONNX model that onnxruntime runs and that computes
what ppqlike's executor simulates (DESIGN.md §6).

Exactly the quantization the simulation applies is written, no more, no less:

* an activation config the executor applies (ACTIVATED / SLAVE / PASSIVE, and an output config
  carrying an integer requantization, TPU style, even when OVERLAPPED) becomes a
  QuantizeLinear → DequantizeLinear pair with the config's resolved scale (float32) and zero
  point: an output config right after the producer (one pair read by every consumer, or with
  ``qdq_per_consumer`` one pair per consumer edge), an input config on that edge only.  A tensor
  the simulation quantizes twice (producer output, then a consumer's ACTIVATED input) gets two
  pairs.  OVERLAPPED configs add nothing: their master's pair is already on the tensor.
* a parameter whose config is baked (or applied) becomes an integer initializer →
  DequantizeLinear (axis = channel axis when per channel) that yields bit for bit the float
  value the executor uses; Clip bounds and the Pad value (onnxruntime needs float scalars there)
  are written as the baked float value.  A parameter read by several ops with different configs
  gets one initializer per distinct result.
* FP32 and SOI ops, and float parameters, are written as they are.

Zero point types: uint8 for [0, 255], int8 within [-128, 127] (also fewer bits: the range then
narrower than the type's is enforced by a Clip after the DequantizeLinear, exact), uint16/int16
at opset 21.  ``uint8_activations`` writes int8 symmetric activations ([-128, 127], zero point
0) as uint8 with zero point 128: the same grid and the same clamp, so the same values.

QuantizeLinear rounds half to even; configs that round otherwise (TPU-MLIR: half away from
zero) differ on exact ties, which is reported (ExportRoundingWarning and the report's
``rounding_mismatch``).
"""

from __future__ import annotations

import os

import onnx
from onnx import helper

from ..core.errors import ExportError
from ..core.ir import Graph
from ..core.subgraphs import has_bodies, walk
from ..core.quant import QuantizationStates, is_applied, is_baked
from ..io.files import MAX_IR_VERSION, StagedFiles
from ..io.onnx_files import check_onnx_model, write_onnx_model
from .opset_upgrade import is_converter_node, tensor_views, upgraded_model
from .qdq_bodies import names_in_bodies, write_bodies
from .qdq_blocks import to_matmul_nbits
from ..core.quant_block import is_block_config
from .qdq_float import FLOAT_OPSET
from .qdq_builder import FLOAT_PARAMETER_SLOTS, QDQ_OPSET, WIDE_OPSET, QdqBuilder
from .common import config_id, is_param_slot, quantizes, rounding_mismatch, source_path, warn_rounding

S = QuantizationStates

__all__ = ["build_qdq_model", "export_qdq_onnx", "QDQ_OPSET", "FLOAT_PARAMETER_SLOTS"]

_UNUSABLE_STATES = (S.INITIAL, S.PASSIVE_INIT, S.DEQUANTIZED)


def _check_states(graph: Graph) -> list[str]:
    notes = []
    for operation in graph.topological_sort():
        if operation.config is None:
            continue
        for side, slot, config in operation.config.iter_configs():
            variables = operation.inputs if side == "input" else operation.outputs
            variable = variables[slot] if slot < len(variables) else None
            if variable is None:
                continue
            who = config_id(operation, side, slot)
            if is_baked(config.state) and not is_param_slot(graph, variable) and config.baked_value is not None:
                raise ExportError(f"{who}: activation {variable.name!r} is {config.state.name}; only parameters "
                                  "can be baked")
            if config.state in _UNUSABLE_STATES:
                notes.append(f"{who} ({variable.name!r}) is {config.state.name}: exported as float, as simulated")
    return notes


def build_qdq_model(graph: Graph, qdq_per_consumer: bool = False, uint8_activations: bool = False,
                    opset: int | None = None, check: bool = True,
                    uint8_weights: bool = False, reserved: set | None = None) -> tuple[onnx.ModelProto, dict]:
    """The QDQ ModelProto of a quantized graph, and a report.

    ``opset``: the default-domain opset to write (at least 13; 21 when 16-bit types need it).
    The report holds ``opset``, counts of pairs and parameters, ``rounding_mismatch`` (None or
    a dict, see :func:`ppqlike.export.common.rounding_mismatch`), ``notes`` and ``tensors``
    (graph activation name -> the ONNX tensor holding its value after its output quantization,
    what the executor hands to consumers; with ``qdq_per_consumer`` the first consumer's copy;
    absent for tensors no consumer reads in per-consumer mode).  Bodies of If/Loop/Scan are written by
    :mod:`ppqlike.export.qdq_bodies` (quantized as their configs say); ``reserved``: names an enclosing
    scope uses, which no new tensor here may take.
    """
    notes = _check_states(graph)
    builder = QdqBuilder(graph, qdq_per_consumer, uint8_activations, set(), uint8_weights=uint8_weights)
    target = max(QDQ_OPSET, graph.opset, opset or 0)
    # Decide the opset first (16-bit types need 21) with a dry run over the configs.
    for _, operation in walk(graph):
        for _, _, config in (operation.config.iter_configs() if operation.config is not None else ()):
            if not (is_applied(config.state) or is_baked(config.state)):
                continue
            if config.float_format is not None:
                target = max(target, FLOAT_OPSET)
            elif 8 < config.num_of_bits <= 16 or is_block_config(config):
                target = max(target, WIDE_OPSET)
    base = upgraded_model(graph, target)
    views = tensor_views(base, graph)  # slots the converter rewired to a reshaped view (Softmax before 13)
    builder.names = {n for node in base.graph.node for n in list(node.input) + list(node.output) + [node.name]}
    builder.names |= {i.name for i in base.graph.initializer} | {v.name for v in graph.variables.values()}
    builder.names |= (reserved or set()) | names_in_bodies(base.graph)
    raw_initializers = {i.name: i for i in base.graph.initializer}
    graph_outputs = {v.name for v in graph.outputs}
    visible: dict[str, str] = {}   # activation name -> what a consumer without an input pair reads
    raw: dict[str, str] = {}       # activation name -> the float value before its output pair
    pending: dict[str, tuple] = {}  # per-consumer mode: activation name -> (pair, tensor) to add per edge
    located: dict[str, str] = {}   # activation name -> ONNX tensor holding it after its output pair

    def read(name: str) -> str:
        """What a consumer without an input pair reads for activation ``name`` (one pair per edge when pending)."""
        if name in pending:
            pair, tensor = pending[name]
            added = builder.add_pair(raw[name], pair, tensor)
            if name in graph.variables:
                located.setdefault(name, added)
            return added
        return visible.get(name, name)

    for node in base.graph.node:
        if is_converter_node(node, graph):  # a node the version converter added
            node = _copy_node(node)
            if node.op_type != "Shape":
                inputs = [read(name) if name else name for name in node.input]
                del node.input[:]
                node.input.extend(inputs)
            builder.nodes.append(node)
            continue
        operation = graph.operations[node.name]
        node = _copy_node(node)
        config = operation.config
        in_configs = config.input_quantization_config if config is not None else []
        if has_bodies(operation):   # quantized bodies, reading what this scope's pairs hand them
            write_bodies(node, operation, read, builder.names, builder.counts, lambda body, names: build_qdq_model(
                body, qdq_per_consumer, uint8_activations, target, False, uint8_weights, names))
        for slot, variable in enumerate(operation.inputs[:len(node.input)]):   # (then what bodies read)
            if variable is None:
                continue
            cfg = in_configs[slot] if slot < len(in_configs) else None
            if is_param_slot(graph, variable):
                name = builder.parameter(operation, slot, variable, cfg)
                if name is not None:
                    node.input[slot] = name
                continue
            view = views.get((operation.name, "input", slot))
            name = view if view is not None else read(variable.name)
            if cfg is not None and is_applied(cfg.state):
                name = builder.add_pair(name, builder.pair_of(cfg, config_id(operation, "input", slot)),
                                        variable.name)
            node.input[slot] = name
        builder.nodes.append(node)
        out_configs = config.output_quantization_config if config is not None else []
        for slot, variable in enumerate(operation.outputs):
            cfg = out_configs[slot] if slot < len(out_configs) else None
            located[variable.name] = variable.name
            if not quantizes(cfg, "output"):
                continue
            pair = builder.pair_of(cfg, config_id(operation, "output", slot))
            name = views.get((operation.name, "output", slot), variable.name)
            if name != variable.name:  # the converter's reshape after the op makes the graph tensor
                raw[name] = name       # from the pair's result
                if qdq_per_consumer:
                    pending[name] = (pair, variable.name)
                else:
                    visible[name] = builder.add_pair(name, pair, variable.name)
                continue
            del located[name]
            if name in graph_outputs:  # the graph output is the quantized value: rename the float one
                node.output[slot] = raw[name] = builder.unique(f"{name}_float")
                builder.add_pair(raw[name], pair, name, output=name)
                visible[name] = located[name] = name
            elif qdq_per_consumer:
                raw[name] = name
                pending[name] = (pair, name)
            else:
                visible[name] = located[name] = builder.add_pair(name, pair, name)
    notes += builder.notes
    if target >= WIDE_OPSET and builder.int8_pairs:
        notes.append("onnxruntime (1.31, 1.32) fails to load opset-21 models with int8 activation QDQ at "
                     "ORT_ENABLE_EXTENDED and above (its QDQ propagation across MaxPool/Reshape and its "
                     "QDQS8ToU8Transformer build invalid QuantizeLinear nodes); for onnxruntime export with "
                     "uint8_activations=True (the same values) or lower the session's optimization level")
    nodes = builder.nodes
    initializers = builder.initializers
    used = {n for node in nodes for n in node.input} | graph_outputs
    initializers = [raw_initializers[n] for n in raw_initializers if n in used] + initializers
    opset_final = max(target, builder.opset_needed)
    if opset_final > target:  # 16-bit activations found late (only when the dry run missed a case)
        raise ExportError(f"graph {graph.name!r} needs opset {opset_final}; pass opset={opset_final}")
    onnx_graph = helper.make_graph(nodes, base.graph.name, list(base.graph.input), list(base.graph.output))
    imports = [helper.make_opsetid(e.domain, target if e.domain in ("", "ai.onnx") else e.version)
               for e in base.opset_import]
    model = helper.make_model(onnx_graph, opset_imports=imports, producer_name="ppqlike")
    model.graph.initializer.extend(initializers)  # after make_model, which copies its graph
    model.ir_version = MAX_IR_VERSION
    mismatch = rounding_mismatch(graph)
    meta = graph.metadata.get("quantization") or {}
    props = {p.key: p.value for p in base.metadata_props}
    props.update({"ppqlike.export": "qdq", "ppqlike.platform": str(meta.get("platform")),
                  "ppqlike.matches_simulation": "no (rounding)" if mismatch else "yes"})
    helper.set_model_props(model, props)
    if check:
        try:
            check_onnx_model(model)
        except onnx.checker.ValidationError as error:
            raise ExportError(f"the QDQ export of {graph.name!r} is not a valid ONNX model: {error}") from None
    report = {"opset": target, "ir_version": model.ir_version, **builder.counts,
              "qdq_per_consumer": bool(qdq_per_consumer), "uint8_activations": bool(uint8_activations),
              "uint8_weights": bool(uint8_weights),
              "rounding_mismatch": mismatch, "notes": notes, "tensors": located}
    return model, report


def _copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    new = onnx.NodeProto()
    new.CopyFrom(node)
    return new


def export_qdq_onnx(graph: Graph, path: str | os.PathLike, qdq_per_consumer: bool = False,
                    uint8_activations: bool = False, opset: int | None = None,
                    protect: tuple = (), warn: bool = True, uint8_weights: bool = False,
                    staged: StagedFiles | None = None, weight_only_format: str = "qdq") -> dict:
    """Build the QDQ model of ``graph`` and write it to ``path`` atomically.

    Refuses to overwrite the graph's source model (recorded by quantize_onnx_model) or any
    path in ``protect``.  Warns (ExportRoundingWarning, unless ``warn`` is False) when the
    platform's rounding makes the export differ from the simulation.  ``staged``: the open
    StagedFiles that reserved ``path`` (a model with external data stages its data file there too).
    ``weight_only_format`` 'matmulnbits': block-quantized weights become com.microsoft MatMulNBits nodes
    (``export.qdq_blocks``; 'qdq': blocked DequantizeLinear).
    Returns the report of :func:`build_qdq_model` plus ``path`` and ``files`` (model first).
    """
    model, report = build_qdq_model(graph, qdq_per_consumer=qdq_per_consumer,
                                    uint8_activations=uint8_activations, opset=opset,
                                    uint8_weights=uint8_weights)
    if weight_only_format == "matmulnbits":
        model, report["matmulnbits"] = to_matmul_nbits(model)
    elif weight_only_format != "qdq":
        raise ExportError(f"weight_only_format {weight_only_format!r} is unknown; choose 'qdq' or 'matmulnbits'")
    report["files"] = write_onnx_model(path, model, protect=(source_path(graph), *protect), staged=staged)
    if warn:
        warn_rounding(report["rounding_mismatch"])
    report["path"] = os.path.abspath(os.fspath(path))
    return report

