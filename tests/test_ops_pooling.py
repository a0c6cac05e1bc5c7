"""MaxPool, AveragePool, LpPool and the global pools against onnxruntime."""

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime

RTOL, ATOL = 1e-5, 1e-6


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


WINDOWS = [
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [3, 2], "pads": [0, 1, 2, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [4, 4], "auto_pad": "SAME_LOWER", "strides": [3, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
    {"kernel_shape": [1, 1], "strides": [2, 2]},
]


@pytest.mark.parametrize("attributes", WINDOWS)
@pytest.mark.parametrize("size", [(11, 11), (12, 9)])
def test_max_pool(attributes, size):
    assert_matches_onnxruntime("MaxPool", {"x": _data(2, 3, *size)}, attributes, exact=True)


@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [3, 3], "dilations": [2, 2]},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
])
def test_max_pool_dilations(attributes):
    assert_matches_onnxruntime("MaxPool", {"x": _data(2, 3, 12, 11)}, attributes, exact=True)


def test_max_pool_1d_3d_and_int8():
    assert_matches_onnxruntime("MaxPool", {"x": _data(2, 3, 15)},
                               {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, exact=True)
    assert_matches_onnxruntime("MaxPool", {"x": _data(1, 2, 6, 7, 5)},
                               {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "ceil_mode": 1}, exact=True)
    ints = np.random.default_rng(1).integers(-128, 128, (2, 3, 8, 8)).astype(np.int8)
    assert_matches_onnxruntime("MaxPool", {"x": ints}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, exact=True)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pool_in_chunks_of_planes(op_type, monkeypatch):
    from ppqlike.executor.ops import pooling
    monkeypatch.setattr(pooling, "_CHUNK", 150)    # one or two planes per chunk, last chunk short
    for attributes in ({"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]},
                       {"kernel_shape": [1, 3], "strides": [1, 2]}):
        assert_matches_onnxruntime(op_type, {"x": _data(3, 3, 9, 8)}, attributes, rtol=RTOL, atol=ATOL)


def test_squeezenet_max_pool():
    assert_matches_onnxruntime("MaxPool", {"x": _data(2, 8, 111, 111)},
                               {"kernel_shape": [3, 3], "strides": [2, 2]}, exact=True)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2], "strides": [1, 2], "ceil_mode": 1},
])
def test_max_pool_indices(storage_order, attributes):
    assert_matches_onnxruntime("MaxPool", {"x": _data(2, 3, 7, 8)}, {**attributes, "storage_order": storage_order},
                               n_outputs=2, exact=True)


@pytest.mark.parametrize("attributes", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attributes, count_include_pad):
    assert_matches_onnxruntime("AveragePool", {"x": _data(2, 3, 11, 10)},
                               {**attributes, "count_include_pad": count_include_pad}, rtol=RTOL, atol=ATOL)


def test_average_pool_1d_and_3d():
    assert_matches_onnxruntime("AveragePool", {"x": _data(2, 3, 15)},
                               {"kernel_shape": [4], "strides": [3], "pads": [2, 1], "count_include_pad": 1},
                               rtol=RTOL, atol=ATOL)
    assert_matches_onnxruntime("AveragePool", {"x": _data(1, 2, 6, 7, 5)},
                               {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [1, 0, 1, 0, 1, 1]},
                               rtol=RTOL, atol=ATOL)


def test_average_pool_dilations_opset19():
    assert_matches_onnxruntime("AveragePool", {"x": _data(2, 3, 12, 11)},
                               {"kernel_shape": [3, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
                               opset=19, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    assert_matches_onnxruntime("LpPool", {"x": _data(2, 3, 9, 8)},
                               {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "p": p},
                               opset=18, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (2, 4, 9), (1, 3, 2, 3, 4)])
def test_global_pools(op_type, shape):
    assert_matches_onnxruntime(op_type, {"x": _data(*shape)}, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op, attributes", [("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
                                            ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})])
def test_plane_chunks_on_the_kernel_threads(op, attributes):
    """SqueezeNet's first pooling geometry on several plane chunks, shared out among 2 and 3 threads."""
    from ppqlike.executor.ops import _threads
    x = np.random.default_rng(8).standard_normal((3, 40, 61, 61)).astype(np.float32)
    for threads in (2, 3):
        _threads.set_num_threads(threads)
        try:
            assert_matches_onnxruntime(op, {"x": x}, attributes, rtol=1e-6, atol=1e-6)
        finally:
            _threads.set_num_threads(None)
