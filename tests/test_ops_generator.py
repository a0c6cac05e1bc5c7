"""Generator kernels against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import assert_matches_onnxruntime as check, make_model, run_onnxruntime
from ppqlike.core.errors import UnsupportedOperationError
from ppqlike.core.ir import Operation
from ppqlike.executor.ops import build_kernel

I64 = np.int64


@pytest.mark.parametrize("value", [None, np.array([3.5], np.float32), np.array([7], I64),
                                   np.array([1], np.int32), np.array([True])])
@pytest.mark.parametrize("shape", [(2, 3), (0, 4), ()])
def test_constant_of_shape(value, shape):
    attributes = None if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", {"s": np.array(shape, I64)}, attributes, initializers={"s"}, exact=True)


def test_constant_of_shape_dynamic():
    check("ConstantOfShape", {"s": np.array([3, 1, 2], I64)}, opset=11, exact=True)


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 10, 3, I64), (10, 0, -3, np.int32), (5, 1, 2, I64), (-2, 9, 1, np.int32),
    (0.1, 10.3, 0.37, np.float32), (1.0, -3.3, -0.11, np.float32), (0.0, 100.0, 0.1, np.float32),
    (0.5, 2.0, 0.25, np.float64), (3.0, 3.0, 1.0, np.float32),
])
@pytest.mark.parametrize("static", [True, False])
def test_range(start, limit, delta, dtype, static):
    inputs = {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)}
    check("Range", inputs, initializers={"a", "b", "c"} if static else None, opset=11, exact=True)


@pytest.mark.parametrize("k", [0, 1, -2, 5])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT64, TensorProto.FLOAT])
def test_eye_like(k, dtype):
    attributes = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", {"x": np.zeros((3, 5), np.float32)}, attributes, exact=True)
    check("EyeLike", {"x": np.zeros((4, 2), np.int32)}, attributes, exact=True)


@pytest.mark.parametrize("name,value,expected", [
    ("value", np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
    ("value_float", 1.5, np.array(1.5, np.float32)),
    ("value_floats", [1.0, 2.0], np.array([1.0, 2.0], np.float32)),
    ("value_int", 4, np.array(4, I64)),
    ("value_ints", [1, -2], np.array([1, -2], I64)),
])
def test_constant(name, value, expected):
    op = Operation("c", "Constant", {name: value})
    got, = build_kernel(op, 13)([])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # the same node in onnxruntime
    node = helper.make_node("Constant", [], ["y"], **{name: numpy_helper.from_array(value) if name == "value"
                                                      else value})
    model = make_model([node], [], [helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(expected.dtype), list(expected.shape))])
    np.testing.assert_array_equal(run_onnxruntime(model, {})[0], got)


def test_constant_needs_one_attribute():
    with pytest.raises(UnsupportedOperationError):
        build_kernel(Operation("c", "Constant", {}), 13)
