"""Calibration: activations are observed on calibration data, batch by batch, streaming.

Reads: INITIAL configs of activations (every ungoverned input/output config
whose tensor is computed at run time), and each config's observer_algorithm.
Writes: scale/offset rendered by the observer, state ACTIVATED.  Observers
keep a fixed-size state, so memory does not grow with the number of batches.

Configs whose algorithm is ``search`` (TPU-MLIR style) are tuned after the
histograms are complete: each candidate threshold is tried on the first
``search_batches`` calibration batches and the one giving the smallest error
on the outputs of the ops that read the tensor is kept; all searched tensors
share one float forward pass per batch (``threshold_search``).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ...core.errors import CalibrationDataError
from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.op_facts import VALUE_PRESERVING_TYPES
from ...core.quant_graph import configured_operations, input_config, output_config
from ...executor import NumpyExecutor, OperationHook
from ...executor.simulation import dequantized
from ..base import QuantizationOptimizationPass, iterate_calibration
from ..distributed import observe_on_ray
from ..observers import ChoiceObserver, make_observer
from .sensitivity import leading_samples, sample_cosines
from .threshold_search import search_thresholds

S = QuantizationStates


class _ObserverHook(OperationHook):
    """Feeds each op's input and output values to the observers watching them."""

    def __init__(self, watched_inputs: dict, watched_outputs: dict):
        self.watched_inputs = watched_inputs      # op name -> [(slot, observer)]
        self.watched_outputs = watched_outputs

    def before_operation(self, operation: Operation, inputs: list):
        for slot, observer in self.watched_inputs.get(operation.name, ()):
            observer.observe(inputs[slot])

    def after_operation(self, operation: Operation, inputs: list, outputs: list):
        for slot, observer in self.watched_outputs.get(operation.name, ()):
            observer.observe(outputs[slot])


def _checked(batches: Iterable, graph: Graph):
    for batch in batches:
        _check_finite(batch, f"graph {graph.name!r}")
        yield batch


def _check_finite(batch, description: str) -> None:
    arrays = batch.values() if isinstance(batch, dict) else (batch if isinstance(batch, (list, tuple)) else [batch])
    for array in arrays:
        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise CalibrationDataError(f"{description}: a calibration batch holds NaN or Inf values; "
                                       "clean the data before calibrating")


def watched_observers(graph: Graph) -> list[tuple[TensorQuantizationConfig, object, Operation, str, int]]:
    """(config, a new observer of it, op, 'input' | 'output', slot) for every activation config to calibrate
    (INITIAL, computed at run time), in graph order: the same list on any copy of the graph."""
    observers = []
    for operation in configured_operations(graph):
        for index, variable in enumerate(operation.inputs):
            config = input_config(operation, index)
            if variable is not None and not variable.is_parameter and config is not None \
                    and config.state is S.INITIAL:
                observers.append((config, make_observer(config), operation, "input", index))
        for index, variable in enumerate(operation.outputs):
            config = output_config(operation, index)
            if config is not None and config.state is S.INITIAL:
                observers.append((config, make_observer(config), operation, "output", index))
    return observers


def observer_hook(observers: list) -> _ObserverHook:
    inputs_watch: dict[str, list] = {}
    outputs_watch: dict[str, list] = {}
    for _, observer, operation, side, index in observers:
        (inputs_watch if side == "input" else outputs_watch).setdefault(operation.name, []).append((index, observer))
    return _ObserverHook(inputs_watch, outputs_watch)


def _terminal(variable, graph_outputs: set[str]) -> bool:
    """Whether no quantized computation reads ``variable``: it is a graph output, or each reader leaves it
    float, or is a value-preserving op (Reshape, Flatten, ...) whose result is itself terminal."""
    if variable.name in graph_outputs:
        return True
    for reader in variable.consumers:
        configs = [input_config(reader, i) for i, v in enumerate(reader.inputs) if v is variable]
        if all(c is None or c.state in (S.FP32, S.SOI, S.DEACTIVATED) for c in configs):
            continue
        if reader.type in VALUE_PRESERVING_TYPES and all(_terminal(out, graph_outputs) for out in reader.outputs):
            continue
        return False
    return True


def choose_terminal_observers(graph: Graph, observer: str) -> int:
    """Give ``observer`` to the output configs to calibrate whose tensors are terminal (see
    :func:`_terminal`): what such a tensor loses to clipping reaches the outputs directly, with no layer
    after it to average the error away, so it wants a range that keeps its extremes (a classifier's top
    logit, a probability near 1) where other tensors take the recipe's observer.  Returns how many."""
    outputs, changed = {v.name for v in graph.outputs}, 0
    for operation in configured_operations(graph):
        for index, variable in enumerate(operation.outputs):
            config = output_config(operation, index)
            if config is not None and config.state is S.INITIAL and _terminal(variable, outputs):
                config.observer_algorithm = observer
                changed += 1
    return changed


def observe_shard(graph: Graph, batches: list) -> list:
    """The observers of ``graph``'s activations (see :func:`watched_observers`) fed ``batches``: what one worker
    of the distributed backend computes on its shard (``ppqlike.optim.distributed``)."""
    observers = watched_observers(graph)
    hook, executor = observer_hook(observers), NumpyExecutor(graph)
    for batch in batches:
        executor.forward(batch, hooks=[hook])
    return [observer for _, observer, *_ in observers]


def _choose_observers(graph: Graph, executor: NumpyExecutor, observers: list, held_aside, first_batches) -> dict:
    """For the 'auto' observers (observers/choice.py): render every one with each candidate in turn, measure
    the output error (1 - mean per-sample cosine against FP32) on held-aside calibration samples (else the
    first calibration batch), and keep the candidate with the smaller error.  Returns what was measured."""
    choosing = [observer for _, observer, *_ in observers if isinstance(observer, ChoiceObserver)]
    if not choosing:
        return {}
    batch = next(iter(held_aside), None) if held_aside is not None else (first_batches[0] if first_batches else None)
    if batch is None:
        return {"observer_chosen": choosing[0].chosen, "observer_errors": {}}
    batch = leading_samples(batch, 16)
    with dequantized(graph):
        reference = executor.forward(batch)
    errors = {}
    for name in choosing[0].candidates:
        for observer in choosing:
            observer.choose(name)
            observer.render()
        error = float(1.0 - np.mean(sample_cosines(executor.forward(batch), reference)))
        errors[name] = error if error == error else float("inf")
    best = min(errors, key=lambda name: errors[name])   # the first of equals: the candidates' order
    for observer in choosing:
        observer.choose(best)
        observer.render()
    return {"observer_chosen": best, "observer_errors": {k: round(v, 6) for k, v in errors.items()},
            "observer_chosen_on": "held-aside calibration samples" if held_aside is not None else "calibration batch 0"}


class RuntimeCalibrationPass(QuantizationOptimizationPass):
    """Observe activations on calibration data and render their scales.

    ``backend``: 'local' (this process, batch after batch) or 'ray' (the batches sharded over ``workers``
    Ray workers, each observing its shard; the observers' states are merged here, exactly: the scales are
    those of the local run, bit for bit; see ``ppqlike.optim.distributed``).
    """

    name = "calibration"

    def __init__(self, search_batches: int = 1, verbose: bool = True, backend: str = "local", workers: int = 2,
                 terminal_observer: str | None = None):
        self.search_batches = search_batches
        self.verbose = verbose
        self.backend, self.workers = backend, workers
        self.terminal_observer = terminal_observer

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        executor = executor or NumpyExecutor(graph)
        terminal = choose_terminal_observers(graph, self.terminal_observer) if self.terminal_observer else 0
        observers = watched_observers(graph)
        if not observers:
            return {"observed": 0}
        workers_report = {}
        first_batches = []
        batches = iterate_calibration(dataloader, calib_steps, collate_fn, "calibration", self.verbose)
        if self.backend == "ray":
            batches = list(_checked(batches, graph))
            shards = observe_on_ray(graph, batches, self.workers, observe_shard)
            first_batches = batches[:self.search_batches]
            workers_report = {"workers": len(shards.observers),
                              "worker_seconds": [round(t, 3) for t in shards.worker_seconds],
                              "worker_peak_mib": [round(m, 1) for m in shards.worker_peak_mib]}
            for shard_observers in shards.observers:
                for (_, observer, *_), theirs in zip(observers, shard_observers):
                    observer.merge(theirs)
        else:
            hook = observer_hook(observers)
            for batch in _checked(batches, graph):
                executor.forward(batch, hooks=[hook])
                if len(first_batches) < self.search_batches:
                    first_batches.append(batch)
        searching = [entry for entry in observers if hasattr(entry[1], "candidates") and hasattr(entry[1], "select")]
        # all searched tensors in one float forward pass per search batch (a tensor no op reads keeps KL)
        searched = search_thresholds(graph, executor, first_batches, searching) if searching else 0
        for config, observer, operation, side, index in observers:
            observer.render()
            config.state = S.ACTIVATED
        choice = _choose_observers(graph, executor, observers, kwargs.get("held_aside"), first_batches)
        return {"observed": len(observers), "searched": searched, "backend": self.backend, **workers_report,
                "terminal_observers": terminal, **choice,
                "observer_bytes": int(sum(o.state_nbytes for _, o, *_ in observers))}
