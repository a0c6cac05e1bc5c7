"""JSON export and import of every quantization config of a graph.

Format (``"format": "ppqlike-quantization-config"``, ``"version": 1``)::

    {
      "format": ..., "version": 1, "ppqlike_version": "0.1.0",
      "graph": name, "opset": 13, "platform": "TRT_INT8", "setting": {...}, "source": "model.onnx",
      "rounding_warning": null | "message",         # the QDQ export differs from the simulation on ties
      "operations": [                                # every op, topological order
        {"name", "type", "platform", "inputs": [tensor|null], "outputs": [tensor],
         "configs": null | {"inputs": [id|null], "outputs": [id|null]}}],
      "configs": [                                   # every config, same order (inputs before outputs)
        {"id": "<op>/<input|output>/<slot>", "op", "op_type", "platform", "side", "slot", "tensor",
         "is_parameter", "state", "dequantized_from", "policy": ["PER_TENSOR", "LINEAR", ...],
         "rounding", "num_of_bits", "quant_min", "quant_max", "channel_axis",
         "scale": number | [per channel] | null, "offset": int | [per channel] | null,
         "observer", "masters": [ids], "detail": {...},
         "baked": null | "rebake" | "none" | {"dtype", "shape", "base64"},   # BAKED/PASSIVE_BAKED only
         "value_sha1": sha1 of the FP32 parameter (parameters only)}],
      "parameters": {name: {"dtype", "shape", "base64"}},   # FP32 values changed by passes
      "notes": [...]
    }

Scales are the float32 values written as JSON numbers (exact: float32 -> double -> text -> double
-> float32 round-trips); ``scale``/``offset`` are the values in use (a governed config's are its
masters'), and ``masters`` restores the live links.  A baked value is not stored when quantizing
the FP32 parameter again with the loaded scale gives it back bit for bit (``"rebake"``, the
normal case); otherwise the float32 baked value is stored (base64).  FP32 parameters a pass
changed (equalization, bias correction) are found by formatting the source model again and are
stored under ``"parameters": {name: {"dtype", "shape", "base64"}}`` (``parameters='auto'``).

:func:`load_config_json` applies such a file to a graph loaded and formatted the same way
(:func:`load_quantized_graph` does both), creating the configs from the JSON directly, so the
executor's simulation is reproduced bit for bit.
"""

from __future__ import annotations

import base64
import hashlib
import os
import warnings
from typing import Any

import numpy as np

from ..core.errors import ExportError
from ..core.ir import Graph
from ..core.quant_operation import OperationQuantizationConfig
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_baked
from ..io.files import read_json
from ..io.onnx_import import load_onnx_graph
from ..optim.recipe import format_for_quantization
from ..optim.setting import QuantizationSetting
from ..platforms.target import TargetPlatform
from .common import config_id, graph_header, is_param_slot, iter_configs, rounding_mismatch, write_json

S = QuantizationStates
FORMAT = "ppqlike-quantization-config"
VERSION = 1

__all__ = ["config_to_json", "export_config_json", "load_config_json", "load_quantized_graph", "FORMAT"]


def _sha1(array: np.ndarray) -> str:
    array = np.asarray(array)
    return hashlib.sha1(array.dtype.str.encode() + str(array.shape).encode()
                        + np.ascontiguousarray(array).tobytes()).hexdigest()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _platform_name(platform) -> str | None:
    if platform is None:
        return None
    return platform.name if isinstance(platform, TargetPlatform) else str(platform)


def _baked_entry(config: TensorQuantizationConfig, value) -> Any:
    if config.baked_value is None:
        return "none"
    baked = np.asarray(config.baked_value)
    if value is not None:
        rebaked = config.fake_quantize(value)
        if rebaked.dtype == baked.dtype and np.array_equal(rebaked, baked):
            return "rebake"
    return _encode(baked)


def _encode(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "base64": base64.b64encode(array.tobytes()).decode("ascii")}


def _decode(entry: dict) -> np.ndarray:
    raw = base64.b64decode(entry["base64"])
    return np.frombuffer(raw, dtype=np.dtype(entry["dtype"])).reshape(entry["shape"]).copy()


def _changed_parameters(graph: Graph, mode: str) -> tuple[dict, str | None]:
    """Parameters to store: ``all``, none, or (``auto``) those a pass changed (equalization, bias
    correction): found by loading and formatting the source model again and comparing."""
    names = sorted({v.name for op in graph.operations.values() if op.config is not None
                    for v in op.inputs if is_param_slot(graph, v)})
    if mode == "none":
        return {}, None
    if mode == "all":
        return {n: _encode(graph.variables[n].value) for n in names}, None
    source, setting = graph_header(graph)["source"], graph_header(graph)["setting"]
    if not source or not os.path.isfile(source):
        return {}, "the source model is unknown: parameters changed by passes could not be detected"
    fresh = load_onnx_graph(source)
    if setting:
        format_for_quantization(fresh, QuantizationSetting.from_dict(setting))
    stored = {}
    for name in names:
        value, other = graph.variables[name].value, fresh.variables.get(name)
        if other is None or other.value is None or other.value.dtype != value.dtype or \
                other.value.shape != value.shape or not np.array_equal(other.value, value):
            stored[name] = _encode(value)
    return stored, None


def config_to_json(graph: Graph, parameters: str = "auto") -> dict:
    """The JSON-ready dict of every config of ``graph`` (see the module docstring).

    ``parameters``: which FP32 parameter values of quantized ops to store: ``auto`` (those that
    differ from the source model loaded and formatted again: changed by a pass such as
    equalization or bias correction), ``all`` or ``none``.
    """
    if parameters not in ("auto", "all", "none"):
        raise ExportError(f"parameters must be 'auto', 'all' or 'none', not {parameters!r}")
    header = graph_header(graph)
    mismatch = rounding_mismatch(graph)
    ids: dict[int, str] = {}
    entries = []
    for operation, side, slot, variable, config in iter_configs(graph):
        identifier = config_id(operation, side, slot)
        if id(config) in ids:  # one config object in two slots
            entries.append({"id": identifier, "same_as": ids[id(config)]})
            continue
        ids[id(config)] = identifier
        data = config.to_dict()
        parameter = is_param_slot(graph, variable)
        entry = {
            "id": identifier, "op": operation.name, "op_type": operation.type,
            "platform": _platform_name(operation.platform), "side": side, "slot": slot,
            "tensor": variable.name, "is_parameter": parameter, "state": data["state"],
            "dequantized_from": data["dequantized_from"], "policy": data["policy"], "rounding": data["rounding"],
            "num_of_bits": data["num_of_bits"], "quant_min": data["quant_min"], "quant_max": data["quant_max"],
            "channel_axis": data["channel_axis"], "scale": data["scale"], "offset": data["offset"],
            "observer": data["observer_algorithm"], "masters": config.masters, "detail": _jsonable(data["detail"]),
            "requantization": data["requantization"], "runtime_kernel": data["runtime_kernel"],
            **({"block_size": data["block_size"]} if "block_size" in data else {}),   # weight-only blocks
        }
        state = config.state if config.state is not S.DEQUANTIZED else config.dequantized_from
        if is_baked(state):
            entry["baked"] = _baked_entry(config, variable.value if parameter else None)
        if parameter:
            entry["value_sha1"] = _sha1(variable.value)
        entries.append(entry)
    for entry in entries:  # master objects -> ids
        if "masters" in entry:
            missing = [m for m in entry["masters"] if id(m) not in ids]
            if missing:
                raise ExportError(f"config {entry['id']}: master {missing[0]!r} belongs to no op of the graph")
            entry["masters"] = [ids[id(m)] for m in entry["masters"]]
    operations = []
    for operation in graph.topological_sort():
        config = operation.config
        configs = None
        if config is not None:
            configs = {key: [None if c is None else config_id(operation, side, i) for i, c in enumerate(items)]
                       for key, side, items in (("inputs", "input", config.input_quantization_config),
                                                ("outputs", "output", config.output_quantization_config))}
        operations.append({"name": operation.name, "type": operation.type,
                           "platform": _platform_name(operation.platform),
                           "inputs": [None if v is None else v.name for v in operation.inputs],
                           "outputs": [v.name for v in operation.outputs], "configs": configs})
    stored, note = _changed_parameters(graph, parameters)
    return {"format": FORMAT, "version": VERSION, **_jsonable(header),
            "rounding_warning": None if mismatch is None else mismatch["message"],
            "operations": operations, "configs": entries, "parameters": stored,
            "notes": [note] if note else []}


def export_config_json(graph: Graph, path, protect: tuple = (), parameters: str = "auto") -> str:
    """Write :func:`config_to_json` of ``graph`` to ``path`` atomically; returns the absolute path."""
    source = graph_header(graph)["source"]
    return write_json(path, config_to_json(graph, parameters), protect=(source, *protect))


# ------------------------------------------------------------------- import
def _read(source) -> dict:
    if isinstance(source, dict):
        return source
    data = read_json(source, "config file", ExportError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExportError(f"{os.fspath(source)!r} is not a ppqlike quantization config (format {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ExportError(f"{os.fspath(source)!r} has config format version {data.get('version')}; "
                          f"this ppqlike reads version {VERSION}")
    return data


def _check_operations(graph: Graph, data: dict) -> None:
    listed = {entry["name"] for entry in data["operations"]}
    extra = sorted(set(graph.operations) - listed)
    if extra:
        raise ExportError(f"graph {graph.name!r} has ops the config does not list, e.g. {extra[:5]}: load and "
                          "format the model with the setting the config was made with")
    for entry in data["operations"]:
        operation = graph.operations.get(entry["name"])
        if operation is None:
            raise ExportError(f"the config lists op {entry['name']!r} ({entry['type']}), which graph "
                              f"{graph.name!r} does not have: load and format the model as it was quantized")
        inputs = [None if v is None else v.name for v in operation.inputs]
        outputs = [v.name for v in operation.outputs]
        if operation.type != entry["type"] or inputs != entry["inputs"] or outputs != entry["outputs"]:
            raise ExportError(f"op {operation.name!r} differs from the config: graph has {operation.type} "
                              f"{inputs} -> {outputs}, config {entry['type']} {entry['inputs']} -> {entry['outputs']}")


def _master_order(entries: dict) -> list[str]:
    """Config ids, each after its masters (and after the config it is an alias of)."""
    order, state = [], {}

    def visit(identifier: str, path: tuple) -> None:
        if state.get(identifier) == "done":
            return
        if identifier in path:
            raise ExportError(f"config {identifier}: its masters form a cycle")
        entry = entries.get(identifier)
        if entry is None:
            raise ExportError(f"the config refers to {identifier!r}, which it does not define")
        for master in ([entry["same_as"]] if "same_as" in entry else entry.get("masters", [])):
            visit(master, path + (identifier,))
        state[identifier] = "done"
        order.append(identifier)

    for identifier in entries:
        visit(identifier, ())
    return order


def load_config_json(graph: Graph, source) -> dict:
    """Apply a config JSON (path or dict) to ``graph``: op platforms and every config, master links
    and baked values included.  The graph must be loaded and formatted as the exported one was
    (see :func:`load_quantized_graph`); mismatching ops raise ExportError.  Returns a report:
    ``configs`` (count), ``rebaked``, ``stored_baked``, ``restored_parameters`` (FP32 values the
    file stores, written into the graph first), ``changed_parameters`` (parameters whose FP32 value
    still differs from the exported graph's: warned, their baked values may differ).
    """
    data = _read(source)
    _check_operations(graph, data)
    for name, encoded in (data.get("parameters") or {}).items():  # values a pass changed
        if name not in graph.variables:
            raise ExportError(f"the config stores parameter {name!r}, which graph {graph.name!r} does not have")
        graph.variables[name].value = _decode(encoded)
    entries = {entry["id"]: entry for entry in data["configs"]}
    created: dict[str, TensorQuantizationConfig] = {}
    report = {"configs": 0, "rebaked": 0, "stored_baked": 0, "changed_parameters": [],
              "restored_parameters": len(data.get("parameters") or {})}
    for identifier in _master_order(entries):
        entry = entries[identifier]
        if "same_as" in entry:
            created[identifier] = created[entry["same_as"]]
            continue
        if entry.get("block_size") is not None:
            raise ExportError(f"the config of {entry['tensor']!r} is a weight-only block config: its integer codes "
                              "are in the exported model, not in the JSON; quantize the model again (its JSON "
                              "cannot be reloaded)")
        as_dict = {"name": entry["tensor"], "state": entry["state"], "dequantized_from": entry["dequantized_from"],
                   "policy": entry["policy"], "rounding": entry["rounding"], "num_of_bits": entry["num_of_bits"],
                   "quant_min": entry["quant_min"], "quant_max": entry["quant_max"],
                   "channel_axis": entry["channel_axis"], "observer_algorithm": entry["observer"],
                   "scale": entry["scale"], "offset": entry["offset"], "masters": entry["masters"],
                   "detail": entry.get("detail") or {}, "requantization": entry.get("requantization"),
                   "runtime_kernel": entry.get("runtime_kernel")}
        created[identifier] = TensorQuantizationConfig.from_dict(as_dict, lookup=created.__getitem__)
        report["configs"] += 1
    for entry in data["operations"]:
        operation = graph.operations[entry["name"]]
        operation.platform = None if entry["platform"] is None else TargetPlatform.parse(entry["platform"])
        configs = entry["configs"]
        operation.config = None if configs is None else OperationQuantizationConfig(
            [None if i is None else created[i] for i in configs["inputs"]],
            [None if i is None else created[i] for i in configs["outputs"]])
    for identifier, entry in entries.items():
        baked = entry.get("baked")
        if baked is None or "same_as" in entry:
            continue
        config = created[identifier]
        variable = graph.variables[entry["tensor"]]
        if isinstance(baked, dict):
            config.baked_value = _decode(baked)
            report["stored_baked"] += 1
        elif baked == "rebake":
            if entry.get("value_sha1") and _sha1(variable.value) != entry["value_sha1"]:
                report["changed_parameters"].append(variable.name)
            config.baked_value = config.fake_quantize(variable.value)
            report["rebaked"] += 1
    if report["changed_parameters"]:
        names = report["changed_parameters"]
        warnings.warn(f"{len(names)} parameter(s) of {graph.name!r} differ from those of the exported graph "
                      f"(e.g. {names[:3]}): their baked values were recomputed from the values loaded now",
                      UserWarning, stacklevel=2)
    graph.metadata["quantization"] = {
        **(graph.metadata.get("quantization") or {}), "platform": data.get("platform"),
        "setting": data.get("setting"), "source": data.get("source"),
        "loaded_config": None if isinstance(source, dict) else os.path.abspath(os.fspath(source))}
    return report


def load_quantized_graph(onnx_file, config_file) -> Graph:
    """Load ``onnx_file``, format it with the setting recorded in ``config_file`` and apply the configs."""
    data = _read(config_file)
    graph = load_onnx_graph(onnx_file)
    if data.get("setting"):
        format_for_quantization(graph, QuantizationSetting.from_dict(data["setting"]))
    load_config_json(graph, data)
    if not isinstance(config_file, dict):
        graph.metadata["quantization"]["loaded_config"] = os.path.abspath(os.fspath(config_file))
    if isinstance(onnx_file, (str, os.PathLike)):
        graph.metadata["quantization"]["source"] = os.fspath(onnx_file)
    return graph
