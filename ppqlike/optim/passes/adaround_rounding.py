"""The rounding of one layer (learned rounding, ``adaround.py``): the weight range search and the Adam
iterations on the soft rounding, and :func:`round_layers`, the form ``distributed.map_items`` runs here or on
Ray workers.

A layer's result is a function of its weight, its weight config as the pass found it, its statistics
(``adaround_rows.LayerStatistics``) and the settings in :class:`RoundingJob`; no random numbers are drawn
(the rows were sampled by the pass before), so the layers can be split over workers in any way and give the
same bits.  A deadline (the pass's time budget) travels as a wall-clock time and each process turns it into
its own ``time.perf_counter()`` value.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from tqdm import tqdm

from ...core import numerics
from ...core.ir import Graph, Operation
from ...core.quant import TensorQuantizationConfig
from ...core.quant_graph import input_config
from .adaround_rows import LayerStatistics, as_groups, broadcast, from_groups

ZETA, GAMMA = 1.1, -0.1
#: a nearest rounding whose loss is at most this fraction of the layer's output energy is exact (the weights lie
#: on the grid to float precision): dividing by that loss overflowed Adam's second moment (MobileNetV2's first
#: conv with 8-bit weights), so the layer keeps it without iterations
EXACT = 1e-12


# ---------------------------------------------------------------- rounding
class SoftRounding:
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


class RoundingAdam:
    """Adam on a SoftRounding's V for the reconstruction gradient with respect to h plus AdaRound's regularizer
    lam * sum(1 - |2h - 1|^b), b annealed from ``beta[0]`` to ``beta[1]`` over the steps after ``start``."""

    B1, B2, EPS = 0.9, 0.999, 1e-8

    def __init__(self, rounder: SoftRounding, lr: float, lam: float, beta: tuple = (20.0, 2.0)):
        self.rounder, self.lr, self.lam, self.beta = rounder, lr, lam, beta
        self.m, self.v2 = np.zeros_like(rounder.v), np.zeros_like(rounder.v)

    def step(self, t: int, start: int, steps: int, grad_h: np.ndarray, h: np.ndarray, raw: np.ndarray,
             sig: np.ndarray) -> None:
        """Step ``t`` (from 0) of ``steps``, regularized from ``start``; ``grad_h``: the reconstruction's
        gradient with respect to h; h, raw, sig: ``rounder.soft()`` at this step."""
        if t >= start:
            progress = (t - start) / max(1, steps - start)
            b = self.beta[1] + (self.beta[0] - self.beta[1]) * (1.0 - progress)
            centred = 2.0 * h - 1.0
            grad_h = grad_h + -self.lam * b * np.abs(centred) ** (b - 1.0) * np.sign(centred) * 2.0
        grad_v = grad_h * (ZETA - GAMMA) * sig * (1.0 - sig) * ((raw > 0.0) & (raw < 1.0))
        b1, b2 = self.B1, self.B2
        self.m = b1 * self.m + (1 - b1) * grad_v
        self.v2 = b2 * self.v2 + (1 - b2) * grad_v * grad_v
        self.rounder.v -= self.lr * (self.m / (1 - b1 ** (t + 1))) / (np.sqrt(self.v2 / (1 - b2 ** (t + 1))) + self.EPS)


def nearest_rounding(operation: Operation, config: TensorQuantizationConfig) -> np.ndarray:
    """The weight rounded to nearest on ``config``'s grid, as [G, O, K] float64."""
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


#: steps a time-fitted optimization runs before its time per step is known (:func:`fitted_steps`)
PROBE_STEPS = 8


def fitted_steps(steps: int, seconds: float, probe_seconds: float) -> int:
    """The steps (the probe's included) an optimization runs in ``seconds`` when its first ``PROBE_STEPS`` took
    ``probe_seconds``: as many as fit, at most ``steps``, at least the probe."""
    per_step = max(probe_seconds / PROBE_STEPS, 1e-9)
    return int(min(steps, max(PROBE_STEPS, seconds / per_step)))


def learn_rounding(stat: LayerStatistics, operation: Operation, config: TensorQuantizationConfig,
                   steps: int = 500, lr: float = 3e-2, lam: float = 0.1, warmup: float = 0.2,
                   beta: tuple = (20.0, 2.0), deadline: float = float("inf"),
                   seconds: float = float("inf")) -> tuple[np.ndarray, dict]:
    """Optimize the rounding of one layer; returns (weight as [G, O, K], facts).  With ``seconds`` finite, the
    steps are as many of ``steps`` as fit in it (:func:`fitted_steps`; the annealing follows them).  At
    ``deadline`` (a ``time.perf_counter()`` value) the iterations stop and the rounding reached so far is
    judged as at the end."""
    rounder = SoftRounding(operation, config)
    nearest = nearest_rounding(operation, config)
    nearest_loss = stat.loss(nearest)
    if nearest_loss * stat.rows <= EXACT * max(stat.energy, 1e-30):   # the weights lie on the grid
        return nearest, _facts(stat, nearest_loss, nearest_loss, changed=0.0, undecided=0.0, steps_done=0)
    # the reconstruction term is divided by the nearest-rounding loss so that lam means the same in every layer
    norm = 1.0 / nearest_loss
    adam = RoundingAdam(rounder, lr, lam, beta)
    start = int(warmup * steps)
    began = time.perf_counter()
    t = 0
    while t < steps:
        if t == PROBE_STEPS and seconds < float("inf"):
            steps = fitted_steps(steps, seconds, time.perf_counter() - began)
            start = int(warmup * steps)
            if t >= steps:
                break
        if t % 16 == 0 and time.perf_counter() >= deadline:
            break
        h, raw, sig = rounder.soft()
        approx, inside = rounder.weight(h)
        grad_w = stat.gradient(approx)
        adam.step(t, start, steps, grad_w * norm * rounder.scale * inside, h, raw, sig)
        t += 1
    done = t
    learned, _ = rounder.weight(rounder.hard())
    learned_loss = stat.loss(learned)
    h, _, _ = rounder.soft()
    return learned, _facts(stat, nearest_loss, learned_loss, changed=float(np.mean(learned != nearest)),
                           undecided=float(np.mean((h > 0.01) & (h < 0.99))), steps_done=done)


def _facts(stat, nearest_loss: float, learned_loss: float, changed: float, undecided: float,
           steps_done: int) -> dict:
    """What :func:`learn_rounding` reports of one layer (losses also relative to its output energy)."""
    energy = max(stat.energy, 1e-30)
    return {"nearest_loss": nearest_loss, "learned_loss": learned_loss,
            "relative_nearest": nearest_loss * stat.rows / energy,
            "relative_learned": learned_loss * stat.rows / energy,
            "changed": changed, "undecided": undecided, "rows": stat.rows, "steps_done": steps_done}


# ---------------------------------------------------------------- one layer, here or on a worker
@dataclass
class RoundingJob:
    """What the rounding of every layer reads: ``graph`` (the weights and their configs as the pass found
    them; left so), the optimization's settings, and ``wall_deadline``, the time budget's end as a
    ``time.time()`` value (inf: no budget)."""

    graph: Graph
    steps: int = 500
    lr: float = 3e-2
    lam: float = 0.1
    warmup: float = 0.2
    scale_search: bool = True
    wall_deadline: float = float("inf")
    progress: bool = False   # a progress bar over the layers (this process only)

    @staticmethod
    def wall_time_of(deadline: float) -> float:
        """A ``time.perf_counter()`` deadline of this process as a wall-clock time, which other processes
        (and machines with synchronised clocks) can read."""
        return deadline if math.isinf(deadline) else time.time() + (deadline - time.perf_counter())

    def deadline(self) -> float:
        """The deadline as a ``time.perf_counter()`` value of this process."""
        if math.isinf(self.wall_deadline):
            return self.wall_deadline
        return time.perf_counter() + (self.wall_deadline - time.time())


#: a layer's cost in multiply-adds of its gradient's matrix product: the element-wise steps over the weight
#: (soft rounding, clamp, Adam) cost as much as ~600 of them per weight, a layer's fixed part ~2e6 (fitted on
#: MobileNetV2's 52 layers at W4A8, 500 steps: 0.04 s to 10.6 s a layer, on this 2-core machine)
ELEMENTWISE_COST, LAYER_COST = 600, 2e6


def layer_cost(stat: LayerStatistics) -> float:
    """The relative time of rounding ``stat``'s layer, to balance the layers over workers (not a result)."""
    inner = stat.k if stat.gram is not None else 2 * stat.rows
    return float(stat.groups * stat.out * stat.k * (inner + ELEMENTWISE_COST) + LAYER_COST)


def round_layer(job: RoundingJob, name: str, stat: LayerStatistics, deadline: float) -> dict:
    """The rounding of layer ``name``: ``scale``/``offset`` (the searched weight range, None when the
    config's is kept), ``value`` (the weight as rounded, float32, in the weight's shape) and ``facts``.
    Computed on a copy of the weight config: the graph is left as it was found."""
    begin = time.perf_counter()
    operation = job.graph.operations[name]
    config = copy.copy(input_config(operation, 1))
    stat.finish()
    searched = search_weight_scale(stat, operation, config) if job.scale_search else {}
    learned, facts = learn_rounding(stat, operation, config, job.steps, job.lr, job.lam, job.warmup,
                                    deadline=deadline)
    kept = facts["learned_loss"] <= facts["nearest_loss"]
    weight = learned if kept else nearest_rounding(operation, config)
    value = from_groups(operation, weight, operation.inputs[1].value.shape).astype(np.float32)
    facts.update(searched)
    facts.update({"op": name, "kept_learned": bool(kept), "seconds": round(time.perf_counter() - begin, 3)})
    changed = searched.get("scale_changed", False)
    return {"scale": config.scale if changed else None, "offset": config.offset if changed else None,
            "value": value, "facts": facts}


def round_layers(job: RoundingJob, items: list) -> list:
    """:func:`round_layer` of each ``(name, statistics)`` item in order, until the deadline: the layers not
    begun by then give None (they keep nearest rounding).  Each layer's statistics are freed once it is done."""
    deadline = job.deadline()
    results: list = []
    for name, stat in tqdm(items, desc="adaround layers", disable=not job.progress, leave=False):
        if time.perf_counter() >= deadline:
            return results + [None] * (len(items) - len(results))
        results.append(round_layer(job, name, stat, deadline))
        stat.release()
    return results
