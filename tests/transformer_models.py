"""Small transformer encoder blocks written the ways exporters write them (tests only).

``encoder_model`` builds one pre-norm block, x [N, T, C]:
LayerNorm -> Q, K, V projections -> Q K^T / sqrt(C) -> Softmax -> x V -> projection -> residual Add ->
LayerNorm -> MLP with GELU -> residual Add.  ``layer_norm`` and ``gelu`` choose the spelling:

* layer_norm: ``pytorch`` (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta: what
  torch.onnx writes for nn.LayerNorm before opset 17), ``mul_reciprocal`` (Mul(d, d) and Mul by Reciprocal,
  no gamma/beta), ``op`` (LayerNormalization, opset 17), ``e_x2`` (ReduceMean(x * x) - Pow(ReduceMean(x), 2),
  + eps, Sqrt, (x - mean) / std, gamma, beta), ``e_x2_reduce_sum`` (jax2tf's: ReduceSum(keepdims=0) * 1/C,
  Max(0, .) on the variance, Reciprocal of Sqrt, (x - mean) * (rsqrt * gamma) + beta), ``keras`` (TensorFlow's:
  mean, Sub and Mul for the squared difference, variance, + eps, Sqrt, Reciprocal, * gamma = k, then
  x * k + (beta - mean * k)), ``rms`` (x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps)) * gamma),
  ``rms_pow`` (x * Pow(ReduceMean(x * x) + eps, -0.5) * gamma), ``rms_div`` (gamma * (x / Sqrt(...)));
* gelu: ``erf`` (x * (1 + Erf(x / sqrt 2)) * 0.5, torch's exact GELU), ``erf_half_first`` ((x * 0.5) *
  (1 + Erf(x * 0.7071))), ``op`` (Gelu, opset 20), ``tanh_pow`` (0.5 * x * (1 + Tanh(0.79788456 * (x + 0.044715 *
  Pow(x, 3))))), ``tanh_mul`` (jax2tf's: Mul(0.044715, x), two Muls by x, Add x, Mul 0.7978846, Tanh, Add 1,
  Mul 0.5, Mul x), ``tanh_factored`` (x * (0.5 + 0.5 * Tanh(0.797885 * x * (1 + 0.044715 * x * x)))),
  ``quick`` (x * Sigmoid(1.702 * x)).
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

    def integers(self, value, prefix: str = "axes") -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
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
        if style in _OTHER_NORMS:
            return _OTHER_NORMS[style](self, x, gamma, beta)
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
        if style in _TANH_GELUS:
            return _TANH_GELUS[style](self, x)
        if style == "op":
            return self.op("Gelu", [x])
        if style == "erf":
            erf = self.op("Erf", [self.op("Div", [x, self.constant(np.sqrt(2.0))])])
            product = self.op("Mul", [x, self.op("Add", [erf, self.constant(1.0)])])
            return self.op("Mul", [product, self.constant(0.5)])
        half = self.op("Mul", [x, self.constant(0.5)])
        erf = self.op("Erf", [self.op("Mul", [x, self.constant(0.70710678)])])
        return self.op("Mul", [half, self.op("Add", [self.constant(1.0), erf])])


def _e_x2(b: _Builder, x: str, gamma: str, beta: str) -> str:
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    variance = b.op("Sub", [b.op("ReduceMean", [b.op("Mul", [x, x])], axes=[-1], keepdims=1),
                            b.op("Pow", [mean, b.constant(2.0)])])
    deviation = b.op("Sqrt", [b.op("Add", [variance, b.constant(1e-5)])])
    normalised = b.op("Div", [b.op("Sub", [x, mean]), deviation])
    return b.op("Add", [b.op("Mul", [normalised, gamma]), beta])


def _e_x2_reduce_sum(b: _Builder, x: str, gamma: str, beta: str) -> str:
    axes, inverse = b.integers([-1]), b.constant(1.0 / CHANNELS)
    mean = b.op("Mul", [b.op("ReduceSum", [x, axes], keepdims=0), inverse])
    square_mean = b.op("Mul", [b.op("ReduceSum", [b.op("Mul", [x, x]), axes], keepdims=0), inverse])
    variance = b.op("Max", [b.constant(0.0), b.op("Sub", [square_mean, b.op("Mul", [mean, mean])])])
    variance = b.op("Unsqueeze", [variance, axes])
    scale = b.op("Mul", [b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [variance, b.constant(1e-6)])])]), gamma])
    centred = b.op("Sub", [x, b.op("Unsqueeze", [mean, axes])])
    return b.op("Add", [b.op("Mul", [centred, scale]), beta])


def _keras(b: _Builder, x: str, gamma: str, beta: str) -> str:
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    difference = b.op("Sub", [x, mean])
    variance = b.op("ReduceMean", [b.op("Mul", [difference, difference])], axes=[-1], keepdims=1)
    inverse = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [variance, b.constant(1e-3)])])])
    scale = b.op("Mul", [inverse, gamma])
    shift = b.op("Sub", [beta, b.op("Mul", [mean, scale])])
    return b.op("Add", [b.op("Mul", [x, scale]), shift])


def _rms(b: _Builder, x: str, gamma: str, beta: str, style: str = "rms") -> str:
    square = b.op("Pow", [x, b.constant(2.0)]) if style == "rms" else b.op("Mul", [x, x])
    variance = b.op("Add", [b.op("ReduceMean", [square], axes=[-1], keepdims=1), b.constant(1e-6)])
    if style == "rms_pow":
        return b.op("Mul", [b.op("Mul", [x, b.op("Pow", [variance, b.constant(-0.5)])]), gamma])
    if style == "rms_div":
        return b.op("Mul", [gamma, b.op("Div", [x, b.op("Sqrt", [variance])])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Reciprocal", [b.op("Sqrt", [variance])])]), gamma])


_OTHER_NORMS = {"e_x2": _e_x2, "e_x2_reduce_sum": _e_x2_reduce_sum, "keras": _keras, "rms": _rms,
                "rms_pow": lambda b, x, g, beta: _rms(b, x, g, beta, "rms_pow"),
                "rms_div": lambda b, x, g, beta: _rms(b, x, g, beta, "rms_div")}


def _tanh_pow(b: _Builder, x: str) -> str:
    inner = b.op("Add", [x, b.op("Mul", [b.op("Pow", [x, b.constant(3.0)]), b.constant(0.044715)])])
    gate = b.op("Add", [b.op("Tanh", [b.op("Mul", [inner, b.constant(0.79788456)])]), b.constant(1.0)])
    return b.op("Mul", [b.op("Mul", [x, b.constant(0.5)]), gate])


def _tanh_mul(b: _Builder, x: str) -> str:
    cube = b.op("Mul", [x, b.op("Mul", [x, b.op("Mul", [b.constant(0.044715), x])])])
    gate = b.op("Tanh", [b.op("Mul", [b.constant(0.7978846), b.op("Add", [x, cube])])])
    return b.op("Mul", [x, b.op("Mul", [b.constant(0.5), b.op("Add", [b.constant(1.0), gate])])])


def _tanh_factored(b: _Builder, x: str) -> str:
    polynomial = b.op("Add", [b.constant(1.0), b.op("Mul", [b.op("Mul", [x, x]), b.constant(0.044715)])])
    gate = b.op("Tanh", [b.op("Mul", [b.op("Mul", [x, b.constant(0.797885)]), polynomial])])
    return b.op("Mul", [x, b.op("Add", [b.constant(0.5), b.op("Mul", [gate, b.constant(0.5)])])])


_TANH_GELUS = {"tanh_pow": _tanh_pow, "tanh_mul": _tanh_mul, "tanh_factored": _tanh_factored,
               "quick": lambda b, x: b.op("Mul", [x, b.op("Sigmoid", [b.op("Mul", [x, b.constant(1.702)])])])}


def mlp_model(layer_norm: str, gelu: str, seed: int = 0, scale: float = 4.0, offset: float = 0.0
              ) -> onnx.ModelProto:
    """x [N, 6, 8] -> Linear (about the identity: the outlier channels stay; ``offset`` added to every channel,
    the common offset residual streams carry) -> LayerNorm -> Linear (weights x ``scale``: pre-activations of a few
    units, as in trained FFNs) -> GELU -> Linear -> y: the blocks alone, after a quantized op as in a real
    network, without the residual that would hide their error."""
    b = _Builder(seed)
    lead = b.constant(np.eye(CHANNELS) + 0.1 * b.rng.standard_normal((CHANNELS, CHANNELS)), "w")
    stream = b.op("MatMul", ["x", lead])
    if offset:
        stream = b.op("Add", [stream, b.constant(np.full(CHANNELS, offset))])
    hidden = b.linear(b.layer_norm(stream, layer_norm), CHANNELS, HIDDEN)
    weight = b.initializers[-2]
    b.initializers[-2] = numpy_helper.from_array(numpy_helper.to_array(weight) * scale, weight.name)
    output = b.linear(b.gelu(hidden, gelu), HIDDEN, CHANNELS)
    b.nodes.append(helper.make_node("Identity", [output], ["y"], name="y_op"))
    return _model(b, "mlp", 20 if gelu == "op" else 17 if layer_norm == "op" else 13)


def _model(b: _Builder, name: str, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           ["N", TOKENS, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", TOKENS, CHANNELS])],
                              b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


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
    return _model(b, "encoder", 20 if gelu == "op" else 17 if layer_norm == "op" else 13)


def encoder_inputs(count: int, seed: int) -> np.ndarray:
    """Token activations with two outlier channels, as real transformers have."""
    x = np.random.default_rng(seed).standard_normal((count, TOKENS, CHANNELS)).astype(np.float32)
    x[..., 2] *= 8.0
    x[..., 5] += 4.0
    return x
