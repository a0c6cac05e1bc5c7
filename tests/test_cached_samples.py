"""The measured samples' FP32 intermediates held within a budget (optim/passes/sensitivity.py, CachedSamples)."""

from __future__ import annotations

import numpy as np
import pytest

from ppqlike import api
from ppqlike.executor import NumpyExecutor
from ppqlike.executor.simulation import dequantized
from ppqlike.optim.passes import sensitivity
from ppqlike.optim.passes.sensitivity import AloneRunner, CachedSamples, sample_slice
from ppqlike.optim.setting import QuantizationSettingFactory

from test_protection_ranking import _data, _model

pytestmark = pytest.mark.filterwarnings("ignore::ppqlike.analysis.verdict.QuantizationQualityWarning")


def _graph(platform="TRT_INT8"):
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe, setting.protection = "plain", False
    return api.quantize_onnx_model(_model(), _data(), platform=platform, setting=setting)


def _references(graph, batches):
    executor = NumpyExecutor(graph)
    with dequantized(graph):
        return [executor.forward(batch) for batch in batches]


def test_batches_that_fit_are_cached_once_and_held():
    graph = _graph()
    batches = _data(2, seed=3)
    runner = AloneRunner(graph, NumpyExecutor(graph))
    measured = CachedSamples(runner, batches, _references(graph, batches))
    assert measured.held is not None and len(measured) == 2
    first = [cached for cached, _ in measured]
    again = [cached for cached, _ in measured]
    assert all(a is b for a, b in zip(first, again))            # the same dicts: nothing computed again
    assert first[0]["x"].shape[0] == 16


@pytest.mark.parametrize("samples_that_fit", [1, 3, 16])
def test_over_the_budget_batches_are_cut_into_pieces_that_fit(samples_that_fit):
    graph = _graph()
    batches = _data(2, seed=3)
    references = _references(graph, batches)
    runner = AloneRunner(graph, NumpyExecutor(graph))
    one_sample = sum(np.asarray(v).nbytes for v in runner.cache(batches[0][:1]).values())
    measured = CachedSamples(runner, batches, references, budget=one_sample * samples_that_fit)
    assert measured.held is None
    sizes = [cached["x"].shape[0] for cached, _ in measured]
    expected = [min(samples_that_fit, 16 - start) for start in range(0, 16, samples_that_fit)] * 2
    assert sizes == expected
    whole = [runner.cache(batch) for batch in batches]
    where = [(batch, start) for batch in range(2) for start in range(0, 16, samples_that_fit)]
    for (batch, start), (cached, reference) in zip(where, measured):
        size = cached["x"].shape[0]
        for name, value in whole[batch].items():   # the pieces' intermediates are the batch's, cut
            np.testing.assert_allclose(cached[name], value[start:start + size], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(reference[0], references[batch][0][start:start + size])
        assert sum(np.asarray(v).nbytes for v in cached.values()) <= one_sample * samples_that_fit


def test_sample_slice_cuts_every_input_alike():
    batch = {"a": np.arange(12).reshape(6, 2), "b": np.arange(6)}
    piece = sample_slice(batch, 2, 5)
    np.testing.assert_array_equal(piece["a"], batch["a"][2:5])
    np.testing.assert_array_equal(piece["b"], batch["b"][2:5])
    assert [p.tolist() for p in sample_slice([np.arange(4), np.arange(4) * 2], 1, 3)] == [[1, 2], [2, 4]]


@pytest.mark.parametrize("platform", ["TRT_INT8", "TPU_INT8"])
def test_the_protection_finds_the_same_damage_within_a_small_budget(platform, monkeypatch):
    """A budget of a few samples cuts the held-aside batches; the wrecked unit is still the one moved."""
    graph = _graph(platform)
    runner = AloneRunner(graph, NumpyExecutor(graph))
    one_sample = sum(np.asarray(v).nbytes for v in runner.cache(_data(1)[0][:1]).values())
    monkeypatch.setattr(sensitivity, "CACHE_BUDGET_BYTES", 3 * one_sample)   # 16 held aside: six pieces
    graph = api.quantize_onnx_model(_model(), _data(), platform=platform)   # balanced
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "protection")
    moved = {name for entry in report["protected"] for name in entry["ops"]}
    assert moved & {"conv_a", "relu_a"} and not moved & {"conv_b", "relu_b"}, report
