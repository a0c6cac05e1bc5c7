"""Accuracy and speed measures of the benchmark matrix (numpy and onnxruntime only; no ppqlike).

* :func:`classification` — top-1 / top-5 against labels;
* :func:`against_reference` — top-1 agreement, SNR (dB) and cosine of a model's outputs against
  the FP32 model's;
* :func:`ort_session`, :func:`ort_outputs` — onnxruntime CPU sessions with the benchmark's options
  (``intra_op_num_threads=2``, one inter-op thread, every graph optimization);
* :func:`relative_throughput` — throughput of one session against another on the same batch,
  repetitions interleaved so that load from other processes hits both alike;
* :func:`runtime_kernels` — which kernels onnxruntime actually runs for a model's Conv, MatMul and
  Gemm after its graph optimizations (integer QLinear kernels or float ones): what explains a
  quantized model's speed, and whether its arithmetic is integer.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

INTRA_OP_THREADS = 2


def classification(logits: np.ndarray, labels: np.ndarray) -> dict:
    """``{"top1", "top5"}``: the fraction of images whose label is the best / among the five best."""
    logits = np.asarray(logits).reshape(len(logits), -1)
    top5 = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    return {"top1": float(np.mean(top5[:, 0] == labels)),
            "top5": float(np.mean(np.any(top5 == labels[:, None], axis=1)))}


def against_reference(output: np.ndarray, reference: np.ndarray) -> dict:
    """How close ``output`` is to ``reference`` (both [N, classes]).

    ``agreement``: fraction of images with the same top-1 class; ``snr_db``: 10·log10 of the
    reference's power over the error's power, summed over every image and class; ``cosine``: mean
    over images of the cosine between the two output vectors.
    """
    a = np.asarray(output, np.float64).reshape(len(output), -1)
    b = np.asarray(reference, np.float64).reshape(len(reference), -1)
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(b ** 2))
    snr = float("inf") if noise == 0 else 10.0 * np.log10(signal / noise)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1.0)
    return {"agreement": float(np.mean(a.argmax(1) == b.argmax(1))), "snr_db": snr, "cosine": float(cosine.mean())}


def ort_session(model_path, threads: int = INTRA_OP_THREADS, optimized: bool = True):
    """A CPU InferenceSession with the benchmark's options (``optimized=False``: no graph optimizations, the
    QDQ semantics of the ONNX spec)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def fused_kernels_exact(model_path) -> bool:
    """Whether onnxruntime's fused integer kernels compute the model exactly on this CPU."""
    from ppqlike.io.import_quantized import fused_kernels_exact as exact
    return exact(model_path)


INTEGER_KERNELS = frozenset({"QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger",
                             "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
FLOAT_KERNELS = frozenset({"Conv", "FusedConv", "NchwcConv", "MatMul", "FusedMatMul", "Gemm", "FusedGemm",
                           "ConvTranspose"})


def runtime_kernels(model_path) -> dict:
    """``{"integer", "float", "quantize_nodes", "op_types"}``: of the model's Conv/MatMul/Gemm, how many
    onnxruntime runs as integer kernels and how many in float after optimizing the graph (the session
    options of :func:`ort_session`), and how many QuantizeLinear/DequantizeLinear nodes remain."""
    import collections
    import os
    import tempfile

    import onnx
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        counts = collections.Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)
    return {"integer": sum(counts[t] for t in INTEGER_KERNELS), "float": sum(counts[t] for t in FLOAT_KERNELS),
            "quantize_nodes": counts["QuantizeLinear"] + counts["DequantizeLinear"], "op_types": dict(counts)}


def ort_outputs(session, images: np.ndarray, batch: int = 16) -> np.ndarray:
    """The first output of ``session`` on ``images``, run ``batch`` images at a time."""
    name = session.get_inputs()[0].name
    parts = [session.run(None, {name: images[i:i + batch]})[0] for i in range(0, len(images), batch)]
    return np.concatenate(parts).reshape(len(images), -1)


def _timed(session, feeds, runs: int) -> float:
    started = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    return (time.perf_counter() - started) / runs


def relative_throughput(candidate, reference, batch: np.ndarray, repetitions: int = 7, runs: int = 3,
                        warmup: int = 2) -> dict:
    """Throughput of ``candidate`` relative to ``reference`` (>1: faster) on one ``batch``.

    After ``warmup`` runs of each, ``repetitions`` pairs are timed, the order inside a pair
    alternating, each measurement the mean of ``runs`` runs; the result is the median of the
    per-pair ratios (adjacent measurements see the same background load).  Also returns the
    images per second of each (median of its measurements).
    """
    feeds_c = {candidate.get_inputs()[0].name: batch}
    feeds_r = {reference.get_inputs()[0].name: batch}
    for _ in range(warmup):
        candidate.run(None, feeds_c)
        reference.run(None, feeds_r)
    ratios, times_c, times_r = [], [], []
    for index in range(repetitions):
        if index % 2 == 0:
            t_c = _timed(candidate, feeds_c, runs)
            t_r = _timed(reference, feeds_r, runs)
        else:
            t_r = _timed(reference, feeds_r, runs)
            t_c = _timed(candidate, feeds_c, runs)
        ratios.append(t_r / t_c)
        times_c.append(t_c)
        times_r.append(t_r)
    return {"speedup": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            "images_per_second": len(batch) / statistics.median(times_c),
            "reference_images_per_second": len(batch) / statistics.median(times_r)}
