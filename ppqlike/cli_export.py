"""Export for the command line: ``ppqlike.api.export_ppq_graph`` when it exists, else a minimal QDQ writer.

:func:`export_quantized` is the one call the command line makes.  The
fallback (:func:`fallback_qdq_model`) mirrors the executor's simulation op by
op, so that the exported model computes what the simulation computes:

* an input slot whose config is applied (ACTIVATED, SLAVE, PASSIVE) on a
  run-time tensor gets a QuantizeLinear/DequantizeLinear pair of its own in
  front of the op (one pair per consumer);
* an output slot whose config is applied gets a pair right after the op, so
  every reader sees the quantized value (the op writes ``<name>__float``);
* a parameter slot that is baked or applied is stored as integers and read
  through DequantizeLinear (int8/uint8 weights, int32 biases).

Integer types follow each config's range (uint8, int8, uint16/int16 at opset
21, int32 for DequantizeLinear only).  QuantizeLinear rounds half to even and
saturates to the type's range: a config that rounds otherwise, or whose range
is narrower than its type (e.g. [-127, 127] activations), is listed in the
returned notes as a difference between export and simulation.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .core.errors import ExportError
from .core.ir import Graph
from .core.quant import RoundingPolicy, is_applied, is_baked
from .io.onnx_export import atomic_write_bytes, export_onnx_model

_TYPES = [(np.uint8, 0, 255, 13), (np.int8, -128, 127, 13), (np.uint16, 0, 65535, 21),
          (np.int16, -32768, 32767, 21), (np.int32, -2 ** 31, 2 ** 31 - 1, 13)]


def export_quantized(graph: Graph, platform, model_path: str, config_path: str) -> dict:
    """Write the QDQ model and the JSON config; returns {'exporter': name, 'notes': [...]}.

    Uses ``ppqlike.api.export_ppq_graph(graph, platform, graph_save_to, config_save_to)``
    when the installed ppqlike has it (it may write platform extras beside
    ``model_path``), the fallback of this module otherwise.
    """
    from . import api
    exporter = getattr(api, "export_ppq_graph", None)
    if exporter is not None:
        with warnings.catch_warnings(record=True) as caught:  # e.g. rounding that differs from the simulation
            warnings.simplefilter("always")
            result = exporter(graph, platform, graph_save_to=model_path, config_save_to=config_path)
        notes = [" ".join(str(w.message).split()) for w in caught]
        if isinstance(result, dict):
            notes += [str(n) for n in result.get("notes", []) or []]
        return {"exporter": "ppqlike.api.export_ppq_graph", "notes": notes}
    model, notes = fallback_qdq_model(graph)
    atomic_write_bytes(model_path, model.SerializeToString())
    atomic_write_bytes(config_path, json.dumps(config_document(graph, notes), indent=1, default=_jsonable).encode())
    return {"exporter": "ppqlike.cli_export (fallback QDQ writer)", "notes": notes}


def _jsonable(value: Any):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def config_document(graph: Graph, notes: list[str] | None = None) -> dict:
    """Every op's platform and quantization configs, plus the run's metadata, as a JSON-ready dict."""
    operations = {}
    for operation in graph.topological_sort():
        platform = operation.platform
        operations[operation.name] = {
            "type": operation.type,
            "platform": getattr(platform, "name", None if platform is None else str(platform)),
            "inputs": [None if v is None else v.name for v in operation.inputs],
            "outputs": [v.name for v in operation.outputs],
            "config": None if operation.config is None else operation.config.to_dict()}
    return {"format": "ppqlike-quantization-config", "version": 1,
            "quantization": graph.metadata.get("quantization", {}), "notes": list(notes or []),
            "operations": operations}


def _int_type(qmin: int, qmax: int, who: str):
    for dtype, low, high, opset in _TYPES:
        if low <= qmin and qmax <= high:
            return dtype, opset, (qmin, qmax) != (low, high)
    raise ExportError(f"{who}: range [{qmin}, {qmax}] fits no ONNX integer type")


class _Writer:
    def __init__(self, graph: Graph, model: onnx.ModelProto):
        self.graph, self.model = graph, model
        self.initializers: list[onnx.TensorProto] = []
        self.notes: list[str] = []
        self.needed_opset = 13
        self.used = {v.name for v in graph.variables.values()} | {n.name for n in model.graph.node}

    def fresh(self, base: str) -> str:
        name, index = base, 1
        while name in self.used:
            index += 1
            name = f"{base}_{index}"
        self.used.add(name)
        return name

    def params(self, tqc, who: str, side_q: bool):
        scale, offset = tqc.scale, tqc.offset
        if scale is None:
            raise ExportError(f"{who}: config {tqc.name!r} is {tqc.state.name} but has no scale")
        dtype, opset, narrow = _int_type(int(tqc.quant_min), int(tqc.quant_max), who)
        if side_q and dtype is np.int32:
            raise ExportError(f"{who}: an int32 activation cannot be written with QuantizeLinear")
        self.needed_opset = max(self.needed_opset, opset)
        if side_q and narrow:
            self.notes.append(f"{who}: range [{tqc.quant_min}, {tqc.quant_max}] is narrower than "
                              f"{np.dtype(dtype).name}; QuantizeLinear clamps to the full type range")
        if side_q and tqc.rounding is not RoundingPolicy.ROUND_HALF_EVEN:
            self.notes.append(f"{who}: simulated with {tqc.rounding.name}; QuantizeLinear rounds half to even")
        scale_name = self.fresh(f"{who}_scale")
        zero_name = self.fresh(f"{who}_zero_point")
        self.initializers.append(numpy_helper.from_array(np.asarray(scale, np.float32), scale_name))
        self.initializers.append(numpy_helper.from_array(np.asarray(offset).astype(dtype), zero_name))
        axis = tqc.channel_axis if np.ndim(scale) else None
        return scale_name, zero_name, dtype, axis

    def qdq(self, source: str, tqc, who: str, target: str | None = None) -> tuple[list, str]:
        scale, zero, _, axis = self.params(tqc, who, side_q=True)
        quantized = self.fresh(f"{who}_quantized")
        target = target or self.fresh(f"{who}_dequantized")
        extra = {} if axis is None else {"axis": int(axis)}
        nodes = [helper.make_node("QuantizeLinear", [source, scale, zero], [quantized], name=self.fresh(f"{who}_Q"),
                                  **extra),
                 helper.make_node("DequantizeLinear", [quantized, scale, zero], [target],
                                  name=self.fresh(f"{who}_DQ"), **extra)]
        return nodes, target

    def parameter(self, variable, tqc, who: str) -> tuple[list, str]:
        value = tqc.baked_value if is_baked(tqc.state) and tqc.baked_value is not None else variable.value
        seen = np.asarray(value if is_baked(tqc.state) else tqc.fake_quantize(value), np.float32)
        scale, zero, dtype, axis = self.params(tqc, who, side_q=False)
        integers = np.asarray(tqc.quantize(value))
        if not np.allclose(np.asarray(tqc.dequantize(integers), np.float32), seen, rtol=1e-6, atol=0):
            self.notes.append(f"{who}: stored as float (its baked value is not on its grid)")
            name = self.fresh(f"{who}_value")
            self.initializers.append(numpy_helper.from_array(seen, name))
            return [], name
        stored = self.fresh(f"{who}_int")
        self.initializers.append(numpy_helper.from_array(integers.astype(dtype), stored))
        target = self.fresh(f"{who}_dequantized")
        extra = {} if axis is None else {"axis": int(axis)}
        return [helper.make_node("DequantizeLinear", [stored, scale, zero], [target], name=self.fresh(f"{who}_DQ"),
                                 **extra)], target


def fallback_qdq_model(graph: Graph) -> tuple[onnx.ModelProto, list[str]]:
    """The QDQ ModelProto of a quantized graph (see the module docstring) and notes on where it differs."""
    if graph.opset < 13:
        raise ExportError(f"graph {graph.name!r} uses opset {graph.opset}; the QDQ export needs opset 13 or later")
    model = export_onnx_model(graph)
    writer = _Writer(graph, model)
    nodes = []
    for node in model.graph.node:
        operation = graph.operations.get(node.name)
        config = None if operation is None else operation.config
        if config is None:
            nodes.append(node)
            continue
        after = []
        for index, tqc in enumerate(config.input_quantization_config):
            if tqc is None or index >= len(operation.inputs) or operation.inputs[index] is None:
                continue
            variable, who = operation.inputs[index], f"{operation.name}.in{index}"
            if variable.is_parameter and (is_applied(tqc.state) or is_baked(tqc.state)):
                extra, name = writer.parameter(variable, tqc, who)
            elif not variable.is_parameter and is_applied(tqc.state):
                extra, name = writer.qdq(node.input[index], tqc, who)
            else:
                continue
            nodes.extend(extra)
            node.input[index] = name
        for index, tqc in enumerate(config.output_quantization_config):
            if tqc is None or index >= len(node.output) or not is_applied(tqc.state):
                continue
            original = node.output[index]
            node.output[index] = writer.fresh(f"{original}__float")
            extra, _ = writer.qdq(node.output[index], tqc, f"{operation.name}.out{index}", target=original)
            after.extend(extra)
        nodes.append(node)
        nodes.extend(after)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(writer.initializers)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < writer.needed_opset:
            raise ExportError(f"graph {graph.name!r} uses opset {opset.version}; its 16-bit configs need opset "
                              f"{writer.needed_opset}")
    # drop parameters nothing reads any more (the float weights replaced by integers)
    read = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model, sorted(set(writer.notes))


def exported_states(graph: Graph) -> dict[str, int]:
    """How many configs are in each state (for summaries)."""
    counts: dict[str, int] = {}
    for operation in graph.operations.values():
        if operation.config is not None:
            for _, _, tqc in operation.config.iter_configs():
                counts[tqc.state.name] = counts.get(tqc.state.name, 0) + 1
    return dict(sorted(counts.items()))


__all__ = ["export_quantized", "fallback_qdq_model", "config_document", "exported_states"]
