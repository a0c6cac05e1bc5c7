"""Indexing kernels against onnxruntime (exact equality: no arithmetic involved)."""

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime as check

RNG = np.random.default_rng(1)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
I64 = np.int64


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("indices", [np.array(1, I64), np.array(-1, I64), np.array([0, -2, 2], I64),
                                     np.array([[0, 1], [-1, 0]], np.int32)])
def test_gather(axis, indices):
    check("Gather", {"x": X, "i": indices}, {"axis": axis}, exact=True)


@pytest.mark.parametrize("static", [True, False])
def test_gather_static_and_int_data(static):
    shape = np.array([2, 3, 4, 5], I64)
    check("Gather", {"x": shape, "i": np.array([0, -1], I64)}, initializers={"x"} if static else None,
          opset=11, exact=True)
    check("Gather", {"x": shape, "i": np.array(-2, I64)}, initializers={"i"} if static else None, exact=True)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    shape = list(X.shape)
    shape[axis] = 2
    indices = RNG.integers(-X.shape[axis], X.shape[axis], size=shape).astype(I64)
    check("GatherElements", {"x": X, "i": indices}, {"axis": axis}, exact=True)


@pytest.mark.parametrize("indices,batch_dims", [
    (np.array([[0, 1], [2, -1]], I64), 0),
    (np.array([[[1]], [[-3]]], I64), 0),
    (np.array([[0, 1, 2], [-1, -2, -3]], I64), 0),
    (np.array([[1], [3], [0]], I64), 1),
    (np.array([[[1, 4]], [[0, 0]], [[-1, 2]]], I64), 1),
])
def test_gather_nd(indices, batch_dims):
    check("GatherND", {"x": X, "i": indices}, {"batch_dims": batch_dims}, exact=True)


def test_gather_nd_batch_dims_2():
    indices = RNG.integers(0, 5, size=(3, 4, 2, 1)).astype(I64)
    check("GatherND", {"x": X, "i": indices}, {"batch_dims": 2}, opset=12, exact=True)


@pytest.mark.parametrize("reduction,opset", [(None, 11), ("none", 16), ("add", 16), ("mul", 16),
                                             ("max", 18), ("min", 18)])
def test_scatter_nd(reduction, opset):
    indices = np.array([[0, 1], [2, -1], [0, 1]], I64) if reduction not in (None, "none") \
        else np.array([[0, 1], [2, -1]], I64)
    updates = RNG.standard_normal((len(indices), 5)).astype(np.float32)
    attributes = None if reduction is None else {"reduction": reduction}
    check("ScatterND", {"x": X, "i": indices, "u": updates}, attributes, opset=opset, exact=True)


def test_scatter_nd_full_index():
    indices = np.array([[0, 0, 0], [2, 3, -1]], I64)
    check("ScatterND", {"x": X, "i": indices, "u": np.array([7, 8], np.float32)}, initializers={"i"},
          exact=True)


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("reduction,opset", [(None, 11), ("add", 16), ("max", 18)])
def test_scatter_elements(axis, reduction, opset):
    shape = list(X.shape)
    shape[axis] = 2
    indices = RNG.integers(-X.shape[axis], X.shape[axis], size=shape).astype(I64)
    if reduction is None:  # duplicates are undefined without a reduction
        indices = np.moveaxis(np.broadcast_to(np.array([0, -1]).reshape(2, 1, 1), [2] + shape[:axis % 3]
                                              + shape[axis % 3 + 1:]), 0, axis).astype(I64)
    updates = RNG.standard_normal(shape).astype(np.float32)
    attributes = {"axis": axis} if reduction is None else {"axis": axis, "reduction": reduction}
    check("ScatterElements", {"x": X, "i": indices, "u": updates}, attributes, opset=opset, exact=True)


@pytest.mark.parametrize("data", [np.array([[1, 0, 3], [0, 0, 2]], np.float32), np.zeros((2, 2), np.int32),
                                  np.array([True, False, True]), np.array(3.0, np.float32)])
def test_nonzero(data):
    check("NonZero", {"x": data}, exact=True)


@pytest.mark.parametrize("opset", [11, 13, 21])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("values", [np.array([0.0, 1.0], np.float32), np.array([-2, 5], np.int64)])
def test_one_hot(opset, axis, values):
    """Negative indices wrap; out-of-range ones (here 7 and -9 for depth 6) give no hot position."""
    indices = np.array([[0, 5, -1], [7, 2, -9]], np.int64)
    check("OneHot", {"indices": indices, "depth": np.array(6, np.int64), "values": values},
                               {"axis": axis}, initializers={"depth", "values"}, opset=opset, exact=True)
