"""SmoothQuant (Xiao et al. 2023): move activation outliers out of a LayerNorm's result into the next weights.

Transformer activations have a few channels far larger than the rest, so one per-tensor int8 scale wastes
the grid on them; weights are quantized per output channel and take a per-input-channel factor almost for
free.  For each LayerNorm whose result is read only by MatMul/Gemm ops with constant weights, input channel
j is divided by s_j and the matching weight row multiplied by s_j:

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha),   X' = X / s,   W' = diag(s) W,   X' W' = X W

The division goes into the LayerNorm's gamma and beta (``y = n * gamma + beta``, so ``y / s`` is
``n * (gamma / s) + beta / s``; an RMSNorm has gamma alone; TensorFlow's ``x * k + (beta - mean * k)`` with
``k = gamma / std`` divides the same way): the constants are the block's ``affine`` ones, which the pattern
finder checked scale its result.

Where the result cannot absorb it - a post-LayerNorm block (BERT) whose LayerNorm also feeds the residual
Add, a GELU's output read by the second feed-forward MatMul, the attention context read by the output
projection - and the platform leaves float tensors between layers at no cost (``insert_multiplies``:
TensorRT's placement, onnxruntime's for transformers), an explicit ``Mul`` by 1/s is written in front of
the MatMuls (a float op, dispatched FP32: TensorRT and onnxruntime fold it into the quantization that
follows), as NNCF's SmoothQuant does.  MiniLM-L6 (post-LN, real weights), ORT_INT8 with onnxruntime running
the export, embedding cosine: 0.990 -> 0.998 with every constant-weight MatMul input smoothed.  The FP32 function is unchanged, up to float rounding.  ``alpha`` is chosen per
LayerNorm on the calibration data (unless given): among :data:`ALPHAS` and no smoothing at all, the one whose
int8 product — per-tensor symmetric activations, per-channel weights, both max-scaled — is closest to the
FP32 product on a sample of the LayerNorm's result rows (relative squared error, summed over the readers).

Reads: FP32 weights and the LayerNorm's gamma/beta (configs still INITIAL: run before the placement and
parameter passes), the calibration data (FP32 forward).  Writes: ``Variable.value`` of gamma, beta and the
readers' weights (new float32 arrays); the inserted Mul ops (no config, platform FP32) and their constants;
the readers' input 0.  Skipped, with the reason in the report: LayerNorms without gamma, whose
gamma/beta/weights are shared with other ops, that normalise over another axis than the last, or whose result
is a graph output or read by anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ...core.ir import Graph, Operation, Variable
from ...core.patterns import LAYER_NORM, Block, find_transformer_blocks
from ...executor import NumpyExecutor
from ...platforms.target import TargetPlatform
from ..base import QuantizationOptimizationPass, iterate_calibration

#: The migration strengths tried per LayerNorm (0 = no smoothing is always a candidate too).
ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9)
_SCALE_BOUNDS = (1e-4, 1e4)


@dataclass
class _Group:
    """One activation and the weights it feeds (``weights``: (variable, input-channel axis)); where the
    division goes: the LayerNorm ``block``'s ``affine`` constants, or (no block) a Mul inserted in front of
    the ``readers``."""

    source: str
    block: Block | None
    affine: list[Variable]
    weights: list[tuple[Variable, int]]
    readers: list[Operation]

    @property
    def name(self) -> str:
        return self.block.tail if self.block is not None else self.source


def channel_scales(activation_max: np.ndarray, weight_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = amax_j ** alpha / wmax_j ** (1 - alpha), kept in [1e-4, 1e4] (1 where a channel is all zero)."""
    activation_max = np.maximum(activation_max.astype(np.float64), 1e-8)
    weight_max = np.maximum(weight_max.astype(np.float64), 1e-8)
    scales = activation_max ** alpha / weight_max ** (1.0 - alpha)
    return np.clip(scales, *_SCALE_BOUNDS)


def int8_product_error(rows: np.ndarray, weights: list[np.ndarray], scales: np.ndarray,
                       references: list[np.ndarray] | None = None) -> float:
    """Relative squared error of the int8 product of (rows / s) and (diag(s) W), summed over ``weights``
    ([C_in, C_out] each): per-tensor symmetric activations, per-output-channel symmetric weights.
    ``references``: the FP32 products ``rows @ W`` where the caller computed them once for every candidate."""
    smoothed = rows / scales
    step = max(float(np.abs(smoothed).max()), 1e-12) / 127.0
    row_codes = np.clip(np.round(smoothed / step), -128, 127).astype(np.float32)
    error = 0.0
    for index, weight in enumerate(weights):
        scaled = weight * scales[:, None]
        weight_step = np.maximum(np.abs(scaled).max(axis=0, keepdims=True), 1e-12) / 127.0
        weight_codes = np.clip(np.round(scaled / weight_step), -127, 127).astype(np.float32)
        reference = rows @ weight if references is None else references[index]
        product = integer_product(row_codes, weight_codes) * (step * weight_step)
        error += float(((product - reference) ** 2).sum() / max(float((reference ** 2).sum()), 1e-30))
    return error


#: the longest run of int8 x int8 products a float32 sum holds exactly: 1024 * 128 * 127 < 2 ** 24
_EXACT_FLOAT32_TERMS = 1024


def integer_product(row_codes: np.ndarray, weight_codes: np.ndarray) -> np.ndarray:
    """``row_codes @ weight_codes`` for int8 codes held in float32, exact: float32 matrix products over
    pieces of at most 1024 input channels (every partial sum an integer below 2^24), summed in float64."""
    channels = row_codes.shape[1]
    total = np.zeros((row_codes.shape[0], weight_codes.shape[1]), np.float64)
    for start in range(0, channels, _EXACT_FLOAT32_TERMS):
        stop = start + _EXACT_FLOAT32_TERMS
        total += row_codes[:, start:stop] @ weight_codes[start:stop]
    return total


class SmoothQuantPass(QuantizationOptimizationPass):
    """Migrate LayerNorm output outliers into the next weights (see the module docstring)."""

    name = "smooth_quant"

    def __init__(self, alpha: float | None = None, rows: int = 2048, steps: int | None = None,
                 verbose: bool = False, insert_multiplies: bool = False):
        self.alpha, self.rows, self.steps, self.verbose = alpha, rows, steps, verbose
        self.insert_multiplies = insert_multiplies

    def optimize(self, graph: Graph, executor: NumpyExecutor | None = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None, **kwargs) -> dict:
        groups, skipped = smoothable_groups(graph, self.insert_multiplies)
        if not groups:  # no LayerNorm feeding weights (every CNN): nothing to do
            return {"smoothed": 0, **({"skipped": skipped} if skipped else {})}
        executor = executor or NumpyExecutor(graph)
        names = list(dict.fromkeys(group.source for group in groups))
        maxima = {name: None for name in names}
        samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
        rng = np.random.default_rng(0)
        steps = self.steps if self.steps is not None else calib_steps
        for batch in iterate_calibration(dataloader, steps, collate_fn, "smooth quant", self.verbose):
            for name, value in zip(names, executor.forward(batch, output_names=names)):
                flat = np.abs(value.reshape(-1, value.shape[-1]))
                peak = flat.max(axis=0)
                maxima[name] = peak if maxima[name] is None else np.maximum(maxima[name], peak)
                chosen = rng.choice(len(flat), size=min(len(flat), self.rows), replace=False)
                samples[name].append(value.reshape(-1, value.shape[-1])[chosen].astype(np.float64))
        details = []
        for group in groups:
            name = group.source
            rows = np.concatenate(samples[name])
            rows = rows[rng.choice(len(rows), size=min(len(rows), self.rows), replace=False)]
            alpha, scales = self._choose(group, maxima[name], rows)
            before = float(maxima[name].max())
            if scales is not None:
                _apply(graph, group, scales)
            details.append({"layer_norm" if group.block is not None else "activation": group.name,
                            "into": "gamma/beta" if group.block is not None else "a Mul before its readers",
                            "alpha": alpha, "readers": len(group.weights),
                            "activation_max_before": round(before, 4),
                            "activation_max_after": round(float((maxima[name] / (1 if scales is None else scales))
                                                                .max()), 4)})
        return {"smoothed": sum(d["alpha"] is not None for d in details), "layer_norms": details,
                "skipped": skipped}

    def _choose(self, group: _Group, activation_max: np.ndarray, rows: np.ndarray):
        weights = [_rows_first(variable.value, axis).astype(np.float64) for variable, axis in group.weights]
        weight_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        if self.alpha is not None:
            return self.alpha, channel_scales(activation_max, weight_max, self.alpha)
        references = [rows @ weight for weight in weights]   # the same for every candidate: computed once
        best = (int8_product_error(rows, weights, np.ones(len(weight_max)), references), None, None)
        for alpha in ALPHAS:
            scales = channel_scales(activation_max, weight_max, alpha)
            error = int8_product_error(rows, weights, scales, references)
            if error < best[0]:
                best = (error, alpha, scales)
        return best[1], best[2]


def smoothable_groups(graph: Graph, insert_multiplies: bool = False) -> tuple[list[_Group], list[dict]]:
    """The LayerNorms whose result can absorb a per-channel division (and why the others cannot); with
    ``insert_multiplies``, in a graph with LayerNorms, also every other activation read by MatMul/Gemm ops
    with constant weights, divided by a Mul written in front of them."""
    groups, skipped = [], []
    outputs = {variable.name for variable in graph.outputs}
    blocks = [block for block in find_transformer_blocks(graph) if block.kind == LAYER_NORM]
    for block in blocks:
        tail = graph.operations[block.tail]
        affine, reason = _affine(graph, block)
        result = graph.variables[block.result]
        readers = list(dict.fromkeys(result.consumers))
        weights = [_weight_of(reader, result) for reader in readers]
        if reason is None and (block.result in outputs or not readers):
            reason = "its result is a graph output or unread"
        if reason is None and any(w is None for w in weights):
            reason = "its result is read by an op other than a MatMul/Gemm with a constant weight"
        if reason is None and any(len(set(v.consumers)) > 1 for v, _ in weights):
            reason = "a weight it feeds is shared with other ops"
        if reason is None:
            channels = {v.value.shape[axis] for v, axis in weights}
            sizes = {variable.value.size for variable in affine}
            if len(channels) != 1 or not sizes <= {1, *channels}:
                reason = "its readers' weights and its gamma/beta disagree on the channel count"
        if reason is not None:
            skipped.append({"layer_norm": tail.name, "reason": reason})
            continue
        groups.append(_Group(block.result, block, affine, weights, readers))
    if insert_multiplies and blocks:
        groups += _multiply_groups(graph, {group.source for group in groups})
    return groups, skipped


def _multiply_groups(graph: Graph, taken: set[str]) -> list[_Group]:
    """Activations (not graph inputs) read by MatMul/Gemm ops with constant, unshared weights of one input
    channel count: each a group smoothed by an inserted Mul in front of those readers."""
    groups = []
    for variable in list(graph.variables.values()):
        if variable.name in taken or variable.is_parameter or variable.producer is None:
            continue
        readers = [reader for reader in dict.fromkeys(variable.consumers)
                   if _weight_of(reader, variable) is not None]
        weights = [_weight_of(reader, variable) for reader in readers]
        if not readers or any(len(set(v.consumers)) > 1 for v, _ in weights):
            continue
        if len({v.value.shape[axis] for v, axis in weights}) != 1:
            continue
        groups.append(_Group(variable.name, None, [], weights, readers))
    return groups


def _affine(graph: Graph, block: Block) -> tuple[list[Variable], str | None]:
    """The block's gamma/beta (its ``affine`` constants), or the reason it cannot absorb the scales."""
    tail = graph.operations[block.tail]
    if tail.type == "LayerNormalization" and \
            tail.attributes.get("axis", -1) not in (-1, len(tail.inputs[0].shape or ()) - 1):
        return [], "it normalises over more than the last axis"
    affine = [graph.variables[name] for name in block.affine]
    if not affine:
        return [], "it has no constant gamma to absorb the scales"
    if any(v.value.size > 1 and v.value.shape[-1] != v.value.size for v in affine):
        return [], "it normalises over another axis than the last"
    if any(len(set(v.consumers)) > 1 for v in affine):
        return [], "its gamma or beta is shared with other ops"
    return affine, None


def _weight_of(reader: Operation, activation: Variable) -> tuple[Variable, int] | None:
    """(weight, axis of its input channels) when ``reader`` multiplies ``activation`` by a constant weight."""
    if reader.type == "MatMul" and reader.inputs[0] is activation and reader.inputs[1].is_parameter \
            and reader.inputs[1].value.ndim == 2:
        return reader.inputs[1], 0
    if reader.type == "Gemm" and reader.inputs[0] is activation and reader.inputs[1].is_parameter \
            and not reader.attributes.get("transA", 0):
        return reader.inputs[1], 1 if reader.attributes.get("transB", 0) else 0
    return None


def _rows_first(weight: np.ndarray, axis: int) -> np.ndarray:
    return weight if axis == 0 else weight.T


def _apply(graph: Graph, group: _Group, scales: np.ndarray) -> None:
    channels = len(scales)
    if group.block is None:   # a Mul by 1/s in front of the readers, which read its result from now on
        source = graph.variables[group.source]
        inverse = graph.create_variable(graph.unique_name(f"{source.name}_smooth_quant_scale"),
                                        value=(1.0 / scales).astype(np.float32))
        smoothed = graph.create_variable(graph.unique_name(f"{source.name}_smoothed"), shape=source.shape,
                                         dtype=source.dtype)
        multiply = graph.create_operation("Mul", [source, inverse], [smoothed],
                                          name=graph.unique_name(f"{source.name}_smooth_quant"))
        multiply.platform = TargetPlatform.FP32
        for reader in group.readers:
            graph.replace_input(reader, 0, smoothed)
    for variable in group.affine:  # a one-value gamma/beta (LayerNormalization broadcasts it) becomes per channel
        value = variable.value if variable.value.size == channels else np.broadcast_to(variable.value, (channels,))
        variable.value = (value / scales.reshape(value.shape)).astype(np.float32)
        variable.shape, variable.dtype = list(variable.value.shape), variable.value.dtype
    for variable, axis in group.weights:
        factor = scales[:, None] if axis == 0 else scales[None, :]
        variable.value = (variable.value * factor).astype(np.float32)
