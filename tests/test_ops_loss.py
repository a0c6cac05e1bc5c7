"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 4), classes=st.integers(2, 5), extra=st.lists(st.integers(1, 3), max_size=2),
       weighted=st.booleans(), ignore=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_losses(op, reduction, n, classes, extra, weighted, ignore, seed):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal([n, classes] + extra).astype(np.float32)
    target = rng.integers(0, classes, [n] + extra).astype(np.int64)
    attributes = {"reduction": reduction}
    if ignore:
        attributes["ignore_index"] = int(target.reshape(-1)[-1])
        target.reshape(-1)[0] = (target.reshape(-1)[-1] + 1) % classes   # one counted target at least
    inputs = {"scores": scores, "target": target}
    if weighted:
        inputs["weight"] = rng.uniform(0.1, 2, classes).astype(np.float32)
    opset = 13 if op == "SoftmaxCrossEntropyLoss" else 22
    n_outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    assert_matches_onnxruntime(op, inputs, attributes, opset=opset, n_outputs=n_outputs, initializers={"weight"},
                               rtol=1e-4, atol=1e-5)
