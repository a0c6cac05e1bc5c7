"""BitShift and the Bitwise ops against onnxruntime, over every integer type each accepts."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]
INTEGERS = [np.int8, np.int16, np.int32, np.int64] + UNSIGNED
# numpy-broadcastable shape pairs
SHAPE_PAIRS = [([2, 3, 4], [2, 3, 4]), ([2, 3, 4], [4]), ([3, 1], [1, 5]), ([], [3]), ([5], [])]


def _integers(dtype, shape, rng):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", UNSIGNED)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@settings(max_examples=8, deadline=None)
@given(pair=st.sampled_from(SHAPE_PAIRS), seed=st.integers(0, 2 ** 16))
def test_bit_shift(dtype, direction, pair, seed):
    rng = np.random.default_rng(seed)
    width = np.iinfo(dtype).bits
    x = _integers(dtype, pair[0], rng)
    amount = rng.integers(0, width, size=pair[1]).astype(dtype)  # onnxruntime's C shift is undefined past it
    assert_matches_onnxruntime("BitShift", {"x": x, "amount": amount}, {"direction": direction}, opset=11)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", INTEGERS)
@settings(max_examples=5, deadline=None)
@given(pair=st.sampled_from(SHAPE_PAIRS), seed=st.integers(0, 2 ** 16))
def test_binary(op, dtype, pair, seed):
    rng = np.random.default_rng(seed)
    assert_matches_onnxruntime(op, {"a": _integers(dtype, pair[0], rng), "b": _integers(dtype, pair[1], rng)},
                               opset=18)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_not(dtype):
    x = _integers(dtype, [3, 4], np.random.default_rng(3))
    assert_matches_onnxruntime("BitwiseNot", {"x": x}, opset=18)
