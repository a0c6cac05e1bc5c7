"""Einsum, Det, CumSum and Trilu against onnxruntime."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

RTOL, ATOL = 1e-4, 1e-5


def _float(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# equation, operand shapes as functions of four sizes
EQUATIONS = [
    ("ij,jk->ik", lambda a, b, c, d: [[a, b], [b, c]]),
    ("bij,bjk->bik", lambda a, b, c, d: [[d, a, b], [d, b, c]]),
    ("ij->ji", lambda a, b, c, d: [[a, b]]),
    ("ii->i", lambda a, b, c, d: [[a, a]]),
    ("ii", lambda a, b, c, d: [[a, a]]),
    ("ij,ij->", lambda a, b, c, d: [[a, b], [a, b]]),
    ("i,j->ij", lambda a, b, c, d: [[a], [b]]),
    ("...ij,...jk->...ik", lambda a, b, c, d: [[d, 2, a, b], [d, 2, b, c]]),
    ("bhqd,bhkd->bhqk", lambda a, b, c, d: [[d, 2, a, b], [d, 2, c, b]]),
    ("ij,jk,kl->il", lambda a, b, c, d: [[a, b], [b, c], [c, d]]),
    ("Ab,bC->AC", lambda a, b, c, d: [[a, b], [b, c]]),
    ("ijk->kji", lambda a, b, c, d: [[a, b, c]]),
    ("i...->...", lambda a, b, c, d: [[a, b, c]]),
]


@pytest.mark.parametrize("equation,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
@settings(max_examples=4, deadline=None)
@given(sizes=st.tuples(*[st.integers(1, 5)] * 4), seed=st.integers(0, 2 ** 16))
def test_einsum(equation, shapes, sizes, seed):
    inputs = {f"x{i}": _float(shape, seed + i) for i, shape in enumerate(shapes(*sizes))}
    assert_matches_onnxruntime("Einsum", inputs, {"equation": equation}, opset=12, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_einsum_types(dtype):
    rng = np.random.default_rng(4)
    a, b = (rng.integers(-5, 5, shape).astype(dtype) for shape in ([3, 4], [2, 4, 5]))
    assert_matches_onnxruntime("Einsum", {"a": a, "b": b}, {"equation": "ij, bjk -> bik"}, opset=12)


@settings(max_examples=10, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), size=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_det(batch, size, seed):
    x = _float(batch + [size, size], seed)
    assert_matches_onnxruntime("Det", {"x": x}, opset=22, rtol=RTOL, atol=ATOL)


def test_det_singular():
    singular = np.array([[1, 2, 3], [2, 4, 6], [0, 1, 1]], np.float32)
    assert_matches_onnxruntime("Det", {"x": singular}, opset=11, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("opset", [11, 14])
@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       exclusive=st.booleans(), reverse=st.booleans())
def test_cumsum(dtype, opset, shape, data, exclusive, reverse):
    if opset == 11 and dtype == np.int32:
        dtype = np.float32  # opset 11: float, double, int32, int64 like 14, but one is enough
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 10).astype(dtype)
    axis_dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    assert_matches_onnxruntime("CumSum", {"x": x, "axis": np.array(axis, axis_dtype)},
                               {"exclusive": int(exclusive), "reverse": int(reverse)}, opset=opset,
                               initializers={"axis"}, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("upper", [0, 1])
@settings(max_examples=8, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), k=st.one_of(st.none(), st.integers(-6, 6)))
def test_trilu(upper, shape, k):
    inputs = {"x": _float(shape, 2)}
    if k is not None:
        inputs["k"] = np.array(k, np.int64)
    assert_matches_onnxruntime("Trilu", inputs, {"upper": upper}, opset=14, exact=True)


def test_trilu_integers():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    assert_matches_onnxruntime("Trilu", {"x": x, "k": np.array(-1, np.int64)}, {"upper": 0}, opset=14)
