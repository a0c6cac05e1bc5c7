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

from ...core import numerics
from ...core.errors import CalibrationDataError
from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.op_facts import AFFINE_TYPES, VALUE_PRESERVING_TYPES
from ...core.quant_graph import configured_operations, input_config, output_config
from ...executor import NumpyExecutor, OperationHook
from ..base import CollatedShard, QuantizationOptimizationPass, iterate_calibration
from ..distributed import file_shards, observe_on_ray, split_into_shards
from ..observers import ChoiceObserver, make_observer
from .references import references_of
from .sensitivity import measured_batches, output_parts, sample_cosines, sample_count
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

    def lets_fuse(self, producer: Operation, activation: Operation) -> bool:
        """A Conv and its Relu/Clip run as one kernel unless the Conv's output is watched itself."""
        return producer.name not in self.watched_outputs and activation.name not in self.watched_inputs


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


def terminal_tensors(graph: Graph) -> tuple[set[str], set[str]]:
    """(terminal, read through float ops): the tensors no quantized computation reads, directly or through float
    ops (a graph output; a tensor each of whose readers reads it float - its input config FP32, SOI or
    deactivated - or passes it on - Reshape, Flatten, ...; an Add/Sub/Mul/Div of a constant: the bias of a
    MatMul classifier - and writes only terminal tensors), and those whose readers all read them float or
    pass them on while something quantized reads what they write: the input of a written-out HardSwish or SiLU,
    read by the block's float Add and Mul, whose result the next convolution reads."""
    outputs, terminal, float_read = {v.name for v in graph.outputs}, set(), set()
    for operation in reversed(graph.topological_sort()):   # readers before the ops writing what they read
        for variable in operation.outputs:
            if variable.name in outputs:
                terminal.add(variable.name)
                continue
            readings = [(_reading(reader, variable), reader.outputs) for reader in variable.consumers]
            if all((reads or passes) and all(out.name in terminal for out in written)
                   for (reads, passes), written in readings):
                terminal.add(variable.name)
            elif all(reads or (passes and all(out.name in terminal or out.name in float_read for out in written))
                     for (reads, passes), written in readings):
                float_read.add(variable.name)
    return terminal, float_read


def _reading(reader: Operation, variable) -> tuple[bool, bool]:
    """(whether ``reader`` reads ``variable`` float, whether it passes it on unchanged or by a constant)."""
    configs = [input_config(reader, i) for i, v in enumerate(reader.inputs) if v is variable]
    reads_float = all(c is None or c.state in (S.FP32, S.SOI, S.DEACTIVATED) for c in configs)
    passes_through = reader.type in VALUE_PRESERVING_TYPES or (
        reader.type in AFFINE_TYPES and all(v is variable or (v is not None and v.is_parameter)
                                             for v in reader.inputs))
    return reads_float, passes_through


def choose_terminal_observers(graph: Graph, observer: str) -> tuple[int, set[str]]:
    """Give ``observer`` to the output configs to calibrate whose tensors are terminal (see
    :func:`terminal_tensors`): what such a tensor loses to clipping reaches the outputs directly, with no
    layer after it to average the error away, so it wants a range that keeps its extremes (a classifier's top
    logit, a probability near 1) where other tensors take the recipe's observer.  Returns how many, and the
    names of the tensors read through float ops only, whose range the observer choice decides apart."""
    (terminal, float_read), changed = terminal_tensors(graph), 0
    for operation in configured_operations(graph):
        for index, variable in enumerate(operation.outputs):
            config = output_config(operation, index)
            if config is not None and config.state is S.INITIAL and config.observer_algorithm != "unit" \
                    and variable.name in terminal:
                config.observer_algorithm = observer
                changed += 1
    return changed, float_read


def observe_shard(graph: Graph, batches: Iterable) -> list:
    """The observers of ``graph``'s activations (see :func:`watched_observers`) fed ``batches`` (a list, or a
    reader of its own calibration files): what one worker of the distributed backend computes on its shard
    (``ppqlike.optim.distributed``)."""
    observers = watched_observers(graph)
    hook, executor = observer_hook(observers), NumpyExecutor(graph)
    for batch in _checked(batches, graph):
        executor.forward(batch, hooks=[hook])
    return [observer for _, observer, *_ in observers]


def observe_shards(graph: Graph, shards: list) -> list:
    """:func:`observe_shard` of each shard (``distributed.map_items``'s form: one result per item)."""
    return [observe_shard(graph, shard) for shard in shards]


def render(observer, unsigned_non_negative: bool = False) -> None:
    """Write the observer's range into its config.  ``unsigned_non_negative`` (TPU-MLIR's convention): a
    symmetric per-tensor activation whose calibration minimum is >= 0 takes the unsigned range [0, 2^b - 1]
    with zero point 0 and scale max / (2^b - 1): twice the steps of [-max, max] for a Relu's output; the
    others keep (or get back) the signed range."""
    config = observer.config
    if unsigned_non_negative and config.policy.symmetric and not config.policy.per_channel:
        bits = config.num_of_bits
        if observer.num_values and float(np.min(observer._min)) >= 0:
            _, high = observer.thresholds()
            top = 2 ** bits - 1
            scale, offset = numerics.minmax_to_scale_offset(0.0, high, 0, top, symmetric=False,
                                                            power_of_2=config.policy.power_of_2,
                                                            rounding=config.rounding)
            config.set_range(0, top)
            config.set_scale_offset(scale, offset)
            return
        if config.quant_min == 0:   # made unsigned by an earlier render (another candidate): signed again
            config.set_range(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    observer.render()


#: samples the choice between the 'auto' candidates is measured on (held-aside ones first)
CHOICE_SAMPLES = 64
#: a candidate this many times as far from FP32 as the best on the first half of them is measured no further
CHOICE_DROP_RATIO = 1.5


def _choice_batches(held_aside, first_batches: list) -> list:
    """Up to CHOICE_SAMPLES samples: the held-aside calibration batches, then the first calibration batches
    (a choice between two estimators does not overfit the samples it is made on)."""
    candidates = [*(held_aside if held_aside is not None else ()), *first_batches]
    return measured_batches(candidates, CHOICE_SAMPLES, description="observer choice data") if candidates else []


def _half_point(batches: list) -> int:
    """How many of the batches hold half of their samples (at least one)."""
    total, count = sum(sample_count(batch) for batch in batches), 0
    for index, batch in enumerate(batches):
        count += sample_count(batch)
        if 2 * count >= total:
            return index + 1
    return len(batches)


def _choose_observers(graph: Graph, executor: NumpyExecutor, observers: list, held_aside, first_batches,
                      unsigned: bool, float_references=None, read_through_float=()) -> dict:
    """For the 'auto' observers (observers/choice.py): render every one with each candidate in turn, measure
    the output error (1 - mean per-sample cosine against FP32) on up to CHOICE_SAMPLES calibration samples
    (held-aside ones first), and keep the candidate with the smaller error.  A candidate whose error on the
    first half of the samples is CHOICE_DROP_RATIO times the best one's or more is not measured on the second
    (its error is reported on the first half); when one candidate is left, the second half is not measured
    (nor run in float).  Then the tensors read through float ops only (``read_through_float``: the inputs of
    written-out activations) are tried with min-max on the samples the chosen one was measured on, and keep
    it where the error falls.  Returns what was measured."""
    choosing = [observer for _, observer, *_ in observers if isinstance(observer, ChoiceObserver)]
    if not choosing:
        return {}
    batches = _choice_batches(held_aside, first_batches)
    if not batches:
        return {"observer_chosen": choosing[0].chosen, "observer_errors": {}}
    half, parts = _half_point(batches), output_parts(graph)
    cosines = {name: [] for name in choosing[0].candidates}
    errors, measured, measured_on, references = {}, list(cosines), 0, []
    for start, stop in ((0, half), (half, len(batches))):
        if stop <= start or (start > 0 and len(measured) == 1):
            break
        references += references_of(batches[start:stop], graph, executor, float_references)
        for name in measured:
            _choose(choosing, name, unsigned)
            cosines[name] += [sample_cosines(executor.forward(batch), reference, parts)
                              for batch, reference in zip(batches[start:stop], references[start:stop])]
            error = float(1.0 - np.mean(np.concatenate(cosines[name])))
            errors[name] = error if error == error else float("inf")
        measured_on += sum(sample_count(batch) for batch in batches[start:stop])
        if start == 0:
            least = min(errors.values())
            measured = [name for name in measured if errors[name] < CHOICE_DROP_RATIO * least or errors[name] == least]
    best = min(measured, key=lambda name: errors[name])   # the first of equals: the candidates' order
    _choose(choosing, best, unsigned)
    report = {"observer_chosen": best, "observer_errors": {k: round(v, 6) for k, v in errors.items()},
              "observer_chosen_on": int(measured_on),
              "observer_dropped_at_half": [name for name in cosines if name not in measured]}
    apart = [observer for observer in read_through_float if isinstance(observer, ChoiceObserver)]
    if apart and best != "minmax" and "minmax" in cosines:
        _choose(apart, "minmax", unsigned)
        count = len(cosines[best])
        error = float(1.0 - np.mean(np.concatenate([sample_cosines(executor.forward(batch), reference, parts)
                                                    for batch, reference in zip(batches[:count], references)])))
        kept = "minmax" if error < errors[best] else best
        _choose(apart, kept, unsigned)
        report["read_through_float"] = {"tensors": len(apart), "minmax_error": round(error, 6), "kept": kept}
    return report


def _choose(observers: list, name: str, unsigned: bool) -> None:
    """Give every one of ``observers`` its candidate ``name``'s range."""
    for observer in observers:
        observer.choose(name)
        render(observer, unsigned)


def _leading_batches(batches: Iterable, search_batches: int, choosing: bool) -> list:
    """The first batches the local run keeps (``search_batches`` of them, or CHOICE_SAMPLES samples when
    choosing observers), at least one; reading stops there."""
    kept, samples, batches = [], 0, iter(batches)
    while not kept or len(kept) < search_batches or (choosing and samples < CHOICE_SAMPLES):
        batch = next(batches, None)   # (asked only when wanted: asking reads the batch's files)
        if batch is None:
            break
        kept.append(batch)
        samples += sample_count(batch)
    return kept


class RuntimeCalibrationPass(QuantizationOptimizationPass):
    """Observe activations on calibration data and render their scales.

    ``backend``: 'local' (this process, batch after batch) or 'ray' (the batches sharded over ``workers``
    Ray workers, each observing its shard; the observers' states are merged here, exactly: the scales are
    those of the local run, bit for bit; see ``ppqlike.optim.distributed``).
    """

    name = "calibration"

    def __init__(self, search_batches: int = 1, verbose: bool = True, backend: str = "local", workers: int = 2,
                 terminal_observer: str | None = None, unsigned_non_negative: bool = False):
        self.search_batches = search_batches
        self.unsigned_non_negative = unsigned_non_negative
        self.verbose = verbose
        self.backend, self.workers = backend, workers
        self.terminal_observer = terminal_observer

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        executor = executor or NumpyExecutor(graph)
        terminal, float_read = choose_terminal_observers(graph, self.terminal_observer) if self.terminal_observer \
            else (0, set())
        observers = watched_observers(graph)
        if not observers:
            return {"observed": 0}
        choosing = any(isinstance(observer, ChoiceObserver) for _, observer, *_ in observers)
        workers_report = {}
        first_batches = []
        batches = iterate_calibration(dataloader, calib_steps, collate_fn, "calibration", self.verbose)
        if self.backend == "ray":
            shards = file_shards(dataloader, calib_steps, self.workers)
            if shards is None:   # batches in memory: the driver reads them and sends arrays
                batches = list(_checked(batches, graph))
                shards = split_into_shards(batches, self.workers)
                first_batches = batches[:max(self.search_batches, len(batches) if choosing else 0)]
            else:                # from files: each worker reads its own; here only the batches kept below
                shards = [CollatedShard(shard, collate_fn) for shard in shards]
                first_batches = _leading_batches(_checked(batches, graph), self.search_batches, choosing)
            mapped = observe_on_ray(graph, shards, self.workers, observe_shards)
            workers_report = {**mapped.report(), "shards_read_by_workers": not isinstance(shards[0], list)}
            for shard_observers in mapped.results:
                for (_, observer, *_), theirs in zip(observers, shard_observers):
                    observer.merge(theirs)
        else:
            hook = observer_hook(observers)
            kept = 0
            for batch in _checked(batches, graph):
                executor.forward(batch, hooks=[hook])
                if len(first_batches) < self.search_batches or (choosing and kept < CHOICE_SAMPLES):
                    first_batches.append(batch)
                    kept += sample_count(batch)
        searching = [entry for entry in observers if hasattr(entry[1], "candidates") and hasattr(entry[1], "select")]
        # all searched tensors in one float forward pass per search batch (a tensor no op reads keeps KL)
        searched = search_thresholds(graph, executor, first_batches[:self.search_batches], searching,
                                     self.backend, self.workers) if searching else 0
        for config, observer, operation, side, index in observers:
            render(observer, self.unsigned_non_negative)
            config.state = S.ACTIVATED
        read_through_float = [observer for config, observer, operation, side, index in observers
                              if side == "output" and operation.outputs[index].name in float_read]
        choice = _choose_observers(graph, executor, observers, kwargs.get("held_aside"), first_batches,
                                   self.unsigned_non_negative, kwargs.get("references"), read_through_float)
        return {"observed": len(observers), "searched": searched, "backend": self.backend, **workers_report,
                "terminal_observers": terminal, **choice,
                "observer_bytes": int(sum(o.state_nbytes for _, o, *_ in observers))}
