"""The report a quantization run writes beside its model (``ppqlike quantize``): cheap analyses, then HTML.

:func:`quick_report` runs the graph-wise analysis on the first batch(es) of
the calibration data (at most ``max_samples`` samples, two forwards) and the
stage comparison on the last batch analysed (reusing the analysis's float and
quantized outputs; two onnxruntime runs), then writes ``report.html``.  An analysis
that fails does not fail the run: its error is written into the report.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import numpy as np

from ..core.ir import Graph
from ..executor import NumpyExecutor
from .error import graphwise_error_analyse
from .report import worst_visible, write_report
from .stages import compare_stages


def take_samples(batch: Any, count: int) -> Any:
    """The first ``count`` samples of a batch (an array, a list of arrays, or a dict name -> array)."""
    if isinstance(batch, dict):
        return {k: np.asarray(v)[:count] for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [np.asarray(v)[:count] for v in batch]
    return np.asarray(batch)[:count]


def _samples(batch: Any) -> int:
    first = next(iter(batch.values())) if isinstance(batch, dict) else (
        batch[0] if isinstance(batch, (list, tuple)) else batch)
    return int(np.shape(first)[0]) if np.ndim(first) else 1


def _first_batches(dataloader: Iterable, batches: int, max_samples: int) -> list:
    taken, samples = [], 0
    if batches <= 0 or max_samples <= 0:
        return taken
    for batch in dataloader:  # stops before asking for a batch it does not need (loading images is slow)
        batch = take_samples(batch, max_samples - samples)
        samples += _samples(batch)
        taken.append(batch)
        if len(taken) >= batches or samples >= max_samples:
            break
    return taken


def quick_report(path, graph: Graph, source_model=None, exported_model=None, dataloader: Iterable | None = None,
                 batches: int = 1, max_samples: int = 8, stage_samples: int = 8, extra: dict | None = None,
                 verbose: bool = False) -> dict:
    """Analyse cheaply and write the report at ``path``; returns {'path', 'seconds', 'worst', 'errors'}.

    Cost: two executor forwards over at most ``max_samples`` samples (the graph-wise analysis,
    whose float and quantized graph outputs of its last batch the stage comparison reuses) and
    two onnxruntime runs on at most ``stage_samples`` of them.
    """
    started = time.perf_counter()
    executor = NumpyExecutor(graph)
    errors: dict[str, str] = {}
    analysis = stages = None
    data = _first_batches(dataloader, batches, max_samples) if dataloader is not None else []
    if data:
        kept: dict = {}
        try:
            analysis = graphwise_error_analyse(graph, data, executor=executor, verbose=verbose, keep_outputs=kept)
        except Exception as error:  # the report says so; the quantized model is still good
            errors["graph-wise analysis"] = f"{type(error).__name__}: {error}"
        try:
            batch = kept.get("inputs", data[-1])
            reuse = None
            if kept and _samples(batch) <= stage_samples:  # the very inputs the analysis ran: reuse its outputs
                reuse = {k: kept[k] for k in ("ir_float", "quantized")}
            stages = compare_stages(source_model, graph, exported_model, take_samples(batch, stage_samples),
                                    executor=executor, precomputed=reuse)
        except Exception as error:
            errors["stage comparison"] = f"{type(error).__name__}: {error}"
    else:
        errors["analysis"] = "no calibration data was given: no analysis ran"
    seconds = round(time.perf_counter() - started, 3)
    facts = dict(extra or {})
    facts["report analyses"] = {"seconds": seconds, "samples analysed": getattr(analysis, "samples", 0),
                                "stage comparison samples": (stages or {}).get("samples", 0)}
    if errors:
        facts["analysis errors"] = errors
    written = write_report(path, graph, analysis=analysis, stages=stages, extra=facts)
    return {"path": written, "seconds": round(time.perf_counter() - started, 3),
            "worst": worst_visible(analysis, graph) if analysis else None, "errors": errors}
