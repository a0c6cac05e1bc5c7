"""The FP32 and the quantized network side by side, op by op: the walk the sequential passes share.

The range search (``range_search.py``) and the sequential reconstruction (``reconstruction.py``) decide one
op at a time with the ops upstream already decided, as BRECQ/QDrop reconstruct block after block.  Both walk
the graph once in topological order on a few calibration samples (one batch of them), holding two values of
each tensor: the FP32 model's, and the quantized model's as the simulation computes it (inputs through their
configs, weights baked or fake-quantized, outputs quantized); a value is freed once its last reader has run.

Reads: the graph's configs as they are when each op runs.  Writes nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation
from ...executor import NumpyExecutor
from ...executor.simulation import apply_config, quantize_outputs
from ..base import iterate_calibration


def walk_inputs(executor: NumpyExecutor, dataloader: Iterable, calib_steps: int | None, collate_fn: Callable | None,
                samples: int, description: str) -> dict:
    """The graph inputs of the first ``samples`` calibration samples, as one batch (input name -> array)."""
    named: dict[str, list] = {}
    taken = 0
    for batch in iterate_calibration(dataloader, calib_steps, collate_fn, description, False):
        for name, value in executor.prepare_inputs(batch).items():
            named.setdefault(name, []).append(value)
        taken += len(next(iter(named.values()))[-1])
        if taken >= samples:
            break
    return {name: np.concatenate(values)[:samples] for name, values in named.items()}


class Walk:
    """The FP32 and quantized values of one walk, freed once their last reader has run."""

    def __init__(self, graph: Graph, executor: NumpyExecutor, inputs: dict):
        self.graph, self.executor = graph, executor
        self.float_values, self.quantized_values = dict(inputs), dict(inputs)
        self.readers_left = {name: len(v.consumers) for name, v in graph.variables.items()}
        self.done: set[str] = set()

    def arguments(self, operation: Operation, values: dict, replace: tuple[str, np.ndarray] | None = None):
        """The op's input values from ``values`` (parameters from the graph), ``replace`` = (name, value)
        standing in for one of them."""
        result = []
        for variable in operation.inputs:
            if variable is None:
                result.append(None)
            elif replace is not None and variable.name == replace[0]:
                result.append(replace[1])
            elif variable.name in values:
                result.append(values[variable.name])
            else:
                result.append(variable.value)
        return result

    def quantized_arguments(self, operation: Operation, replace=None) -> list:
        """The op's inputs in the quantized path, through its input configs (what its kernel reads)."""
        arguments = self.arguments(operation, self.quantized_values, replace)
        config = operation.config
        if config is not None:
            arguments = [apply_config(c, a) for c, a in zip(config.input_quantization_config, arguments)] + \
                arguments[len(config.input_quantization_config):]
        return arguments

    def run_float(self, operation: Operation) -> list:
        """The op's results in the FP32 path."""
        return self.executor.run_operation(operation, self.arguments(operation, self.float_values), quantized=False)

    def run_quantized_inputs(self, operation: Operation, replace=None) -> list:
        """The op's raw (not yet output-quantized) results in the quantized path."""
        return self.executor.run_operation(operation, self.quantized_arguments(operation, replace), quantized=False)

    def run_quantized(self, operation: Operation) -> list:
        """The op's results in the quantized path, through its output configs."""
        return quantize_outputs(operation, self.run_quantized_inputs(operation))

    def finish(self, operation: Operation, float_results: list, quantized_results: list) -> None:
        """Record the op's results in both paths and free the inputs it was the last reader of."""
        for variable, value in zip(operation.outputs, float_results):
            self.float_values[variable.name] = value
        for variable, value in zip(operation.outputs, quantized_results):
            self.quantized_values[variable.name] = value
        self.done.add(operation.name)
        for variable in operation.inputs:
            if variable is not None and variable.name in self.readers_left:
                self.readers_left[variable.name] -= 1
                if self.readers_left[variable.name] == 0 and variable not in self.graph.outputs:
                    self.float_values.pop(variable.name, None)
                    self.quantized_values.pop(variable.name, None)
