"""Where the quantization error comes from: graph-wise and layer-wise analysis (PPQ's two analysers).

Both return an :class:`ErrorAnalysis`, a dict op name -> value of ``method``
('snr' in dB — TPU-MLIR's SQNR —, 'cosine' or 'mse', see
:mod:`ppqlike.analysis.metrics`), carrying every measure per op in ``.stats``.
Neither changes a config state: ops run float or quantized through
``NumpyExecutor.run_operation`` (see :mod:`ppqlike.analysis.stepping`), so the
graph is left exactly as it was, also when a batch or a kernel raises.

Costs (N analysed ops, one "forward" = one run of the whole graph on a batch).
Measured on MobileNetV2 (TRT_INT8, 117 quantized ops, 224x224 images) on a
2-core machine shared with other work, where one executor forward of 8
images takes about 1 s:

* :func:`graphwise_error_analyse` — 2 forwards per batch (float and quantized
  run side by side, op by op, in one pass) plus four dot products per op
  output (chunked, about 5% of the time).  Memory: two live sets of
  activations, never all of them.  MobileNetV2: 3.3 s for 8 images, 13 s for
  32 (2 batches of 16) — about what calibrating on the same images costs.
* :func:`layerwise_error_analyse` — per batch, one float forward for the
  reference outputs, one float walk, and for each analysed op the part of the
  graph from that op to the end (on average half a forward): about
  2 + N/2 forwards.  MobileNetV2: 52 s for all 117 ops on one batch of 8
  images (2.7 s for 3 ops on 2).  Hence one batch by default and the
  ``operations=`` argument to analyse a subset.
* :func:`~ppqlike.analysis.compare_stages` — two executor forwards and two
  onnxruntime runs: 3.8 s on 8 images (1.3 s of it onnxruntime, session
  creation included).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Iterable

from tqdm.auto import tqdm

from ..core.compat import ignore_device
from ..core.ir import Graph
from ..executor import NumpyExecutor
from ..optim.base import iterate_calibration
from .metrics import METHODS, ErrorStats, check_method, worse_first_key
from .stepping import float_outputs, graph_outputs, prepare_inputs, run_step, run_steps, select_operations


class ErrorAnalysis(dict):
    """op name -> value of ``method``, in graph (topological) order, with the details of the run.

    Attributes: ``kind`` ('graphwise' | 'layerwise'), ``method``, ``stats``
    (op name -> {'snr', 'cosine', 'mse', 'euclidean', 'noise_ratio', 'elements'}),
    ``op_types`` (op name -> type), ``samples`` and ``batches`` used,
    ``seconds`` taken.
    """

    def __init__(self, kind: str, method: str, stats: dict, op_types: dict, samples: int, batches: int,
                 seconds: float):
        super().__init__((name, s[method]) for name, s in stats.items())
        self.kind, self.method, self.stats, self.op_types = kind, method, stats, op_types
        self.samples, self.batches, self.seconds = samples, batches, seconds

    @property
    def larger_is_better(self) -> bool:
        return METHODS[self.method]

    def sorted_items(self) -> list[tuple[str, float]]:
        """(op name, value), worst first."""
        key = worse_first_key(self.method)
        return sorted(self.items(), key=lambda item: key(item[1]))

    def worst(self, count: int = 10) -> list[tuple[str, float]]:
        return self.sorted_items()[:count]

    def table(self, limit: int | None = None) -> str:
        """The text table, worst first: op, type, then every measure."""
        rows = self.sorted_items()[:limit]
        width = max([len(name) for name, _ in rows] + [9])
        head = (f"{self.kind} error analysis ({self.method}, worst first; {self.samples} samples in "
                f"{self.batches} batch(es), {self.seconds:.1f} s)")
        lines = [head, f"{'operation':<{width}s}  {'type':<18s} {'SNR dB':>8s} {'cosine':>10s} {'MSE':>11s}"]
        for name, _ in rows:
            s = self.stats[name]
            lines.append(f"{name:<{width}s}  {self.op_types.get(name, ''):<18s} {format_db(s['snr']):>8s} "
                         f"{s['cosine']:>10.6f} {s['mse']:>11.4g}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-ready form (inf as the string 'inf')."""
        def clean(value):
            return value if not isinstance(value, float) or math.isfinite(value) else str(value)
        return {"kind": self.kind, "method": self.method, "samples": self.samples, "batches": self.batches,
                "seconds": round(self.seconds, 3),
                "operations": [{"name": n, "type": self.op_types.get(n), **{k: clean(v) for k, v in s.items()}}
                               for n, s in self.stats.items()]}


def format_db(value: float) -> str:
    return "inf" if value == math.inf else ("-inf" if value == -math.inf else f"{value:.2f}")


def _batch_size(inputs: dict) -> int:
    for value in inputs.values():
        shape = getattr(value, "shape", ())
        if shape:
            return int(shape[0])
    return 1


def _print(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _finish(kind: str, method: str, graph: Graph, stats: dict, samples: int, batches: int, started: float,
            verbose: bool) -> "ErrorAnalysis":
    """The ErrorAnalysis of a finished run (printed as a table when ``verbose``)."""
    result = ErrorAnalysis(kind, method, {n: s.as_dict() for n, s in stats.items()},
                           {n: graph.operations[n].type for n in stats}, samples, batches,
                           time.perf_counter() - started)
    if verbose:
        _print(result.table())
    return result


def _checked_tensors(graph: Graph, names: Iterable[str]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in graph.variables]
    if unknown:
        raise KeyError(f"graph {graph.name!r} has no tensor named {unknown} (interested_outputs)")
    return names


def _producers(graph: Graph, names: Iterable[str]) -> list[str]:
    """Op names for PPQ's interested_outputs: an op name stays, a tensor name becomes its producer's."""
    names = [names] if isinstance(names, str) else list(names)
    found = []
    for name in names:
        if name in graph.operations:
            found.append(name)
        elif name in graph.variables and graph.variables[name].producer is not None:
            found.append(graph.variables[name].producer.name)
        else:
            raise KeyError(f"graph {graph.name!r} has no op or computed tensor named {name!r} (interested_outputs)")
    return found


def graphwise_error_analyse(graph: Graph, dataloader: Iterable, steps: int | None = None, method: str = "snr",
                            collate_fn: Callable | None = None, executor: NumpyExecutor | None = None,
                            verbose: bool = True, operations: Iterable | None = None,
                            keep_outputs: dict | None = None, running_device=None,
                            interested_outputs: Iterable[str] | None = None, fetchs=None) -> ErrorAnalysis:
    """Error of every quantized op's output, the whole graph quantized, against the graph run in float.

    For each batch (``steps`` batches, all when None) the float graph and the
    quantized graph run side by side op by op: each op's float output is
    compared with its quantized output as soon as both exist, the sums are
    accumulated (in float64, over all elements of all batches: the measure of
    the concatenated data) and the arrays dropped when the plan no longer needs
    them.  ``operations`` restricts the ops measured (default: every op with a
    config in effect, see :func:`ppqlike.core.quant_graph.quantizing_operations`).
    With ``verbose`` a tqdm bar shows the batches and the table is printed,
    worst first.  Config states are never changed.  ``keep_outputs``, a dict, receives the
    last batch's ``'inputs'`` and graph outputs in float (``'ir_float'``) and quantized
    (``'quantized'``), which :func:`~ppqlike.analysis.compare_stages` can reuse.

    PPQ's keywords: ``running_device`` (ignored: numpy on the CPU), ``interested_outputs`` (tensor or op
    names: only the ops producing them are measured), ``fetchs`` (ignored: every element is used).
    ``method='noise_ratio'`` gives PPQ's 'snr' number (noise power / signal power) instead of dB.
    """
    ignore_device(running_device, "graphwise_error_analyse")
    if interested_outputs is not None:
        operations = _producers(graph, interested_outputs)
    method = check_method(method)
    started = time.perf_counter()
    executor = executor or NumpyExecutor(graph)
    plan = executor.compile()
    chosen = {op.name for op in select_operations(graph, operations)}
    output_names = [v.name for v in graph.outputs]
    stats = {step.operation.name: ErrorStats() for step in plan.steps if step.operation.name in chosen}
    samples = batches = 0
    for batch in iterate_calibration(dataloader, steps, collate_fn, "graphwise analysis", verbose):
        inputs = prepare_inputs(executor, plan, batch)
        reference, quantized = dict(inputs), dict(inputs)
        samples += _batch_size(inputs)
        batches += 1
        for step in plan.steps:
            name = step.operation.name
            fp = run_step(executor, step, reference, quantized=False)
            qt = run_step(executor, step, quantized, quantized=True)
            if name in stats:
                for index in float_outputs(fp):
                    stats[name].update(fp[index], qt[index])
        if keep_outputs is not None:
            keep_outputs.update(inputs=inputs,
                                ir_float=graph_outputs(executor, reference, output_names),
                                quantized=graph_outputs(executor, quantized, output_names))
    return _finish("graphwise", method, graph, stats, samples, batches, started, verbose)


def layerwise_error_analyse(graph: Graph, dataloader: Iterable, steps: int | None = None, method: str = "snr",
                            collate_fn: Callable | None = None, executor: NumpyExecutor | None = None,
                            verbose: bool = True, operations: Iterable | None = None, running_device=None,
                            interested_outputs: Iterable[str] | None = None, fetchs=None) -> ErrorAnalysis:
    """Error of the graph outputs when only one op is quantized, every other op running in float.

    For each analysed op (default every op with a config in effect;
    ``operations`` names a subset) the graph runs with that op's configs
    applied and every other op's skipped — what dequantizing all configs but
    that op's computes — and its outputs are compared with the float graph's.
    ``steps`` batches are used, **one** when None: the cost is about 2 + N/2
    forwards per batch for N ops (the float prefix up to each op is shared, only
    the rest of the graph is run again).  Config states are never changed.
    PPQ's keywords: ``interested_outputs`` (tensor names compared instead of the graph outputs),
    ``running_device`` and ``fetchs`` (ignored); ``method='noise_ratio'`` is PPQ's 'snr' number.
    """
    ignore_device(running_device, "layerwise_error_analyse")
    method = check_method(method)
    started = time.perf_counter()
    executor = executor or NumpyExecutor(graph)
    plan = executor.compile()
    chosen = {op.name for op in select_operations(graph, operations)}
    order = [step.operation.name for step in plan.steps if step.operation.name in chosen]  # ops the outputs need
    stats = {name: ErrorStats() for name in order}
    last = max([i for i, step in enumerate(plan.steps) if step.operation.name in stats], default=-1)
    output_names = [v.name for v in graph.outputs] if interested_outputs is None else \
        _checked_tensors(graph, interested_outputs)
    steps = 1 if steps is None else steps
    samples = batches = 0
    bar = tqdm(total=len(order) * steps, desc="layerwise analysis", unit="op",
               disable=None if verbose else True, leave=False)  # no bar in a non-terminal log
    try:
        for batch in iterate_calibration(dataloader, steps, collate_fn, "layerwise analysis", verbose=False):
            inputs = prepare_inputs(executor, plan, batch)
            samples += _batch_size(inputs)
            batches += 1
            values = run_steps(executor, plan.steps, dict(inputs), lambda op: False)
            reference = graph_outputs(executor, values, output_names)
            del values
            walk = dict(inputs)  # the float values live just before the step at ``position``
            for position, step in enumerate(plan.steps[:last + 1]):
                name = step.operation.name
                if name in stats:
                    target = step.operation
                    branch = run_steps(executor, plan.steps[position:], dict(walk), lambda op: op is target)
                    for ref, out in zip(reference, graph_outputs(executor, branch, output_names)):
                        if float_outputs([ref]):
                            stats[name].update(ref, out)
                    del branch
                    bar.update(1)
                run_step(executor, step, walk, quantized=False)
    finally:
        bar.close()
    return _finish("layerwise", method, graph, stats, samples, batches, started, verbose)
