"""A QDQ model read apart: the float model its Q/DQ pairs compute on, and each quantized tensor's scale, zero
point, axis and integer type as the file states them (``ppqlike.io.import_quantized`` makes configs of them)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.errors import ModelLoadError
from ..core.numerics import along_channel_axis
from ..core.quant import (QuantizationPolicy, QuantizationProperty, QuantizationStates, RoundingPolicy,
                          TensorQuantizationConfig)

P = QuantizationProperty
#: the integer range of each integer type a file may quantize to
INTEGER_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
                  np.dtype(np.int16): (-32768, 32767), np.dtype(np.int32): (-(2 ** 31), 2 ** 31 - 1)}


@dataclass(frozen=True)
class FileQuantization:
    """One tensor's quantization as the file states it."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None            # None: per tensor
    dtype: np.dtype

    def same_as(self, other: "FileQuantization") -> bool:
        return (self.axis == other.axis and self.dtype == other.dtype and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))

    def config(self, name: str, state: QuantizationStates) -> TensorQuantizationConfig:
        low, high = INTEGER_RANGES[self.dtype]
        symmetric = bool(np.all(self.zero_point == 0)) and low < 0
        flags = (P.PER_CHANNEL if self.axis is not None else P.PER_TENSOR) | P.LINEAR | \
            (P.SYMMETRICAL if symmetric else P.ASYMMETRICAL)
        bits = 32 if self.dtype == np.int32 else 8 * self.dtype.itemsize
        scale = self.scale if self.axis is not None else self.scale.reshape(())
        offset = self.zero_point if self.axis is not None else self.zero_point.reshape(())
        return TensorQuantizationConfig(QuantizationPolicy(flags), RoundingPolicy.ROUND_HALF_EVEN, bits, low, high,
                                        scale=scale, offset=offset, observer_algorithm="imported",
                                        channel_axis=self.axis, state=state, name=name)


@dataclass
class QdqSplit:
    """The float model and what was removed from it."""

    model: onnx.ModelProto
    activations: dict[str, FileQuantization]
    parameters: dict[str, FileQuantization]
    original_names: dict[str, str]      # a renamed tensor -> the file's name of the float tensor it holds
    restored: dict[str, str] = field(default_factory=dict)  # a restored Relu's output -> the tensor before it


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            found[node.output[0]] = numpy_helper.to_array(helper.get_attribute_value(node.attribute[0]))
    return found


def _file_quantization(node: onnx.NodeProto, constants: dict, data_dtype, where: str) -> FileQuantization:
    label = f"{node.op_type} node {node.name!r}"
    if node.input[1] not in constants or (len(node.input) > 2 and node.input[2] and node.input[2] not in constants):
        raise ModelLoadError(f"{where}: {label} has a computed scale or zero point; ppqlike imports constant ones")
    scale = np.asarray(constants[node.input[1]], np.float32)
    zero = np.asarray(constants[node.input[2]]) if len(node.input) > 2 and node.input[2] else \
        np.zeros(scale.shape, data_dtype or np.uint8)
    dtype = np.dtype(zero.dtype)
    if dtype not in INTEGER_RANGES:
        raise ModelLoadError(f"{where}: {label} quantizes to {dtype}; ppqlike imports 8-, 16- and 32-bit integers")
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("block_size"):
        raise ModelLoadError(f"{where}: {label} uses block quantization; ppqlike imports per-tensor and per-axis")
    axis = int(attributes.get("axis", 1)) if scale.size > 1 else None
    return FileQuantization(scale.reshape(-1) if axis is not None else scale.reshape(1),
                            zero.astype(np.int64).reshape(-1) if axis is not None else zero.astype(np.int64).reshape(1),
                            axis, dtype)


def _quantize_constant(value: np.ndarray, facts: FileQuantization) -> np.ndarray:
    """QuantizeLinear of a constant: clamp(round_half_even(x / scale) + zero point) in the file's integer type."""
    value = np.asarray(value, np.float32)
    scale, zero_point = (along_channel_axis(p, value.ndim, value.shape, facts.axis)
                         for p in (facts.scale, facts.zero_point))
    low, high = INTEGER_RANGES[facts.dtype]
    return np.clip(np.rint(value / scale) + zero_point, low, high).astype(facts.dtype)


def split_qdq(model: onnx.ModelProto, where: str) -> QdqSplit:
    """Remove the Q/DQ nodes: the float model, the activations' and the parameters' file quantization."""
    constants = _constants(model)
    nodes = list(model.graph.node)
    producer = {out: node for node in nodes for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    rename: dict[str, str] = {}                    # tensor name -> the name it takes in the float model
    activations: dict[str, FileQuantization] = {}
    parameters: dict[str, FileQuantization] = {}
    new_initializers: list[onnx.TensorProto] = []
    dropped: set[int] = set()
    for node in nodes:
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        label = f"DequantizeLinear node {node.name!r}"
        source = node.input[0]
        quantizer = producer.get(source)
        if quantizer is not None and quantizer.op_type == "QuantizeLinear" and quantizer.input[0] in constants \
                and all(r.op_type == "DequantizeLinear" for r in readers.get(source, [])):
            # a constant quantized in the graph (a Pad value, a Clip bound): store its integers
            facts = _file_quantization(quantizer, constants, None, where)
            constants[source] = _quantize_constant(constants[quantizer.input[0]], facts)
            dropped.add(id(quantizer))
        if source in constants:
            facts = _file_quantization(node, constants, constants[source].dtype, where)
            integers = constants[source].astype(np.int64)
            scale, zero_point = (along_channel_axis(p, integers.ndim, integers.shape, facts.axis)
                                 for p in (facts.scale, facts.zero_point))
            value = ((integers - zero_point).astype(np.float32) * scale).astype(np.float32)
            new_initializers.append(numpy_helper.from_array(value, node.output[0]))
            parameters[node.output[0]] = facts
            dropped.add(id(node))
            continue
        if quantizer is None or quantizer.op_type != "QuantizeLinear":
            raise ModelLoadError(f"{where}: {label} reads {source!r}, which no QuantizeLinear computes; ppqlike "
                                 "imports integer activations only as QuantizeLinear -> DequantizeLinear pairs")
        facts = _file_quantization(node, constants, None, where)
        if not facts.same_as(_file_quantization(quantizer, constants, None, where)):
            raise ModelLoadError(f"{where}: {label} dequantizes with other parameters than QuantizeLinear node "
                                 f"{quantizer.name!r} quantized with; ppqlike imports matching pairs")
        float_name = quantizer.input[0]
        if float_name in activations and not activations[float_name].same_as(facts):
            raise ModelLoadError(f"{where}: tensor {float_name!r} is quantized with two different scales (node "
                                 f"{quantizer.name!r}); ppqlike imports one quantization per tensor")
        activations[float_name] = facts
        rename[node.output[0]] = float_name
        dropped.update({id(node), id(quantizer)})
        for reader in readers.get(source, []):
            if reader.op_type != "DequantizeLinear":
                raise ModelLoadError(f"{where}: {reader.op_type} node {reader.name!r} computes on the integers of "
                                     f"{source!r}; ppqlike imports QDQ models whose ops read dequantized values")
    # a dequantized graph output keeps its name: the float tensor behind it takes that name
    original_names: dict[str, str] = {}
    for dq_output, float_name in list(rename.items()):
        if dq_output in outputs:
            for other, target in rename.items():
                if target == float_name:
                    rename[other] = dq_output
            rename[float_name] = dq_output
            original_names[dq_output] = float_name
            activations[dq_output] = activations.pop(float_name)
    kept = []
    for node in nodes:
        if id(node) in dropped:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:], copy.output[:]
        copy.input.extend(rename.get(n, n) for n in node.input)
        copy.output.extend(rename.get(n, n) for n in node.output)
        kept.append(copy)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(kept)
    used = {n for node in kept for n in node.input} | outputs
    keep_initializers = [t for t in result.graph.initializer if t.name in used]
    del result.graph.initializer[:]
    result.graph.initializer.extend(keep_initializers + new_initializers)
    return QdqSplit(result, activations, parameters, original_names)
