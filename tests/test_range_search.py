"""Activation-range search at the readers' outputs, with quantized inputs (ppqlike.optim.passes.range_search)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import ppqlike
from ppqlike.api import quantize_onnx_model
from ppqlike.core import numerics
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.optim.base import TimeBudget
from ppqlike.optim.passes import ActivationRangeSearchPass
from ppqlike.optim.passes.range_search import candidate_grids, relative_error
from ppqlike.optim.setting import QuantizationSettingFactory
from onnx_helpers import make_model
from test_accuracy_passes import _conv, chain_model, data, prepared, run_passes


def wide_channel_model():
    """x -> conv0 (1x1, diagonal 1, 1, 50) -> conv -> y, where conv ignores channel 2 (zero weights): conv0's
    channel 2 is 50x wider than the others, so its per-tensor min-max range spends its steps on values no
    reader uses."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((4, 3, 3, 3)) * 0.3
    weight[:, 2] = 0.0
    identity, identity_inits = _conv("conv0", "x", "e", np.diag([1.0, 1.0, 50.0]).reshape(3, 3, 1, 1),
                                       np.zeros(3))
    conv, inits = _conv("conv", "e", "y", weight, np.zeros(4), pads=[1] * 4)
    return make_model([identity, conv], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
                      identity_inits + inits)


def wide_channel_batches(count, seed=0):
    return [np.random.default_rng(seed + i).standard_normal((8, 3, 8, 8)).astype(np.float32) for i in range(count)]


def _reader_error(graph, batches):
    executor = ppqlike.NumpyExecutor(graph)
    from ppqlike.executor.simulation import dequantized
    got = [executor.forward(b)[0] for b in batches]
    with dequantized(graph):
        want = [executor.forward(b)[0] for b in batches]
    return float(np.mean([relative_error(g, w) for g, w in zip(got, want)]))


def test_candidates_start_with_the_calibrated_grid_and_shrink_the_observed_range():
    config = ppqlike.TensorQuantizationConfig(
        ppqlike.QuantizationPolicy(ppqlike.QuantizationProperty.PER_TENSOR | ppqlike.QuantizationProperty.LINEAR
                                   | ppqlike.QuantizationProperty.ASYMMETRICAL), num_of_bits=8,
        quant_min=0, quant_max=255, scale=0.5, offset=0, state=S.ACTIVATED, name="t")
    values = np.linspace(-1.0, 9.0, 101)
    grids = candidate_grids(config, values, 4, 0.5)
    assert grids[0] == (0.5, 0)
    for factor, grid in zip(np.linspace(0.5, 1.0, 4), grids[1:]):
        assert grid == numerics.minmax_to_scale_offset(-factor, 9 * factor, 0, 255, symmetric=False)


def test_the_search_clips_a_range_whose_outliers_no_reader_uses():
    batches = wide_channel_batches(3)
    setting = QuantizationSettingFactory.for_platform("ORT_INT8", recipe="plain")  # min-max ranges
    plain = quantize_onnx_model(wide_channel_model(), batches, platform="ORT_INT8", setting=setting)
    setting.range_search = True
    setting.range_search_samples = 16
    searched = quantize_onnx_model(wide_channel_model(), batches, platform="ORT_INT8", setting=setting)
    before = plain.operations["conv0"].config.output_quantization_config[0]
    after = searched.operations["conv0"].config.output_quantization_config[0]
    assert after.state is S.ACTIVATED and after.num_of_bits == 8
    # the tensor's own error would keep the min-max range; its reader's says clip as far as offered (0.3)
    assert float(after.scale) < 0.35 * float(before.scale)
    detail = after.detail["range_search"]
    assert detail["readers"] == ["conv"] and detail["chosen_error"] < detail["calibrated_error"]
    # and the error at the reader drops on data the search did not see
    unseen = wide_channel_batches(2, seed=10)
    assert _reader_error(searched, unseen) < _reader_error(plain, unseen)


def test_the_search_never_picks_a_worse_range_than_calibration_on_its_samples():
    batches = data(3)
    graph, policy = prepared(chain_model(), "TRT_INT8")
    executor, _ = run_passes(graph, policy, batches, stop_before="baking")
    search = ActivationRangeSearchPass(samples=8, candidates=6)
    report = search.optimize(graph, executor=executor, dataloader=batches, calib_steps=len(batches))
    assert report["searched"] > 0 and not report["budget_spent"]
    for operation in graph.operations.values():
        for config in (operation.config.output_quantization_config if operation.config else []):
            if config is not None and "range_search" in config.detail:
                detail = config.detail["range_search"]
                assert detail["chosen_error"] <= detail["calibrated_error"]


def test_a_spent_budget_leaves_the_calibrated_ranges():
    batches = data(2)
    graph, policy = prepared(chain_model(), "ORT_INT8")
    executor, _ = run_passes(graph, policy, batches, stop_before="baking")
    scales = {op.name: [None if c is None or c.scale is None else float(np.max(c.scale))
                        for c in op.config.output_quantization_config]
              for op in graph.operations.values() if op.config is not None}
    budget = TimeBudget(0.0)
    report = ActivationRangeSearchPass(time_budget=budget).optimize(graph, executor=executor, dataloader=batches,
                                                                     calib_steps=len(batches))
    assert report["searched"] == 0 and report["budget_spent"]
    assert scales == {op.name: [None if c is None or c.scale is None else float(np.max(c.scale))
                                for c in op.config.output_quantization_config]
                      for op in graph.operations.values() if op.config is not None}


def test_a_time_budget_is_shared_from_the_first_pass_that_asks():
    budget = TimeBudget(5.0)
    first = budget.deadline()
    assert budget.deadline() == first and TimeBudget.of(budget) is budget
    assert TimeBudget(None).deadline() == float("inf") and TimeBudget.of(2.0).seconds == 2.0
    with pytest.raises(ppqlike.PPQLikeError):
        TimeBudget(-1.0)


def test_scales_shared_by_alignment_are_not_searched():
    batches = data(2)
    rng = np.random.default_rng(0)
    a, a_init = _conv("conv_a", "x", "ca", rng.standard_normal((4, 3, 1, 1)), np.zeros(4))
    b, b_init = _conv("conv_b", "x", "cb", rng.standard_normal((4, 3, 1, 1)) * 3, np.zeros(4))
    concat = helper.make_node("Concat", ["ca", "cb"], ["cat"], name="concat", axis=1)
    c, c_init = _conv("conv_c", "cat", "y", rng.standard_normal((2, 8, 1, 1)), np.zeros(2))
    model = make_model([a, b, concat, c], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 8, 8])],
                       a_init + b_init + c_init)
    graph, policy = prepared(model, "TRT_INT8")
    executor, _ = run_passes(graph, policy, batches, stop_before="baking")
    ActivationRangeSearchPass(samples=8, candidates=4).optimize(graph, executor=executor, dataloader=batches,
                                                                calib_steps=len(batches))
    concat_output = graph.operations["concat"].config.output_quantization_config[0]
    assert [c.state for name in ("conv_a", "conv_b")
            for c in graph.operations[name].config.output_quantization_config] == [S.SLAVE, S.SLAVE]
    assert "range_search" not in concat_output.detail  # its scale is the Concat inputs' scale too
    assert graph.operations["conv_c"].config.output_quantization_config[0].detail["range_search"]["readers"] == []


def test_a_part_of_a_budget_runs_on_the_same_clock():
    budget = TimeBudget(10.0)
    part = budget.part(0.6)
    deadline = part.deadline()  # starts the shared clock
    assert budget.started is not None and deadline == pytest.approx(budget.started + 6.0)
    assert budget.deadline() == pytest.approx(budget.started + 10.0)
    assert TimeBudget(None).part(0.5).deadline() == float("inf")


def _output_scales(graph):
    return {op.name: [None if c is None or c.scale is None else float(np.max(c.scale))
                      for c in op.config.output_quantization_config]
            for op in graph.operations.values() if op.config is not None}


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8"])
def test_a_checked_search_is_kept_only_where_the_held_aside_error_falls(platform):
    """With ``checked_on``: the search's ranges stay only if the output error on the check samples fell;
    otherwise every range is put back exactly, and no config keeps a search record."""
    batches = data(3)
    graph, policy = prepared(chain_model(), platform)
    executor, _ = run_passes(graph, policy, batches, stop_before="baking")
    before = _output_scales(graph)
    report = ActivationRangeSearchPass(samples=8, candidates=6, checked_on=8).optimize(
        graph, executor=executor, dataloader=batches, calib_steps=len(batches), held_aside=data(1, seed=7))
    assert report["searched"] > 0
    records = [c for op in graph.operations.values() if op.config is not None
               for c in op.config.all_configs() if "range_search" in c.detail]
    if report["kept"]:
        assert report["error_after"] < report["error_before"] and records
    else:
        assert report["error_after"] >= report["error_before"] and report["changed"] == 0
        assert _output_scales(graph) == before and not records


def test_the_check_puts_back_a_search_that_raises_the_error(monkeypatch):
    """A search whose choices raise the error (every searched range forced to a tenth of the calibrated
    one) is undone."""
    from ppqlike.optim.passes import range_search

    def worst(self, walk, operation, index, config, value, float_value):
        config.set_scale_offset(float(config.scale) / 10, int(config.offset))
        config.detail["range_search"] = {"forced": True}
        return 1.0, 0.5

    monkeypatch.setattr(range_search.ActivationRangeSearchPass, "_choose", worst)
    batches = data(3)
    graph, policy = prepared(chain_model(), "ORT_INT8")
    executor, _ = run_passes(graph, policy, batches, stop_before="baking")
    before = _output_scales(graph)
    report = ActivationRangeSearchPass(samples=8, checked_on=8).optimize(
        graph, executor=executor, dataloader=batches, calib_steps=len(batches), held_aside=data(1, seed=7))
    assert report["searched"] > 0 and not report["kept"] and report["error_after"] > report["error_before"]
    assert _output_scales(graph) == before
    assert not any("range_search" in c.detail for op in graph.operations.values() if op.config is not None
                   for c in op.config.all_configs())
