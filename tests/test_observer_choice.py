"""The 'auto' activation observer (optim/observers/choice.py, chosen in optim/passes/calibration.py): each
candidate range estimator is tried on held-aside calibration samples, the one closest to FP32 is kept, and
the graph is then exactly the graph that candidate alone gives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ppqlike import api
from ppqlike.export.common import iter_configs
from ppqlike.optim.observers.choice import CANDIDATES
from ppqlike.optim.setting import QuantizationSettingFactory

from onnx_helpers import make_model

RNG = np.random.default_rng(23)


def _model():
    """x -> MatMul -> Relu -> MatMul -> y (16 features)."""
    tensors = {"w1": RNG.standard_normal((16, 16)) * 0.4, "w2": RNG.standard_normal((16, 4)) * 0.4}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    return make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 16])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tensors.items()])


def _batches(outliers: bool) -> list[np.ndarray]:
    """Five batches of 16 samples; with ``outliers``, every fourth sample is 30 times larger (a rare loud
    input: a range from the mean of per-sample extremes clips it, min-max keeps it)."""
    batches = []
    for _ in range(5):
        x = RNG.standard_normal((16, 16)).astype(np.float32)
        if outliers:
            x[::4] *= 30
        batches.append(x)
    return batches


def _quantize(model, batches, observer: str, platform: str = "ORT_INT8"):
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe, setting.activation_observer = "plain", observer
    return api.quantize_onnx_model(model, batches, platform=platform, setting=setting)


def _report(graph) -> dict:
    return next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "calibration")


def _ranges(graph) -> dict:
    return {(op.name, side, slot): (np.asarray(config.scale).tolist(), np.asarray(config.offset).tolist(),
                                    config.quant_min, config.quant_max)
            for op, side, slot, _, config in iter_configs(graph)}


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8"])
@pytest.mark.parametrize("outliers", [False, True])
def test_the_closest_candidate_is_kept_and_the_graph_is_its_own(platform, outliers):
    model, batches = _model(), _batches(outliers)
    graph = _quantize(model, batches, "auto", platform)
    report = _report(graph)
    errors = report["observer_errors"]
    assert list(errors) == list(CANDIDATES)
    assert report["observer_chosen"] == min(errors, key=errors.get)
    # the held-aside batch (the last of five), then the first three; the first half only when one candidate
    # is left after it
    alone_at_half = len(report["observer_dropped_at_half"]) == len(CANDIDATES) - 1
    assert report["observer_chosen_on"] == (32 if alone_at_half else 64)
    alone = _quantize(model, batches, report["observer_chosen"], platform)
    assert _ranges(graph) == _ranges(alone)



def test_a_classifier_bias_add_leaves_its_matmul_output_terminal():
    """x -> MatMul -> Add(constant bias) -> y, 3-D (so not fused into a Gemm): the MatMul's output reaches
    the output through a constant shift only, so balanced gives it the terminal observer (min-max: the top
    logit is not clipped, which would make quantized logits tie at the top code), as it does the output."""
    weight, bias = RNG.standard_normal((16, 10)).astype(np.float32), RNG.standard_normal(10).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("Add", ["logits", "b"], ["y"], name="bias")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2, 16])],
                       [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 2, 10])],
                       [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    batches = [b.reshape(8, 2, 16) for b in _batches(False)]
    graph = api.quantize_onnx_model(model, batches, platform="ORT_INT8")
    assert [op.type for op in graph.operations.values()] == ["MatMul", "Add"]
    config = graph.operations["fc"].config.output_quantization_config[0]
    assert config.observer_algorithm == "minmax"
    logits = np.concatenate(batches[:4]) @ weight   # the fifth batch is held aside
    top = (255 - float(config.offset)) * float(config.scale)
    assert top >= logits.max() - float(config.scale)   # the largest calibration logit is not clipped


def test_a_candidate_far_behind_at_half_is_dropped_without_changing_the_choice(monkeypatch):
    """After half the choice samples, a candidate whose error is CHOICE_DROP_RATIO times the best one's is not
    measured further; the candidates kept are measured on all samples, and the choice and the graph are those
    of measuring every candidate on every sample."""
    import ppqlike.optim.passes.calibration as calibration
    model, batches = _model(), _batches(False)
    graph = _quantize(model, batches, "auto")
    report = _report(graph)
    errors, dropped = report["observer_errors"], report["observer_dropped_at_half"]
    monkeypatch.setattr(calibration, "CHOICE_DROP_RATIO", float("inf"))
    full = _quantize(model, batches, "auto")
    full_errors = _report(full)["observer_errors"]
    assert _report(full)["observer_dropped_at_half"] == []
    kept = [name for name in CANDIDATES if name not in dropped]
    if len(kept) > 1:   # measured on every sample, as in the full run
        assert {name: errors[name] for name in kept} == {name: full_errors[name] for name in kept}
        assert report["observer_chosen_on"] == _report(full)["observer_chosen_on"]
    else:               # one left at half: the second half is not measured
        assert report["observer_chosen_on"] < _report(full)["observer_chosen_on"]
    assert report["observer_chosen"] == _report(full)["observer_chosen"] == min(full_errors, key=full_errors.get)
    assert _ranges(graph) == _ranges(full)
    assert dropped   # on these data a candidate is far behind, so the test sees a drop
    assert all(errors[name] > min(errors.values()) for name in dropped)
