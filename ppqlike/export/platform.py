"""Export a quantized graph for a platform: the files its policy's ``exporter`` calls for.

* ``qdq_onnx`` (TensorRT, onnxruntime, DSP, TIDL, NXP, PPL CUDA, academic): the QDQ ONNX model;
  TensorRT and PPL CUDA also get ``<model>.dynamic_range.json`` beside it.
* ``tpu_mlir``: the QDQ ONNX model, plus ``<model>_cali_table`` and ``<model>_qtable`` beside it.

A model over 2 GB keeps its weights in ``<model>.data`` beside it (``io.onnx_files.write_onnx_model``).

With ``config_save_to`` the JSON of every config is written too.  The files appear together or
not at all (staged beside their destinations, then renamed); none may be the graph's source model.
"""

from __future__ import annotations

import os
import warnings

from ..core.declared_names import unknown_name_error
from ..core.errors import ExportError, UnknownExportOptionError
from ..core.ir import Graph
from ..core.subgraphs import walk
from ..io.files import StagedFiles
from ..platforms.policies import get_platform_policy
from ..platforms.target import TargetPlatform
from .common import source_path, warn_rounding
from .config_json import export_config_json
from .qdq import export_qdq_onnx
from .tensorrt import export_tensorrt_dynamic_ranges
from .tpu_mlir import export_tpu_mlir_tables

__all__ = ["export_for_platform", "EXPORT_OPTIONS", "sidecar_paths"]

#: Options of :func:`export_for_platform` (None: the graph's setting, else False / automatic).
EXPORT_OPTIONS = ("qdq_per_consumer", "uint8_activations", "uint8_weights", "opset", "weight_only_format")
_RANGE_PLATFORMS = (TargetPlatform.TRT_INT8, TargetPlatform.PPL_CUDA_INT8)


def sidecar_paths(graph_save_to) -> dict[str, str]:
    """Where the extra files go, beside the model: dynamic ranges, calibration table, qtable."""
    base = os.path.splitext(os.path.abspath(os.fspath(graph_save_to)))[0]
    return {"dynamic_range": base + ".dynamic_range.json", "cali_table": base + "_cali_table",
            "qtable": base + "_qtable"}


def export_for_platform(graph: Graph, platform, graph_save_to, config_save_to=None, stacklevel: int = 2,
                        **options) -> list[str]:
    """Write what ``platform``'s exporter calls for; returns the absolute paths written, model first.

    Options: ``qdq_per_consumer`` and ``uint8_activations`` (default: the graph's setting
    ``export_qdq_per_consumer`` / ``export_uint8_activations``, else False), ``uint8_weights`` (default:
    the setting's ``export_uint8_weights``, else True where the simulation is onnxruntime's integer
    kernels: its u8 x u8 kernels are exact on every CPU), ``opset``, ``weight_only_format`` ('qdq' or
    'matmulnbits' for block-quantized weights; default: the setting's ``weight_only_format``).
    ``stacklevel``: where the rounding warning points (2: the caller).
    """
    unknown = sorted(set(options) - set(EXPORT_OPTIONS))
    if unknown:
        raise unknown_name_error(f"unknown export option(s) {unknown}", unknown, EXPORT_OPTIONS, noun="options",
                                 error=UnknownExportOptionError)
    platform = TargetPlatform.parse(platform)
    policy = get_platform_policy(platform)
    meta = graph.metadata.get("quantization") or {}
    if meta.get("platform") not in (None, platform.name):
        warnings.warn(f"graph {graph.name!r} was quantized for {meta['platform']} but is exported for "
                      f"{platform.name}: the configs are written as they are", UserWarning, stacklevel=stacklevel)
    setting = meta.get("setting") or {}
    per_consumer = options.get("qdq_per_consumer")
    if per_consumer is None:
        per_consumer = bool(setting.get("export_qdq_per_consumer") or False)
    uint8 = options.get("uint8_activations")
    if uint8 is None:
        uint8 = bool(setting.get("export_uint8_activations") or False)
    uint8_weights = options.get("uint8_weights")
    if uint8_weights is None:
        uint8_weights = setting.get("export_uint8_weights")
    if uint8_weights is None:
        uint8_weights = policy.runtime_kernels == "onnxruntime"
    if policy.exporter not in ("qdq_onnx", "tpu_mlir"):
        raise ExportError(f"{platform.name}'s exporter {policy.exporter!r} is unknown; ppqlike writes "
                          "'qdq_onnx' and 'tpu_mlir'")
    if not any(operation.config is not None for _, operation in walk(graph)):   # bodies' ops included
        raise ExportError(f"graph {graph.name!r} holds no quantization configs: it was never quantized; "
                          "quantize it first (ppqlike.quantize_onnx_model) or import a quantized model "
                          "(ppqlike.import_quantized_onnx)")
    sidecars = sidecar_paths(graph_save_to)
    source = source_path(graph)
    # every file is staged beside its destination and renamed into place together: all appear or none
    with StagedFiles(protect=(source,)) as staged:
        paths = [os.fspath(graph_save_to)]
        if platform in _RANGE_PLATFORMS:
            paths.append(sidecars["dynamic_range"])
        if policy.exporter == "tpu_mlir":
            paths += [sidecars["cali_table"], sidecars["qtable"]]
        if config_save_to is not None:
            paths.append(os.fspath(config_save_to))
        temporary = {path: staged.reserve(path) for path in paths}  # every check before any writing
        report = export_qdq_onnx(graph, temporary[paths[0]], qdq_per_consumer=per_consumer,
                                 uint8_activations=uint8, uint8_weights=bool(uint8_weights),
                                 opset=options.get("opset"), warn=False, staged=staged,
                                 weight_only_format=options.get("weight_only_format")
                                 or setting.get("weight_only_format") or "qdq")
        if platform in _RANGE_PLATFORMS:
            export_tensorrt_dynamic_ranges(graph, temporary[sidecars["dynamic_range"]])
        if policy.exporter == "tpu_mlir":
            export_tpu_mlir_tables(graph, temporary[sidecars["cali_table"]], temporary[sidecars["qtable"]])
        if config_save_to is not None:
            export_config_json(graph, temporary[os.fspath(config_save_to)])
    paths = [os.path.abspath(path) for path in paths]
    paths[1:1] = report.get("files", [])[1:]  # the model's external data file, when it has one
    warn_rounding(report["rounding_mismatch"], stacklevel=stacklevel + 1)
    return paths
