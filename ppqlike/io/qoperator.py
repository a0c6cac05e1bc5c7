"""QOperator -> QDQ: rewrite a model of QLinear* ops into DequantizeLinear -> float op -> QuantizeLinear.

onnxruntime's QOperator format (the ONNX model zoo's INT8 models) computes on
integers with ops such as QLinearConv; the QDQ form states the same arithmetic
with the float op between a DequantizeLinear per input and a QuantizeLinear
per output.  ppqlike imports QDQ (``ppqlike.io.import_quantized``), so a
QOperator model is rewritten first.  Ops that only move integers
(Reshape, MaxPool, ...) read dequantized values and requantize on the same
grid, which is exact.  Anything else that reads integers is refused, naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.errors import ModelLoadError
from ..core.op_facts import VALUE_PRESERVING_TYPES

#: QLinear op -> (float op, positions of (int input, scale, zero point) triples, (out scale, out zero point)
#: positions, the position of an int32 bias or None)
_BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}
_UNARY = {"QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
          "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearSoftmax": "Softmax"}
QOPERATOR_TYPES = frozenset({"QLinearConv", "QLinearMatMul", "QGemm", "QLinearConcat"} | set(_BINARY) | set(_UNARY))


class _Rewriter:
    """Builds the QDQ node list, remembering each integer tensor's (scale, zero point) names."""

    def __init__(self, model: onnx.ModelProto, where: str):
        self.model, self.where = model, where
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.grid: dict[str, tuple[str, str]] = {}      # integer tensor -> (scale name, zero-point name)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}__ppqlike_{self.counter}"

    def dequantize(self, name: str, scale: str, zero_point: str, axis: int | None = None) -> str:
        out = self.fresh(f"{name}_dequantized")
        attributes = {} if axis is None else {"axis": axis}
        inputs = [name, scale] + ([zero_point] if zero_point else [])
        self.nodes.append(helper.make_node("DequantizeLinear", inputs, [out], **attributes))
        return out

    def quantize(self, float_name: str, out: str, scale: str, zero_point: str) -> None:
        inputs = [float_name, scale] + ([zero_point] if zero_point else [])
        self.nodes.append(helper.make_node("QuantizeLinear", inputs, [out]))
        self.grid[out] = (scale, zero_point)

    def bias(self, name: str, input_scale: str, weight_scale: str) -> str:
        """DequantizeLinear of an int32 bias with scale S_input * S_weight (zero point 0)."""
        try:
            scale = (self.constants[input_scale].astype(np.float32) *
                     self.constants[weight_scale].astype(np.float32)).astype(np.float32)
        except KeyError as missing:
            raise ModelLoadError(f"{self.where}: bias {name!r} needs constant scales; {missing} is not one") from None
        scale_name = self.fresh(f"{name}_scale")
        self.initializers.append(numpy_helper.from_array(scale.reshape(-1) if scale.size > 1 else scale.reshape(()),
                                                         scale_name))
        return self.dequantize(name, scale_name, "", 0 if scale.size > 1 else None)

    def float_op(self, node: onnx.NodeProto, op_type: str, inputs: list[str], out_scale: str, out_zero: str,
                 attributes: dict) -> None:
        float_out = self.fresh(f"{node.output[0]}_float")
        self.nodes.append(helper.make_node(op_type, inputs, [float_out], name=node.name or None, **attributes))
        self.quantize(float_out, node.output[0], out_scale, out_zero)

    def rewrite(self, node: onnx.NodeProto) -> None:
        op, i = node.op_type, list(node.input) + [""] * 9
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if op == "QuantizeLinear":
            self.nodes.append(node)
            self.grid[node.output[0]] = (i[1], i[2])
        elif op == "QLinearConv":
            x, w = self.dequantize(i[0], i[1], i[2]), self.dequantize(i[3], i[4], i[5], 0)
            inputs = [x, w] + ([self.bias(i[8], i[1], i[4])] if i[8] else [])
            self.float_op(node, "Conv", inputs, i[6], i[7], attributes)
        elif op == "QLinearMatMul":
            a, b = self.dequantize(i[0], i[1], i[2]), self.dequantize(i[3], i[4], i[5], 1)
            self.float_op(node, "MatMul", [a, b], i[6], i[7], attributes)
        elif op == "QGemm":
            trans_b = int(attributes.get("transB", 0))
            a, b = self.dequantize(i[0], i[1], i[2]), self.dequantize(i[3], i[4], i[5], 0 if trans_b else 1)
            inputs = [a, b] + ([self.bias(i[6], i[1], i[4])] if i[6] else [])
            if not i[7]:
                raise ModelLoadError(f"{self.where}: QGemm node {node.name!r} has a float output; ppqlike imports "
                                     "QGemm with a quantized output only")
            self.float_op(node, "Gemm", inputs, i[7], i[8], attributes)
        elif op in _BINARY:
            a, b = self.dequantize(i[0], i[1], i[2]), self.dequantize(i[3], i[4], i[5])
            self.float_op(node, _BINARY[op], [a, b], i[6], i[7], attributes)
        elif op in _UNARY:
            attributes.pop("opset", None)  # QLinearSoftmax: the Softmax opset whose axis semantics it follows
            if attributes.pop("channels_last", 0):
                raise ModelLoadError(f"{self.where}: {op} node {node.name!r} is channels-last; not supported")
            self.float_op(node, _UNARY[op], [self.dequantize(i[0], i[1], i[2])], i[3], i[4], attributes)
        elif op == "QLinearConcat":  # (y_scale, y_zero, then (x, scale, zero) triples)
            inputs = [self.dequantize(*node.input[k:k + 3]) for k in range(2, len(node.input), 3)]
            self.float_op(node, "Concat", inputs, i[0], i[1], attributes)
        elif any(name in self.grid for name in node.input):
            self.moves_integers(node)
        else:
            self.nodes.append(node)

    def moves_integers(self, node: onnx.NodeProto) -> None:
        """An op reading integer tensors: allowed when it only moves values (same grid out as in)."""
        if node.op_type not in VALUE_PRESERVING_TYPES or node.op_type == "DequantizeLinear":
            if node.op_type == "DequantizeLinear":
                self.nodes.append(node)
                return
            raise ModelLoadError(f"{self.where}: {node.op_type} node {node.name!r} computes on quantized integers; "
                                 "ppqlike imports QLinearConv/MatMul/Add/Mul/GlobalAveragePool/AveragePool/Concat/"
                                 "Sigmoid/LeakyRelu/Softmax, QGemm and ops that only move values")
        data = node.input[0]
        scale, zero = self.grid[data]
        inputs = [self.dequantize(name, *self.grid[name]) if name in self.grid else name for name in node.input]
        float_out = self.fresh(f"{node.output[0]}_float")
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:], copy.output[:]
        copy.input.extend(inputs)
        copy.output.extend([float_out] + list(node.output[1:]))
        self.nodes.append(copy)
        self.quantize(float_out, node.output[0], scale, zero)


def is_qoperator(model: onnx.ModelProto) -> bool:
    """Whether the model holds QOperator nodes (QLinearConv, QLinearAdd, ...)."""
    return any(node.op_type in QOPERATOR_TYPES for node in model.graph.node)


def qoperator_to_qdq(model: onnx.ModelProto, where: str = "model") -> onnx.ModelProto:
    """The QDQ form of a QOperator model (a new ModelProto; the input is not changed)."""
    rewriter = _Rewriter(model, where)
    for node in model.graph.node:
        rewriter.rewrite(node)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(rewriter.nodes)
    result.graph.initializer.extend(rewriter.initializers)
    domains = {node.domain for node in rewriter.nodes}
    imports = [o for o in result.opset_import if o.domain in domains or o.domain in ("", "ai.onnx")]
    del result.opset_import[:]
    result.opset_import.extend(imports)  # the contrib domain stays while a node still uses it
    return result
