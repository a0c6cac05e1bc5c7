"""Reduction kernels against onnxruntime: axes as attribute or input, keepdims,
noop_with_empty_axes, ArgMax/ArgMin and TopK tie-breaking."""

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime, run_executor, run_onnxruntime, single_node_model

RNG = np.random.default_rng(3)
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
AXES = [None, [1], [-1], [0, 2], [-3, -1], [0, 1, 2, 3]]


def _data(op, shape=(2, 3, 4, 5), dtype=np.float32):
    if op in ("ReduceLogSum", "ReduceProd"):  # positive sums, products of moderate size
        return np.asarray(RNG.uniform(0.5, 1.5, shape), dtype)
    return np.asarray(RNG.normal(0, 2, shape), dtype)


def _axes_in_input(op, opset):
    return opset >= 18 or (op == "ReduceSum" and opset >= 13)


def _reduce(op, x, axes, opset, attributes=None, initializer=True, **tolerances):
    attributes = dict(attributes or {})
    inputs = {"x": x}
    if _axes_in_input(op, opset):
        inputs["axes"] = None if axes is None else np.array(axes, np.int64)
    elif axes is not None:
        attributes["axes"] = axes
    return assert_matches_onnxruntime(op, inputs, attributes, initializers={"axes"} if initializer else None,
                                      opset=opset, **tolerances)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_keepdims(op, opset, axes, keepdims):
    _reduce(op, _data(op), axes, opset, {"keepdims": keepdims}, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("axes", [None, []])
def test_reduce_noop_with_empty_axes(op, noop, axes):
    # with noop set nothing is reduced, but the elementwise part (square, abs, log...) still applies
    _reduce(op, _data(op, (3, 4)), axes, 18, {"noop_with_empty_axes": noop}, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_sum_opset13_noop(noop):
    _reduce("ReduceSum", _data("ReduceSum", (3, 4)), None, 13, {"noop_with_empty_axes": noop})


def test_reduce_axes_as_runtime_input():
    x = _data("ReduceMean")
    _reduce("ReduceMean", x, [1, -1], 18, {"keepdims": 0}, initializer=False)
    _reduce("ReduceSum", x, [0, 2], 13, initializer=False)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axes", [None, [1], [0, 2]])
def test_reduce_integer(op, dtype, axes):
    x = np.asarray(RNG.integers(-3 if op != "ReduceProd" else 1, 4, (2, 3, 4)), dtype)
    _reduce(op, x, axes, 13, {"keepdims": 0})  # integer ReduceMean truncates toward zero


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_double(op):
    _reduce(op, _data(op, dtype=np.float64), [1], 13, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp",
                                "ReduceSumSquare"])
def test_reduce_empty_axis(op):
    _reduce(op, np.zeros((2, 0, 3), np.float32), [1], 13)


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 999.0, -1000.0], [-np.inf, -np.inf, -np.inf], [-1e4, -1e4, 0.0]], np.float32)
    _reduce("ReduceLogSumExp", x, [1], 13)
    _reduce("ReduceLogSumExp", x, None, 18, {"keepdims": 0})


def _ties(shape, dtype=np.float32):
    return np.asarray(RNG.integers(0, 4, shape), dtype)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [None, 1, -1, -3])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last,opset", [(None, 11), (None, 13), (0, 13), (1, 12), (1, 13)])
def test_arg_max_min(op, axis, keepdims, last, opset):  # select_last_index arrived in opset 12
    attributes = {"keepdims": keepdims}
    if axis is not None:
        attributes["axis"] = axis
    if last is not None:
        attributes["select_last_index"] = last
    assert_matches_onnxruntime(op, {"x": _ties((3, 4, 6))}, attributes, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.uint8])
def test_arg_max_min_dtypes(dtype):
    for op in ("ArgMax", "ArgMin"):
        assert_matches_onnxruntime(op, {"x": _ties((4, 5), dtype)}, {"axis": 1, "select_last_index": 1})


def _topk_inputs(shape, k, dtype=np.float32):
    return {"x": _ties(shape, dtype), "k": np.array([k], np.int64)}


@pytest.mark.parametrize("axis", [None, -1, 0, 1, -2])
@pytest.mark.parametrize("largest", [None, 0, 1])
@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("opset", [11, 13])
def test_topk_ties_keep_index_order(axis, largest, k, opset):
    attributes = {} if largest is None else {"largest": largest}
    if axis is not None:
        attributes["axis"] = axis
    assert_matches_onnxruntime("TopK", _topk_inputs((4, 5, 6), k), attributes, initializers={"k"},
                               n_outputs=2, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_dtypes(dtype, largest):
    assert_matches_onnxruntime("TopK", _topk_inputs((3, 8), 5, dtype), {"largest": largest},
                               initializers={"k"}, n_outputs=2)


def test_topk_k_runtime_input_and_full_length():
    assert_matches_onnxruntime("TopK", _topk_inputs((3, 7), 7), n_outputs=2)
    x = np.asarray(RNG.normal(size=(2, 300)), np.float32)
    assert_matches_onnxruntime("TopK", {"x": x, "k": np.array([10], np.int64)}, n_outputs=2)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_unsorted_returns_the_same_set(largest):
    # onnxruntime's sorted=0 order is unspecified: compare (index, value) pairs as sets
    inputs = _topk_inputs((3, 9), 4)
    model = single_node_model("TopK", inputs, {"sorted": 0, "largest": largest}, {"k"}, 2, 13)
    expected = run_onnxruntime(model, {"x": inputs["x"]})
    actual = run_executor(model, {"x": inputs["x"]})
    for row in range(3):
        want = sorted(zip(expected[1][row].tolist(), expected[0][row].tolist()))
        got = sorted(zip(actual[1][row].tolist(), actual[0][row].tolist()))
        assert got == want
    assert actual[1].dtype == np.int64


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_signed_zeros_infinities_and_k0(largest):
    x = np.array([[0.0, -0.0, 1.0, -np.inf, -0.0, np.inf, 0.0, -1.0]], np.float32)
    for k in (0, 5, 8):
        assert_matches_onnxruntime("TopK", {"x": x, "k": np.array([k], np.int64)}, {"largest": largest},
                                   initializers={"k"}, n_outputs=2)


@pytest.mark.parametrize("dtype", [np.float16, np.uint8, np.int8, np.int16, np.uint32, bool])
@pytest.mark.parametrize("largest", [False, True])
def test_topk_selection_path_matches_stable_sort(dtype, largest):
    # dtypes onnxruntime's TopK lacks: the O(n) key path against a stable argsort
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    x = _ties((5, 40), dtype) if dtype is not bool else _ties((5, 40)) > 1
    kernel = build_kernel(Operation("t", "TopK", {"largest": int(largest), "axis": 1}), 13)
    values, indices = kernel([x, np.array([7], np.int64)])
    keyed = -x.astype(np.float64) if largest else x.astype(np.float64)
    expected = np.argsort(keyed, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis=1))
    assert values.dtype == x.dtype and indices.dtype == np.int64
