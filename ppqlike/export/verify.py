"""How far the exported QDQ model is from the executor's simulation, measured two ways.

* **end to end**: both run on the same inputs; per graph output the top-1 agreement, the
  fraction of values equal and within one *output step* (see
  :func:`ppqlike.export.common.output_steps`), the largest difference in steps and the cosine.
* **op by op**: every op of the graph is run by the executor on exactly the values onnxruntime
  fed the matching node (quantized inputs included), and its output, after its output
  quantization, is compared with onnxruntime's.  This separates what the export writes from
  what float arithmetic does: two float32 implementations of a convolution differ in the last
  bits, a value near a rounding boundary then lands one step apart, and a deep network carries
  such flips forward and multiplies them, so end-to-end agreement falls with depth even for an
  exact export, while op-by-op agreement stays at float noise.  Op by op compares with the QDQ
  model run unoptimized (the ONNX semantics, float ops between DequantizeLinear and
  QuantizeLinear), so the executor runs its float kernels there; end to end, a platform whose
  simulation computes onnxruntime's integer kernels (ORT_INT8) matches the optimized session
  bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ..core.declared_names import refuse_unknown_keywords
from ..core.errors import UnknownExportOptionError
from ..core.ir import Graph
from ..executor import NumpyExecutor
from ..io.onnx_files import onnxruntime_session
from .common import governing_config, output_steps, quantizes, rounding_mismatch
from .qdq import build_qdq_model

__all__ = ["compare_outputs", "verify_export", "run_qdq_model"]

_LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
           "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def run_qdq_model(model: onnx.ModelProto, feeds: dict, outputs=None, optimization: str = "all") -> list:
    """Run ``model`` in onnxruntime (CPU) at an optimization level ('disable', 'basic', 'extended', 'all')."""
    options = ort.SessionOptions()
    options.graph_optimization_level = _LEVELS[optimization]
    options.log_severity_level = 3
    session = onnxruntime_session(model, options)
    return session.run(outputs, feeds)


def compare_outputs(exported: np.ndarray, simulated: np.ndarray, step: float | None) -> dict:
    """Agreement of one output: top-1 over the last axis (``top1_agreement``; and
    ``top1_agreement_near_ties``, which also counts an exported top-1 class whose simulated value is
    within one step of the simulated best), exact, within one step, max and mean difference, cosine."""
    exported, simulated = np.asarray(exported, np.float64), np.asarray(simulated, np.float64)
    diff = np.abs(exported - simulated)
    result: dict[str, Any] = {"step": step, "exact": float(np.mean(diff == 0)), "max_diff": float(diff.max()),
                              "mean_diff": float(diff.mean())}
    if step:
        result.update(within_one_step=float(np.mean(diff <= step * (1 + 1e-5))),
                      max_steps=float(diff.max() / step), mean_steps=float(diff.mean() / step))
    if exported.ndim >= 2 and exported.shape[-1] > 1:
        top = exported.argmax(-1)
        result["top1_agreement"] = float(np.mean(top == simulated.argmax(-1)))
        if step:  # a class the simulation puts within one step of its best is a near tie
            chosen = np.take_along_axis(simulated, top[..., None], -1)[..., 0]
            result["top1_agreement_near_ties"] = float(np.mean(chosen >= simulated.max(-1) - step * (1 + 1e-5)))
    a, b = exported.reshape(len(exported), -1), simulated.reshape(len(simulated), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    result["cosine"] = float(np.mean(np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1)))
    return result


def _feeds(graph: Graph, inputs) -> dict:
    return NumpyExecutor(graph).prepare_inputs(inputs)


def _per_operation(graph: Graph, model: onnx.ModelProto, report: dict, feeds: dict) -> dict:
    nodes = {node.name: node for node in model.graph.node}
    constants = {i.name for i in model.graph.initializer} | set(feeds)
    wanted: list[str] = []
    for operation in graph.operations.values():
        node = nodes[operation.name]
        names = [n for n in node.input if n] + [report["tensors"][v.name] for v in operation.outputs
                                                if v.name in report["tensors"]]
        names += [report["tensors"].get(v.name, v.name) for v in operation.inputs[len(node.input):] if v is not None
                  and not v.is_parameter]   # what a body reads from this scope
        wanted += [n for n in names if n not in constants and n not in wanted]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in wanted if n not in present)
    values = dict(zip(wanted, run_qdq_model(probe, feeds, wanted, "disable")))
    values.update(feeds)
    executor = NumpyExecutor(graph, runtime_kernels=False)  # each op as the QDQ model states it, unfused
    quantized, floats = [], []
    for operation in graph.topological_sort():
        node = nodes[operation.name]
        read = [*node.input, *(report["tensors"].get(v.name, v.name) for v in operation.inputs[len(node.input):]
                               if v is not None)]   # then what its bodies read from this scope
        arguments = [None if v is None else (v.value if v.is_parameter and v not in graph.inputs
                                             else values[read[i]]) for i, v in enumerate(operation.inputs)]
        results = executor.run_operation(operation, arguments)
        configs = operation.config.output_quantization_config if operation.config is not None else []
        for slot, (variable, got) in enumerate(zip(operation.outputs, results)):
            name = report["tensors"].get(variable.name)
            if name is None or name not in values:
                continue
            want, got = np.asarray(values[name]), np.asarray(got)
            if not np.issubdtype(want.dtype, np.floating):
                quantized.append((float(np.array_equal(want, got)), 0.0, operation.name))
                continue
            config = configs[slot] if slot < len(configs) else None
            governing = governing_config(config) if config is not None else None
            diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
            if governing is not None and governing.scale is not None and quantizes(config, "output"):
                step = float(np.max(governing.scale))
                quantized.append((float(np.mean(diff == 0)), float(diff.max() / step), operation.name))
            elif want.size:
                floats.append((float(diff.max() / max(float(np.abs(want).max()), 1e-30)), operation.name))
    worst = min(quantized) if quantized else (1.0, 0.0, None)
    return {"quantized_outputs": len(quantized), "min_exact": worst[0], "worst_operation": worst[2],
            "mean_exact": float(np.mean([q[0] for q in quantized])) if quantized else 1.0,
            "max_steps": max((q[1] for q in quantized), default=0.0),
            "float_outputs": len(floats), "max_relative_error": max((f[0] for f in floats), default=0.0)}


def verify_export(graph: Graph, inputs, model: onnx.ModelProto | None = None,
                  optimizations=("disable", "all"), per_operation_inputs=None, **options) -> dict:
    """Measure the export of ``graph`` against its simulation on ``inputs``.

    ``model``: the exported ModelProto (built with ``options``, build_qdq_model's keywords, when None).
    ``optimizations``: the onnxruntime levels to run end to end.  ``per_operation_inputs``: inputs for the op-by-op
    check (a few images: every intermediate tensor is kept), None to skip it.  Returns
    ``{"end_to_end": {level: {output: compare_outputs(...)}}, "per_operation": {...},
    "rounding_mismatch": ...}``.
    """
    refuse_unknown_keywords(build_qdq_model, options, "verify_export()", error=UnknownExportOptionError)
    report = None
    if model is None:
        model, report = build_qdq_model(graph, **options)
    feeds = _feeds(graph, inputs)
    simulated = NumpyExecutor(graph).forward(feeds)
    steps = output_steps(graph)
    result: dict[str, Any] = {"end_to_end": {}}
    for level in optimizations:
        exported = run_qdq_model(model, feeds, [v.name for v in graph.outputs], level)
        result["end_to_end"][level] = {v.name: compare_outputs(e, s, steps[v.name])
                                       for v, e, s in zip(graph.outputs, exported, simulated)}
    if per_operation_inputs is not None:
        if report is None or options.get("qdq_per_consumer"):
            model, report = build_qdq_model(graph)
        result["per_operation"] = _per_operation(graph, model, report, _feeds(graph, per_operation_inputs))
    result["rounding_mismatch"] = rounding_mismatch(graph)
    return result
