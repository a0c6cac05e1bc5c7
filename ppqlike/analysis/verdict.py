"""The verdict every quantization run ends with: how close the quantized graph stays to FP32, and what to try.

:func:`quantization_verdict` runs the quantized graph and its FP32 self (every config dequantized) on
calibration samples held aside from calibration (``quantize_onnx_model`` keeps the last batch aside when
the data has four batches or more; otherwise calibration samples, and the verdict says so), and measures
the output cosine, mean per sample, outputs averaged.  Below ``threshold`` (0.98) it warns
(:class:`QuantizationQualityWarning`), naming the ops whose quantization alone hurts their results most
(``AloneRunner.local_error``: each op run quantized on FP32 inputs, relative error per channel) and what to
try.  A run that produces NaN or infinite outputs is below any threshold.

Reads: the graph's configs (restored exactly afterwards).  Writes nothing but the returned dict.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from ..core.ir import Graph
from ..executor import NumpyExecutor
from ..optim.passes.precision_moves import find_units
from ..optim.passes.references import FloatReferences, references_of
from ..optim.passes.sensitivity import AloneRunner, CachedSamples, output_parts, sample_cosines

VERDICT_THRESHOLD = 0.98


class QuantizationQualityWarning(UserWarning):
    """The quantized model's outputs are far from the FP32 model's on held-aside calibration samples."""


def quantization_verdict(graph: Graph, executor: NumpyExecutor, batches: list, held_aside: bool,
                         threshold: float = VERDICT_THRESHOLD, worst: int = 5,
                         references: FloatReferences | None = None) -> dict:
    """The output cosine of ``graph`` against FP32 on ``batches`` (``sensitivity.measured_batches``: the
    held-aside samples) and, below ``threshold``, the ``worst`` ops and advice, also issued as a
    :class:`QuantizationQualityWarning`."""
    started = time.perf_counter()
    quantized = [executor.forward(batch) for batch in batches]
    references = references_of(batches, graph, executor, references)
    finite = all(np.isfinite(np.asarray(value, np.float64)).all() for outputs in quantized for value in outputs
                 if np.asarray(value).dtype.kind == "f")
    parts = output_parts(graph)   # a detector's boxes and scores compared apart
    cosines = np.concatenate([sample_cosines(q, r, parts) for q, r in zip(quantized, references)])
    cosine = float(np.mean(cosines)) if finite else float("nan")
    verdict = {"output_cosine": None if cosine != cosine else round(cosine, 6), "finite_outputs": finite,
               "worst_sample_cosine": round(float(np.min(cosines)), 6) if finite else None,
               "samples": int(len(cosines)), "held_aside": held_aside, "threshold": threshold, "ok": True}
    if cosine == cosine and cosine >= threshold:
        verdict["seconds"] = round(time.perf_counter() - started, 3)
        return verdict
    runner = AloneRunner(graph, executor)
    measured, units = CachedSamples(runner, batches, references), find_units(graph)
    sums = [0] * len(units)
    for cached, _ in measured:
        sums = [total + runner.local_error(unit, cached) for total, unit in zip(sums, units)]
    ranked = sorted(((total / len(measured), unit) for total, unit in zip(sums, units)),
                    key=lambda item: -item[0])[:worst]
    names = [unit[-1].name for _, unit in ranked]
    verdict.update({"ok": False, "worst_ops": [{"op": unit[-1].name, "type": unit[-1].type,
                                                "relative_error": round(error, 6)} for error, unit in ranked]})
    measured = "NaN or infinite outputs" if not finite else f"output cosine {cosine:.4f}"
    where = "held-aside calibration samples" if held_aside else "calibration samples (too few to hold any aside)"
    pins = ", ".join(f"{name!r}: 'FP32'" for name in names[:2])
    advice = ("try recipe='best', or accuracy_target=0.99 (moves the most sensitive layers to a higher "
              f"precision), or keep the worst in float: dispatching_table={{{pins}}}")
    verdict["advice"] = advice
    warnings.warn(f"{graph.name!r} quantized keeps {measured} against FP32 on {len(cosines)} {where}, below "
                  f"{threshold}; the ops whose quantization hurts most: {', '.join(names)}; {advice}",
                  QuantizationQualityWarning, stacklevel=3)
    verdict["seconds"] = round(time.perf_counter() - started, 3)
    return verdict
