"""The accuracy target's measurements, as functions that ``distributed.map_items`` runs here or on Ray workers.

Each takes what is shared (:class:`TrialData`: the graph with its configs as calibrated, the batches, their
FP32 outputs, the units by op name) and a chunk of items, and returns one result per item that depends only
on that item and on the shared data; the graph is left as it was found.  So the accuracy target
(:mod:`.mixed_precision`) gets the same numbers whether its units and trials are measured in one process
or split over workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.ir import Graph, Operation
from ...executor import NumpyExecutor
from .precision_moves import move_to_float_format, move_to_fp32, move_to_wider_grid, restore, snapshot
from .sensitivity import AloneRunner, cosine_lower_bound, output_cosine, output_parts, sample_cosines


@dataclass
class TrialData:
    """What every measurement reads: ``graph`` (configs as the pass found them), ``batches`` and their FP32
    ``references``, ``unit_names`` (each unit's op names), ``observed`` (FP32 range of each tensor, which a
    move to a wider grid reads), and the executor's ``runtime_kernels`` setting."""

    graph: Graph
    batches: list
    references: list
    unit_names: list[list[str]]
    observed: dict = field(default_factory=dict)
    runtime_kernels: bool = True
    local_executor: NumpyExecutor | None = None   # this process's executor of ``graph`` (never sent)
    local_runner: AloneRunner | None = None       # this process's runner, which notes ``observed`` (never sent)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "local_executor": None, "local_runner": None}

    def unit(self, index: int) -> list[Operation]:
        return [self.graph.operations[name] for name in self.unit_names[index]]

    def executor(self) -> NumpyExecutor:
        if self.local_executor is not None and self.local_executor.graph is self.graph:
            return self.local_executor
        return NumpyExecutor(self.graph, runtime_kernels=self.runtime_kernels)


def move_unit(graph: Graph, unit: list[Operation], bits, observed: dict) -> None:
    """Move ``unit`` to ``bits`` (an integer grid), a float format name ('F16', 'BF16'), or None (FP32)."""
    if bits is None:
        move_to_fp32(graph, unit)
    elif isinstance(bits, str):
        move_to_float_format(graph, unit, bits)
    else:
        move_to_wider_grid(graph, unit, bits, observed)


def unit_sensitivities(data: TrialData, indices: list[int]) -> list[float]:
    """For each unit, the output cosine with that unit alone quantized, averaged over the batches."""
    runner = data.local_runner if data.local_runner is not None else AloneRunner(data.graph, data.executor())
    units, parts = [data.unit(i) for i in indices], output_parts(data.graph)
    totals = [0.0] * len(units)
    for batch, reference in zip(data.batches, data.references):
        cached = runner.cache(batch)
        for k, unit in enumerate(units):
            totals[k] += output_cosine(runner.quantize_alone(unit, cached), reference, parts) / len(data.batches)
        del cached
    return totals


def trial_cosines(data: TrialData, trials: list[list[tuple[int, object]]]) -> list[float]:
    """For each trial (the moves (unit index, bits) to make, in order, from the configs as found), the
    target's measure of the whole graph: mean - one standard error of the per-sample output cosine."""
    graph, executor = data.graph, data.executor()
    original, parts = snapshot(graph), output_parts(graph)
    results = []
    try:
        for trial in trials:
            restore(graph, original)
            for index, bits in trial:
                move_unit(graph, data.unit(index), bits, data.observed)
            results.append(cosine_lower_bound(np.concatenate([sample_cosines(executor.forward(b), r, parts)
                                                              for b, r in zip(data.batches, data.references)])))
    finally:
        restore(graph, original)
    return results
