"""Sin, Cos, Tan, their inverses and the hyperbolic functions against onnxruntime (opsets 21 and 22)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

RTOL, ATOL = 1e-4, 1e-6
# each op's inputs: inside the domain, plus points outside it where the result is NaN
DOMAINS = {"Sin": (-10, 10), "Cos": (-10, 10), "Tan": (-1.5, 1.5), "Asin": (-1.2, 1.2), "Acos": (-1.2, 1.2),
           "Atan": (-20, 20), "Sinh": (-8, 8), "Cosh": (-8, 8), "Asinh": (-50, 50), "Acosh": (0.5, 50),
           "Atanh": (-1.1, 1.1)}
shapes = st.lists(st.integers(1, 5), min_size=0, max_size=4)


@pytest.mark.parametrize("op", sorted(DOMAINS))
@settings(max_examples=6, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2 ** 16))
def test_float32(op, shape, seed):
    low, high = DOMAINS[op]
    x = np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)
    assert_matches_onnxruntime(op, {"x": x}, opset=22, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
@pytest.mark.parametrize("opset", [21, 22])
def test_double(op, opset):
    x = np.linspace(-20, 20, 41)
    assert_matches_onnxruntime(op, {"x": x}, opset=opset, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op", ["Asin", "Acos", "Acosh", "Atanh"])
def test_outside_the_domain_is_nan(op):
    x = np.array([-3.0, 3.0, np.nan, np.inf], np.float32)
    assert_matches_onnxruntime(op, {"x": x}, opset=21, rtol=RTOL, atol=ATOL)
