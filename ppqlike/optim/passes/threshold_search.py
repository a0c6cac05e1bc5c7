"""TPU-MLIR-style threshold search for the calibration pass: every searched tensor in one forward pass per batch.

The ``search`` observer (:class:`ppqlike.optim.observers.SearchObserver`)
offers candidate thresholds from its KL threshold up to the absolute
maximum.  For each searched tensor, each candidate is tried where the tensor
is used: every op that reads it (the op whose input config it is, or every
consumer of an output) is run on the batch with the tensor fake-quantized at
that candidate, everything else in float, and the candidate with the
smallest squared error on those ops' outputs (summed over readers and
batches) is selected.

Cost.  One FP32 forward pass per search batch, with a hook that, at each
reader op, runs the candidates for the tensors it reads on the inputs it is
handed: the reader's float output is computed once and each candidate costs
one run of the reader op.  In all about ``num_candidates`` forward passes'
worth of op runs per batch (each op reads about one searched tensor), and
no activation is kept beyond the op being run, so memory does not grow with
the number of searched tensors.  (The first version captured every reader's
inputs with a forward pass per tensor and recomputed the float output per
candidate: about (tensors + 2 * candidates) forward passes per batch.)

Split over Ray workers (``backend='ray'``): each worker runs the float forward passes with the candidates
of its share of the tensors (a tensor's errors depend on its own candidates only): the same errors.

Reads: the observers' candidates; the graph run in float
(``dequantized``).  Writes: ``observer.select(best)`` for each searched
tensor (the calibration pass then renders the scale and activates the
config); the per-candidate errors go to ``config.detail['search']``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ...core.ir import Graph, Operation
from ...executor import NumpyExecutor, OperationHook
from ...executor.simulation import dequantized
from ..distributed import map_items


class _Task:
    """One searched tensor: its config, observer, candidates and accumulated errors."""

    def __init__(self, config, observer, variable_name: str, readers: list[Operation]):
        self.config, self.observer, self.variable = config, observer, variable_name
        self.readers = readers
        self.candidates = list(observer.candidates())
        self.errors = np.zeros(len(self.candidates))


class _SearchHook(OperationHook):
    def __init__(self, executor: NumpyExecutor, tasks: list[_Task]):
        self.executor = executor
        self.by_reader: dict[str, list[_Task]] = {}
        for task in tasks:
            for reader in task.readers:
                self.by_reader.setdefault(reader.name, []).append(task)

    def before_operation(self, operation: Operation, inputs: list):
        tasks = self.by_reader.get(operation.name)
        if not tasks:
            return None
        reference = None
        for task in tasks:
            slots = [i for i, v in enumerate(operation.inputs) if v is not None and v.name == task.variable]
            if not slots or any(inputs[i] is None for i in slots):
                continue
            if reference is None:
                reference = [np.asarray(r, np.float64) for r in
                             self.executor.run_operation(operation, list(inputs), quantized=False)]
            original = inputs[slots[0]]
            for k, threshold in enumerate(task.candidates):
                task.observer.select(threshold)
                task.observer.render()
                quantized = task.config.fake_quantize(original)
                arguments = list(inputs)
                for slot in slots:
                    arguments[slot] = quantized
                outputs = self.executor.run_operation(operation, arguments, quantized=False)
                task.errors[k] += sum(float(np.mean((np.asarray(o, np.float64) - r) ** 2))
                                      for o, r in zip(outputs, reference) if np.issubdtype(r.dtype, np.floating))
        return None


@dataclass
class SearchData:
    """What the searches of all tensors share: the graph, the search batches, and per searched tensor its
    config, observer, name and readers' names (sent together, so each observer keeps its config)."""

    graph: Graph
    batches: list
    tasks: list[tuple]                # (config, observer, variable name, reader op names)
    runtime_kernels: bool = True
    local_executor: NumpyExecutor | None = None   # this process's executor of ``graph`` (never sent)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "local_executor": None}


def candidate_errors(data: SearchData, indices: list[int]) -> list[np.ndarray]:
    """The summed squared error at the readers of each candidate of the searched tensors ``indices``: one
    float forward pass per batch with those tensors' candidates tried at their readers (a tensor's errors
    depend on its own candidates only, so the tensors can be split over workers)."""
    graph = data.graph
    executor = data.local_executor if data.local_executor is not None and data.local_executor.graph is graph \
        else NumpyExecutor(graph, runtime_kernels=data.runtime_kernels)
    tasks = [_Task(config, observer, name, [graph.operations[r] for r in readers])
             for config, observer, name, readers in (data.tasks[i] for i in indices)]
    hook = _SearchHook(executor, tasks)
    with dequantized(graph):
        for batch in data.batches:
            executor.forward(batch, hooks=[hook])
    return [task.errors for task in tasks]


def search_thresholds(graph: Graph, executor: NumpyExecutor, batches: Sequence, entries: Iterable,
                      backend: str = "local", workers: int = 1) -> int:
    """Select the best candidate of every ``(config, observer, operation, side, index)`` entry; returns how many.

    ``side`` is 'input' (the tensor is input ``index`` of ``operation``, which is then its only reader) or
    'output' (output ``index``; every consumer reads it).  Entries without readers keep the KL threshold.
    ``backend`` 'ray': the tensors are split over ``workers`` Ray workers (``distributed.map_items``), with
    the same errors.
    """
    tasks = []
    for config, observer, operation, side, index in entries:
        if side == "input":
            variable, readers = operation.inputs[index], [operation]
        else:
            variable = operation.outputs[index]
            readers = list(dict.fromkeys(variable.consumers))
        if variable is None or not readers:
            continue
        tasks.append(_Task(config, observer, variable.name, readers))
    if not tasks or not batches:
        return 0
    shared = SearchData(graph, list(batches), [(t.config, t.observer, t.variable, [r.name for r in t.readers])
                                               for t in tasks],
                        runtime_kernels=executor.runtime_kernels, local_executor=executor)
    errors = map_items(candidate_errors, shared, list(range(len(tasks))), backend, workers).results
    for task, task_errors in zip(tasks, errors):
        task.errors = task_errors
        best = int(np.argmin(task.errors)) if np.all(np.isfinite(task.errors)) else len(task.candidates) - 1
        task.observer.select(task.candidates[best])
        task.config.detail["search"] = {"candidates": [float(c) for c in task.candidates],
                                        "errors": [float(e) for e in task.errors], "selected": best,
                                        "readers": [r.name for r in task.readers]}
    return len(tasks)
