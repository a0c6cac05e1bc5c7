"""TensorRT dynamic ranges: ``{tensor name: amax}`` for TensorRT's implicit INT8 mode.

TensorRT's ``ITensor.set_dynamic_range(-amax, amax)`` takes a symmetric range; the INT8 scale it
uses is ``amax / 127``.  So ``amax = scale * 127`` gives back ppqlike's scale exactly (for the
usual symmetric int8 activations, zero point 0).  Format (as PPQ's TensorRT JSON export)::

    {
      "format": "ppqlike-tensorrt-dynamic-range", "version": 1, "platform": "TRT_INT8",
      "act_quant_info": {"<tensor>": amax, ...},        # every quantized activation tensor
      "weight_quant_info": {"<initializer>": amax | [amax per output channel], ...},
      "notes": [...]
    }

``act_quant_info`` lists every activation tensor whose grid is known: a tensor quantized by its
producer's output config, and also the tensors whose config is OVERLAPPED (a Conv output
followed by a fused Relu/Clip carries the activation's range, as TensorRT fuses the two), graph
inputs (their first consumer's input config) and tensors of FP32 ops read by quantized ops.
For asymmetric configs (not TensorRT's own) amax is max(|S*(qmin-Z)|, |S*(qmax-Z)|) and a note
says the range is not exact.  Weights: ``scale * quant_max`` per channel (127 for [-127, 127]).
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Graph
from ..core.quant import QuantizationStates, TensorQuantizationConfig, is_applied, is_baked
from ..core.quant_block import is_block_config
from .common import graph_header, is_param_slot, iter_configs, tensor_configs, write_json

FORMAT = "ppqlike-tensorrt-dynamic-range"

__all__ = ["amax_of", "tensorrt_dynamic_ranges", "export_tensorrt_dynamic_ranges"]


def amax_of(config: TensorQuantizationConfig) -> tuple[np.ndarray, bool]:
    """(amax per tensor or per channel as float64, exact) of a config with a scale."""
    scale = np.asarray(config.scale, np.float64)
    offset = np.zeros(scale.shape) if config.offset is None else np.asarray(config.offset, np.float64)
    low, high = scale * (config.quant_min - offset), scale * (config.quant_max - offset)
    exact = bool(np.all(offset == 0)) and config.quant_min < 0
    return (scale * config.quant_max if exact else np.maximum(np.abs(low), np.abs(high))), exact


def _number(array: np.ndarray):
    return float(array) if array.ndim == 0 else [float(v) for v in array.ravel()]


def tensorrt_dynamic_ranges(graph: Graph) -> dict:
    """The dynamic-range dict of ``graph`` (see the module docstring)."""
    activations, inexact = {}, []
    for name, config in tensor_configs(graph).items():
        amax, exact = amax_of(config)
        activations[name] = float(np.max(amax))
        if not exact or amax.ndim:
            inexact.append(name)
    weights = {}
    for operation, side, slot, variable, config in iter_configs(graph):
        if side != "input" or not is_param_slot(graph, variable) or variable.name in weights:
            continue
        if not (is_baked(config.state) or is_applied(config.state)) or config.state in (
                QuantizationStates.PASSIVE, QuantizationStates.PASSIVE_BAKED) or config.scale is None:
            continue
        if is_block_config(config):   # weight-only blocks: in the QDQ model, no INT8 amax describes them
            continue
        amax, _ = amax_of(config)
        weights[variable.name] = _number(amax)
    notes = ["amax = scale * 127: TensorRT's INT8 scale is amax / 127",
             "tensors whose config is OVERLAPPED carry their master's range (fused activations)"]
    if inexact:
        notes.append(f"{len(inexact)} tensor(s) are asymmetric or per channel; their amax only bounds the "
                     f"range: {inexact[:10]}")
    header = graph_header(graph)
    return {"format": FORMAT, "version": 1, "platform": header["platform"], "graph": header["graph"],
            "act_quant_info": activations, "weight_quant_info": weights, "notes": notes}


def export_tensorrt_dynamic_ranges(graph: Graph, path, protect: tuple = ()) -> str:
    """Write :func:`tensorrt_dynamic_ranges` to ``path`` atomically; returns the absolute path."""
    return write_json(path, tensorrt_dynamic_ranges(graph), protect=(graph_header(graph)["source"], *protect))
