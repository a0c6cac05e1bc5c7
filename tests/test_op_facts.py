"""Op facts (ppqlike.core.op_facts) checked against what the ops compute in onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

import ppqlike
from ppqlike.core.op_facts import (BIAS_TYPES, COMPUTING_TYPES, POSITIVELY_HOMOGENEOUS_TYPES, output_channels,
                                   weight_channel_axis)
from ppqlike.core.quant import IntegerRequantization, QuantizationPolicy, QuantizationProperty as P
from ppqlike.core.quant import TensorQuantizationConfig
from onnx_helpers import run_onnxruntime, single_node_model

RNG = np.random.default_rng(7)
F32 = np.float32

CASES = [  # op type, inputs (x, w), attributes
    ("Conv", (RNG.standard_normal((1, 3, 5, 5)), RNG.standard_normal((4, 3, 3, 3))), {}),
    ("ConvTranspose", (RNG.standard_normal((1, 3, 5, 5)), RNG.standard_normal((3, 4, 3, 3))), {}),
    ("Gemm", (RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))), {}),
    ("Gemm", (RNG.standard_normal((2, 3)), RNG.standard_normal((4, 3))), {"transB": 1}),
    ("MatMul", (RNG.standard_normal((2, 5, 3)), RNG.standard_normal((3, 4))), {}),
]


@pytest.mark.parametrize("op_type, arrays, attributes", CASES, ids=lambda c: str(c)[:20])
def test_weight_channel_axis_is_the_output_channel(op_type, arrays, attributes):
    """Scaling weight channel c along the stated axis scales exactly output channel c (onnxruntime computes)."""
    x, w = (a.astype(F32) for a in arrays)
    model = single_node_model(op_type, {"x": x, "w": w}, attributes, initializers={"w"})
    graph = ppqlike.load_onnx_graph(model)
    operation = next(iter(graph.operations.values()))
    axis = weight_channel_axis(operation)
    channels = output_channels(operation)
    assert operation.type in COMPUTING_TYPES and channels == 4
    base = run_onnxruntime(model, {"x": x})[0]
    scaled_w = np.moveaxis(w.copy(), axis, 0)
    scaled_w[1] *= 2
    scaled_w = np.moveaxis(scaled_w, 0, axis)
    scaled = run_onnxruntime(single_node_model(op_type, {"x": x, "w": scaled_w}, attributes, initializers={"w"}),
                             {"x": x})[0]
    out_axis = 1 if op_type in ("Conv", "ConvTranspose") else -1
    base, scaled = np.moveaxis(base, out_axis, 0), np.moveaxis(scaled, out_axis, 0)
    ratio = scaled / np.where(base == 0, 1, base)
    np.testing.assert_allclose(ratio[1], 2, rtol=1e-4)
    np.testing.assert_allclose(np.delete(ratio, 1, axis=0), 1, rtol=1e-4)


def test_bias_types_take_a_bias_input():
    assert BIAS_TYPES <= COMPUTING_TYPES and "MatMul" not in BIAS_TYPES


@pytest.mark.parametrize("op_type", sorted(POSITIVELY_HOMOGENEOUS_TYPES - {"Dropout", "PRelu"}))
def test_positively_homogeneous_ops_commute_with_a_positive_scale(op_type):
    x = RNG.standard_normal((1, 3, 6, 6)).astype(F32)
    attributes = {"kernel_shape": [2, 2]} if op_type in ("MaxPool", "AveragePool") else {}
    model = single_node_model(op_type, {"x": x}, attributes)
    scale = np.array([0.5, 2.0, 3.0], F32)[None, :, None, None]
    np.testing.assert_allclose(run_onnxruntime(model, {"x": x * scale})[0],
                               run_onnxruntime(model, {"x": x})[0] * scale, rtol=1e-5, atol=1e-6)


def test_integer_requantization_survives_copy_and_json():
    config = TensorQuantizationConfig(QuantizationPolicy(P.PER_TENSOR | P.LINEAR | P.SYMMETRICAL), scale=0.5,
                                      offset=0, name="y")
    config.requantization = IntegerRequantization.from_arrays([1 << 30], [31], [0.25], 1)
    config.runtime_kernel = "onnxruntime"
    back = TensorQuantizationConfig.from_dict(config.to_dict())
    assert back.requantization == config.requantization and back.runtime_kernel == "onnxruntime"
    assert config.copy().requantization == config.requantization
    config.reset()
    assert config.requantization is None and config.runtime_kernel is None
