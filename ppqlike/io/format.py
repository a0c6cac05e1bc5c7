"""Graph formatting: simplify an imported graph before dispatch and quantization.

Every function edits the graph in place through its editing API and returns
a :class:`FormatReport` (what changed, with counts).  Constant folding
evaluates with onnxruntime, never with the executor (a higher layer).
BatchNormalization and bias-Add folding live in :mod:`ppqlike.io.fold`, the
report in :mod:`ppqlike.io.format_report`; both are re-exported here.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from onnx import helper, numpy_helper

from ..core.ir import Graph, Operation
from ..core.op_facts import PASS_THROUGH_TYPES
from .files import MAX_IR_VERSION
from .fold import FOLLOWER_FOLDS, fold_batchnorm, fold_bias_add, fold_followers, fold_scale_mul
from .fold_loop import fold_loop_invariants
from .fold_pad import fold_pad_into_conv
from .format_report import FormatReport, finish_report, remove_dead_code, start_report
from .onnx_export import operation_to_node
from .onnx_files import onnxruntime_session
from .shapes import infer_shapes, is_static, set_input_shapes

DEFAULT_DOMAINS = ("", "ai.onnx")
#: Ops whose output is random: never folded.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})
#: Ops never folded: random ones, and those whose outputs are sequences or optionals.
UNFOLDABLE_OPS = RANDOM_OPS | frozenset({
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceAt", "SequenceErase",
    "SequenceLength", "SplitToSequence", "ConcatFromSequence", "SequenceMap", "Optional", "OptionalGetElement",
    "OptionalHasElement"})


def remove_identity(graph: Graph) -> FormatReport:
    """Remove Identity ops and inference Dropouts (graph.bypass_operation); interface names are kept.

    A Dropout whose mask is read, or whose training_mode is not a constant
    False, stays; so does an Identity from a graph input (or parameter) to a
    graph output.
    """
    report = start_report(graph)
    for operation in graph.topological_sort():
        if operation.type not in PASS_THROUGH_TYPES or operation.domain not in DEFAULT_DOMAINS:
            continue
        if operation.type == "Dropout" and len(operation.inputs) > 2 and operation.inputs[2] is not None:
            training = operation.inputs[2]
            if not training.is_parameter or bool(np.any(training.value)):
                report.skipped["Dropout in training mode"] += 1
                continue
        if graph.bypass_operation(operation):
            report.counts[f"{operation.type} removed"] += 1
        else:
            report.skipped[f"{operation.type} on the graph interface or with a used mask"] += 1
    report.counts.update(remove_dead_code(graph).counts)  # e.g. the Dropout ratios nothing reads now
    return finish_report(graph, report)


def _static_value(operation: Operation, shape) -> np.ndarray | None:
    """The value of a Shape or Size op from its input's static shape (None when not static)."""
    if shape is None:
        return None
    if operation.type == "Size":
        return np.array(int(np.prod(shape)), np.int64) if is_static(shape) else None
    dims = list(shape)[operation.attributes.get("start", 0):operation.attributes.get("end", None)]
    return np.array(dims, np.int64) if is_static(dims) else None


def _run_onnxruntime(graph: Graph, operations: list, known: dict) -> dict:
    """Evaluate ``operations`` (in order) in one onnxruntime session; returns output name -> array."""
    import onnxruntime  # imported when needed: a second or so

    produced = [v.name for op in operations for v in op.outputs]
    produced_set = set(produced)
    initializers = {}
    for operation in operations:
        for variable in operation.inputs:
            if variable is not None and variable.name not in produced_set and variable.name not in initializers:
                value = variable.value if variable.is_parameter else known[variable.name]
                initializers[variable.name] = numpy_helper.from_array(np.asarray(value), variable.name)
    onnx_graph = helper.make_graph([operation_to_node(op) for op in operations], "fold", [],
                                   [helper.make_empty_tensor_value_info(n) for n in produced],
                                   list(initializers.values()))
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", graph.opset)])
    model.ir_version = MAX_IR_VERSION
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime_session(model, options)
    return dict(zip(produced, session.run(None, {})))


def _evaluate(graph: Graph, operations: list, known: dict, report: FormatReport) -> dict:
    """All outputs in one session; if onnxruntime refuses, op by op, skipping the ones it cannot run."""
    if not operations:
        return {}
    try:
        return _run_onnxruntime(graph, operations, known)
    except Exception:  # fall back below, to find the op at fault
        pass
    values = dict(known)
    for operation in operations:
        if any(v is not None and not v.is_parameter and v.name not in values for v in operation.inputs):
            continue  # depends on an op that could not be evaluated
        try:
            values.update(_run_onnxruntime(graph, [operation], values))
        except Exception as error:
            message = " ".join(str(error).split())[:200]
            report.notes.append(f"could not fold {operation.type} {operation.name!r}: {message}")
            report.skipped["ops onnxruntime could not evaluate"] += 1
    return values


def has_foldable_ops(graph: Graph) -> bool:
    """True when some op reads only parameters (cheap test: no shape inference)."""
    return any(op.domain in DEFAULT_DOMAINS and op.type not in UNFOLDABLE_OPS
               and all(v is None or v.is_parameter for v in op.inputs) for op in graph.operations.values())


def fold_constants(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None = None,
                   max_expansion: int = 1 << 20) -> FormatReport:
    """Replace every op whose inputs are all constants (transitively) by parameters, then remove dead code.

    ``input_shapes`` ({input name: static shape}) fixes the graph inputs'
    shapes first, so that a Shape (or Size) op whose input shape is then
    statically known becomes a constant, and its whole arithmetic chain
    folds.  The graph is then valid only for those input shapes.  Foldable ops
    are evaluated in one onnxruntime session.  Random ops never fold; an op
    whose output has more than ``max_expansion`` elements and more than all its
    inputs together (e.g. a ConstantOfShape making a large zero tensor) stays,
    so that the model does not grow.
    """
    report = start_report(graph)
    if input_shapes:
        report.notes.extend(set_input_shapes(graph, input_shapes))
    constant = {name for name, v in graph.variables.items() if v.is_parameter}
    to_run, shape_ops, known, shapes = [], [], {}, None
    for operation in graph.topological_sort():
        if operation.domain not in DEFAULT_DOMAINS or operation.type in UNFOLDABLE_OPS:
            continue
        if all(v is None or v.name in constant for v in operation.inputs):
            to_run.append(operation)
        elif operation.type in ("Shape", "Size") and operation.inputs[0] is not None:
            shapes = infer_shapes(graph) if shapes is None else shapes
            value = _static_value(operation, shapes.get(operation.inputs[0].name))
            if value is None:
                report.skipped["Shape/Size of a dynamic shape"] += 1
                continue
            shape_ops.append(operation)
            known[operation.outputs[0].name] = value
        else:
            continue
        constant.update(v.name for v in operation.outputs)
    values = {**known, **_evaluate(graph, to_run, known, report)}
    for operation in shape_ops + to_run:
        outputs = list(operation.outputs)
        results = [values.get(v.name) for v in outputs]
        if any(r is None for r in results):
            continue
        size_out = sum(int(np.size(r)) for r in results)
        if size_out > max_expansion and operation not in shape_ops and size_out > sum(
                int(np.size(v.value if v.is_parameter else values[v.name])) for v in operation.inputs if v is not None):
            report.skipped[f"{operation.type}: output too large to store"] += 1
            continue
        graph.remove_operation(operation, remove_unused_outputs=False)
        for variable, result in zip(outputs, results):
            result = np.asarray(result)
            variable.value, variable.shape, variable.dtype = result, list(result.shape), result.dtype
        report.counts["ops folded"] += 1
        if operation in shape_ops:
            report.counts["Shape/Size ops made constant from static shapes"] += 1
    dead = remove_dead_code(graph)
    report.counts.update(dead.counts)
    return finish_report(graph, report)


def format_graph(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None = None) -> FormatReport:
    """Run every formatting step in order and return the combined report.

    Identity removal, constant folding (with ``input_shapes``, see
    :func:`fold_constants`), loop-invariant constants into Loop bodies, BatchNormalization folding, scale-Mul and
    bias-Add folding,
    zero-Pad folding into Conv pads, then constant folding again if some op
    reads only constants.
    """
    report = remove_identity(graph)
    report = report.merge(fold_constants(graph, input_shapes))
    report = report.merge(fold_loop_invariants(graph))
    report = report.merge(fold_followers(graph))
    report = report.merge(fold_pad_into_conv(graph))
    if has_foldable_ops(graph):
        report = report.merge(fold_constants(graph))
    graph.check()
    return report


__all__ = ["FormatReport", "FOLLOWER_FOLDS", "fold_batchnorm", "fold_bias_add", "fold_scale_mul", "fold_followers", "fold_loop_invariants", "fold_pad_into_conv", "fold_constants", "format_graph",
           "has_foldable_ops", "remove_dead_code", "remove_identity", "RANDOM_OPS", "UNFOLDABLE_OPS"]
