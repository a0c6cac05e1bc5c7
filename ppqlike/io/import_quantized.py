"""Import a quantized ONNX model (QDQ or QOperator, from QAT or another tool) as FP32 graph + configs.

The file's QuantizeLinear/DequantizeLinear pairs are removed and become
tensor quantization configs carrying the file's scales and zero points:

* a DequantizeLinear of a constant (weight, int32 bias) becomes the float
  parameter it computes, read through a BAKED (bias: PASSIVE_BAKED) config
  holding the integers' scale, zero point and axis;
* a QuantizeLinear -> DequantizeLinear pair on a computed tensor becomes an
  ACTIVATED config on the output of the op producing it (on the readers'
  inputs when a graph input is quantized); readers of a quantized tensor get
  input configs OVERLAPPED by it;
* every other slot of an op that touches a quantized tensor is FP32 (SOI for
  shape slots); ops touching none carry no config.

Rounding is half to even (QuantizeLinear's).  The ops onnxruntime fuses into
integer kernels (read from its own optimized graph) are marked
``runtime_kernel = 'onnxruntime'``, so the simulation computes what
onnxruntime computes.  What cannot be mapped raises ModelLoadError naming the node.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

from ..core.errors import ModelLoadError
from ..core.host import onnxruntime_saturates_u8s8, weights_may_saturate
from ..core.ir import Graph, Operation
from ..core.numerics import along_channel_axis
from ..core.op_facts import BIAS_TYPES
from ..core.quant_operation import OperationQuantizationConfig
from ..core.quant import QuantizationPolicy, QuantizationProperty, QuantizationStates, TensorQuantizationConfig
from ..core.requantization import RUNTIME_KERNEL_ONNXRUNTIME
from .onnx_files import onnxruntime_session
from .onnx_import import describe_source, graph_from_model, read_model
from .qdq_split import INTEGER_RANGES, QdqSplit, split_qdq
from .qoperator import is_qoperator, qoperator_to_qdq

S = QuantizationStates
P = QuantizationProperty
#: op types whose onnxruntime integer kernels ppqlike simulates bit for bit
_RUNTIME_KERNEL_TYPES = frozenset({"Conv", "MatMul", "Gemm", "Add", "GlobalAveragePool"})
#: the policy of FP32/SOI slots (never applied; a policy is required of every config)
_FLOAT_POLICY = QuantizationPolicy(P.PER_TENSOR | P.LINEAR | P.SYMMETRICAL)
#: ops after which onnxruntime's quantizer drops a Relu/Clip, its range starting at zero doing the clipping
_FOLDS_ACTIVATION = frozenset({"Conv", "Gemm", "MatMul", "Add"})


def restore_folded_relus(split: QdqSplit) -> None:
    """Put back, as Relu, the activations a quantizer folded into a range that starts at zero.

    onnxruntime's quantizer removes the Relu/Clip after Conv, Gemm, MatMul or Add when the output's
    range starts at zero (zero point = the lowest integer): quantized, nothing changes, but the float
    graph loses its clipping and an error analysis against it compares with a model that never existed.
    A Relu on such a tensor leaves the quantized result unchanged (the clamp at the zero point is the
    Relu) and restores the float graph where the dropped op was a Relu (a Clip's upper bound, past the
    range, is lost either way).  Graph outputs are left alone.
    """
    model = split.model
    outputs = {o.name for o in model.graph.output}
    names = {n for node in model.graph.node for n in list(node.input) + list(node.output) + [node.name]}
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type not in _FOLDS_ACTIVATION or node.domain not in ("", "ai.onnx"):
            continue
        name = node.output[0]
        facts = split.activations.get(name)
        if facts is None or facts.axis is not None or name in outputs \
                or int(facts.zero_point[0]) != INTEGER_RANGES[facts.dtype][0]:
            continue
        before = name + "_before_relu"
        while before in names:
            before += "_"
        names.add(before)
        node.output[0] = before
        nodes.append(helper.make_node("Relu", [before], [name], name=name + "_restored_Relu"))
        split.restored[name] = before
        split.original_names[before] = split.original_names.get(name, name)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def onnxruntime_fused_outputs(model: onnx.ModelProto) -> set[str]:
    """Names of tensors still computed by a node after onnxruntime's graph optimizations: an op whose output
    is not among them was fused into an integer kernel (QLinearConv, QLinearAdd, ...)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    with tempfile.TemporaryDirectory(prefix="ppqlike-ort-") as folder:
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        onnxruntime_session(model, options)
        # (the node names are all that is read: a large float weight the optimized file refers to outside
        # itself, e.g. in the source model's data file, is not loaded)
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return {name for node in optimized.graph.node for name in node.output}


def _attach_configs(graph: Graph, split: QdqSplit, fused: set[str] | None, platform) -> dict:
    """Write the configs on the ops that touch a quantized tensor; returns counts for the report."""
    counts = {"activations": 0, "weights": 0, "biases": 0, "runtime_kernels": 0, "quantized_ops": 0,
              "kernels_with_8bit_weights": 0, "restored_relus": len(split.restored)}
    before_relu = {before: name for name, before in split.restored.items()}
    for operation in graph.topological_sort():
        touched = [v for v in operation.inputs + operation.outputs
                   if v is not None and (v.name in split.activations or v.name in split.parameters)]
        if not touched:
            operation.config = None
            continue
        inputs = []
        for index, variable in enumerate(operation.inputs):
            inputs.append(None if variable is None else _input_config(graph, operation, index, variable, split,
                                                                       counts))
        outputs = []
        for variable in operation.outputs:
            facts = split.activations.get(variable.name)
            if variable.name in before_relu:  # fused with the restored Relu, whose config governs (linked below)
                outputs.append(split.activations[before_relu[variable.name]].config(variable.name, S.INITIAL))
            elif facts is None:
                outputs.append(TensorQuantizationConfig(_FLOAT_POLICY,
                                                        state=S.FP32, name=variable.name))
            else:
                outputs.append(facts.config(variable.name, S.ACTIVATED))
                counts["activations"] += 1
        operation.config = OperationQuantizationConfig(inputs, outputs)
        operation.platform = platform
        counts["quantized_ops"] += 1
        if operation.type == "Relu" and operation.outputs[0].name in split.restored:
            _link_restored_relu(operation, split)
        output = outputs[0] if outputs else None
        if _runs_as_integer_kernel(operation, output, fused, split, before_relu):
            output.runtime_kernel = RUNTIME_KERNEL_ONNXRUNTIME
            counts["runtime_kernels"] += 1
            counts["kernels_with_8bit_weights"] += _uses_8bit_weights(operation)
    return counts


def _runs_as_integer_kernel(operation: Operation, output, fused: set[str] | None, split: QdqSplit,
                             before_relu: dict) -> bool:
    """Whether onnxruntime runs ``operation`` as one of its integer kernels (``fused`` None: every one does)."""
    if operation.type not in _RUNTIME_KERNEL_TYPES or output is None:
        return False
    if output.state is not S.ACTIVATED and operation.outputs[0].name not in before_relu:
        return False
    file_names = {split.original_names.get(v.name, v.name) for v in operation.outputs}
    return fused is None or not file_names & fused


def fused_kernels_exact(source) -> bool:
    """Whether onnxruntime's fused integer kernels compute the QDQ/QOperator model ``source`` (a path or a
    ModelProto) exactly on this CPU: always, except on x86 without VNNI when an int8 weight integer leaves
    7 bits (its u8 x s8 pair sums saturate there; see ppqlike.core.host)."""
    if not onnxruntime_saturates_u8s8():
        return True
    model = source if isinstance(source, onnx.ModelProto) else onnx.load(os.fspath(source))
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("DequantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm"):
            for name in node.input[:4]:
                if name in constants and constants[name].data_type == onnx.TensorProto.INT8:
                    if weights_may_saturate(numpy_helper.to_array(constants[name])):
                        return False
    return True


def _link_restored_relu(relu: Operation, split: QdqSplit) -> None:
    """The restored Relu's output config governs its input and its producer's output (OVERLAPPED), as
    ppqlike's own fusion of Conv + Relu does: the producer's integer kernel requantizes to that grid."""
    master = relu.config.output_quantization_config[0]
    source = relu.inputs[0]
    source.producer.config.output_quantization_config[source.producer.outputs.index(source)] \
        .dominated_by(master, S.OVERLAPPED)
    reader = split.activations[relu.outputs[0].name].config(source.name, S.INITIAL)
    reader.dominated_by(master, S.OVERLAPPED)
    relu.config.input_quantization_config[0] = reader


def _uses_8bit_weights(operation: Operation) -> bool:
    """Whether an integer kernel's weight integers leave the 7-bit range (see core.host)."""
    if operation.type not in ("Conv", "MatMul", "Gemm") or len(operation.inputs) < 2:
        return False
    config = operation.config.input_quantization_config[1]
    if config.state is not S.BAKED or config.num_of_bits != 8:
        return False
    integers = config.quantize(config.baked_value).astype(np.int64)
    return weights_may_saturate(integers - along_channel_axis(config.offset, integers.ndim, integers.shape,
                                                              config.channel_axis))


def _input_config(graph: Graph, operation: Operation, index: int, variable, split: QdqSplit,
                  counts: dict) -> TensorQuantizationConfig:
    facts = split.parameters.get(variable.name)
    if facts is not None:
        is_bias = operation.type in BIAS_TYPES and index == 2
        config = facts.config(variable.name, S.PASSIVE_BAKED if is_bias else S.BAKED)
        config.baked_value = np.array(variable.value, np.float32)  # its own copy: the exporter writes integers
        counts["biases" if is_bias else "weights"] += 1
        return config
    facts = split.activations.get(variable.name)
    if facts is None:
        state = S.FP32 if variable.value is None or np.issubdtype(np.asarray(variable.value).dtype, np.floating) \
            else S.SOI
        return TensorQuantizationConfig(_FLOAT_POLICY, state=state, name=variable.name)
    producer = variable.producer
    if producer is not None and producer.config is not None:
        master = producer.config.output_quantization_config[producer.outputs.index(variable)]
        if master is not None and master.state is S.ACTIVATED:
            config = facts.config(variable.name, S.INITIAL)
            config.dominated_by(master, S.OVERLAPPED)
            return config
    return facts.config(variable.name, S.ACTIVATED)


def is_quantized_model(model: onnx.ModelProto) -> bool:
    """Whether the model already holds quantization (QuantizeLinear/DequantizeLinear or QLinear* nodes)."""
    return is_qoperator(model) or any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def import_quantized(source, platform=None, restore_activations: bool = True) -> Graph:
    """Read a QDQ or QOperator model into the IR: the FP32 graph plus configs carrying the file's scales.

    ``platform`` (a TargetPlatform) is set on every quantized op.  ``restore_activations``: put back the
    Relus a quantizer folded into ranges (see :func:`restore_folded_relus`).  ``graph.metadata['quantization']``
    records the source, the format and what was imported.
    """
    return graph_from_quantized_model(read_model(source), source, platform, restore_activations)


def graph_from_quantized_model(model: onnx.ModelProto, source, platform=None,
                               restore_activations: bool = True) -> Graph:
    """:func:`import_quantized` of a model :func:`read_model` has checked; ``source`` is what it was read from."""
    where = describe_source(source)
    file_format = "QOperator" if is_qoperator(model) else "QDQ"
    qdq = qoperator_to_qdq(model, where) if file_format == "QOperator" else model
    if not is_quantized_model(model):
        raise ModelLoadError(f"{where}: the model holds no QuantizeLinear/DequantizeLinear or QLinear* nodes; "
                             "it is not quantized (quantize it with ppqlike.quantize_onnx_model)")
    split = split_qdq(qdq, where)
    if restore_activations:
        restore_folded_relus(split)
    # QOperator ops are onnxruntime's integer kernels by definition; for QDQ ask onnxruntime what it fuses
    fused = None if file_format == "QOperator" else onnxruntime_fused_outputs(model)
    graph = graph_from_model(split.model, where)
    counts = _attach_configs(graph, split, fused, platform)
    counts["saturating_cpu"] = onnxruntime_saturates_u8s8()
    if counts["kernels_with_8bit_weights"] and counts["saturating_cpu"]:
        warnings.warn(f"{where}: {counts['kernels_with_8bit_weights']} integer kernels have weights beyond 7 "
                      "bits; onnxruntime on this CPU (x86 without VNNI) may saturate their u8 x s8 pair sums, "
                      "so its outputs can differ from the exact integer result ppqlike simulates (quantize "
                      "with reduce_range=True for such CPUs)", stacklevel=3)
    graph.metadata["quantization"] = {
        "platform": getattr(platform, "name", None), "setting": None,
        "source": os.fspath(source) if isinstance(source, (str, os.PathLike)) else None,
        "imported": {"format": file_format, **counts}}
    return graph
