"""Folding of BatchNormalization, constant scales (Mul) and bias Adds into the Conv/ConvTranspose/Gemm/MatMul
before them.

Part of graph formatting (:mod:`ppqlike.io.format`).  Reads parameter values
and static shapes; writes weights and biases (a weight another op also reads
is copied, never changed under that op), removes the folded op, and turns a
2-D MatMul with a constant weight into a Gemm where it gains a bias.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from ..core.ir import Graph, Operation, Variable
from ..core.op_facts import COMPUTING_TYPES
from .format_report import FormatReport, finish_report, remove_dead_code, start_report
from .shapes import infer_shapes

DEFAULT_DOMAINS = ("", "ai.onnx")


def _float_parameter(variable: Variable | None) -> bool:
    return variable is not None and variable.is_parameter and np.issubdtype(variable.value.dtype, np.floating)


def _write_parameter(graph: Graph, operation: Operation, index: int, value: np.ndarray, dtype) -> None:
    """Give input ``index`` of ``operation`` the new ``value``: in place when only this op reads the
    parameter, else (shared weight, missing bias) as a new parameter."""
    value = np.asarray(value, dtype=dtype)
    current = operation.inputs[index] if index < len(operation.inputs) else None
    if current is not None and current.is_parameter and current.consumers == [operation] \
            and current not in graph.outputs:
        current.value, current.shape, current.dtype = value, list(value.shape), value.dtype
        return
    base = current.name if current is not None else f"{operation.name}_bias"
    graph.replace_input(operation, index, graph.create_variable(graph.unique_name(f"{base}_folded"), value=value))


def _remove_follower(graph: Graph, follower: Operation, source: Variable) -> None:
    """Remove ``follower`` (reading ``source``); its readers read ``source``, which takes its output's
    name when that output is a graph output."""
    target = follower.outputs[0]
    target_is_output = target in graph.outputs
    graph.remove_operation(follower, remove_unused_outputs=False)
    graph.replace_variable(target, source)
    graph.remove_variable(target)
    if target_is_output:
        graph.rename_variable(source, target.name)
        source.shape = target.shape if source.shape is None else source.shape
        source.dtype = target.dtype if source.dtype is None else source.dtype


def _fusable_producer(graph: Graph, variable: Variable, report: FormatReport, what: str) -> Operation | None:
    """The Conv/ConvTranspose/Gemm/MatMul writing ``variable`` when ``variable`` has no other reader."""
    producer = variable.producer
    if producer is None:
        report.skipped[f"{what} on a graph input or constant"] += 1
        return None
    if producer.type not in COMPUTING_TYPES or producer.domain not in DEFAULT_DOMAINS:
        report.skipped[f"{what} after {producer.type}"] += 1
        return None
    if len(variable.consumers) != 1 or variable in graph.outputs:
        report.skipped[f"{what} whose input has other readers"] += 1
        return None
    weight = producer.inputs[1] if len(producer.inputs) > 1 else None
    bias = producer.inputs[2] if len(producer.inputs) > 2 else None
    if not _float_parameter(weight) or (bias is not None and not _float_parameter(bias)):
        report.skipped[f"{what} after {producer.type} with a computed weight or bias"] += 1
        return None
    return producer


def _channels(producer: Operation) -> int:
    """Number of output channels (Conv, ConvTranspose) or output features (Gemm, MatMul)."""
    weight = producer.inputs[1].value
    if producer.type == "Conv":
        return weight.shape[0]
    if producer.type == "ConvTranspose":
        return weight.shape[1] * int(producer.attributes.get("group", 1))
    if producer.type == "Gemm":
        return weight.shape[0] if producer.attributes.get("transB", 0) else weight.shape[1]
    return weight.shape[1] if weight.ndim == 2 else -1  # MatMul: only a 2-D weight folds


def _scale_weight(producer: Operation, scale: np.ndarray) -> np.ndarray:
    """The producer's weight with output channel ``c`` multiplied by ``scale[c]`` (in float64)."""
    weight = producer.inputs[1].value.astype(np.float64)
    if producer.type == "Conv":
        return weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    if producer.type == "ConvTranspose":  # [C_in, M/g, k...]: output channel g*(M/g)+j
        group = int(producer.attributes.get("group", 1))
        grouped = weight.reshape((group, weight.shape[0] // group) + weight.shape[1:])
        factor = scale.reshape((group, 1, weight.shape[1]) + (1,) * (weight.ndim - 2))
        return (grouped * factor).reshape(weight.shape)
    if producer.type == "Gemm" and producer.attributes.get("transB", 0):
        return weight * scale[:, None]
    return weight * scale[None, :]


def _rank_two_input(graph: Graph, producer: Operation, shapes: dict) -> bool:
    """For a MatMul: True when its first input is known to be 2-D (then it can become a Gemm)."""
    shape = shapes.get(producer.inputs[0].name) if producer.inputs[0] is not None else None
    return shape is not None and len(shape) == 2 and producer.inputs[1].value.ndim == 2


def _matmul_to_gemm(graph: Graph, matmul: Operation) -> Operation:
    """Replace a MatMul by an equivalent Gemm (same name, inputs and output)."""
    inputs, outputs, name = list(matmul.inputs), list(matmul.outputs), matmul.name
    graph.remove_operation(matmul, remove_unused_outputs=False)
    return graph.create_operation("Gemm", inputs, outputs, attributes={"alpha": 1.0, "beta": 1.0}, name=name)


def _add_bias(graph: Graph, producer: Operation, addend: np.ndarray, scale: np.ndarray | None = None) -> None:
    """bias' = scale * bias + addend (Conv, ConvTranspose), or the same on Gemm's C with beta folded in."""
    dtype = producer.inputs[1].value.dtype
    bias_var = producer.inputs[2] if len(producer.inputs) > 2 else None
    bias = 0.0 if bias_var is None else bias_var.value.astype(np.float64)
    if producer.type == "Gemm":
        bias = bias * float(producer.attributes.get("beta", 1.0))
        producer.attributes["beta"] = 1.0
    new_bias = (bias if scale is None else scale * bias) + addend
    _write_parameter(graph, producer, 2, np.broadcast_to(new_bias, np.broadcast(bias, addend).shape)
                     if producer.type == "Gemm" else np.broadcast_to(new_bias, addend.shape), dtype)


def fold_batchnorm(graph: Graph) -> FormatReport:
    """Fold each BatchNormalization into the Conv, ConvTranspose, Gemm or 2-D MatMul before it.

    Only when the BN's input is read by the BN alone and the weight (and
    bias) are constants; the op gains a bias if it had none; a MatMul becomes
    a Gemm (its input must be known to be 2-D, so that BN's channel axis is
    the MatMul's last).  A BN on a graph input or after any other op stays.
    """
    report, shapes = start_report(graph), None
    for bn in graph.topological_sort():
        if bn.type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
            continue
        if bn.attributes.get("training_mode", 0) or any(v.consumers or v in graph.outputs for v in bn.outputs[1:]):
            report.skipped["BatchNormalization in training mode"] += 1
            continue
        if not all(_float_parameter(v) for v in bn.inputs[1:5]) or len(bn.inputs) < 5:
            report.skipped["BatchNormalization with computed statistics"] += 1
            continue
        producer = _fusable_producer(graph, bn.inputs[0], report, "BatchNormalization")
        if producer is None:
            continue
        gamma, beta, mean, var = (v.value.astype(np.float64).reshape(-1) for v in bn.inputs[1:5])
        scale = gamma / np.sqrt(var + float(bn.attributes.get("epsilon", 1e-5)))
        if _channels(producer) != scale.size:
            report.skipped["BatchNormalization whose channel count does not match"] += 1
            continue
        if producer.type == "MatMul":
            shapes = infer_shapes(graph) if shapes is None else shapes
            if not _rank_two_input(graph, producer, shapes):
                report.skipped["BatchNormalization after a MatMul whose input is not known to be 2-D"] += 1
                continue
            producer = _matmul_to_gemm(graph, producer)
            report.counts["MatMul turned into Gemm"] += 1
        _write_parameter(graph, producer, 1, _scale_weight(producer, scale), producer.inputs[1].value.dtype)
        _add_bias(graph, producer, beta - mean * scale, scale)
        _remove_follower(graph, bn, bn.inputs[0])
        report.counts[f"BatchNormalization folded into {producer.type}"] += 1
    dead = remove_dead_code(graph)
    report.counts.update(dead.counts)
    return finish_report(graph, report)


def _per_channel(producer: Operation, constant: np.ndarray) -> np.ndarray | None:
    """``constant`` as a per-output-channel vector when adding it to the producer's output is a bias add."""
    channels = _channels(producer)
    rank = producer.inputs[1].value.ndim if producer.type in ("Conv", "ConvTranspose") else 2
    if constant.ndim > rank or channels <= 0:   # (a MatMul of a weight that is not 2-D: no channels to fold into)
        return None
    aligned = (1,) * (rank - constant.ndim) + constant.shape  # numpy broadcasting aligns on the right
    if any(d != 1 for i, d in enumerate(aligned) if i != 1) or aligned[1] not in (1, channels):
        return None
    return np.broadcast_to(constant.astype(np.float64).reshape(-1), (channels,))


def _constant_operand(operation: Operation) -> tuple[Variable, Variable] | None:
    """(the constant float input, the computed one) of a binary op with exactly one of each, else None."""
    if operation.domain not in DEFAULT_DOMAINS or len(operation.inputs) != 2 or None in operation.inputs:
        return None
    constants = [v for v in operation.inputs if v.is_parameter]
    activations = [v for v in operation.inputs if not v.is_parameter]
    if len(constants) != 1 or len(activations) != 1 or not _float_parameter(constants[0]):
        return None
    return constants[0], activations[0]


def _channel_follower(graph: Graph, operation: Operation, op_type: str, report: FormatReport
                      ) -> tuple[Variable, Operation, np.ndarray | None] | None:
    """For an ``op_type`` op of a computed tensor and a constant of the producer's dtype: (the tensor, the
    Conv/ConvTranspose/Gemm/MatMul writing it, the constant per output channel or None where it is not), when
    that producer can take the op in (:func:`_fusable_producer`); else None, the reason counted in ``report``."""
    operands = _constant_operand(operation) if operation.type == op_type else None
    if operands is None:
        return None
    constant, activation = operands
    producer = _fusable_producer(graph, activation, report, op_type)
    if producer is None:
        return None
    if constant.value.dtype != producer.inputs[1].value.dtype:
        report.skipped[f"{op_type} of another dtype"] += 1
        return None
    return activation, producer, _per_channel(producer, constant.value)


def fold_scale_mul(graph: Graph) -> FormatReport:
    """Fold ``Mul(op output, constant)`` into the op's weight (and bias) when the constant is per output channel.

    y = s * (W x + b) = (s W) x + s b, exact in float, as onnxruntime's ConvMulFusion does: a Conv followed by
    a learned scale (PP-OCRv4's "learnable affine" blocks: Conv -> Mul -> Add) is then quantized once, at the
    end of the affine, where the chain was rounded after each op.  The constant's shapes are those of
    :func:`fold_bias_add`; a MatMul keeps its type (no bias to add).  Runs before it, so that the Add after
    the Mul folds too.
    """
    report = start_report(graph)
    for mul in graph.topological_sort():
        follower = _channel_follower(graph, mul, "Mul", report)
        if follower is None:
            continue
        activation, producer, scale = follower
        if scale is None or not np.isfinite(scale).all():
            report.skipped[f"Mul after {producer.type} that is not a finite per-channel scale"] += 1
            continue
        dtype = producer.inputs[1].value.dtype
        _write_parameter(graph, producer, 1, _scale_weight(producer, scale), dtype)
        if len(producer.inputs) > 2 and producer.inputs[2] is not None:
            _add_bias(graph, producer, np.zeros_like(scale), scale)
        _remove_follower(graph, mul, activation)
        report.counts[f"Mul folded into the weights of {producer.type}"] += 1
    dead = remove_dead_code(graph)
    report.counts.update(dead.counts)
    return finish_report(graph, report)


def fold_bias_add(graph: Graph) -> FormatReport:
    """Fold ``Add(op output, constant)`` into the op's bias when the constant is per output channel.

    Conv/ConvTranspose: [C,1,1] or [1,C,1,1] (a plain [C] broadcasts along
    the last spatial axis and is left alone); Gemm and 2-D MatMul (which
    becomes a Gemm): [N] or [1,N]; a single value always.
    """
    report, shapes = start_report(graph), None
    for add in graph.topological_sort():
        follower = _channel_follower(graph, add, "Add", report)
        if follower is None:
            continue
        activation, producer, addend = follower
        if addend is None:
            report.skipped[f"Add after {producer.type} that is not a per-channel bias"] += 1
            continue
        if producer.type == "MatMul":
            shapes = infer_shapes(graph) if shapes is None else shapes
            if not _rank_two_input(graph, producer, shapes):
                report.skipped["Add after a MatMul whose input is not known to be 2-D"] += 1
                continue
            producer = _matmul_to_gemm(graph, producer)
            report.counts["MatMul turned into Gemm"] += 1
        _add_bias(graph, producer, addend)
        _remove_follower(graph, add, activation)
        report.counts[f"Add folded into the bias of {producer.type}"] += 1
    dead = remove_dead_code(graph)
    report.counts.update(dead.counts)
    return finish_report(graph, report)


#: the folds in the order :func:`fold_followers` runs them
FOLLOWER_FOLDS = (fold_batchnorm, fold_scale_mul, fold_bias_add)


def fold_followers(graph: Graph, folds: Sequence[Callable[[Graph], FormatReport]] = FOLLOWER_FOLDS,
                   rounds: int = 4) -> FormatReport:
    """Run ``folds`` in order, again while a round folds something (every fold removes the op it folds, so the
    graph has fewer ops), at most ``rounds`` times: a fold can make the next one possible (PP-OCRv4's
    ConvTranspose -> bias Add -> BatchNormalization: the Add folds first, then the BatchNormalization is right
    after the ConvTranspose).  Counts add up over the rounds; the skipped counts are the last round's."""
    report, counts, last = start_report(graph), Counter(), FormatReport()
    for _ in range(rounds):
        before, last = len(graph.operations), FormatReport()
        for fold in folds:
            last = last.merge(fold(graph))
        counts += last.counts
        if len(graph.operations) == before:
            break
    return finish_report(graph, FormatReport(counts, last.skipped, last.notes, report.ops_before))
