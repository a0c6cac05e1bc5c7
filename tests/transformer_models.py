"""Small transformer encoder blocks written the ways exporters write them (tests only).

``encoder_model`` builds one pre-norm block, x [N, T, C]:
LayerNorm -> Q, K, V projections -> Q K^T / sqrt(C) -> Softmax -> x V -> projection -> residual Add ->
LayerNorm -> MLP with GELU -> residual Add.  ``layer_norm`` and ``gelu`` choose the spelling:

* layer_norm: ``pytorch`` (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta: what
  torch.onnx writes for nn.LayerNorm before opset 17), ``mul_reciprocal`` (Mul(d, d) and Mul by Reciprocal,
  no gamma/beta), ``op`` (LayerNormalization, opset 17);
* gelu: ``erf`` (x * (1 + Erf(x / sqrt 2)) * 0.5, torch's exact GELU), ``erf_half_first`` ((x * 0.5) *
  (1 + Erf(x * 0.7071))), ``op`` (Gelu, opset 20).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOKENS, CHANNELS, HIDDEN = 6, 8, 16


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.count = [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def constant(self, value, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def op(self, op_type: str, inputs, prefix: str | None = None, **attributes) -> str:
        output = self.name(prefix or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output + "_op", **attributes))
        return output

    def linear(self, x: str, fan_in: int, fan_out: int) -> str:
        weight = self.constant(self.rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in), "w")
        bias = self.constant(self.rng.standard_normal(fan_out) * 0.1, "b")
        return self.op("Add", [self.op("MatMul", [x, weight]), bias])

    def layer_norm(self, x: str, style: str) -> str:
        gamma = self.constant(1 + 0.1 * self.rng.standard_normal(CHANNELS), "gamma")
        beta = self.constant(0.1 * self.rng.standard_normal(CHANNELS), "beta")
        if style == "op":
            return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)
        centred = self.op("Sub", [x, self.op("ReduceMean", [x], axes=[-1], keepdims=1)])
        square = (self.op("Pow", [centred, self.constant(2.0)]) if style == "pytorch"
                  else self.op("Mul", [centred, centred]))
        variance = self.op("ReduceMean", [square], axes=[-1], keepdims=1)
        deviation = self.op("Sqrt", [self.op("Add", [variance, self.constant(1e-5)])])
        if style == "pytorch":
            normalised = self.op("Div", [centred, deviation])
            return self.op("Add", [self.op("Mul", [normalised, gamma]), beta])
        return self.op("Mul", [centred, self.op("Reciprocal", [deviation])])

    def gelu(self, x: str, style: str) -> str:
        if style == "op":
            return self.op("Gelu", [x])
        if style == "erf":
            erf = self.op("Erf", [self.op("Div", [x, self.constant(np.sqrt(2.0))])])
            product = self.op("Mul", [x, self.op("Add", [erf, self.constant(1.0)])])
            return self.op("Mul", [product, self.constant(0.5)])
        half = self.op("Mul", [x, self.constant(0.5)])
        erf = self.op("Erf", [self.op("Mul", [x, self.constant(0.70710678)])])
        return self.op("Mul", [half, self.op("Add", [self.constant(1.0), erf])])


def encoder_model(layer_norm: str = "pytorch", gelu: str = "erf", seed: int = 0) -> onnx.ModelProto:
    """One pre-norm transformer encoder block (see the module docstring); input 'x' [N, 6, 8]."""
    b = _Builder(seed)
    normed = b.layer_norm("x", layer_norm)
    query, key, value = (b.linear(normed, CHANNELS, CHANNELS) for _ in range(3))
    scores = b.op("MatMul", [query, b.op("Transpose", [key], perm=[0, 2, 1])], "scores")
    probabilities = b.op("Softmax", [b.op("Div", [scores, b.constant(np.sqrt(CHANNELS))])], axis=-1)
    attended = b.op("MatMul", [probabilities, value], "attended")
    residual = b.op("Add", ["x", b.linear(attended, CHANNELS, CHANNELS)], "residual")
    hidden = b.gelu(b.linear(b.layer_norm(residual, layer_norm), CHANNELS, HIDDEN), gelu)
    output = b.op("Add", [residual, b.linear(hidden, HIDDEN, CHANNELS)], "output")
    b.nodes.append(helper.make_node("Identity", [output], ["y"], name="y_op"))
    opset = 20 if gelu == "op" else 17 if layer_norm == "op" else 13
    graph = helper.make_graph(b.nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["N", TOKENS, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", TOKENS, CHANNELS])],
                              b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def encoder_inputs(count: int, seed: int) -> np.ndarray:
    """Token activations with two outlier channels, as real transformers have."""
    x = np.random.default_rng(seed).standard_normal((count, TOKENS, CHANNELS)).astype(np.float32)
    x[..., 2] *= 8.0
    x[..., 5] += 4.0
    return x
