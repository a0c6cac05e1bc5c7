"""SmoothQuant (issue 14): LayerNorm output outliers moved into the next weights; FP32 outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_helpers import run_onnxruntime
from transformer_models import encoder_inputs, encoder_model
from ppqlike import api
from ppqlike.core.errors import PlatformError
from ppqlike.core.patterns import find_transformer_blocks
from ppqlike.executor import NumpyExecutor
from ppqlike.io.load import load_graph
from ppqlike.optim.passes import SmoothQuantPass
from ppqlike.optim.passes.smooth_quant import channel_scales, int8_product_error
from ppqlike.optim.setting import QuantizationSettingFactory

CALIB = [encoder_inputs(8, 1), encoder_inputs(8, 2)]
TEST = encoder_inputs(32, 3)


def _layer_norm_results(graph) -> list[str]:
    return [b.result for b in find_transformer_blocks(graph) if b.kind == "LayerNorm"]


@pytest.mark.parametrize("layer_norm", ["pytorch", "op", "e_x2", "e_x2_reduce_sum", "keras", "rms", "rms_pow",
                                        "rms_div"])
@pytest.mark.parametrize("alpha", [None, 0.5])
def test_fp32_outputs_unchanged_and_ranges_lowered(layer_norm, alpha):
    """Every spelling: gamma and beta (gamma alone for an RMSNorm; TensorFlow's beta - mean * k included) divided,
    the next weights multiplied, the function the same."""
    model = encoder_model(layer_norm)
    graph = load_graph(model)
    results = _layer_norm_results(graph)
    executor = NumpyExecutor(graph)
    before = [np.abs(v).max() for v in executor.forward({"x": TEST}, output_names=results)]
    report = SmoothQuantPass(alpha=alpha).optimize(graph, executor=executor, dataloader=CALIB)
    assert report["smoothed"] == 2 and not report["skipped"]
    output = executor.forward({"x": TEST})[0]
    reference = run_onnxruntime(model, {"x": TEST})[0]  # the source model, as onnxruntime runs it
    np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    after = [np.abs(v).max() for v in executor.forward({"x": TEST}, output_names=results)]
    assert all(a < b for a, b in zip(after, before)), (before, after)
    for detail in report["layer_norms"]:
        assert detail["activation_max_after"] < detail["activation_max_before"]
        assert alpha is None or detail["alpha"] == alpha


def test_layer_norm_without_gamma_is_skipped_with_its_reason():
    graph = load_graph(encoder_model("mul_reciprocal"))
    report = SmoothQuantPass().optimize(graph, dataloader=CALIB)
    assert report["smoothed"] == 0
    assert {s["reason"] for s in report["skipped"]} == {"it has no constant gamma to absorb the scales"}


def test_result_read_by_another_op_is_skipped():
    """A LayerNorm whose result also feeds a non-MatMul (here the graph output) cannot absorb the scales."""
    model = encoder_model()
    graph = load_graph(model)
    first = _layer_norm_results(graph)[0]
    graph.outputs = [*graph.outputs, graph.variables[first]]
    report = SmoothQuantPass().optimize(graph, dataloader=CALIB)
    assert report["smoothed"] == 1
    assert "graph output" in report["skipped"][0]["reason"]


def test_the_chosen_alpha_never_does_worse_than_no_smoothing():
    graph = load_graph(encoder_model())
    executor = NumpyExecutor(graph)
    results = _layer_norm_results(graph)
    rows = executor.forward({"x": TEST}, output_names=results[:1])[0].reshape(-1, 8).astype(np.float64)
    block = next(b for b in find_transformer_blocks(graph) if b.kind == "LayerNorm")
    weights = [c.inputs[1].value.astype(np.float64) for c in graph.variables[block.result].consumers]
    plain = int8_product_error(rows, weights, np.ones(8))
    SmoothQuantPass().optimize(graph, executor=executor, dataloader=[TEST])
    smoothed_rows = executor.forward({"x": TEST}, output_names=results[:1])[0].reshape(-1, 8).astype(np.float64)
    smoothed_weights = [c.inputs[1].value.astype(np.float64) for c in graph.variables[block.result].consumers]
    assert int8_product_error(smoothed_rows, smoothed_weights, np.ones(8)) <= plain


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.lists(st.floats(1e-3, 1e3), min_size=3, max_size=3),
       st.lists(st.floats(1e-3, 1e3), min_size=3, max_size=3))
def test_channel_scales_balance_the_two_ranges(alpha, activation, weight):
    """s = a^alpha / w^(1 - alpha): after smoothing, a / s and w * s are a^(1-alpha) w^(1-alpha) and
    a^alpha w^alpha, so alpha = 0.5 gives both sqrt(a w)."""
    activation, weight = np.array(activation), np.array(weight)
    scales = channel_scales(activation, weight, alpha)
    np.testing.assert_allclose(activation / scales, (activation * weight) ** (1 - alpha), rtol=1e-9)
    np.testing.assert_allclose(weight * scales, (activation * weight) ** alpha, rtol=1e-9)


def test_setting_runs_it_in_the_pipeline_and_the_export_matches():
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.smooth_quant = True
    graph = api.quantize_onnx_model(encoder_model(), CALIB, platform="TRT_INT8", setting=setting)
    passes = {p["name"]: p["report"] for p in graph.metadata["quantization"]["passes"]}
    layer_norms = [d for d in passes["smooth_quant"]["layer_norms"] if "layer_norm" in d]
    assert len(layer_norms) == 2 and all(d["alpha"] is not None for d in layer_norms)
    names = [p["name"] for p in graph.metadata["quantization"]["passes"]]
    assert names.index("smooth_quant") < names.index("placement") < names.index("parameter")
    with pytest.raises(PlatformError, match="smooth_quant_alpha"):
        setting.smooth_quant_alpha = 1.5
        setting.validate()


def test_the_products_computed_once_give_the_same_error():
    """The alpha search hands every candidate the FP32 products rows @ W computed once: the error is the one
    computed from scratch, to the bit."""
    from ppqlike.optim.passes.smooth_quant import channel_scales, int8_product_error
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((64, 12)) * np.linspace(0.1, 20, 12)
    weights = [rng.standard_normal((12, 8)), rng.standard_normal((12, 5))]
    scales = channel_scales(np.abs(rows).max(0), np.max([np.abs(w).max(1) for w in weights], axis=0), 0.5)
    assert int8_product_error(rows, weights, scales, [rows @ w for w in weights]) == \
        int8_product_error(rows, weights, scales)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2600), st.integers(0, 2 ** 31 - 1))
def test_the_integer_product_is_exact(channels, seed):
    """int8 x int8 codes multiplied in float32 pieces give the exact integer product (computed in int64), up
    to the largest codes on every term."""
    from ppqlike.optim.passes.smooth_quant import integer_product
    rng = np.random.default_rng(seed)
    rows = rng.integers(-128, 128, (3, channels))
    weights = rng.integers(-127, 128, (channels, 2))
    rows[0], weights[:, 0] = -128, -127   # the largest sum there can be
    exact = rows.astype(np.int64) @ weights.astype(np.int64)
    assert np.array_equal(integer_product(rows.astype(np.float32), weights.astype(np.float32)), exact)
