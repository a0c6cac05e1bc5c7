"""AdaRound-style learned rounding of weights (Nagel et al. 2020, "Up or Down?"), layer by layer, in numpy.

Nearest rounding is not the best rounding: for each Conv/Gemm the pass
chooses, weight by weight, floor or ceil so that the layer's output on
calibration data is reconstructed best.  The choice is relaxed to a soft
variable h(V) = clip(sigmoid(V) * (zeta - gamma) + gamma, 0, 1) (the
rectified sigmoid, zeta = 1.1, gamma = -0.1) with

    W~ = S * (clamp(floor(W / S) + h(V) + Z, qmin, qmax) - Z)

and V is optimized with Adam on

    || (W~ - W) x ||^2 (summed over output channels, mean over rows)
      + lam * sum(1 - |2 h(V) - 1|^beta)

where x is the layer's input on calibration data: each layer undoes its own
rounding error (the symmetric reconstruction), so one pass over the data
serves every layer at once.  The reconstruction term is divided by its
value at nearest rounding, so that ``lam`` weighs the same in every layer.
For the first ``warmup`` fraction of the iterations lam is 0; then beta
anneals from 20 to 2 so that h is pushed to 0 or 1.  At the end h is
rounded (V >= 0 means up) and the result is kept only when its
reconstruction error on the calibration rows is below that of nearest
rounding (so it never does worse there).

Which x, and where the pass runs.  ``inputs='float'``: x is the input in the
FP32 model (the forward pass runs ``dequantized``); ``build_pipeline`` puts
the pass right after the parameter pass, before calibration, so that the
activations are calibrated on the network with the rounding it will run
with.  ``inputs='quantized'``: x is the input as the quantized model feeds
it (quantized upstream and the layer's own input quantization), for a pass
placed after calibration.  Measured on MobileNetV2 at W4A8, learned
rounding before calibration on float inputs, calibrated on calibration
images 0-63, top-1 on the held-out calibration images 100-199 (FP32 80%):
62% with 500 steps (the default), 71% with 2000 (3.3x the time).  The
benchmark (200 calibration images, 300 dev images, docs/BENCHMARKS.md):
nearest rounding 10%, learned 70%, FP32 84%.  Placed after calibration on
quantized inputs it does worse (the ranges were calibrated with nearest-rounded
4-bit weights, whose activations are far from the final ones).  The paper's
asymmetric target W x_fp from quantized inputs needs the layers rounded
strictly one after another (rounded together, each compensated upstream
error the upstream layers removed themselves: 1% top-1); it is not offered.

Before the rounding is learned, the weight's range is searched too
(``scale_search``): ranges ratio * [min, max] for 36 ratios in [0.3, 1] are
scored with nearest rounding on the same statistics, per output channel when
the weight is quantized per channel (the error of a layer's output channel
depends on that channel's weights only), and the best scale/offset replaces
the min-max one in the weight config (4-bit weights gain most from
clipping).

How the data is held.  A convolution is an im2col matrix product: a row is
the patch one output position reads, so each group of the layer is
y = X W^T with X [rows, C/g * kh * kw].  On every calibration batch one
forward pass samples ``samples / batches`` output positions per layer
(subsampled spatially, so the cost stays small) and adds the rows to
fixed-size statistics: the rows themselves while there are fewer than the
patch length K, then the Gram matrix G = X^T X [K, K], which is all the
loss and its gradient need (D = W~ - W):

    loss = tr(D G D^T) / rows,    dloss/dW~ = 2 D G / rows

so memory does not grow with the number of rows or batches (the statistics
of all layers are held together: at most K^2 float64 per layer and group).
The gradient goes through the clamp (zero where clamped) and the rectified
sigmoid (zero where h is clipped), computed in numpy.

Reads: ACTIVATED weight configs (scale, offset, range) of TARGET Conv (2-D,
any group), Gemm and MatMul (a 2-D weight [K, N] as its second input, of
fewer than 8 bits) ops whose weight is a parameter read by that op alone;
with ``inputs='quantized'`` the calibrated activation configs too.
Writes: the weight config's scale/offset (scale search; the PASSIVE bias
follows it, S_input * S_weight), then ``config.baked_value`` = the weight
rounded as learned and state BAKED (the baking pass then leaves it alone).
``config.detail['adaround']`` records the layer's errors.  The FP32 weight
in ``Variable.value`` is kept.

Time budget: checked between batches of the row capture, between layers and
every 16 iterations inside a layer; a layer stopped early is judged like a
finished one (its hard rounding kept only if better than nearest), the layers
not reached keep nearest rounding.  The rows live in ``adaround_rows.py``, the
rounding of one layer in ``adaround_rounding.py``.

On Ray workers (``backend='ray'``, the setting's ``calibration_backend``): the
rows are gathered here (one forward pass per batch serves every layer), then
the layers' roundings, independent of each other and drawing no random
numbers, are split over ``workers`` Ray workers (``distributed.map_items``,
each worker's share of the layers balanced by their cost, each taken in the
graph's order); the graph goes once to the object store, each layer's
statistics to the worker that rounds it, and the results are baked here: the
same bits as the local run.  Each worker stops at the same deadline (sent as a
wall-clock time); the layers it has not begun by then keep nearest rounding.

Use: 4-bit weights (``ACADEMIC_W4A8``), where rounding matters most; 8-bit
weights in the ``best`` recipe.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates
from ...core.quant_graph import configured_operations, input_config
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from ..base import QuantizationOptimizationPass, TimeBudget, iterate_calibration
from ..distributed import longest_first_chunks, map_items
from .adaround_rounding import (RoundingJob, layer_cost, learn_rounding, nearest_rounding, round_layers,
                                search_weight_scale)
from .adaround_rows import ROUNDING_TYPES, LayerStatistics, RowHook, conv_geometry

__all__ = ["AdaroundPass", "learn_rounding", "nearest_rounding", "search_weight_scale"]

S = QuantizationStates


def rounding_unsupported(operation: Operation, states: tuple = (S.ACTIVATED,)) -> str | None:
    """Why ``operation``'s weight cannot be learned-rounded (None: it can): a Conv (2-D), Gemm or MatMul (a 2-D
    second input, fewer than 8 bits) whose weight is a parameter of its own, its config in one of ``states`` with
    a scale."""
    if operation.type not in ROUNDING_TYPES or len(operation.inputs) < 2:
        return "not a Conv, Gemm or MatMul"
    weight = operation.inputs[1]
    if weight is None or not weight.is_parameter or any(c is not operation for c in weight.consumers):
        return "weight is not a parameter of its own"
    if operation.type == "MatMul" and (weight.value.ndim != 2 or operation.inputs[0].is_parameter):
        return "MatMul whose weight is not a 2-D second input"
    config = input_config(operation, 1)
    if config is None or config.state not in states or config.scale is None:
        return f"weight config is {None if config is None else config.state.name}, not " \
               f"{' or '.join(state.name for state in states)}"
    if operation.type == "MatMul" and config.num_of_bits >= 8:   # measured: no gain for the time (RECIPES, round 18)
        return "MatMul weight of 8 bits or more (nearest rounding)"
    if operation.type == "Gemm" and operation.attributes.get("transA", 0):
        return "Gemm with transA"
    if operation.type == "Conv" and conv_geometry(operation, weight.value) is None:
        return "only 2-D convolutions with explicit pads"
    return None


class AdaroundPass(QuantizationOptimizationPass):
    """Learned rounding of Conv/Gemm weights, baked by the pass itself (see the module docstring).

    ``steps``: Adam iterations per layer; ``samples``: rows (output positions)
    per layer drawn from the calibration data in all; ``lr``, ``lam``
    (regularizer weight, relative to the layer's nearest-rounding error),
    ``warmup``: the fraction of iterations without the regularizer;
    ``scale_search``: search the weight range first; ``calib_batches``:
    batches to draw rows from (None: the pipeline's ``calib_steps``); ``time_budget_s``: seconds the pass
    may take from its start, or a TimeBudget shared with later passes (None: no limit): when they are spent the layers not yet done keep nearest
    rounding (the baking pass rounds them), so the pass always leaves a valid graph; ``backend`` 'local' or
    'ray' and ``workers``: where the layers are rounded (see the module docstring).
    """

    name = "adaround"

    def __init__(self, steps: int = 500, samples: int = 4096, lr: float = 3e-2, lam: float = 0.1,
                 warmup: float = 0.2, scale_search: bool = True, inputs: str = "quantized",
                 calib_batches: int | None = None, seed: int = 0, verbose: bool = True,
                 time_budget_s: float | None = None, backend: str = "local", workers: int = 2):
        if steps < 1 or samples < 1:
            raise ValueError("adaround needs steps >= 1 and samples >= 1")
        if inputs not in ("quantized", "float"):
            raise ValueError(f"adaround inputs must be 'quantized' or 'float', not {inputs!r}")
        self.inputs = inputs
        self.steps, self.samples, self.lr, self.lam, self.warmup = int(steps), int(samples), lr, lam, warmup
        self.scale_search = bool(scale_search)
        self.calib_batches, self.seed, self.verbose = calib_batches, seed, verbose
        self.time_budget_s = time_budget_s
        self.backend, self.workers = backend, workers

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        deadline = TimeBudget.of(self.time_budget_s).deadline()
        executor = executor or NumpyExecutor(graph)
        stats, skipped = {}, []
        for operation in configured_operations(graph):
            if operation.type not in ROUNDING_TYPES:
                continue
            reason = rounding_unsupported(operation)
            if reason is None:
                stats[operation.name] = LayerStatistics(operation)
            else:
                skipped.append({"op": operation.name, "reason": reason})
        if not stats:
            return {"layers": 0, "skipped": len(skipped), "skipped_ops": skipped}
        batches_wanted = self.calib_batches if self.calib_batches is not None else calib_steps
        known = batches_wanted
        if known is None:
            try:
                known = len(dataloader)  # type: ignore[arg-type]
            except TypeError:
                known = 8
        hook = RowHook(stats, max(1, math.ceil(self.samples / max(1, known))), self.seed)
        batches = 0
        for batch in iterate_calibration(dataloader, batches_wanted, collate_fn, "adaround rows", self.verbose):
            if self.inputs == "float":
                with dequantized(graph):
                    executor.forward(batch, hooks=[hook])
            else:
                executor.forward(batch, hooks=[hook])   # one pass serves every layer
            batches += 1
            if time.perf_counter() >= deadline:
                break  # the rows so far serve; every layer is then left to nearest rounding below
        capture_seconds = time.perf_counter() - started
        peak = sum(s.nbytes for s in stats.values())
        layers, budget_spent = [], False
        items = []
        for name, stat in stats.items():
            if stat.rows == 0:
                skipped.append({"op": name, "reason": "not reached by the calibration data"})
            else:
                stat.finish()
                items.append((name, stat))
        stats.clear()   # (the items hold them; each is freed once its layer is done)
        job = RoundingJob(graph, self.steps, self.lr, self.lam, self.warmup, self.scale_search,
                          RoundingJob.wall_time_of(deadline), progress=self.verbose and self.backend == "local")
        chunks = longest_first_chunks([layer_cost(stat) for _, stat in items], self.workers) \
            if self.backend == "ray" else None
        mapped = map_items(round_layers, job, items, self.backend, self.workers, chunks=chunks)
        for (name, _), result in zip(items, mapped.results):
            if result is None:
                budget_spent = True
                seconds = TimeBudget.of(self.time_budget_s).seconds
                skipped.append({"op": name, "reason": f"time budget of {seconds} s spent"})
            else:
                layers.append(self._bake_layer(graph.operations[name], result))
        improved = [f for f in layers if f["kept_learned"]]
        return {"layers": len(layers), "improved": len(improved), "batches": batches, "steps": self.steps,
                "samples": self.samples, "scale_search": self.scale_search, "inputs": self.inputs,
                "capture_seconds": round(capture_seconds, 3), "statistics_bytes": int(peak),
                "mean_relative_error_nearest": float(np.mean([f["relative_nearest"] for f in layers])) if layers else 0.0,
                "mean_relative_error_learned": float(np.mean([min(f["relative_learned"], f["relative_nearest"])
                                                              for f in layers])) if layers else 0.0,
                "skipped": len(skipped), "time_budget_s": TimeBudget.of(self.time_budget_s).seconds, "budget_spent": budget_spent,
                "backend": self.backend, **mapped.report(),
                "layer_details": layers, "skipped_ops": skipped}

    @staticmethod
    def _bake_layer(operation: Operation, result: dict) -> dict:
        """Write one layer's rounding (``adaround_rounding.round_layer``'s result) into its weight config:
        the searched range, the rounded weight baked; its facts (but for the seconds) into the detail."""
        config = input_config(operation, 1)
        if result["scale"] is not None:
            config.set_scale_offset(result["scale"], result["offset"])
        config.baked_value = result["value"]
        config.state = S.BAKED
        facts = result["facts"]
        config.detail["adaround"] = {k: (round(v, 8) if isinstance(v, float) else v) for k, v in facts.items()
                                     if k not in ("op", "seconds")}
        return facts
