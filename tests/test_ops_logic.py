"""Logic kernels against onnxruntime: comparisons, boolean ops, Where, variadic Max/Min/Sum/Mean."""

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime

RNG = np.random.default_rng(2)

SHAPE_PAIRS = [
    ([2, 3, 4, 5], [2, 3, 4, 5]),
    ([2, 3, 4, 5], [3, 1, 1]),
    ([2, 3, 4, 5], [5]),
    ([2, 3, 4, 5], []),
    ([5], [2, 3, 4, 5]),
    ([], []),
    ([4, 1], [1, 3]),
]


def _values(shape, dtype=np.float32):
    # small integers so that ties (Equal, GreaterOrEqual) actually occur
    return np.asarray(RNG.integers(-3, 4, shape), dtype)


def _bools(shape):
    return np.asarray(RNG.integers(0, 2, shape), bool)


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
def test_comparisons_broadcast(op, shapes):
    assert_matches_onnxruntime(op, {"a": _values(shapes[0]), "b": _values(shapes[1])}, opset=13)


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
@pytest.mark.parametrize("opset", [12, 13])
def test_comparisons_dtypes(op, dtype, opset):
    assert_matches_onnxruntime(op, {"a": _values([3, 4], dtype), "b": _values([4], dtype)}, opset=opset)


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)
    b = np.array([np.nan, np.nan, 1.0, -np.inf], np.float32)
    for op in ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"]:
        assert_matches_onnxruntime(op, {"a": a, "b": b}, opset=16)


def test_equal_bool():
    assert_matches_onnxruntime("Equal", {"a": _bools([3, 4]), "b": _bools([4])})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
def test_boolean_binary(op, shapes):
    assert_matches_onnxruntime(op, {"a": _bools(shapes[0]), "b": _bools(shapes[1])})


@pytest.mark.parametrize("shape", [[2, 3, 4], []])
def test_not(shape):
    assert_matches_onnxruntime("Not", {"x": _bools(shape)})


@pytest.mark.parametrize("shapes", [
    ([2, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5]),
    ([2, 3, 4, 5], [3, 1, 1], []),
    ([5], [2, 3, 4, 5], [4, 1]),
    ([3, 1, 1], [], [5]),
    ([], [2, 3], [2, 3]),
    ([], [], []),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_where_broadcasts_three_inputs(shapes, dtype):
    inputs = {"c": _bools(shapes[0]), "x": _values(shapes[1], dtype), "y": _values(shapes[2], dtype) + 10}
    assert_matches_onnxruntime("Where", inputs, opset=16)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("shapes", [
    ([2, 3, 4, 5],),
    ([2, 3, 4, 5], [3, 1, 1]),
    ([5], [2, 3, 4, 5]),
    ([3, 1, 1], [5], []),
    ([], [4, 1], [1, 3], [4, 3]),
    ([], []),
])
@pytest.mark.parametrize("opset", [11, 13])
def test_variadic(op, shapes, opset):
    inputs = {f"x{i}": np.asarray(RNG.normal(0, 2, shape), np.float32) for i, shape in enumerate(shapes)}
    assert_matches_onnxruntime(op, inputs, opset=opset)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
def test_max_min_dtypes(op, dtype):
    inputs = {"a": _values([3, 4], dtype) if dtype != np.uint8 else _values([3, 4]).astype(np.uint8) + 3,
              "b": _values([4], dtype) if dtype != np.uint8 else _values([4]).astype(np.uint8) + 3}
    assert_matches_onnxruntime(op, inputs, opset=13)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_propagate_nan(op):
    a = np.array([np.nan, 1.0, 2.0], np.float32)
    b = np.array([1.0, np.nan, 3.0], np.float32)
    assert_matches_onnxruntime(op, {"a": a, "b": b}, opset=13)


def test_sum_double():  # onnxruntime has no double Mean
    inputs = {"a": np.asarray(RNG.normal(0, 1, [3, 4])), "b": np.asarray(RNG.normal(0, 1, [4]))}
    assert_matches_onnxruntime("Sum", inputs, rtol=1e-12)


def test_is_nan_and_is_inf():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1e38], np.float32)
    assert_matches_onnxruntime("IsNaN", {"x": x}, opset=13)
    for positive in (0, 1):
        for negative in (0, 1):
            assert_matches_onnxruntime("IsInf", {"x": x}, {"detect_positive": positive,
                                                          "detect_negative": negative}, opset=13)


def test_variadic_does_not_alias_or_modify_inputs():
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    a, b = np.ones([2, 3], np.float32), np.full([3], 2.0, np.float32)
    for op in ["Max", "Min", "Sum", "Mean"]:
        out, = build_kernel(Operation("n", op), 13)([a])
        assert not np.shares_memory(out, a)
        out, = build_kernel(Operation("n", op), 13)([a, b, b])
        np.testing.assert_array_equal(a, 1.0)
        np.testing.assert_array_equal(b, 2.0)
