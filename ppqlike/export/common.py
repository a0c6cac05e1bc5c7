"""What every exporter shares: config ids, the applied parameters of a config, integer storage types,
the rounding check, the graph header and the atomic text writer.

Which configs are in effect (applied, baked, governing) is decided in ``ppqlike.core.quant_graph``,
the rule the simulation follows too.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from onnx import TensorProto

from ..core.errors import ExportError
from ..core.ir import Graph, Operation, Variable
from ..core.quant import RoundingPolicy, TensorQuantizationConfig
from ..core.quant_graph import governing_config, iter_tensor_configs, quantizes, requantized
from ..io.files import atomic_write_bytes

__all__ = ["ExportRoundingWarning", "config_id", "split_config_id", "iter_configs", "is_param_slot",
           "StorageType", "storage_type", "rounding_mismatch", "quantizes", "requantized", "warn_rounding",
           "graph_header", "write_text", "write_json", "governing_config", "tensor_configs", "source_path",
           "output_steps"]


class ExportRoundingWarning(UserWarning):
    """The platform rounds activations otherwise than half to even, as ONNX QuantizeLinear does:
    the exported model differs from the simulation on exact ties."""


def config_id(operation: Operation | str, side: str, slot: int) -> str:
    """The unique id of one config: ``"<op name>/<input|output>/<slot>"``."""
    name = operation if isinstance(operation, str) else operation.name
    return f"{name}/{side}/{slot}"


def split_config_id(identifier: str) -> tuple[str, str, int]:
    """Inverse of :func:`config_id` (op names may hold '/')."""
    try:
        name, side, slot = identifier.rsplit("/", 2)
        if side not in ("input", "output"):
            raise ValueError
        return name, side, int(slot)
    except ValueError:
        raise ExportError(f"{identifier!r} is not a config id of the form '<op>/<input|output>/<slot>'") from None


def iter_configs(graph: Graph) -> Iterator[tuple[Operation, str, int, Variable, TensorQuantizationConfig]]:
    """(op, side, slot, variable, config) of every config, ops in topological order."""
    order = {op.name: i for i, op in enumerate(graph.topological_sort())}
    items = list(iter_tensor_configs(graph))
    items.sort(key=lambda item: (order[item[0].name], item[1] != "input", item[2]))
    return iter(items)


def is_param_slot(graph: Graph, variable: Variable | None) -> bool:
    """A constant (initializer) input, as the exporters see it: a parameter that is not a graph input."""
    return variable is not None and variable.is_parameter and variable not in graph.inputs


@dataclass(frozen=True)
class StorageType:
    """An ONNX integer type able to hold a quantized range."""

    numpy: np.dtype
    onnx: int
    low: int
    high: int
    opset: int          # lowest default-domain opset whose Q/DQ accept it

    @property
    def name(self) -> str:
        return self.numpy.name


_STORAGE = (
    StorageType(np.dtype(np.uint8), TensorProto.UINT8, 0, 255, 13),
    StorageType(np.dtype(np.int8), TensorProto.INT8, -128, 127, 13),
    StorageType(np.dtype(np.uint16), TensorProto.UINT16, 0, 65535, 21),
    StorageType(np.dtype(np.int16), TensorProto.INT16, -32768, 32767, 21),
    StorageType(np.dtype(np.int32), TensorProto.INT32, -(2 ** 31), 2 ** 31 - 1, 13),
)


def storage_type(quant_min: int, quant_max: int, allow_int32: bool = False, who: str = "") -> StorageType:
    """The narrowest ONNX integer type holding [quant_min, quant_max]: uint8, int8 (opset 13), uint16,
    int16 (opset 21), int32 (DequantizeLinear only: ``allow_int32``)."""
    for kind in _STORAGE:
        if kind.low <= quant_min and quant_max <= kind.high:
            if kind.numpy == np.int32 and not allow_int32:
                break
            return kind
    raise ExportError(f"{who or 'a config'}: integer range [{quant_min}, {quant_max}] has no ONNX "
                      "QuantizeLinear type (8 and 16 bits only; 32 bits only for parameters)")


def _is_activation(graph: Graph, variable: Variable | None) -> bool:
    return variable is not None and not is_param_slot(graph, variable)


def rounding_mismatch(graph: Graph) -> dict | None:
    """Applied activation configs whose rounding is not half to even (QuantizeLinear's), or None.

    Parameters are exported as integers computed with the config's own rounding, so only
    activations (quantized at run time by QuantizeLinear) can differ.  Returns
    ``{"message", "roundings": {policy: count}, "configs": [ids]}``.
    """
    found: dict[str, list[str]] = {}
    integer: list[str] = []
    for operation, side, slot, variable, config in iter_configs(graph):
        if not quantizes(config, side) or not _is_activation(graph, variable):
            continue
        if config.rounding is not RoundingPolicy.ROUND_HALF_EVEN:
            found.setdefault(config.rounding.name, []).append(config_id(operation, side, slot))
        if requantized(config, side):
            integer.append(config_id(operation, side, slot))
    if not found and not integer:
        return None
    parts = []
    if found:
        count = sum(len(v) for v in found.values())
        parts.append(f"{count} activation quantizer(s) round {', '.join(sorted(found))}, but ONNX QuantizeLinear "
                     "rounds half to even: the exported model differs from ppqlike's simulation wherever x / scale "
                     "falls exactly on .5 (weights and biases are exported as integers and match exactly)")
    if integer:
        parts.append(f"{len(integer)} op output(s) are requantized from the int32 accumulator by an integer "
                     "multiplier and shift (M0 >> rshift ~= S_in*S_w/S_out); the export divides by the float scale "
                     "instead, equal except on ties and within the multiplier's precision")
    return {"message": "; ".join(parts), "roundings": {k: len(v) for k, v in sorted(found.items())},
            "configs": [c for v in found.values() for c in v], "integer_requantization": integer}


def warn_rounding(mismatch: dict | None, stacklevel: int = 3) -> None:
    if mismatch is not None:
        warnings.warn(mismatch["message"], ExportRoundingWarning, stacklevel=stacklevel)


def source_path(graph: Graph) -> str | None:
    """The input model's path recorded by quantize_onnx_model (None if unknown)."""
    return (graph.metadata.get("quantization") or {}).get("source")


def graph_header(graph: Graph) -> dict:
    """Platform, setting and source of a quantized graph, from ``metadata['quantization']``."""
    from .. import __version__
    meta = graph.metadata.get("quantization") or {}
    return {"ppqlike_version": __version__, "graph": graph.name, "opset": graph.opset,
            "platform": meta.get("platform"), "setting": meta.get("setting"), "source": meta.get("source")}


def write_text(path, text: str, protect: tuple = ()) -> str:
    """Write ``text`` (UTF-8) atomically; returns the absolute path."""
    atomic_write_bytes(path, text.encode("utf-8"), protect=protect)
    return os.path.abspath(os.fspath(path))


def write_json(path, data, protect: tuple = ()) -> str:
    """Write ``data`` as indented JSON atomically; returns the absolute path."""
    return write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n", protect=protect)


def tensor_configs(graph: Graph) -> dict[str, TensorQuantizationConfig]:
    """Activation tensor name -> the config giving its quantization grid.

    The producer's output config wins (followed through OVERLAPPED links: a Conv output
    overlapped by the Relu after it carries the Relu's grid, as TensorRT and TPU-MLIR fuse
    them); a graph input or a tensor of an FP32 op takes its first consumer's input config.
    Tensors whose configs are all FP32/SOI/... are left out.
    """
    found: dict[str, TensorQuantizationConfig] = {}
    inputs: dict[str, TensorQuantizationConfig] = {}
    for operation, side, slot, variable, config in iter_configs(graph):
        if not _is_activation(graph, variable):
            continue
        governing = governing_config(config)
        if governing is None or governing.scale is None:
            continue
        if side == "output":
            found.setdefault(variable.name, governing)
        else:
            inputs.setdefault(variable.name, governing)
    for name, config in inputs.items():
        found.setdefault(name, config)
    return found


def output_steps(graph: Graph) -> dict[str, float | None]:
    """Graph output name -> its *output step*: the scale of the last quantized tensor it comes from.

    A graph output quantized by its producer has that scale (the largest one when per channel).
    An output of an unquantized op (Softmax left in FP32, a Gemm whose output is not quantized)
    takes the largest step of the quantized tensors it is computed from, searching back through
    unquantized ops: the step then bounds the output difference only for ops that do not amplify
    differences (Softmax, Flatten, Reshape, Relu, pooling: 1-Lipschitz in the max norm).  None when
    nothing upstream is quantized.
    """
    memo: dict[str, float | None] = {}

    def step(variable: Variable) -> float | None:
        if variable.name in memo:
            return memo[variable.name]
        memo[variable.name] = None
        producer = variable.producer
        found = None
        if producer is not None:
            config = producer.config
            outputs = config.output_quantization_config if config is not None else []
            slot = producer.outputs.index(variable)
            governing = governing_config(outputs[slot]) if slot < len(outputs) and outputs[slot] is not None \
                else None
            if governing is not None and governing.scale is not None:
                found = float(np.max(governing.scale))
            else:
                inputs = config.input_quantization_config if config is not None else []
                candidates = []
                for index, source in enumerate(producer.inputs):
                    if source is None or is_param_slot(graph, source):
                        continue
                    cfg = inputs[index] if index < len(inputs) else None
                    governing = governing_config(cfg) if cfg is not None else None
                    candidates.append(float(np.max(governing.scale)) if governing is not None
                                      and governing.scale is not None else step(source))
                candidates = [c for c in candidates if c is not None]
                found = max(candidates) if candidates else None
        memo[variable.name] = found
        return found

    return {variable.name: step(variable) for variable in graph.outputs}
