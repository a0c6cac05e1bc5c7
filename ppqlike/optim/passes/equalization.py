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
from dataclasses import dataclass

import numpy as np

from ...core.ir import Graph, Operation, Variable
from ...core.op_facts import POSITIVELY_HOMOGENEOUS_TYPES, weight_channel_axis
from ...core.quant import QuantizationStates
from ..base import QuantizationOptimizationPass

S = QuantizationStates

_CLIP_MODES = ("exact", "skip")


@dataclass
class _Pair:
    """A -> [between] -> B: output channel i of A feeds input channel i of B."""

    first: Operation
    between: list
    second: Operation
    clip: Operation | None = None

    @property
    def name(self) -> str:
        return f"{self.first.name} -> {self.second.name}"


# --------------------------------------------------------------------- weights
def _param(operation: Operation, index: int) -> Variable | None:
    variable = operation.inputs[index] if index < len(operation.inputs) else None
    return variable if variable is not None and variable.is_parameter else None


def _output_axis(operation: Operation) -> int | None:
    """Axis of the weight holding output channels (None: unsupported layout)."""
    if operation.type not in ("Conv", "Gemm") or operation.attributes.get("transA", 0):
        return None
    return weight_channel_axis(operation)


def _first_ranges(operation: Operation) -> np.ndarray:
    """max |W| per output channel of ``operation`` (A of a pair)."""
    weight = operation.inputs[1].value
    axis = _output_axis(operation)
    moved = np.moveaxis(np.abs(weight.astype(np.float64)), axis, 0)
    return moved.reshape(moved.shape[0], -1).max(axis=1)


def _second_ranges(operation: Operation, channels: int) -> np.ndarray | None:
    """max |W| per input channel of ``operation`` (B of a pair); None when the layout is not supported."""
    weight = np.abs(operation.inputs[1].value.astype(np.float64))
    if operation.type == "Gemm":
        if operation.attributes.get("transA", 0):
            return None
        matrix = weight if operation.attributes.get("transB", 0) else weight.T   # [out, in]
        return matrix.max(axis=0) if matrix.shape[1] == channels else None
    group = int(operation.attributes.get("group", 1))
    per_group_in = weight.shape[1]
    if per_group_in * group != channels or weight.shape[0] % group:
        return None
    per_group_out = weight.shape[0] // group
    grouped = weight.reshape(group, per_group_out, per_group_in, -1)          # [g, out/g, in/g, k]
    return grouped.max(axis=(1, 3)).reshape(-1)                                # channel i = g * in/g + j


def _scale_first(operation: Operation, scale: np.ndarray) -> None:
    """Divide output channel i of A (weight and bias) by scale[i]."""
    weight = operation.inputs[1]
    axis = _output_axis(operation)
    shape = [1] * weight.value.ndim
    shape[axis] = -1
    weight.value = (weight.value / scale.reshape(shape)).astype(weight.value.dtype)
    bias = _param(operation, 2)
    if bias is not None:
        if operation.type == "Gemm" and bias.value.size != scale.size:
            raise ValueError("Gemm bias does not have one value per output channel")
        bias.value = (bias.value / scale.reshape(bias.value.shape)).astype(bias.value.dtype)


def _scale_second(operation: Operation, scale: np.ndarray) -> None:
    """Multiply input channel i of B by scale[i]."""
    weight = operation.inputs[1]
    value = weight.value
    if operation.type == "Gemm":
        factor = scale.reshape(1, -1) if operation.attributes.get("transB", 0) else scale.reshape(-1, 1)
        weight.value = (value * factor).astype(value.dtype)
        return
    group = int(operation.attributes.get("group", 1))
    per_group_in = value.shape[1]
    per_group_out = value.shape[0] // group
    factor = scale.reshape(group, 1, per_group_in)                      # [g, 1, in/g]
    factor = np.broadcast_to(factor, (group, per_group_out, per_group_in)).reshape(value.shape[0], per_group_in)
    weight.value = (value * factor.reshape(factor.shape + (1,) * (value.ndim - 2))).astype(value.dtype)


# -------------------------------------------------------------- chain checks
def _scalar(value) -> float | None:
    array = np.asarray(value)
    return float(array.reshape(())) if array.size == 1 else None


def _clip_bounds(operation: Operation) -> tuple[float, float] | None:
    """(lo, hi) of a Clip with constant scalar bounds (±inf when absent); None otherwise."""
    if "min" in operation.attributes or "max" in operation.attributes:   # opset < 11
        return float(operation.attributes.get("min", -np.inf)), float(operation.attributes.get("max", np.inf))
    bounds = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        variable = operation.inputs[index] if index < len(operation.inputs) else None
        if variable is None:
            bounds.append(default)
            continue
        if not variable.is_parameter or len(variable.consumers) != 1:
            return None
        value = _scalar(variable.value)
        if value is None:
            return None
        bounds.append(value)
    return bounds[0], bounds[1]


def _pad_is_homogeneous(operation: Operation) -> bool:
    """A Pad that adds no batch/channel entries and fills with 0 (or reflects/copies edges)."""
    mode = operation.attributes.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if "pads" in operation.attributes:                                  # opset < 11
        pads = np.asarray(operation.attributes["pads"])
        value = float(operation.attributes.get("value", 0.0))
    else:
        pad_var = operation.inputs[1] if len(operation.inputs) > 1 else None
        if pad_var is None or not pad_var.is_parameter:
            return False
        pads = np.asarray(pad_var.value).reshape(-1)
        value_var = operation.inputs[2] if len(operation.inputs) > 2 else None
        if value_var is not None and not value_var.is_parameter:
            return False
        value = 0.0 if value_var is None or value_var.value.size == 0 else _scalar(value_var.value)
        if len(operation.inputs) > 3 and operation.inputs[3] is not None:    # axes input: keep it simple
            return False
    if value is None or (mode == "constant" and value != 0.0) or mode not in ("constant", "reflect", "edge"):
        return False
    rank = pads.size // 2
    return rank >= 2 and not np.any(pads[[0, 1, rank, rank + 1]])


def _unshared(variable: Variable | None, operation: Operation, graph: Graph) -> bool:
    return (variable is not None and variable.is_parameter and all(c is operation for c in variable.consumers)
            and variable not in graph.outputs and variable not in graph.inputs)


def _weights_free(operation: Operation, graph: Graph, with_bias: bool) -> str | None:
    """Why the weights of ``operation`` may not change (None: they may)."""
    weight = operation.inputs[1] if len(operation.inputs) > 1 else None
    if not _unshared(weight, operation, graph):
        return f"weight of {operation.name} is not a parameter of its own"
    configs = operation.config.input_quantization_config
    if len(configs) > 1 and configs[1] is not None and configs[1].state is not S.INITIAL:
        return f"weight config of {operation.name} is {configs[1].state.name}, not INITIAL (run before 'parameter')"
    if with_bias:
        bias = operation.inputs[2] if len(operation.inputs) > 2 else None
        if bias is not None and not _unshared(bias, operation, graph):
            return f"bias of {operation.name} is not a parameter of its own"
    if not np.issubdtype(weight.value.dtype, np.floating):
        return f"weight of {operation.name} is not floating point"
    return None


def find_pairs(graph: Graph) -> tuple[list[_Pair], list[dict]]:
    """Every equalizable pair of the graph, and the candidate pairs skipped with their reasons."""
    pairs, skipped = [], []
    for first in graph.topological_sort():
        if first.type not in ("Conv", "Gemm") or _output_axis(first) is None:
            continue
        if len(first.inputs) < 2 or _param(first, 1) is None:
            continue
        between, clip, current = [], None, first.outputs[0]
        second, reason, stop = None, None, None
        while True:
            if current in graph.outputs or len(current.consumers) != 1:
                reason = f"{current.name} is read by {len(current.consumers)} ops or is a graph output"
                break
            consumer = stop = current.consumers[0]
            if consumer.inputs.count(current) != 1 or consumer.inputs[0] is not current:
                reason = f"{consumer.name} reads {current.name} at another slot"
                break
            if consumer.type in ("Conv", "Gemm"):
                second = consumer
                break
            if consumer.config is None:
                reason = f"{consumer.name} ({consumer.type}) is not TARGET (dispatched {_label(consumer)})"
                break
            if consumer.type == "Clip":
                if clip is not None or _clip_bounds(consumer) is None:
                    reason = f"{consumer.name}: a second Clip, or bounds that are not constant scalars"
                    break
                clip = consumer
            elif consumer.type == "Pad":
                if not _pad_is_homogeneous(consumer):
                    reason = f"{consumer.name}: a Pad that fills with a non-zero value or pads channels"
                    break
            elif consumer.type not in POSITIVELY_HOMOGENEOUS_TYPES:
                reason = f"{consumer.name} ({consumer.type}) does not commute with per-channel scaling"
                break
            between.append(consumer)
            current = consumer.outputs[0]
        if second is None:
            if stop is not None and first.config is not None:  # a chain that stops at an op: say why
                skipped.append({"pair": f"{first.name} -> {stop.name}", "reason": reason})
            continue
        for operation in (first, second):
            if reason is None and operation.config is None:
                reason = f"{operation.name} is not TARGET (dispatched {_label(operation)})"
        if reason is None and _param(second, 1) is None:
            reason = f"weight of {second.name} is computed at run time"
        reason = reason or _weights_free(first, graph, True) or _weights_free(second, graph, False)
        if reason is None and _second_ranges(second, _first_ranges(first).size) is None:
            reason = f"{second.name}: weight layout does not match {first.name}'s channels"
        if reason is not None:
            skipped.append({"pair": f"{first.name} -> {second.name}", "reason": reason})
            continue
        pairs.append(_Pair(first, between, second, clip))
    return pairs, skipped


def _label(operation: Operation) -> str:
    return str(getattr(operation.platform, "name", operation.platform))


# ------------------------------------------------------------ interval bounds
def _input_interval(operation: Operation, graph: Graph) -> tuple[float, float] | None:
    """Bounds of every value of ``operation``'s data input, when an upstream Clip/Relu fixes them."""
    variable = operation.inputs[0]
    lo, hi = -np.inf, np.inf
    while variable is not None and variable.producer is not None:
        producer = variable.producer
        if producer.type == "Pad" and _pad_is_homogeneous(producer):
            lo, hi = min(lo, 0.0), max(hi, 0.0)  # a zero pad adds zeros (reflect/edge add nothing new)
            variable = producer.inputs[0]
            continue
        if producer.type in ("MaxPool", "GlobalMaxPool", "Identity", "Dropout"):
            variable = producer.inputs[0]
            continue
        if producer.type == "Relu":
            return (0.0 if lo == -np.inf else min(lo, 0.0)), np.inf
        if producer.type == "Clip":
            bounds = _clip_bounds(producer)
            if bounds is None:
                return None
            low = bounds[0] if lo == -np.inf else min(lo, bounds[0])
            high = bounds[1] if hi == np.inf else max(hi, bounds[1])
            return low, high
        return None
    return None


def _preactivation_bounds(first: Operation, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """Per output channel of A, (lowest, highest) value its output can take (interval arithmetic)."""
    interval = _input_interval(first, graph)
    if interval is None or not all(np.isfinite(interval)):
        return None
    lo, hi = min(interval[0], 0.0), max(interval[1], 0.0)  # the op's own zero padding reads zeros too
    weight = first.inputs[1].value.astype(np.float64)
    moved = np.moveaxis(weight, _output_axis(first), 0).reshape(weight.shape[_output_axis(first)], -1)
    positive, negative = np.maximum(moved, 0).sum(axis=1), np.minimum(moved, 0).sum(axis=1)
    if first.type == "Gemm":
        alpha = float(first.attributes.get("alpha", 1.0))
        positive, negative = (positive * alpha, negative * alpha) if alpha >= 0 else (negative * alpha, positive * alpha)
    low = positive * lo + negative * hi
    high = positive * hi + negative * lo
    bias = _param(first, 2)
    if bias is not None:
        b = bias.value.astype(np.float64).reshape(-1)
        if first.type == "Gemm":
            b = b * float(first.attributes.get("beta", 1.0))
        if b.size not in (1, low.size):
            return None
        low, high = low + b, high + b
    return low, high


# ------------------------------------------------------------------- the pass
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
    def _pair_scales(self, pair: _Pair, graph: Graph, stats: dict) -> np.ndarray:
        """The scales of one sweep over ``pair`` (ones where a channel must not move)."""
        r1 = _first_ranges(pair.first)
        r2 = _second_ranges(pair.second, r1.size)
        free = (r1 > self.min_range * max(r1.max(), 1e-30)) & (r2 > self.min_range * max(r2.max(), 1e-30))
        lowest = np.zeros_like(r1)                      # smallest scale that keeps a channel exact
        if pair.clip is not None:
            lo, hi = _clip_bounds(pair.clip)
            low_free, high_free = lo in (0.0, -np.inf), hi in (0.0, np.inf)  # bounds at 0/inf scale exactly
            if not (low_free and high_free):
                bounds = _preactivation_bounds(pair.first, graph)
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
        total = {pair.name: np.ones(_first_ranges(pair.first).size) for pair in pairs}
        stats = {"clip_safe_channels": 0, "clip_fixed_channels": 0}
        for sweep in range(self.iterations):
            for pair in pairs:
                scale = self._pair_scales(pair, graph, stats if sweep == 0 else dict(stats))
                _scale_first(pair.first, scale)
                _scale_second(pair.second, scale)
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


def _pair_spread(pair: _Pair) -> float:
    """Spread of the ranges the pair equalizes: A's output channels and B's input channels, averaged."""
    first = _first_ranges(pair.first)
    return 0.5 * (_log_spread(first) + _log_spread(_second_ranges(pair.second, first.size)))


def _mean(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else 0.0
