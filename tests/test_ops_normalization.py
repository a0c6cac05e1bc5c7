"""The normalization kernels against onnxruntime: BatchNormalization, LayerNormalization,
InstanceNormalization, GroupNormalization (opsets 18 and 21), RMSNormalization, LpNormalization,
MeanVarianceNormalization and LRN."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

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


@pytest.mark.parametrize("opset", [18, 21])
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 2), groups=st.integers(1, 3), per_group=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 4), max_size=2), epsilon=st.sampled_from([1e-5, 1e-2]))
def test_group_normalization(opset, n, groups, per_group, spatial, epsilon):
    """Opset 18: scale and bias per group; opset 21: per channel."""
    channels = groups * per_group
    count = groups if opset == 18 else channels
    x = _data(n, channels, *spatial, seed=channels) * 3 + 1
    inputs = {"x": x, "scale": _data(count, seed=1), "bias": _data(count, seed=2)}
    # onnx.checker refuses the deprecated opset 18 form (which onnxruntime runs): no importer checks there
    assert_matches_onnxruntime("GroupNormalization", inputs, {"num_groups": groups, "epsilon": epsilon},
                               opset=opset, initializers={"scale", "bias"}, rtol=1e-4, atol=1e-5,
                               checked=opset != 18)


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       epsilon=st.sampled_from([1e-5, 1e-1]))
def test_rms_normalization(shape, data, epsilon):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    normalized = shape[axis:] if axis < 0 else shape[axis:]
    scale_shape = data.draw(st.sampled_from([normalized, normalized[-1:]]))
    inputs = {"x": _data(*shape, seed=len(shape)), "scale": _data(*scale_shape, seed=3)}
    assert_matches_onnxruntime("RMSNormalization", inputs, {"axis": axis, "epsilon": epsilon}, opset=23,
                               initializers={"scale"}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("opset", [21, 22])
@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_lp_normalization(p, opset, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = _data(*shape, seed=4)
    x[(0,) * len(shape)] = 0.0
    assert_matches_onnxruntime("LpNormalization", {"x": x}, {"axis": axis, "p": p}, opset=opset,
                               rtol=1e-4, atol=1e-6)


def test_lp_normalization_zero_norm():
    x = np.zeros((2, 3), np.float32)
    x[1] = [3, 4, 0]
    assert_matches_onnxruntime("LpNormalization", {"x": x}, {"axis": 1}, opset=21, exact=True)


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=4, max_size=4), data=st.data())
def test_mean_variance_normalization(shape, data):
    axes = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True)))
    x = _data(*shape, seed=5) * 2 + 1
    assert_matches_onnxruntime("MeanVarianceNormalization", {"x": x}, {} if axes is None else {"axes": axes},
                               opset=13, rtol=1e-4, atol=1e-4)


def test_mean_variance_normalization_constant_input():
    """onnxruntime divides by the standard deviation alone (no epsilon): NaN for a constant slice."""
    x = np.full((1, 2, 3, 3), 2.5, np.float32)
    x[0, 1] = np.arange(9).reshape(3, 3)
    y = assert_matches_onnxruntime("MeanVarianceNormalization", {"x": x}, {"axes": [2, 3, 7]}, opset=13,
                                   rtol=1e-4, atol=1e-6)[0]
    assert np.isnan(y[0, 0]).all() and np.isfinite(y[0, 1]).all()


@settings(max_examples=12, deadline=None)
@given(size=st.sampled_from([1, 3, 5, 7]), channels=st.integers(1, 7), spatial=st.lists(st.integers(1, 4),
                                                                                      min_size=2, max_size=2),
       alpha=st.sampled_from([1e-4, 0.5]), beta=st.sampled_from([0.75, 1.5]), bias=st.sampled_from([1.0, 2.0]))
def test_lrn(size, channels, spatial, alpha, beta, bias):
    """onnxruntime runs odd sizes on 4-D inputs only (the reference evaluator sums the wrong axis)."""
    x = _data(2, channels, *spatial, seed=6) * 3
    attributes = {"size": size, "alpha": alpha, "beta": beta, "bias": bias}
    assert_matches_onnxruntime("LRN", {"x": x}, attributes, opset=13, rtol=1e-4, atol=1e-5)


def test_lrn_even_size_window_and_rank_3():
    """The window of channel c is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] (the spec), any rank:
    size 2 sums channels c and c + 1; ones give 1 / (1 + 1 / 2 * 2) = 0.5, the last channel 1 / 1.5."""
    x = np.ones((1, 5, 1), np.float32)
    model = single_node_model("LRN", {"x": x}, {"size": 2, "alpha": 1.0, "beta": 1.0, "bias": 1.0}, opset=13)
    y = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model)).forward({"x": x})[0]
    np.testing.assert_allclose(y.ravel(), [0.5, 0.5, 0.5, 0.5, 1 / 1.5], rtol=1e-6)
