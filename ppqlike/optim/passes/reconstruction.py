"""Sequential reconstruction: each Conv/Gemm/MatMul's weight rounding learned, layer after layer, against the FP32
model's output from the input the quantized network feeds it (QDrop's dropped quantization, in expectation).

Learned rounding on FP32 inputs (``adaround.py``) makes each layer reproduce its own output; the errors of
the layers upstream (their weights, the activations' 8-bit grids) reach it all the same.  Here the layers
are taken one after another in topological order on ``samples`` calibration samples, walking the FP32 and
the quantized network side by side (``walk.py``): layer l's rounding is learned on the input the quantized
network computes with layers 1..l-1 already rounded, against the FP32 network's output W x_f, so that it
compensates what reaches it (the asymmetric reconstruction of BRECQ/AdaQuant, layer by layer).  Following
QDrop (Wei et al. 2022), each element of the input keeps its quantization with probability 1 - ``drop``
and takes its FP32 value otherwise; the loss is the expectation over these drops, which for a linear
layer has a closed form (``adaround_rows.TargetStatistics``), so no random masks are drawn and the
statistics are three K x K matrices per group.  The optimization itself is AdaRound's
(``adaround_rounding.learn_rounding``: rectified sigmoid, annealed regularizer, Adam).

A layer keeps whichever of the rounding learned here, nearest rounding and the rounding it came with
(learned on FP32 inputs, when the ``adaround`` pass ran before) has the smaller expected loss on these
rows: the pass never makes a layer's reconstruction worse.  The weight ranges are the ones the layer came
with (the biases' PASSIVE configs were derived from them).

Reads: ACTIVATED or BAKED weight configs of Conv (2-D) / Gemm / MatMul ops (``adaround.rounding_unsupported``), the
calibrated activation configs (after calibration, alignment and the passive pass).  Writes:
``config.baked_value`` and state BAKED; ``config.detail['reconstruction']``.  Stops at ``time_budget``: the
layers not reached keep the rounding they had.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates
from ...core.quant_graph import configured_operations, input_config
from ...executor import NumpyExecutor
from ..base import QuantizationOptimizationPass, TimeBudget
from .adaround import rounding_unsupported
from .adaround_rounding import learn_rounding, nearest_rounding
from .adaround_rows import MATRIX_TYPES, RowHook, TargetStatistics, as_groups, from_groups
from .walk import Walk, walk_inputs

S = QuantizationStates

#: rows (output positions) turned into statistics at a time, to bound the memory of a wide layer's rows
ROW_CHUNK = 512


def reconstruction_targets(graph: Graph) -> set[str]:
    """The Conv/Gemm/MatMul ops whose weight rounding a reconstruction learns (ACTIVATED or BAKED weight configs)."""
    return {op.name for op in configured_operations(graph) if rounding_unsupported(op, (S.ACTIVATED, S.BAKED)) is None}


def kept_rounding(losses: dict[str, float]) -> str:
    """Which rounding ('learned', 'previous', 'nearest') a layer or block keeps: the one of least loss, a tie
    keeping what was there ('previous')."""
    return min(losses, key=lambda name: (losses[name], name != "previous"))


class SequentialReconstructionPass(QuantizationOptimizationPass):
    """Learn each Conv/Gemm/MatMul's weight rounding against the FP32 output, from the quantized network's input
    (module docstring).  ``samples``: calibration samples walked (one batch); ``rows``: output positions per
    layer; ``steps``, ``lr``, ``lam``, ``warmup``: AdaRound's optimization; ``drop``: QDrop's probability of
    an input element taking its FP32 value; ``time_budget``: a TimeBudget, seconds or None."""

    name = "reconstruction"

    def __init__(self, samples: int = 32, rows: int = 4096, steps: int = 500, drop: float = 0.5,
                 lr: float = 3e-2, lam: float = 0.1, warmup: float = 0.2, seed: int = 0,
                 time_budget: TimeBudget | float | None = None, verbose: bool = False):
        if samples < 1 or rows < 1 or steps < 1 or not 0.0 <= drop <= 1.0:
            raise ValueError(f"reconstruction needs samples, rows and steps >= 1 and 0 <= drop <= 1; got {samples}, "
                             f"{rows}, {steps}, {drop}")
        self.samples, self.rows, self.steps, self.drop = int(samples), int(rows), int(steps), float(drop)
        self.lr, self.lam, self.warmup, self.seed = lr, lam, warmup, seed
        self.time_budget, self.verbose = TimeBudget.of(time_budget), verbose

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        deadline = self.time_budget.deadline()
        targets = reconstruction_targets(graph)
        if not targets:
            return {"layers": 0, "seconds": round(time.perf_counter() - started, 3)}
        executor = executor or NumpyExecutor(graph)
        walk = Walk(graph, executor, walk_inputs(executor, dataloader, calib_steps, collate_fn, self.samples,
                                                 "reconstruction data"))
        sampler = RowHook({}, self.rows, self.seed)
        layers, budget_spent = [], False
        for operation in tqdm(graph.topological_sort(), desc="reconstruction", disable=not self.verbose, leave=False):
            if len(layers) == len(targets):
                break   # every layer done: nothing downstream to walk for
            if operation.name in targets and time.perf_counter() >= deadline:
                budget_spent = True   # the layers left keep their rounding: no need to walk further
                break
            float_results = walk.run_float(operation)
            if operation.name in targets:
                layers.append(self._reconstruct(operation, walk, sampler, deadline))
            walk.finish(operation, float_results, walk.run_quantized(operation))
        kept = [layer["kept"] for layer in layers]
        return {"layers": len(layers), "targets": len(targets), "samples": self.samples, "drop": self.drop,
                "kept_learned": kept.count("learned"), "kept_previous": kept.count("previous"),
                "kept_nearest": kept.count("nearest"), "budget_spent": budget_spent,
                "mean_relative_loss": round(float(np.mean([layer["relative_loss"] for layer in layers])), 6)
                if layers else 0.0,
                "seconds": round(time.perf_counter() - started, 3)}

    def _statistics(self, operation: Operation, walk: Walk, sampler: RowHook) -> TargetStatistics:
        """The layer's expected-loss statistics from its quantized-path and FP32-path inputs."""
        quantized_input = walk.quantized_arguments(operation)[0]
        float_input = walk.arguments(operation, walk.float_values)[0]
        positions = sampler.sample_positions(operation, quantized_input)
        stat = TargetStatistics(operation, self.drop)
        matrix = operation.type in MATRIX_TYPES
        count = len(positions) if matrix else len(positions[0])
        for begin in range(0, count, ROW_CHUNK):
            chunk = positions[begin:begin + ROW_CHUNK] if matrix else \
                tuple(p[begin:begin + ROW_CHUNK] for p in positions)
            stat.add(RowHook.rows_at(operation, quantized_input, chunk), RowHook.rows_at(operation, float_input, chunk))
        return stat

    def _reconstruct(self, operation: Operation, walk: Walk, sampler: RowHook, deadline: float,
                     seconds: float = float("inf")) -> dict:
        """Learn, compare and bake one layer's rounding, its steps fitted to ``seconds`` (inf: ``steps``);
        returns its facts."""
        begin = time.perf_counter()
        stat = self._statistics(operation, walk, sampler)
        config = input_config(operation, 1)
        learned, facts = learn_rounding(stat, operation, config, self.steps, self.lr, self.lam, self.warmup,
                                        deadline=deadline, seconds=seconds - (time.perf_counter() - begin))
        losses = {"learned": facts["learned_loss"], "nearest": facts["nearest_loss"]}   # (learn_rounding's)
        previous = None
        if config.state is S.BAKED and config.baked_value is not None:
            previous = as_groups(operation, np.asarray(config.baked_value, np.float64))
            losses["previous"] = stat.loss(previous)
        kept = kept_rounding(losses)
        weight = {"learned": learned, "previous": previous}.get(kept)
        if weight is None:
            weight = nearest_rounding(operation, config)
        config.baked_value = from_groups(operation, weight, operation.inputs[1].value.shape).astype(np.float32)
        if config.state is not S.BAKED:
            config.state = S.BAKED
        energy = max(stat.energy, 1e-30)
        detail = {"kept": kept, **{f"loss_{name}": round(loss, 8) for name, loss in losses.items()},
                  "relative_loss": losses[kept] * stat.rows / energy, "rows": stat.rows,
                  "steps_done": facts["steps_done"], "seconds": round(time.perf_counter() - begin, 3)}
        config.detail["reconstruction"] = detail
        stat.release()
        return {"op": operation.name, **detail}
