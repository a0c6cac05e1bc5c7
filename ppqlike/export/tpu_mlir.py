"""TPU-MLIR calibration table and quantize table.

Calibration table (``model_deploy.py --calibration_table``): comment lines start with ``#``;
one line per activation tensor::

    # op_name    threshold    min    max
    <tensor> <threshold> <min> <max>

TPU-MLIR derives the int8 scale as ``threshold / 127``, so ``threshold = scale * 127`` gives back
ppqlike's scale (symmetric int8, zero point 0).  ``min``/``max`` are the range observed during
calibration when the config records one in ``config.detail`` (keys ``min``/``max``), else
``-threshold``/``threshold``; for asymmetric configs they are the grid's ends S*(qmin-Z),
S*(qmax-Z) and the threshold is the larger magnitude: an unsigned symmetric config ([0, 255], zero point
0, made for a tensor whose calibration minimum is >= 0) is written with min 0 and threshold S * 255, from
which TPU-MLIR makes the same uint8 type (sign = min < 0, scale = threshold / 255).  Tensor names are the ONNX tensor names,
which TPU-MLIR uses as op names.

Quantize table (``--quantize_table``): ``<op output tensor> <mode>`` lines: ``F32`` for every
op that runs in float (dispatched FP32), ``BF16`` / ``F16`` for every op whose configs are on that float
grid (a layer the accuracy target or the protection moved there; every op of TPU_BF16 / TPU_F16); shape-or-index
ops are left to TPU-MLIR.  Tensors on a float grid have no line in the calibration table.
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Graph
from ..platforms.target import TargetPlatform
from .common import graph_header, tensor_configs, write_text
from .tensorrt import amax_of

__all__ = ["tpu_calibration_table", "tpu_quantize_table", "export_tpu_mlir_tables"]


def _detail_range(detail: dict) -> tuple[float, float] | None:
    low, high = detail.get("min"), detail.get("max")
    if low is None or high is None:
        return None
    return float(np.min(low)), float(np.max(high))


def _header(graph: Graph, what: str) -> list[str]:
    header = graph_header(graph)
    return [f"# {what} for TPU-MLIR, written by ppqlike {header['ppqlike_version']}",
            f"# graph: {header['graph']}  platform: {header['platform']}  source: {header['source']}"]


def tpu_calibration_table(graph: Graph) -> str:
    """The calibration table text of ``graph`` (see the module docstring)."""
    lines = _header(graph, "calibration table") + [
        "# threshold = scale * 127 (TPU-MLIR: scale = threshold / 127)", "###", "# op_name    threshold    min    max"]
    for name, config in tensor_configs(graph).items():
        if config.float_format is not None:   # a BF16/F16 tensor: its mode is in the quantize table
            continue
        amax, exact = amax_of(config)
        threshold = float(np.max(amax))
        if exact:
            low, high = -threshold, threshold
        else:
            scale = np.asarray(config.scale, np.float64)
            offset = np.zeros(scale.shape) if config.offset is None else np.asarray(config.offset, np.float64)
            low = float(np.min(scale * (config.quant_min - offset)))
            high = float(np.max(scale * (config.quant_max - offset)))
        observed = _detail_range(config.detail)
        if observed is not None:
            low, high = observed
        lines.append(f"{name} {threshold!r} {low!r} {high!r}")
    return "\n".join(lines) + "\n"


def tpu_quantize_table(graph: Graph) -> str:
    """The quantize table text: ``<tensor> F32`` for the outputs of every FP32 op."""
    lines = _header(graph, "quantize table") + ["# op_name    quantize_mode"]
    for operation in graph.topological_sort():
        if operation.platform is TargetPlatform.FP32 or operation.platform == TargetPlatform.FP32.name:
            lines += [f"{variable.name} F32" for variable in operation.outputs]
            continue
        mode = _float_mode(operation)
        if mode is not None:
            lines += [f"{variable.name} {mode}" for variable in operation.outputs]
    return "\n".join(lines) + "\n"


def _float_mode(operation) -> str | None:
    """``BF16`` / ``F16`` when the op's own configs (weights, outputs) are on that float grid, else None."""
    if operation.config is None:
        return None
    names = {c.float_format.name for c in operation.config.all_configs() if c.float_format is not None
             and c.state.name not in ("FP32", "SOI", "DEACTIVATED")}
    if not names:
        return None
    return {"BF16": "BF16", "FP16": "F16"}.get(sorted(names)[0])


def export_tpu_mlir_tables(graph: Graph, cali_table_path, qtable_path, protect: tuple = ()) -> list[str]:
    """Write both tables atomically; returns their absolute paths."""
    protect = (graph_header(graph)["source"], *protect)
    return [write_text(cali_table_path, tpu_calibration_table(graph), protect=protect),
            write_text(qtable_path, tpu_quantize_table(graph), protect=protect)]
