"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearConv, QLinearMatMul, ConvInteger and
MatMulInteger, as a float model may carry them, against onnxruntime.

onnxruntime's Python API cannot return int4 tensors: the int4/uint4 cases are compared with onnx's
ReferenceEvaluator.  float8 codes come back from onnxruntime as the same bytes.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as T

from onnx_helpers import assert_matches_onnxruntime, run_executor, run_onnxruntime, run_reference, single_node_model

INTEGER_TYPES = [np.int8, np.uint8, np.int16, np.uint16]


def _float(shape, seed, scale=4.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _codes(dtype, shape, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _scales(shape, seed):
    return np.random.default_rng(seed).uniform(0.01, 0.2, shape).astype(np.float32)


@pytest.mark.parametrize("dtype", INTEGER_TYPES)
@pytest.mark.parametrize("granularity", ["tensor", "axis", "block"])
@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), data=st.data(), seed=st.integers(0, 2 ** 16))
def test_quantize_and_dequantize_linear(dtype, granularity, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    attributes, opset = {}, 13 if dtype in (np.int8, np.uint8) and granularity != "block" else 21
    if granularity == "tensor":
        parameter_shape = []
    elif granularity == "axis":
        parameter_shape = [shape[axis]]
        attributes["axis"] = axis
    else:
        block = data.draw(st.integers(1, max(shape[axis], 1)))
        parameter_shape = list(shape)
        parameter_shape[axis] = -(-shape[axis] // block)
        attributes.update(axis=axis, block_size=block)
    scale, zero_point = _scales(parameter_shape, seed), _codes(dtype, parameter_shape, seed + 1)
    x = _float(shape, seed + 2, 3.0) / 0.05          # past the code range too: saturation
    x.reshape(-1)[::5] = np.round(x.reshape(-1)[::5]) + 0.5      # ties: half to even
    inputs = {"x": x, "scale": scale, "zero_point": zero_point}
    assert_matches_onnxruntime("QuantizeLinear", inputs, attributes, opset=opset, initializers={"scale", "zero_point"})
    codes = {"q": _codes(dtype, shape, seed + 3), "scale": scale, "zero_point": zero_point}
    assert_matches_onnxruntime("DequantizeLinear", codes, attributes, opset=opset,
                               initializers={"scale", "zero_point"}, rtol=1e-6, atol=0)


@pytest.mark.parametrize("opset", [11, 13, 19, 21, 23])
def test_quantize_linear_defaults(opset):
    """No zero point: uint8; int32 input; DequantizeLinear of int32 codes."""
    x = np.array([-3.7, -0.5, 0.5, 1.5, 2.5, 300.0], np.float32)
    assert_matches_onnxruntime("QuantizeLinear", {"x": x, "scale": np.array(0.5, np.float32)}, opset=opset,
                               initializers={"scale"})
    q = np.array([-1000, 0, 7, 2 ** 20], np.int32)
    assert_matches_onnxruntime("DequantizeLinear", {"q": q, "scale": np.array(0.25, np.float32)}, opset=opset,
                               initializers={"scale"}, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype_code", [T.INT16, T.UINT16, T.INT8])
def test_quantize_linear_output_dtype(dtype_code):
    x = _float([3, 4], 1) / 0.01
    assert_matches_onnxruntime("QuantizeLinear", {"x": x, "scale": np.array(0.02, np.float32)},
                               {"output_dtype": dtype_code}, opset=21, initializers={"scale"})


@pytest.mark.parametrize("dtype_code", [T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8_codes(dtype_code, saturate):
    """float8 codes: onnxruntime returns e4m3fn as its bytes (the executor's array viewed as bytes must
    agree); the types it cannot return are compared with the ReferenceEvaluator."""
    x = np.concatenate([_float([20], 3), np.array([1e6, -1e6, 0.0, 0.3], np.float32)])
    attributes = {"output_dtype": dtype_code, "saturate": saturate}
    model = single_node_model("QuantizeLinear", {"x": x, "scale": np.array(0.5, np.float32)}, attributes, opset=21,
                              initializers={"scale"}, infer_with_reference=True)
    want = run_onnxruntime(model, {"x": x})[0] if dtype_code == T.FLOAT8E4M3FN else run_reference(model, {"x": x})[0]
    got = run_executor(model, {"x": x})[0]
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    codes = got.copy()
    back = single_node_model("DequantizeLinear", {"q": codes, "scale": np.array(0.5, np.float32)}, {}, opset=21,
                             initializers={"scale"}, infer_with_reference=True)
    np.testing.assert_array_equal(run_executor(back, {"q": codes})[0], run_reference(back, {"q": codes})[0])


@pytest.mark.parametrize("dtype_code", [T.INT4, T.UINT4])
def test_int4_codes_against_the_reference(dtype_code):
    x = _float([4, 6], 5) / 0.5
    scale = _scales([4, 3], 6)
    assert_matches_onnxruntime("QuantizeLinear", {"x": x, "scale": scale},
                               {"output_dtype": dtype_code, "axis": 1, "block_size": 2}, opset=21,
                               initializers={"scale"}, reference=True)


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), spread=st.sampled_from([0.0, 1.0, 50.0]),
       shift=st.sampled_from([-10.0, 0.0, 10.0]), seed=st.integers(0, 2 ** 16))
def test_dynamic_quantize_linear(shape, spread, shift, seed):
    x = _float(shape, seed, spread) + np.float32(shift)
    assert_matches_onnxruntime("DynamicQuantizeLinear", {"x": x}, opset=11, n_outputs=3, rtol=1e-6, atol=0)


def _conv_inputs(rng, x_type, w_type, n, c, m, size, kernel, per_channel):
    return {"x": _codes(x_type, (n, c) + size, rng.integers(1 << 16)),
            "w": _codes(w_type, (m, c) + kernel, rng.integers(1 << 16)),
            "x_zero_point": _codes(x_type, (), rng.integers(1 << 16)),
            "w_zero_point": np.zeros(m if per_channel else (), w_type) if w_type == np.int8 else
            _codes(w_type, (), rng.integers(1 << 16))}


@pytest.mark.parametrize("x_type,w_type", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 4), m=st.integers(1, 4),
       size=st.tuples(st.integers(3, 7), st.integers(3, 7)),
       kernel=st.sampled_from([(1, 1), (3, 3), (2, 3)]), stride=st.integers(1, 2), pad=st.integers(0, 1),
       per_channel=st.booleans(), with_bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_qlinear_conv(x_type, w_type, n, c, m, size, kernel, stride, pad, per_channel, with_bias, seed):
    rng = np.random.default_rng(seed)
    raw = _conv_inputs(rng, x_type, w_type, n, c, m, size, kernel, per_channel and w_type == np.int8)
    inputs = {"x": raw["x"], "x_scale": np.array(0.02, np.float32), "x_zero_point": raw["x_zero_point"],
              "w": raw["w"], "w_scale": _scales([m] if per_channel else [], seed), "w_zero_point": raw["w_zero_point"],
              "y_scale": np.array(rng.uniform(0.5, 4), np.float32), "y_zero_point": _codes(x_type, (), seed + 9)}
    if with_bias:
        inputs["b"] = rng.integers(-5000, 5000, m).astype(np.int32)
    if np.size(inputs["w_scale"]) > 1 and np.size(inputs["w_zero_point"]) == 1:
        inputs["w_zero_point"] = np.full(m, inputs["w_zero_point"], w_type)
    attributes = {"strides": [stride] * 2, "pads": [pad] * 4}
    assert_matches_onnxruntime("QLinearConv", inputs, attributes, opset=11, initializers=set(inputs) - {"x"})


@pytest.mark.parametrize("x_type,w_type", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@settings(max_examples=8, deadline=None)
@given(c=st.integers(1, 4), m=st.integers(1, 4), size=st.tuples(st.integers(2, 6), st.integers(2, 6)),
       group=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_conv_integer(x_type, w_type, c, m, size, group, seed):
    rng = np.random.default_rng(seed)
    raw = _conv_inputs(rng, x_type, w_type, 1, c * group, m * group, size, (2, 2), False)
    raw["w"] = raw["w"][:, :c]
    inputs = {"x": raw["x"], "w": raw["w"], "x_zero_point": raw["x_zero_point"], "w_zero_point": raw["w_zero_point"]}
    assert_matches_onnxruntime("ConvInteger", inputs, {"group": group}, opset=11,
                               initializers={"w", "x_zero_point", "w_zero_point"})


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@settings(max_examples=10, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 5), k=st.integers(1, 6), n=st.integers(1, 5),
       per_column=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matmul_integer_and_qlinear_matmul(a_type, b_type, batch, m, k, n, per_column, seed):
    rng = np.random.default_rng(seed)
    a, b = _codes(a_type, batch + [m, k], seed), _codes(b_type, [k, n], seed + 1)
    a_zero_point = _codes(a_type, (), seed + 2)
    b_zero_point = _codes(b_type, [n] if per_column else (), seed + 3)
    assert_matches_onnxruntime("MatMulInteger", {"a": a, "b": b, "a_zero_point": a_zero_point,
                                                 "b_zero_point": b_zero_point}, opset=11,
                               initializers={"b", "a_zero_point", "b_zero_point"})
    inputs = {"a": a, "a_scale": np.array(0.03, np.float32), "a_zero_point": a_zero_point, "b": b,
              "b_scale": _scales([n] if per_column else [], seed), "b_zero_point": b_zero_point,
              "y_scale": np.array(rng.uniform(0.2, 2), np.float32), "y_zero_point": _codes(a_type, (), seed + 4)}
    assert_matches_onnxruntime("QLinearMatMul", inputs, opset=21, initializers=set(inputs) - {"a"})
