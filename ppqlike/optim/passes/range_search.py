"""Activation-range search against the readers' outputs, with the quantized inputs they will see.

Calibration chooses each activation range from that tensor alone (min-max,
KL, or the MSE of the tensor).  What matters is the error the range causes
where the tensor is used, in the network as it will run: upstream already
quantized.  This pass walks the graph once in topological order on
``samples`` calibration samples, computing two paths side by side:

* FP32: every op in float;
* quantized: every op as the simulation runs it (inputs through their
  configs, weights baked or fake-quantized, outputs quantized), with the
  ranges already chosen for the tensors upstream (sequential, as in
  BRECQ/QDrop's block-by-block reconstruction).

At each op whose output holds its own per-tensor quantization point (an
ACTIVATED output config, after fusion the Relu/Clip of a Conv), candidate
ranges ``f * [min, max]`` of the op's quantized-path output (f from ``low``
to 1, ``candidates`` values) and the calibrated range are scored by

    sum over readers R of  || R(x_q) - R_fp32 ||^2 / || R_fp32 ||^2

where R(x_q) is the reader run in the quantized path with this tensor
quantized at the candidate (its other inputs as the quantized path holds
them) and R_fp32 its FP32 output; a tensor without a reader whose inputs are
all known yet (graph outputs) is scored on itself.  The best range is kept
(the calibrated one unless another is strictly better), and the walk goes on
with it.

Skipped: per-channel activations, configs that other configs are SLAVE to
(Concat/Add alignment shares their scale), and 16-bit grids.  onnxruntime's
integer kernels are not used in the search (the float kernel on the same
grid differs in the last bits only).  The pass stops choosing at
``time_budget`` (a :class:`~ppqlike.optim.base.TimeBudget` shared with the
other passes of the recipe) and keeps the calibrated ranges of the tensors
not yet reached.

Checked (``checked_on``; `best` sets it, with the protection run before the
search): the output error on the held-aside samples is measured before and
after, and every range is put back unless it fell.

Reads: ACTIVATED output configs after calibration, alignment and the passive
pass (and the protection's moves); the calibration data.  Writes: their scale
and offset (state and grid unchanged); ``config.detail['range_search']``
(calibrated and chosen error).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from ...core import numerics
from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import configured_operations, master_chain
from ...executor import NumpyExecutor
from ...executor.simulation import apply_output_config
from ..base import QuantizationOptimizationPass, TimeBudget
from .precision_moves import restore, snapshot
from .references import check_data
from .sensitivity import output_error
from .walk import Walk, walk_inputs

S = QuantizationStates


def _shared_masters(graph: Graph) -> set[int]:
    """ids of the configs some SLAVE config takes its scale from (their scale is not theirs alone)."""
    shared = set()
    for operation in configured_operations(graph):
        for config in operation.config.all_configs():
            if config.state is S.SLAVE:
                shared.update(id(master) for master in master_chain(config))
    return shared


def _searchable(config: TensorQuantizationConfig | None, shared: set[int]) -> bool:
    return (config is not None and config.state is S.ACTIVATED and config.num_of_bits <= 8
            and np.size(config.scale) == 1 and id(config) not in shared)


def candidate_grids(config: TensorQuantizationConfig, values: np.ndarray, count: int,
                    low: float) -> list[tuple[float, int]]:
    """(scale, offset) pairs: the config's own first, then f * [min, max] of ``values`` for f in [low, 1]."""
    grids = [(float(config.scale), int(config.offset))]
    minimum, maximum = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    policy = config.policy
    for factor in np.linspace(low, 1.0, count):
        grid = numerics.minmax_to_scale_offset(factor * minimum, factor * maximum, config.quant_min,
                                               config.quant_max, symmetric=policy.symmetric,
                                               power_of_2=policy.power_of_2, rounding=config.rounding)
        if grid not in grids:
            grids.append(grid)
    return grids


def relative_error(got: np.ndarray, want: np.ndarray, want_energy: float | None = None) -> float:
    """||got - want||^2 / ||want||^2 (the squared error where ``want`` is all zero); float32 BLAS dot products,
    enough to rank candidates.  ``want_energy``: ||want||^2 when already known."""
    error = energy(np.asarray(got, np.float32) - np.asarray(want, np.float32))
    want_energy = energy(want) if want_energy is None else want_energy
    return error / want_energy if want_energy > 0 else error


def energy(values: np.ndarray) -> float:
    """||values||^2 as a float32 BLAS dot product."""
    flat = np.ravel(np.asarray(values, np.float32))
    return float(np.dot(flat, flat))


class ActivationRangeSearchPass(QuantizationOptimizationPass):
    """Choose each per-tensor activation range by the error it causes at its readers (module docstring).

    ``samples``: calibration samples to walk (taken from the first batches);
    ``candidates``: ranges tried per tensor besides the calibrated one;
    ``low``: the smallest fraction of [min, max] tried; ``time_budget``:
    a TimeBudget, seconds, or None.
    """

    name = "range_search"

    def __init__(self, samples: int = 32, candidates: int = 12, low: float = 0.3,
                 time_budget: TimeBudget | float | None = None, verbose: bool = False,
                 checked_on: int | None = None):
        if samples < 1 or candidates < 1 or not 0.0 < low <= 1.0:
            raise ValueError(f"range search needs samples >= 1, candidates >= 1, 0 < low <= 1; "
                             f"got {samples}, {candidates}, {low}")
        self.samples, self.candidates, self.low = int(samples), int(candidates), float(low)
        self.time_budget = TimeBudget.of(time_budget)
        self.verbose, self.checked_on = verbose, checked_on

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        """Search (see :meth:`search`); with ``checked_on``, the output error (1 - cosine against FP32) is
        measured before and after on that many samples (the held-aside batches where the pipeline has them)
        and every range put back unless it fell (unchecked where there is no sample to measure)."""
        executor = executor or NumpyExecutor(graph)
        check = check_data(graph, executor, dataloader, self.checked_on, collate_fn, kwargs,
                           "range search check data") if self.checked_on else None
        if check is None:
            return self.search(graph, executor, dataloader, calib_steps, collate_fn)
        error_before, saved = output_error(executor, *check), snapshot(graph)
        report = self.search(graph, executor, dataloader, calib_steps, collate_fn)
        error_after = output_error(executor, *check)
        kept = error_after < error_before
        if not kept:
            restore(graph, saved)
        return {**report, "error_before": round(error_before, 6), "error_after": round(error_after, 6),
                "kept": kept, "changed": report["changed"] if kept else 0}

    def search(self, graph: Graph, executor: NumpyExecutor, dataloader: Iterable | None,
               calib_steps: int | None, collate_fn: Callable | None) -> dict:
        """Walk the graph once and choose each searchable range at its readers."""
        started = time.perf_counter()
        deadline = self.time_budget.deadline()
        walk = Walk(graph, executor, walk_inputs(executor, dataloader, calib_steps, collate_fn, self.samples,
                                                "range search data"))
        shared = _shared_masters(graph)
        searched, changed, budget_spent = 0, 0, False
        gains = []
        order = graph.topological_sort()
        for operation in tqdm(order, desc="range search", disable=not self.verbose, leave=False):
            float_results = walk.run_float(operation)
            raw = walk.run_quantized_inputs(operation)
            configs = operation.config.output_quantization_config if operation.config is not None else []
            quantized_results = []
            for index, value in enumerate(raw):
                config = configs[index] if index < len(configs) else None
                if _searchable(config, shared) and not budget_spent:
                    if time.perf_counter() >= deadline:
                        budget_spent = True
                    else:
                        before, after = self._choose(walk, operation, index, config, value, float_results[index])
                        searched += 1
                        changed += int(after < before)
                        gains.append(after / before if before > 0 else 1.0)
                quantized_results.append(apply_output_config(config, value))
            walk.finish(operation, float_results, quantized_results)
        return {"searched": searched, "changed": changed, "samples": self.samples,
                "mean_error_ratio": round(float(np.mean(gains)), 4) if gains else 1.0,
                "budget_spent": budget_spent, "seconds": round(time.perf_counter() - started, 3)}

    def _choose(self, walk: Walk, operation: Operation, index: int, config: TensorQuantizationConfig,
                value: np.ndarray, float_value: np.ndarray) -> tuple[float, float]:
        """Score the candidate grids of ``config`` and keep the best; returns (calibrated, chosen) error."""
        name = operation.outputs[index].name
        readers = [r for r in operation.outputs[index].consumers
                   if r.name not in walk.done and all(v is None or v.name == name or v.value is not None
                                                      or v.name in walk.float_values for v in r.inputs)]
        references = [walk.executor.run_operation(r, walk.arguments(r, walk.float_values, (name, float_value)),
                                                  quantized=False)[0] for r in readers]
        energies = [energy(reference) for reference in references]
        errors = []
        grids = candidate_grids(config, value, self.candidates, self.low)
        for scale, offset in grids:
            config.set_scale_offset(scale, offset)
            quantized = config.fake_quantize(value)
            if readers:
                error = sum(relative_error(walk.run_quantized_inputs(r, (name, quantized))[0], want, energy)
                            for r, want, energy in zip(readers, references, energies))
            else:
                error = relative_error(quantized, float_value)
            errors.append(error)
        best = int(np.argmin(errors)) if min(errors) < errors[0] else 0
        config.set_scale_offset(*grids[best])
        config.detail["range_search"] = {"calibrated_error": errors[0], "chosen_error": errors[best],
                                         "readers": [r.name for r in readers]}
        return errors[0], errors[best]
