"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization"): balance weight ranges across pairs.

For a pair of computing ops A -> (activation, pooling, padding ...) -> B whose
in-between ops commute with a positive per-channel scaling, output channel i
of A is divided by s_i (weights and bias) and input channel i of B is
multiplied by s_i.  With s_i = sqrt(r1_i / r2_i), where r1_i is the range of
A's output channel i and r2_i the range of B's input channel i, both become
sqrt(r1_i * r2_i): the per-channel ranges of each weight tensor move closer
together, which is what per-tensor weight quantization needs.  The pass
sweeps all pairs ``iterations`` times (each sweep recomputes the ranges), so
chains Conv -> Clip -> depthwise Conv -> Clip -> Conv are balanced along the
whole chain.

Reads: the FP32 ``Variable.value`` of the weights and biases of TARGET
Conv/Gemm ops (ops with a config) whose weight configs are still INITIAL,
i.e. the pass must run before the parameter pass.
Writes: ``Variable.value`` of those weights and biases (float32, new
arrays); no config and no state changes.

Ops between A and B (all TARGET, each read only by the next, none a graph
output): Relu, LeakyRelu, PRelu, MaxPool, AveragePool, GlobalAveragePool,
GlobalMaxPool, Identity, Dropout and Pad (constant 0, reflect or edge; no
padding of the batch or channel axis) are positively homogeneous per
channel, so the FP32 function is unchanged exactly (up to float rounding).

Clip is not: Clip(x / s_i, lo, hi) = Clip(x, lo * s_i, hi * s_i) / s_i, so
scaling channel i moves its bounds to (lo * s_i, hi * s_i), and ONNX Clip has
only scalar bounds (replacing ReLU6 by ReLU, as AIMET does, is no way out:
it turns EfficientNet-Lite0's FP32 output cosine into 0.69).  ``clip`` says
what to do with a pair through a Clip:

* ``"exact"`` (default): channel i may move only when the Clip provably never
  cuts it, before or after scaling.  Its pre-activation is bounded by
  interval arithmetic on A's weights and bias, given that A's input is the
  output of an upstream Clip (possibly through a zero Pad or a max pooling);
  a channel inside (lo, hi) may take any s_i >= high_i / hi (and
  >= low_i / lo for a negative lo).  A bound at 0 or infinity scales
  exactly, so Clip(0, inf) is a Relu.  Every other channel keeps s_i = 1.
  The FP32 function is unchanged (to float rounding; tested to 1e-4
  relative), but ReLU6 networks have few such channels: the channels with
  the widest weights are those that saturate.
* ``"skip"``: pairs through a bounded Clip are left alone.

The scales.  With some channels fixed, what per-tensor quantization cares
about is T1 * T2, the product of the two tensors' largest ranges (the sum of
r1_i * r2_i does not change).  The pass makes T1 * T2 as small as the fixed
channels allow and then gives every free channel the same relative
precision in both tensors: s_i = sqrt(r1_i * T2 / (r2_i * T1)), kept in
[r1_i / T1, T2 / r2_i] so that no free channel exceeds the targets.  With no
fixed channel this is Nagel's s_i = sqrt(r1_i / r2_i).  A free channel that
the legal scales (exactness, ``max_scale``) cannot keep under the targets is
fixed too.  So one sweep over a pair never widens that pair's ranges; but
consecutive pairs share a weight tensor (B of one pair is A of the next),
so the sweeps are repeated.  The report gives, per pair and on average, the
spread log10(largest / geometric mean) of A's output-channel and B's
input-channel ranges, before and after.

Weights or biases read by any other op, ops without a config (FP32 or SOI
by dispatch), grouped B convolutions whose groups are not depthwise or 1,
and weights whose configs already hold scales are skipped; the report says
why for each skipped pair.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.ir import Graph
from ..base import QuantizationOptimizationPass
from .equalization_pairs import (EqualizationPair, clip_bounds, find_pairs, first_ranges, preactivation_bounds,
                                 scale_first, scale_second, second_ranges)

_CLIP_MODES = ("exact", "skip")


class LayerwiseEqualizationPass(QuantizationOptimizationPass):
    """Cross-layer equalization of Conv/Gemm pairs (see the module docstring).

    ``iterations``: sweeps over all pairs.  ``clip``: 'exact' | 'skip'.
    ``max_scale``: every s_i stays in [1/max_scale, max_scale], so that a
    nearly dead channel does not blow an activation range up.
    ``min_range``: channels whose weight range is below this (relative to the
    tensor's largest) keep s_i = 1.  The report counts Clip channels found
    safe or fixed in the first sweep.
    """

    name = "equalization"

    def __init__(self, iterations: int = 10, clip: str = "exact", max_scale: float = 16.0,
                 min_range: float = 1e-6):
        if clip not in _CLIP_MODES:
            raise ValueError(f"equalization clip mode must be one of {_CLIP_MODES}, not {clip!r}")
        if iterations < 1:
            raise ValueError(f"equalization iterations must be >= 1, got {iterations}")
        self.iterations, self.clip = int(iterations), clip
        self.max_scale, self.min_range = float(max_scale), float(min_range)

    # ---------------------------------------------------------------- scales
    def _pair_scales(self, pair: EqualizationPair, graph: Graph, stats: dict) -> np.ndarray:
        """The scales of one sweep over ``pair`` (ones where a channel must not move)."""
        r1 = first_ranges(pair.first)
        r2 = second_ranges(pair.second, r1.size)
        free = (r1 > self.min_range * max(r1.max(), 1e-30)) & (r2 > self.min_range * max(r2.max(), 1e-30))
        lowest = np.zeros_like(r1)                      # smallest scale that keeps a channel exact
        if pair.clip is not None:
            lo, hi = clip_bounds(pair.clip)
            low_free, high_free = lo in (0.0, -np.inf), hi in (0.0, np.inf)  # bounds at 0/inf scale exactly
            if not (low_free and high_free):
                bounds = preactivation_bounds(pair.first, graph)
                if bounds is None:
                    stats["clip_fixed_channels"] += int(r1.size)
                    return np.ones_like(r1)
                low, high = bounds
                # never cut now (high <= hi, low >= lo) and never cut after scaling: s_i >= high/hi, low/lo
                inactive = (high_free | (high <= hi)) & (low_free | (low >= lo))
                if not high_free:
                    lowest = np.maximum(lowest, np.maximum(high, 0.0) / hi)
                if not low_free:
                    lowest = np.maximum(lowest, np.minimum(low, 0.0) / lo)
                stats["clip_safe_channels"] += int((free & inactive).sum())
                stats["clip_fixed_channels"] += int((free & ~inactive).sum())
                free &= inactive
        scale = np.ones_like(r1)
        # Fixed channels keep their ranges; the product of the two tensors' largest ranges, T1 * T2, is
        # what per-tensor precision depends on (the sum of r1_i * r2_i does not change): make it as small
        # as the fixed channels allow, then give each free channel equal precision in both tensors.  A
        # free channel whose legal scales (exactness, max_scale) cannot keep it under the targets is fixed.
        while free.any():
            t1, t2 = _targets(r1[~free].max(initial=0.0), r2[~free].max(initial=0.0),
                              float((r1 * r2)[free].max()))
            low = np.maximum.reduce([r1 / t1, lowest, np.full_like(r1, 1.0 / self.max_scale)])
            high = np.minimum(t2 / np.maximum(r2, 1e-300), self.max_scale)
            feasible = low <= high * (1 + 1e-9)
            if np.all(feasible[free]):
                wanted = np.sqrt(r1 * t2 / (np.maximum(r2, 1e-300) * t1))
                scale[free] = np.clip(wanted, low, np.maximum(low, high))[free]
                break
            free &= feasible
        return scale

    # ------------------------------------------------------------------ run
    def optimize(self, graph: Graph, **kwargs) -> dict:
        pairs, skipped = find_pairs(graph)
        if self.clip == "skip":
            kept = []
            for pair in pairs:
                if pair.clip is not None:
                    skipped.append({"pair": pair.name, "reason": f"through Clip {pair.clip.name} (clip='skip')"})
                else:
                    kept.append(pair)
            pairs = kept
        before = {pair.name: _pair_spread(pair) for pair in pairs}
        total = {pair.name: np.ones(first_ranges(pair.first).size) for pair in pairs}
        stats = {"clip_safe_channels": 0, "clip_fixed_channels": 0}
        for sweep in range(self.iterations):
            for pair in pairs:
                scale = self._pair_scales(pair, graph, stats if sweep == 0 else dict(stats))
                scale_first(pair.first, scale)
                scale_second(pair.second, scale)
                total[pair.name] *= scale
        report_pairs = []
        for pair in pairs:
            scale = total[pair.name]
            report_pairs.append({
                "first": pair.first.name, "second": pair.second.name,
                "between": [op.name for op in pair.between], "channels": int(scale.size),
                "scale_min": float(scale.min()), "scale_max": float(scale.max()),
                "channels_scaled": int(np.sum(np.abs(scale - 1) > 1e-6)),
                "spread_before": before[pair.name], "spread_after": _pair_spread(pair)})
        return {"pairs": len(pairs), "iterations": self.iterations, "clip_mode": self.clip,
                "channels_scaled": int(sum(p["channels_scaled"] for p in report_pairs)),
                "mean_spread_before": _mean(p["spread_before"] for p in report_pairs),
                "mean_spread_after": _mean(p["spread_after"] for p in report_pairs),
                **{k: v for k, v in stats.items() if v}, "skipped": len(skipped),
                "pair_details": report_pairs, "skipped_pairs": skipped}


def _targets(fixed1: float, fixed2: float, product: float) -> tuple[float, float]:
    """Smallest largest-ranges (T1, T2) with T1 >= fixed1, T2 >= fixed2 and T1 * T2 >= product."""
    if fixed1 * fixed2 >= product and fixed1 > 0 and fixed2 > 0:
        return fixed1, fixed2
    if fixed1 <= 0 and fixed2 <= 0:
        root = math.sqrt(product)
        return root, root
    if fixed2 <= 0:
        t1 = max(fixed1, math.sqrt(product))
        return t1, product / t1
    if fixed1 <= 0:
        t2 = max(fixed2, math.sqrt(product))
        return product / t2, t2
    t1 = max(fixed1, math.sqrt(product * fixed1 / fixed2))
    return t1, product / t1


def _log_spread(ranges: np.ndarray) -> float:
    """log10(largest / geometric mean) of the nonzero channel ranges (0 for none)."""
    ranges = ranges[ranges > 0]
    return float(np.log10(ranges.max()) - np.mean(np.log10(ranges))) if ranges.size else 0.0


def _pair_spread(pair: EqualizationPair) -> float:
    """Spread of the ranges the pair equalizes: A's output channels and B's input channels, averaged."""
    first = first_ranges(pair.first)
    return 0.5 * (_log_spread(first) + _log_spread(second_ranges(pair.second, first.size)))


def _mean(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else 0.0
