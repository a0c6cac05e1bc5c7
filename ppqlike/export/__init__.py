"""Layer 6: exporters of quantized graphs.

* :mod:`.qdq` — QDQ ONNX that onnxruntime runs and that reproduces the executor's simulation;
* :mod:`.config_json` — every config as JSON, and back onto a freshly loaded graph;
* :mod:`.tensorrt` — TensorRT dynamic ranges ``{tensor: amax}``;
* :mod:`.tpu_mlir` — TPU-MLIR calibration table and quantize table;
* :mod:`.platform` — the files a platform's exporter calls for (``ppqlike.api.export_ppq_graph``);
* :mod:`.verify` — how far the export is from the simulation, end to end and op by op.
"""

from .common import ExportRoundingWarning, output_steps, rounding_mismatch
from .config_json import config_to_json, export_config_json, load_config_json, load_quantized_graph
from .platform import export_for_platform, sidecar_paths
from .qdq import build_qdq_model, export_qdq_onnx
from .tensorrt import export_tensorrt_dynamic_ranges, tensorrt_dynamic_ranges
from .tpu_mlir import export_tpu_mlir_tables, tpu_calibration_table, tpu_quantize_table
from .verify import compare_outputs, verify_export

__all__ = ["ExportRoundingWarning", "output_steps", "rounding_mismatch", "config_to_json", "export_config_json",
           "load_config_json", "load_quantized_graph", "export_for_platform", "sidecar_paths", "build_qdq_model",
           "export_qdq_onnx", "export_tensorrt_dynamic_ranges", "tensorrt_dynamic_ranges",
           "export_tpu_mlir_tables", "tpu_calibration_table", "tpu_quantize_table", "compare_outputs",
           "verify_export"]
