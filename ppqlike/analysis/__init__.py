"""Error analysis and the HTML report (layer 6, "face"; DESIGN.md §1 and §8).

* :func:`graphwise_error_analyse` — each quantized op's output error, whole graph quantized;
* :func:`layerwise_error_analyse` — the graph outputs' error with one op quantized at a time;
* :func:`compare_stages` — FP32 ONNX / IR in float / simulation / exported model, TPU-MLIR style;
* :func:`write_report` — ``report.html``, one offline file; :func:`quick_report` for a run.

No analysis changes a config state (see :mod:`ppqlike.analysis.stepping`).
"""

from ..core.quant_graph import quantizing_operations
from .error import ErrorAnalysis, graphwise_error_analyse, layerwise_error_analyse
from .metrics import ErrorStats, compare, cosine_similarity, euclidean_similarity, mse, snr, sqnr
from .report import render_report, write_report
from .run_report import quick_report
from .stages import compare_stages

__all__ = ["ErrorAnalysis", "ErrorStats", "compare", "compare_stages", "cosine_similarity",
           "euclidean_similarity", "graphwise_error_analyse", "layerwise_error_analyse", "mse",
           "quantizing_operations", "quick_report", "render_report", "snr", "sqnr", "write_report"]
