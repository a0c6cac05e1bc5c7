"""BatchNormalization, LayerNormalization and InstanceNormalization against onnxruntime."""

import numpy as np
import pytest

import ppqlike
from ppqlike.core.errors import PPQLikeError
from onnx_helpers import assert_matches_onnxruntime, single_node_model

RTOL, ATOL = 1e-5, 1e-5


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _bn_inputs(shape, seed=0):
    c = shape[1]
    rng = np.random.default_rng(seed)
    return {"x": _data(*shape, seed=seed), "scale": _data(c, seed=seed + 1), "bias": _data(c, seed=seed + 2),
            "mean": _data(c, seed=seed + 3), "var": rng.uniform(0.1, 2.0, c).astype(np.float32)}


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (3, 5), (2, 3, 7), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("epsilon", [1e-5, 1e-2])
def test_batch_normalization(shape, epsilon):
    assert_matches_onnxruntime("BatchNormalization", _bn_inputs(shape), {"epsilon": epsilon},
                               initializers={"scale", "bias", "mean", "var"}, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [11, 15])
def test_batch_normalization_opsets(opset):
    assert_matches_onnxruntime("BatchNormalization", _bn_inputs((2, 3, 4, 4), seed=5), opset=opset,
                               initializers={"scale", "bias", "mean", "var"}, rtol=RTOL, atol=ATOL)


def test_batch_normalization_training_mode_is_unsupported():
    graph = ppqlike.Graph(opset=15)
    x = graph.create_variable("x", shape=[2, 3, 4, 4], dtype=np.float32)
    parameters = [graph.create_variable(name, value=value) for name, value in _bn_inputs((2, 3, 4, 4)).items()
                  if name != "x"]
    outputs = [graph.create_variable(name) for name in ("y", "running_mean", "running_var")]
    graph.inputs.append(x)
    graph.outputs.append(outputs[0])
    graph.create_operation("BatchNormalization", [x, *parameters], outputs, attributes={"training_mode": 1})
    with pytest.raises(PPQLikeError, match="training_mode"):
        ppqlike.NumpyExecutor(graph)


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_normalization(axis):
    shape = (2, 3, 4, 5)
    normalized = shape[axis:]
    inputs = {"x": _data(*shape), "scale": _data(*normalized, seed=1), "bias": _data(*normalized, seed=2)}
    assert_matches_onnxruntime("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, opset=17,
                               initializers={"scale", "bias"}, rtol=1e-4, atol=1e-5)


def test_layer_normalization_without_bias():
    # onnxruntime 1.31 crashes on a LayerNormalization without its bias input: compare with a zero bias
    x, scale = _data(2, 3, 4, 5), _data(4, 5, seed=1)
    with_zero = single_node_model("LayerNormalization", {"x": x, "scale": scale, "bias": np.zeros_like(scale)},
                                  {"axis": 2}, opset=17, initializers={"scale", "bias"})
    expected = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(with_zero)).forward({"x": x})[0]
    without = single_node_model("LayerNormalization", {"x": x, "scale": scale}, {"axis": 2}, opset=17,
                                initializers={"scale"})
    got = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(without)).forward({"x": x})[0]
    np.testing.assert_array_equal(got, expected)


def test_layer_normalization_statistics_outputs():
    inputs = {"x": _data(3, 4, 6), "scale": _data(6, seed=1), "bias": _data(6, seed=2)}
    assert_matches_onnxruntime("LayerNormalization", inputs, {"axis": -1}, opset=17, n_outputs=3,
                               initializers={"scale", "bias"}, rtol=1e-4, atol=1e-5)


def test_layer_normalization_broadcast_scale():
    inputs = {"x": _data(2, 3, 8), "scale": _data(1, 8, seed=1)[0], "bias": _data(8, seed=2)}
    assert_matches_onnxruntime("LayerNormalization", inputs, {"axis": 2}, opset=17,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 4, 9), (1, 2, 3, 4, 5)])
def test_instance_normalization(shape):
    inputs = {"x": _data(*shape), "scale": _data(shape[1], seed=1), "bias": _data(shape[1], seed=2)}
    assert_matches_onnxruntime("InstanceNormalization", inputs, {"epsilon": 1e-4},
                               initializers={"scale", "bias"}, rtol=1e-4, atol=1e-5)
