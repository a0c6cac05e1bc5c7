"""Activation kernels against onnxruntime: attributes, opset forms, extreme inputs."""

import math

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime

RNG = np.random.default_rng(1)
SHAPES = [[2, 3, 4, 5], [7], []]
EXTREMES = np.array([-1e4, -100.0, -89.0, -20.0, -1.0, -0.0, 0.0, 1e-6, 1.0, 20.0, 89.0, 100.0, 1e4],
                    np.float32)


def _float(shape, scale=3.0, dtype=np.float32):
    return np.asarray(RNG.normal(0.0, scale, shape), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op,opset", [
    ("Relu", 13), ("Sigmoid", 13), ("Tanh", 13), ("HardSwish", 14), ("Softplus", 13),
    ("Softsign", 13), ("Mish", 18), ("Elu", 13), ("Selu", 13), ("Celu", 13), ("HardSigmoid", 13),
    ("LeakyRelu", 13), ("ThresholdedRelu", 13)])
def test_unary_activations(op, opset, shape):
    assert_matches_onnxruntime(op, {"x": _float(shape)}, opset=opset)


@pytest.mark.parametrize("op,opset", [
    ("Relu", 13), ("Sigmoid", 13), ("Tanh", 13), ("HardSwish", 14), ("Softplus", 13), ("Softsign", 13),
    ("Mish", 18), ("Elu", 13), ("Selu", 13), ("HardSigmoid", 13), ("LeakyRelu", 13)])
def test_extreme_inputs_are_stable(op, opset):
    assert_matches_onnxruntime(op, {"x": EXTREMES}, opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh"])
def test_double(op):
    assert_matches_onnxruntime(op, {"x": _float([3, 4], dtype=np.float64)}, rtol=1e-12, atol=1e-15)


def test_relu_integer_and_nan():
    assert_matches_onnxruntime("Relu", {"x": RNG.integers(-9, 9, [3, 4]).astype(np.int32)}, opset=14)
    assert_matches_onnxruntime("Relu", {"x": np.array([np.nan, -1, 1, -np.inf], np.float32)})


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.5, -0.5, 0.0])
def test_leaky_relu_alpha(alpha):
    assert_matches_onnxruntime("LeakyRelu", {"x": _float([2, 3, 4])}, {"alpha": alpha}, exact=True)


@pytest.mark.parametrize("slope_shape", [[3, 1, 1], [5], [1], [4, 5], [2, 3, 4, 5]])
@pytest.mark.parametrize("opset", [11, 13, 16])
def test_prelu_slope_broadcasting(slope_shape, opset):
    slope = np.asarray(RNG.uniform(-0.5, 0.5, slope_shape), np.float32)
    assert_matches_onnxruntime("PRelu", {"x": _float([2, 3, 4, 5]), "slope": slope},
                               initializers={"slope"}, opset=opset)


def test_prelu_integer():
    x = RNG.integers(-9, 9, [2, 3]).astype(np.int32)
    assert_matches_onnxruntime("PRelu", {"x": x, "slope": np.array([1, 2, 3], np.int32)}, opset=16)


@pytest.mark.parametrize("low,high", [(0.0, 6.0), (None, 1.0), (-1.0, None), (None, None), (2.0, 1.0)])
@pytest.mark.parametrize("opset", [11, 13])
def test_clip_optional_bounds(low, high, opset):
    inputs = {"x": _float([2, 3, 4, 5]),
              "low": None if low is None else np.array(low, np.float32),
              "high": None if high is None else np.array(high, np.float32)}
    assert_matches_onnxruntime("Clip", inputs, initializers={"low", "high"}, opset=opset, exact=True)


def test_clip_trailing_inputs_omitted_and_runtime_bounds():
    assert_matches_onnxruntime("Clip", {"x": _float([3, 4]), "low": np.array(0.5, np.float32)}, opset=13)
    assert_matches_onnxruntime("Clip", {"x": _float([3, 4])}, opset=13)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
def test_clip_other_dtypes(dtype):
    x = RNG.integers(0 if dtype == np.uint8 else -50, 50, [3, 4]).astype(dtype)
    inputs = {"x": x, "low": np.array(3, dtype), "high": np.array(20, dtype)}
    assert_matches_onnxruntime("Clip", inputs, initializers={"low", "high"}, opset=13, exact=True)


@pytest.mark.parametrize("attributes", [{"min": 0.0, "max": 6.0}, {"min": -1.0}, {"max": 0.5}, {}])
def test_clip_attribute_form_before_opset11(attributes):
    # the loader reads opset 11+, so the opset-6 form is checked on the kernel directly
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    x = _float([3, 4])
    out, = build_kernel(Operation("c", "Clip", attributes), 10)([x])
    expected = np.clip(x, attributes.get("min", -np.inf), attributes.get("max", np.inf))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("attributes", [{}, {"alpha": 0.1, "beta": 0.3}, {"alpha": -0.5, "beta": 0.8}])
def test_hard_sigmoid_attributes(attributes):
    assert_matches_onnxruntime("HardSigmoid", {"x": _float([2, 3, 4])}, attributes)


@pytest.mark.parametrize("op,attributes", [
    ("Elu", {"alpha": 0.5}), ("Selu", {"alpha": 1.5, "gamma": 2.0}), ("Celu", {"alpha": 2.0}),
    ("ThresholdedRelu", {"alpha": 0.5}), ("ThresholdedRelu", {"alpha": -1.0})])
def test_activation_attributes(op, attributes):
    assert_matches_onnxruntime(op, {"x": _float([2, 3, 4])}, attributes, opset=13)


SOFTMAX_CASES = [(axis, opset) for opset in (11, 12) for axis in (None, 0, 1, 2, -1)] + \
                [(axis, 13) for axis in (None, 0, 1, 2, -1, -3)]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis,opset", SOFTMAX_CASES)
def test_softmax_axis_semantics(op, axis, opset):
    attributes = {} if axis is None else {"axis": axis}
    assert_matches_onnxruntime(op, {"x": _float([2, 3, 4])}, attributes, opset=opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_is_stable(op, opset):
    x = np.array([[1000.0, 999.0, -1000.0, 0.0], [-1e4, -1e4 + 1, -1e4 + 2, -1e4],
                  [-np.inf, 0.0, 1.0, 2.0]], np.float32)
    assert_matches_onnxruntime(op, {"x": x}, opset=opset, rtol=1e-5, atol=1e-5)


def test_softmax_rank1_and_double():
    assert_matches_onnxruntime("Softmax", {"x": _float([7])}, {"axis": 0}, opset=11)
    assert_matches_onnxruntime("LogSoftmax", {"x": _float([7])}, {"axis": -1}, opset=12)
    assert_matches_onnxruntime("Softmax", {"x": _float([3, 5], dtype=np.float64)}, rtol=1e-12, atol=1e-15)
    assert_matches_onnxruntime("LogSoftmax", {"x": _float([3, 5], dtype=np.float64)}, rtol=1e-12,
                               atol=1e-13)


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
@pytest.mark.parametrize("shape", [[2, 3, 4, 5], []])
def test_gelu(approximate, shape):
    attributes = {} if approximate is None else {"approximate": approximate}
    assert_matches_onnxruntime("Gelu", {"x": _float(shape)}, attributes, opset=20)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_extremes(approximate):
    x = np.concatenate([EXTREMES, np.linspace(-8, 8, 1601, dtype=np.float32)])
    assert_matches_onnxruntime("Gelu", {"x": x}, {"approximate": approximate}, opset=20)


def test_gelu_double():
    # onnxruntime has no double erf (Gelu 'none' fails there) and its double
    # 'tanh' Gelu is off by up to 6e-9, so double is checked against math.erfc
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    x = np.concatenate([_float([200], dtype=np.float64), EXTREMES.astype(np.float64)])
    out, = build_kernel(Operation("g", "Gelu"), 20)([x])
    expected = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-300)
    assert_matches_onnxruntime("Gelu", {"x": x}, {"approximate": "tanh"}, opset=20, rtol=1e-7, atol=1e-8)


def test_gelu_rejects_unknown_approximation():
    from ppqlike.core.errors import UnsupportedOperationError
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    with pytest.raises(UnsupportedOperationError):
        build_kernel(Operation("g", "Gelu", {"approximate": "fast"}), 20)


def test_kernels_do_not_modify_inputs():
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    x = _float([2, 3])
    saved = x.copy()
    for op in ["Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Softmax",
               "LogSoftmax", "Gelu", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish"]:
        out, = build_kernel(Operation("n", op), 20)([x])
        np.testing.assert_array_equal(x, saved)
        assert not np.shares_memory(out, x)


@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 0), (11, -2), (12, 3), (13, 1), (13, -1), (13, 0)])
def test_hardmax_matches_onnxruntime(opset, axis):
    x = _float([2, 3, 4, 5])
    x[0, 1, 2, :] = 7.0  # ties: the first largest wins
    assert_matches_onnxruntime("Hardmax", {"x": x}, {"axis": axis}, opset=opset, exact=True)


@pytest.mark.parametrize("op, opset, attributes", [("Softmax", 13, {}), ("LogSoftmax", 13, {}),
                                                    ("Softmax", 11, {"axis": 3}), ("Erf", 13, {}),
                                                    ("Gelu", 20, {})])
def test_large_tensors_on_the_kernel_threads(op, opset, attributes):
    """Attention-sized Softmax rows and MLP-sized Erf/Gelu blocks shared out among 2 and 3 threads
    (uneven splits) give onnxruntime's values."""
    from ppqlike.executor.ops import _threads
    x = _float([2, 3, 97, 197]) * 4   # 114,654 elements: several row blocks, one to three Erf blocks
    if op != "Softmax" or opset != 11:
        x = np.concatenate([x, x[:1] * 0.5])
    for threads in (2, 3):
        _threads.set_num_threads(threads)
        try:
            assert_matches_onnxruntime(op, {"x": x}, attributes, opset=opset, rtol=1e-5, atol=1e-6)
        finally:
            _threads.set_num_threads(None)
