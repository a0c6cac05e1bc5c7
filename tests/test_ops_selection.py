"""OneHot, Compress, ReverseSequence, CenterCropPad and Unique against onnxruntime."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), depth=st.integers(1, 6), data=st.data(),
       types=st.sampled_from([(np.int64, np.int64, np.int64), (np.int64, np.int64, np.float32),
                              (np.int64, np.int32, np.float32), (np.int64, np.float32, np.int32),
                              (np.int32, np.int32, np.float32), (np.int32, np.float32, np.float32),
                              (np.float32, np.int64, np.int64), (np.float32, np.float32, np.float32)]))
def test_one_hot(shape, depth, data, types):
    index_type, depth_type, value_type = types  # the combinations onnxruntime 1.32 has kernels for
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    indices = np.random.default_rng(depth).integers(-depth - 2, depth + 2, shape).astype(index_type)
    inputs = {"indices": indices, "depth": np.array(depth, depth_type), "values": np.array([-2, 7], value_type)}
    assert_matches_onnxruntime("OneHot", inputs, {"axis": axis}, opset=11, initializers={"depth", "values"})


def test_one_hot_fractional_indices_and_depth():
    inputs = {"indices": np.array([[0.7, 2.2], [-1.5, 3.9]], np.float32), "depth": np.array([4.0], np.float32),
              "values": np.array([0, 1], np.float32)}
    assert_matches_onnxruntime("OneHot", inputs, opset=11, initializers={"depth", "values"})


@settings(max_examples=20, deadline=None)
@given(shape=shapes, data=st.data())
def test_compress(shape, data):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    length = x.size if axis is None else shape[axis]
    condition = np.array(data.draw(st.lists(st.booleans(), min_size=1, max_size=length)))
    attributes = {} if axis is None else {"axis": axis}
    assert_matches_onnxruntime("Compress", {"x": x, "condition": condition}, attributes, opset=11,
                               initializers={"condition"})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 4), steps=st.integers(1, 5), rest=st.lists(st.integers(1, 3), max_size=2),
       data=st.data())
def test_reverse_sequence(batch_axis, time_axis, batch, steps, rest, data):
    shape = ([steps, batch] if time_axis == 0 else [batch, steps]) + rest
    x = np.random.default_rng(steps).standard_normal(shape).astype(np.float32)
    lengths = np.array(data.draw(st.lists(st.integers(1, steps), min_size=batch, max_size=batch)), np.int64)
    assert_matches_onnxruntime("ReverseSequence", {"x": x, "lengths": lengths},
                               {"batch_axis": batch_axis, "time_axis": time_axis}, opset=11, exact=True)


@settings(max_examples=20, deadline=None)
@given(shape=shapes, data=st.data())
def test_center_crop_pad(shape, data):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1
    axes = data.draw(st.one_of(st.none(), st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                                                   max_size=len(shape), unique_by=lambda a: a % len(shape))))
    count = len(shape) if axes is None else len(axes)
    target = np.array(data.draw(st.lists(st.integers(1, 7), min_size=count, max_size=count)), np.int64)
    attributes = {} if axes is None else {"axes": axes}
    assert_matches_onnxruntime("CenterCropPad", {"x": x, "shape": target}, attributes, opset=18,
                               initializers={"shape"}, exact=True)


@pytest.mark.parametrize("sort", [0, 1])
@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       dtype=st.sampled_from([np.float32, np.int64, np.int8]))
def test_unique(sort, shape, data, dtype):
    x = np.random.default_rng(sum(shape)).integers(-2, 3, shape).astype(dtype)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    attributes = {"sorted": sort} if axis is None else {"sorted": sort, "axis": axis}
    assert_matches_onnxruntime("Unique", {"x": x}, attributes, opset=11, n_outputs=4, exact=True)
