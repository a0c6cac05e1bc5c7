"""Which op pairs cross-layer equalization (``equalization``) can balance, and their weights' per-channel
ranges and scalings.

A pair is a computing op A, the ops between that commute with a positive per-channel scaling (or a Clip
the scaling provably never cuts), and the computing op B reading them (``find_pairs``, which also says why
each pair it skips is skipped).  Reads the ops' FP32 parameters and configs; ``scale_first`` /
``scale_second`` write new weight and bias values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.ir import Graph, Operation, Variable
from ...core.op_facts import POSITIVELY_HOMOGENEOUS_TYPES, weight_channel_axis
from ...core.quant import QuantizationStates

S = QuantizationStates


@dataclass
class EqualizationPair:
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


def first_ranges(operation: Operation) -> np.ndarray:
    """max |W| per output channel of ``operation`` (A of a pair)."""
    weight = operation.inputs[1].value
    axis = _output_axis(operation)
    moved = np.moveaxis(np.abs(weight.astype(np.float64)), axis, 0)
    return moved.reshape(moved.shape[0], -1).max(axis=1)


def second_ranges(operation: Operation, channels: int) -> np.ndarray | None:
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


def scale_first(operation: Operation, scale: np.ndarray) -> None:
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


def scale_second(operation: Operation, scale: np.ndarray) -> None:
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


def clip_bounds(operation: Operation) -> tuple[float, float] | None:
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


def find_pairs(graph: Graph) -> tuple[list[EqualizationPair], list[dict]]:
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
                if clip is not None or clip_bounds(consumer) is None:
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
        if reason is None and second_ranges(second, first_ranges(first).size) is None:
            reason = f"{second.name}: weight layout does not match {first.name}'s channels"
        if reason is not None:
            skipped.append({"pair": f"{first.name} -> {second.name}", "reason": reason})
            continue
        pairs.append(EqualizationPair(first, between, second, clip))
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
            bounds = clip_bounds(producer)
            if bounds is None:
                return None
            low = bounds[0] if lo == -np.inf else min(lo, bounds[0])
            high = bounds[1] if hi == np.inf else max(hi, bounds[1])
            return low, high
        return None
    return None


def preactivation_bounds(first: Operation, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
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
