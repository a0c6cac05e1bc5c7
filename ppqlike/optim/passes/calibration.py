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
from ...core.quant_graph import configured_operations, input_config, output_config
from ...executor import NumpyExecutor, OperationHook
from ..base import QuantizationOptimizationPass, iterate_calibration
from ..observers import make_observer
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


def _check_finite(batch, description: str) -> None:
    arrays = batch.values() if isinstance(batch, dict) else (batch if isinstance(batch, (list, tuple)) else [batch])
    for array in arrays:
        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise CalibrationDataError(f"{description}: a calibration batch holds NaN or Inf values; "
                                       "clean the data before calibrating")


class RuntimeCalibrationPass(QuantizationOptimizationPass):
    """Observe activations on calibration data and render their scales."""

    name = "calibration"

    def __init__(self, search_batches: int = 1, verbose: bool = True):
        self.search_batches = search_batches
        self.verbose = verbose

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        executor = executor or NumpyExecutor(graph)
        inputs_watch: dict[str, list] = {}
        outputs_watch: dict[str, list] = {}
        observers: list[tuple[TensorQuantizationConfig, object, Operation, str, int]] = []
        for operation in configured_operations(graph):
            for index, variable in enumerate(operation.inputs):
                config = input_config(operation, index)
                if variable is not None and not variable.is_parameter and config is not None \
                        and config.state is S.INITIAL:
                    observer = make_observer(config)
                    inputs_watch.setdefault(operation.name, []).append((index, observer))
                    observers.append((config, observer, operation, "input", index))
            for index, variable in enumerate(operation.outputs):
                config = output_config(operation, index)
                if config is not None and config.state is S.INITIAL:
                    observer = make_observer(config)
                    outputs_watch.setdefault(operation.name, []).append((index, observer))
                    observers.append((config, observer, operation, "output", index))
        if not observers:
            return {"observed": 0}
        hook = _ObserverHook(inputs_watch, outputs_watch)
        first_batches = []
        for batch in iterate_calibration(dataloader, calib_steps, collate_fn, "calibration", self.verbose):
            _check_finite(batch, f"graph {graph.name!r}")
            executor.forward(batch, hooks=[hook])
            if len(first_batches) < self.search_batches:
                first_batches.append(batch)
        searching = [entry for entry in observers if hasattr(entry[1], "candidates") and hasattr(entry[1], "select")]
        # all searched tensors in one float forward pass per search batch (a tensor no op reads keeps KL)
        searched = search_thresholds(graph, executor, first_batches, searching) if searching else 0
        for config, observer, operation, side, index in observers:
            observer.render()
            config.state = S.ACTIVATED
        return {"observed": len(observers), "searched": searched,
                "observer_bytes": int(sum(o.state_nbytes for _, o, *_ in observers))}
