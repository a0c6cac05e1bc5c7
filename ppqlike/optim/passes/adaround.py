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
any group) and Gemm ops whose weight is a parameter read by that op alone;
with ``inputs='quantized'`` the calibrated activation configs too.
Writes: the weight config's scale/offset (scale search; the PASSIVE bias
follows it, S_input * S_weight), then ``config.baked_value`` = the weight
rounded as learned and state BAKED (the baking pass then leaves it alone).
``config.detail['adaround']`` records the layer's errors.  The FP32 weight
in ``Variable.value`` is kept.

Time budget: checked between batches of the row capture, between layers and
every 16 iterations inside a layer; a layer stopped early is judged like a
finished one (its hard rounding kept only if better than nearest), the layers
not reached keep nearest rounding.  The rows live in ``adaround_rows.py``.

Use: 4-bit weights (``ACADEMIC_W4A8``), where rounding matters most; 8-bit
weights in the ``best`` recipe.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Sequence

import numpy as np
from tqdm import tqdm

from ...core import numerics
from ...core.ir import Graph, Operation
from ...core.quant import QuantizationStates, TensorQuantizationConfig
from ...core.quant_graph import configured_operations, input_config
from ...executor import NumpyExecutor
from ...executor.simulation import dequantized
from ..base import QuantizationOptimizationPass, TimeBudget, iterate_calibration
from .adaround_rows import LayerStatistics, RowHook, as_groups, broadcast, conv_geometry, from_groups

S = QuantizationStates
ZETA, GAMMA = 1.1, -0.1


def _supported(operation: Operation, graph: Graph) -> str | None:
    """Why ``operation`` cannot be learned-rounded (None: it can)."""
    if operation.type not in ("Conv", "Gemm") or len(operation.inputs) < 2:
        return "not a Conv or Gemm"
    weight = operation.inputs[1]
    if weight is None or not weight.is_parameter or any(c is not operation for c in weight.consumers):
        return "weight is not a parameter of its own"
    config = input_config(operation, 1)
    if config is None or config.state is not S.ACTIVATED or config.scale is None:
        return f"weight config is {None if config is None else config.state.name}, not ACTIVATED"
    if operation.type == "Gemm" and operation.attributes.get("transA", 0):
        return "Gemm with transA"
    if operation.type == "Conv" and conv_geometry(operation, weight.value) is None:
        return "only 2-D convolutions with explicit pads"
    return None


# ---------------------------------------------------------------- rounding
class _Rounder:
    """The soft-rounding problem of one layer: V, h(V), the quantized weight and their gradients (float32: the
    steps' arithmetic; the grid values floor, offset and the config's float32 scale are exact in it)."""

    def __init__(self, operation: Operation, config: TensorQuantizationConfig):
        weight = operation.inputs[1].value.astype(np.float64)
        self.shape = weight.shape
        scale = broadcast(config, config.scale, weight.shape)
        offset = broadcast(config, config.offset, weight.shape)
        scale, offset = as_groups(operation, scale), as_groups(operation, offset)
        grouped = as_groups(operation, weight)
        floor = np.floor(grouped / scale)
        rest = grouped / scale - floor
        p = np.clip((rest - GAMMA) / (ZETA - GAMMA), 1e-6, 1 - 1e-6)
        self.v = np.log(p / (1 - p)).astype(np.float32)
        self.scale, self.offset, self.floor = (a.astype(np.float32) for a in (scale, offset, floor))
        self.qmin, self.qmax = config.quant_min, config.quant_max

    def soft(self):
        sig = np.float32(1.0) / (np.float32(1.0) + np.exp(-self.v))
        raw = sig * (ZETA - GAMMA) + GAMMA
        return np.clip(raw, 0.0, 1.0), raw, sig

    def weight(self, h: np.ndarray):
        q = self.floor + h + self.offset
        clamped = np.clip(q, self.qmin, self.qmax)
        return self.scale * (clamped - self.offset), (q >= self.qmin) & (q <= self.qmax)

    def hard(self) -> np.ndarray:
        return (self.v >= 0).astype(np.float32)


def _nearest(operation: Operation, config: TensorQuantizationConfig) -> np.ndarray:
    return as_groups(operation, config.fake_quantize(operation.inputs[1].value).astype(np.float64))


def search_weight_scale(stat: LayerStatistics, operation: Operation, config: TensorQuantizationConfig,
                        ratios: Sequence[float] = tuple(np.linspace(0.3, 1.0, 36))) -> dict:
    """Clip the weight range by the ratio (per channel when the config is) that reconstructs the layer best.

    Candidate ranges are ratio * [min, max] of the weight (per channel or per tensor, as the
    parameter pass measured them); each is scored with nearest rounding on the layer's statistics
    and the best one's scale/offset is written into the (ACTIVATED) config.
    """
    weight = operation.inputs[1].value.astype(np.float64)
    per_channel = bool(config.policy.per_channel) and config.scale is not None and config.scale.ndim == 1
    if per_channel:
        axis = config.channel_axis % weight.ndim
        others = tuple(a for a in range(weight.ndim) if a != axis)
        low, high = weight.min(axis=others), weight.max(axis=others)
    else:
        low, high = np.array(weight.min()), np.array(weight.max())
    policy = config.policy
    candidates, scores = [], []
    for ratio in list(ratios) + [1.0]:
        scale, offset = numerics.minmax_to_scale_offset(
            low * ratio, high * ratio, config.quant_min, config.quant_max, symmetric=policy.symmetric,
            power_of_2=policy.power_of_2, rounding=config.rounding)
        scale, offset = np.asarray(scale, np.float32), np.asarray(offset, np.int64)
        axis_view = config.channel_axis if per_channel else None
        approx = numerics.fake_quantize(weight.astype(np.float32), scale, offset, config.quant_min,
                                        config.quant_max, config.rounding, channel_axis=axis_view)
        score = stat.channel_errors(as_groups(operation, approx.astype(np.float64))).reshape(-1)
        candidates.append((scale, offset))
        scores.append(score)
    scores = np.array(scores)                                               # [ratios, channels]
    before = float(scores[-1].sum())
    if per_channel:
        best = np.argmin(scores, axis=0)
        scale = np.array([candidates[b][0][c] for c, b in enumerate(best)], np.float32)
        offset = np.array([np.broadcast_to(candidates[b][1], candidates[b][0].shape)[c]
                           for c, b in enumerate(best)], np.int64)
        after = float(scores[best, np.arange(scores.shape[1])].sum())
        chosen = [float(list(ratios)[b]) if b < len(ratios) else 1.0 for b in best]
        ratio = float(np.mean(chosen))
    else:
        best = int(np.argmin(scores.sum(axis=1)))
        scale, offset = candidates[best]
        after = float(scores[best].sum())
        ratio = float(list(ratios)[best]) if best < len(ratios) else 1.0
    if after < before:
        config.set_scale_offset(scale, offset)
    return {"clip_ratio": ratio, "scale_changed": bool(after < before)}


def learn_rounding(stat: LayerStatistics, operation: Operation, config: TensorQuantizationConfig,
                   steps: int = 500, lr: float = 3e-2, lam: float = 0.1, warmup: float = 0.2,
                   beta: tuple = (20.0, 2.0), deadline: float = float("inf")) -> tuple[np.ndarray, dict]:
    """Optimize the rounding of one layer; returns (weight as [G, O, K], facts).  At ``deadline`` (a
    ``time.perf_counter()`` value) the iterations stop and the rounding reached so far is judged as at the end."""
    rounder = _Rounder(operation, config)
    nearest = _nearest(operation, config)
    nearest_loss = stat.loss(nearest)
    # the reconstruction term is divided by the nearest-rounding loss so that lam means the same in every layer
    norm = 1.0 / max(nearest_loss, 1e-30)
    m = np.zeros_like(rounder.v)
    v2 = np.zeros_like(rounder.v)
    b1, b2, eps = 0.9, 0.999, 1e-8
    start = int(warmup * steps)
    done = steps
    for t in range(steps):
        if t % 16 == 0 and time.perf_counter() >= deadline:
            done = t
            break
        h, raw, sig = rounder.soft()
        approx, inside = rounder.weight(h)
        grad_w = stat.gradient(approx)
        grad_h = grad_w * norm * rounder.scale * inside
        if t >= start:
            progress = (t - start) / max(1, steps - start)
            b = beta[1] + (beta[0] - beta[1]) * (1.0 - progress)
            centred = 2.0 * h - 1.0
            grad_h += -lam * b * np.abs(centred) ** (b - 1.0) * np.sign(centred) * 2.0
        grad_v = grad_h * (ZETA - GAMMA) * sig * (1.0 - sig) * ((raw > 0.0) & (raw < 1.0))
        m = b1 * m + (1 - b1) * grad_v
        v2 = b2 * v2 + (1 - b2) * grad_v * grad_v
        rounder.v -= lr * (m / (1 - b1 ** (t + 1))) / (np.sqrt(v2 / (1 - b2 ** (t + 1))) + eps)
    learned, _ = rounder.weight(rounder.hard())
    learned_loss = stat.loss(learned)
    h, _, _ = rounder.soft()
    energy = max(stat.energy, 1e-30)
    facts = {"nearest_loss": nearest_loss, "learned_loss": learned_loss,
             "relative_nearest": nearest_loss * stat.rows / energy,
             "relative_learned": learned_loss * stat.rows / energy,
             "changed": float(np.mean(learned != nearest)),
             "undecided": float(np.mean((h > 0.01) & (h < 0.99))), "rows": stat.rows, "steps_done": done}
    return learned, facts


class AdaroundPass(QuantizationOptimizationPass):
    """Learned rounding of Conv/Gemm weights, baked by the pass itself (see the module docstring).

    ``steps``: Adam iterations per layer; ``samples``: rows (output positions)
    per layer drawn from the calibration data in all; ``lr``, ``lam``
    (regularizer weight, relative to the layer's nearest-rounding error),
    ``warmup``: the fraction of iterations without the regularizer;
    ``scale_search``: search the weight range first; ``calib_batches``:
    batches to draw rows from (None: the pipeline's ``calib_steps``); ``time_budget_s``: seconds the pass
    may take from its start, or a TimeBudget shared with later passes (None: no limit): when they are spent the layers not yet done keep nearest
    rounding (the baking pass rounds them), so the pass always leaves a valid graph.
    """

    name = "adaround"

    def __init__(self, steps: int = 500, samples: int = 4096, lr: float = 3e-2, lam: float = 0.1,
                 warmup: float = 0.2, scale_search: bool = True, inputs: str = "quantized",
                 calib_batches: int | None = None, seed: int = 0, verbose: bool = True,
                 time_budget_s: float | None = None):
        if steps < 1 or samples < 1:
            raise ValueError("adaround needs steps >= 1 and samples >= 1")
        if inputs not in ("quantized", "float"):
            raise ValueError(f"adaround inputs must be 'quantized' or 'float', not {inputs!r}")
        self.inputs = inputs
        self.steps, self.samples, self.lr, self.lam, self.warmup = int(steps), int(samples), lr, lam, warmup
        self.scale_search = bool(scale_search)
        self.calib_batches, self.seed, self.verbose = calib_batches, seed, verbose
        self.time_budget_s = time_budget_s

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        deadline = TimeBudget.of(self.time_budget_s).deadline()
        executor = executor or NumpyExecutor(graph)
        stats, skipped = {}, []
        for operation in configured_operations(graph):
            if operation.type not in ("Conv", "Gemm"):
                continue
            reason = _supported(operation, graph)
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
        for name in tqdm(list(stats), desc="adaround layers", disable=not self.verbose, leave=False):
            stat = stats.pop(name)  # freed once its layer is done
            if stat.rows == 0:
                skipped.append({"op": name, "reason": "not reached by the calibration data"})
            elif budget_spent or (budget_spent := time.perf_counter() >= deadline):
                skipped.append({"op": name, "reason": f"time budget of {self.time_budget_s} s spent"})
            else:
                layers.append(self._round_layer(graph.operations[name], stat, deadline))
        improved = [f for f in layers if f["kept_learned"]]
        return {"layers": len(layers), "improved": len(improved), "batches": batches, "steps": self.steps,
                "samples": self.samples, "scale_search": self.scale_search, "inputs": self.inputs,
                "capture_seconds": round(capture_seconds, 3), "statistics_bytes": int(peak),
                "mean_relative_error_nearest": float(np.mean([f["relative_nearest"] for f in layers])) if layers else 0.0,
                "mean_relative_error_learned": float(np.mean([min(f["relative_learned"], f["relative_nearest"])
                                                              for f in layers])) if layers else 0.0,
                "skipped": len(skipped), "time_budget_s": TimeBudget.of(self.time_budget_s).seconds, "budget_spent": budget_spent,
                "layer_details": layers, "skipped_ops": skipped}

    def _round_layer(self, operation: Operation, stat: LayerStatistics, deadline: float = float("inf")) -> dict:
        config = input_config(operation, 1)
        stat.finish()
        begin = time.perf_counter()
        searched = search_weight_scale(stat, operation, config) if self.scale_search else {}
        learned, facts = learn_rounding(stat, operation, config, self.steps, self.lr, self.lam, self.warmup,
                                        deadline=deadline)
        kept = facts["learned_loss"] <= facts["nearest_loss"]
        weight = learned if kept else _nearest(operation, config)
        value = from_groups(operation, weight, operation.inputs[1].value.shape)
        config.baked_value = value.astype(np.float32)
        config.state = S.BAKED
        facts.update(searched)
        facts.update({"op": operation.name, "kept_learned": bool(kept),
                      "seconds": round(time.perf_counter() - begin, 3)})
        config.detail["adaround"] = {k: (round(v, 8) if isinstance(v, float) else v) for k, v in facts.items()
                                     if k != "op"}
        return facts
