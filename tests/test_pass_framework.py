"""The pass interface, the pipeline (order, timing, placement) and the user pass registry."""

import numpy as np
import pytest

import ppqlike
from ppqlike.core.errors import CalibrationDataError, PlatformError
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.optim.recipe import build_pipeline
from ppqlike.platforms.policies import get_platform_policy
from ppqlike.optim.base import (CalibrationRepeatWarning, PassRegistry, QuantizationOptimizationPass,
                                QuantizationOptimizationPipeline, iterate_calibration)
from test_passes import small_model


class Recorder(QuantizationOptimizationPass):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def optimize(self, graph, **kwargs):
        self.log.append((self.name, sorted(k for k, v in kwargs.items() if v is not None)))
        return {"seen": len(graph.operations)}


def test_pipeline_runs_in_order_times_each_and_places_passes():
    log = []
    pipeline = QuantizationOptimizationPipeline([Recorder("a", log), Recorder("b", log)])
    pipeline.insert(Recorder("before_b", log), before="b")
    pipeline.insert(Recorder("after_a", log), after="a")
    records = pipeline.optimize(ppqlike.load_onnx_graph(small_model()), executor="E", dataloader=[1])
    assert [name for name, _ in log] == ["a", "after_a", "before_b", "b"]
    assert log[0][1] == ["dataloader", "executor"]
    assert [r.name for r in records] == ["a", "after_a", "before_b", "b"]
    assert all(r.seconds >= 0 and r.report == {"seen": 12} for r in records)
    with pytest.raises(PlatformError, match="no pass named 'nope'.*'a'"):
        pipeline.insert(Recorder("x", log), before="nope")


def test_user_pass_registered_before_a_builtin_pass_runs_there():
    seen = {}

    class Inspect(QuantizationOptimizationPass):
        name = "inspect"

        def optimize(self, graph, **kwargs):
            config = graph.operations["conv1"].config.input_quantization_config[1]
            seen["weight_state"] = config.state

    registry = PassRegistry()
    registry.register(Inspect(), after="parameter")
    policy = get_platform_policy("ORT_INT8")
    pipeline = registry.apply(build_pipeline(policy, ppqlike.QuantizationSetting(), registry=PassRegistry()))
    assert pipeline.names.index("inspect") == pipeline.names.index("parameter") + 1
    ppqlike.register_pass(Inspect(), before="calibration")
    try:
        batches = [np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)]
        graph = ppqlike.quantize_onnx_model(small_model(), batches, platform="ORT_INT8")
    finally:
        ppqlike.optim.base.DEFAULT_PASS_REGISTRY.clear()
    assert seen["weight_state"] is S.ACTIVATED  # parameters were quantized, nothing baked yet
    names = [p["name"] for p in graph.metadata["quantization"]["passes"]]
    assert names.index("inspect") == names.index("calibration") - 1


def test_registry_refuses_non_passes():
    with pytest.raises(PlatformError):
        PassRegistry().register(object())


def test_iterate_calibration_counts_and_errors():
    assert list(iterate_calibration([1, 2, 3], 2, verbose=False)) == [1, 2]
    assert list(iterate_calibration([1, 2], None, collate_fn=lambda b: b * 10, verbose=False)) == [10, 20]
    # shorter than calib_steps: run again until the steps are done, as PPQ's RuntimeCalibrationPass does,
    # said in one warning line
    with pytest.warns(CalibrationRepeatWarning, match="holds 2 batches: it is run 3 times") as caught:
        assert list(iterate_calibration([1, 2], 5, verbose=False)) == [1, 2, 1, 2, 1]
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    with pytest.raises(CalibrationDataError, match="no batch"):
        list(iterate_calibration([], None, verbose=False))
    with pytest.raises(CalibrationDataError, match="yielded only 1 batches and cannot be run again"):
        list(iterate_calibration(iter([1]), 3, verbose=False))
