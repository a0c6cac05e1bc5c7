"""Stage-by-stage comparison of the graph outputs, in the manner of TPU-MLIR's tensor compare.

Four stages, on the same inputs:

1. ``fp32_onnx`` — the original FP32 ONNX model in onnxruntime;
2. ``ir_float``  — ppqlike's IR (formatted, possibly equalized) in the
   executor, every config dequantized (``dequantized(graph)``);
3. ``quantized`` — the executor's quantization simulation;
4. ``exported``  — the exported (QDQ) model in onnxruntime.

Each adjacent pair, and ``fp32_onnx`` against ``exported`` (the whole way),
is compared per graph output with cosine similarity, TPU-MLIR's Euclidean
similarity ``1 - ||a-b|| / ||(a+b)/2||`` and SQNR ``10 log10(sum a² / sum
(a-b)²)`` (dB; see :mod:`ppqlike.analysis.metrics` for how it differs from
TPU-MLIR's zero-mean variant), plus the largest absolute difference and, for
[N, C] outputs, the top-1 agreement.  The first of each pair is the reference.

A stage that cannot run (no exported model, onnxruntime refuses a model) is
left out, its reason in ``result['skipped']``.  fp32_onnx vs ir_float
measures what formatting did (BN folding, constant folding): cosine about 1.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..core.ir import Graph
from ..executor import NumpyExecutor
from ..executor.simulation import dequantized
from ..io.onnx_files import onnxruntime_session
from .metrics import ErrorStats

STAGES = ("fp32_onnx", "ir_float", "quantized", "exported")
PAIRS = (("fp32_onnx", "ir_float"), ("ir_float", "quantized"), ("quantized", "exported"),
         ("fp32_onnx", "exported"))


def _session(model, optimization: str):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = {
        "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL}[optimization]
    options.log_severity_level = 3
    if isinstance(model, (str, os.PathLike)):
        source: Any = os.fspath(model)
    elif isinstance(model, (bytes, bytearray)):
        source = bytes(model)
    else:  # onnx.ModelProto, written with external data when over 2 GB
        return onnxruntime_session(model, options)
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _run_onnxruntime(model, inputs: dict, names: list[str], optimization: str) -> list[np.ndarray]:
    """Run ``model``; outputs matched to ``names`` by name, else by position."""
    session = _session(model, optimization)
    feed = {}
    for spec in session.get_inputs():
        if spec.name not in inputs:
            raise ValueError(f"the model needs input {spec.name!r}; the inputs given are {sorted(inputs)}")
        feed[spec.name] = inputs[spec.name]
    available = [o.name for o in session.get_outputs()]
    if all(name in available for name in names):
        wanted = names
    elif len(available) == len(names):
        wanted = available
    else:
        raise ValueError(f"the model's outputs {available} do not match the graph's {names}")
    return [np.asarray(v) for v in session.run(wanted, feed)]


def compare_stages(onnx_path_or_model, graph: Graph, exported_model=None, inputs=None,
                   executor: NumpyExecutor | None = None, ort_optimization: str = "all",
                   precomputed: dict | None = None) -> dict:
    """Compare the four stages on ``inputs`` (one array, a list, or a dict name -> array).

    ``onnx_path_or_model`` is the FP32 model (path, bytes or ModelProto; None
    skips that stage), ``exported_model`` the exported one (likewise).
    ``ort_optimization`` ('disable' | 'basic' | 'extended' | 'all') is
    onnxruntime's graph optimization level for both: 'all' (the default, what
    a deployment gets) fuses Q/DQ into integer kernels, 'disable' runs the QDQ
    semantics as the ONNX spec writes them.  ``precomputed`` maps stage names to output
    lists already computed on these inputs (e.g. ``keep_outputs`` of
    :func:`~ppqlike.analysis.graphwise_error_analyse`); those stages are not run again.  Returns::

        {'samples': n, 'outputs': [name, ...], 'stages': [stage, ...],
         'skipped': {stage: reason}, 'seconds': {stage: s},
         'rows': [{'reference': stage, 'measured': stage, 'output': name, 'cosine', 'euclidean',
                   'sqnr', 'max_abs_diff', 'top1_agreement' (N x C outputs only)}, ...]}
    """
    if inputs is None:
        raise ValueError("compare_stages needs inputs: an array, a list of arrays or a dict name -> array")
    executor = executor or NumpyExecutor(graph)
    named = executor.prepare_inputs(inputs)
    names = [v.name for v in graph.outputs]
    results: dict[str, list[np.ndarray]] = {}
    seconds: dict[str, float] = {}
    skipped: dict[str, str] = {}

    def stage(name: str, run) -> None:
        if precomputed and name in precomputed:
            results[name] = [np.asarray(v) for v in precomputed[name]]
            seconds[name] = 0.0
            return
        started = time.perf_counter()
        try:
            results[name] = run()
        except Exception as error:  # recorded, not raised: one failing stage must not hide the others
            skipped[name] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        seconds[name] = round(time.perf_counter() - started, 3)

    if onnx_path_or_model is not None:
        stage("fp32_onnx", lambda: _run_onnxruntime(onnx_path_or_model, named, names, ort_optimization))
    else:
        skipped["fp32_onnx"] = "no FP32 model given"

    def ir_float():
        with dequantized(graph):
            return executor.forward(named)

    stage("ir_float", ir_float)
    stage("quantized", lambda: executor.forward(named))
    if exported_model is not None:
        stage("exported", lambda: _run_onnxruntime(exported_model, named, names, ort_optimization))
    else:
        skipped["exported"] = "no exported model given"

    rows = []
    for reference, measured in PAIRS:
        if reference not in results or measured not in results:
            continue
        for name, a, b in zip(names, results[reference], results[measured]):
            row: dict[str, Any] = {"reference": reference, "measured": measured, "output": name}
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                row["error"] = f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
                rows.append(row)
                continue
            stats = ErrorStats().update(a, b)
            row.update(cosine=stats.cosine(), euclidean=stats.euclidean(), sqnr=stats.snr(),
                       max_abs_diff=float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0)
            if a.ndim == 2 and a.shape[1] > 1:
                row["top1_agreement"] = float(np.mean(a.argmax(1) == b.argmax(1)))
            rows.append(row)
    first = next(iter(named.values()), None)
    return {"samples": int(first.shape[0]) if first is not None and first.ndim else 1, "outputs": names,
            "stages": [s for s in STAGES if s in results], "skipped": skipped, "seconds": seconds,
            "ort_optimization": ort_optimization, "rows": rows}
