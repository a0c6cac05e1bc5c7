"""The sequential reconstruction (QDrop's expected loss, layer after layer): the statistics' closed form
against the average over every drop mask, its gradient, and the pass on a small network."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

import ppqlike
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.executor.simulation import dequantized
from ppqlike.optim.passes import AdaroundPass, SequentialReconstructionPass
from ppqlike.optim.passes.adaround_rows import LayerStatistics, RowHook, TargetStatistics
from ppqlike.optim.setting import QuantizationSettingFactory
from test_accuracy_passes import chain_model, data, prepared, run_passes


def _gemm(weight: np.ndarray):
    """An operation-like Gemm reading [K] rows with weight [O, K] (transB=1)."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="g", transB=1)], "g",
        [helper.make_tensor_value_info("x", 1, ["N", weight.shape[1]])],
        [helper.make_tensor_value_info("y", 1, ["N", weight.shape[0]])],
        [helper.make_tensor("w", 1, weight.shape, weight.ravel().tolist())]), opset_imports=[helper.make_opsetid("", 13)])
    return ppqlike.load_onnx_graph(model).operations["g"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), drop=st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_the_closed_form_is_the_mean_over_every_drop_mask(seed, drop):
    rng = np.random.default_rng(seed)
    rows, k, out = 2, 3, 2
    weight = rng.standard_normal((out, k)).astype(np.float32)
    operation = _gemm(weight)
    quantized, exact = rng.standard_normal((1, rows, k)), rng.standard_normal((1, rows, k))
    stat = TargetStatistics(operation, drop)
    stat.add(quantized, exact)
    approx = weight[None].astype(np.float64) + 0.1 * rng.standard_normal((1, out, k))
    expected = 0.0
    for mask in itertools.product([0, 1], repeat=rows * k):    # 1: the element's quantization is dropped
        kept = np.array(mask).reshape(1, rows, k)
        probability = np.prod(np.where(kept == 1, drop, 1.0 - drop))
        mixed = np.where(kept == 1, exact, quantized)
        error = mixed[0] @ approx[0].T - exact[0] @ weight.astype(np.float64).T
        expected += probability * float(np.sum(error ** 2))
    assert stat.loss(approx) * rows == pytest.approx(max(expected, 0.0), rel=1e-9, abs=1e-9)
    assert stat.energy == pytest.approx(float(np.sum((exact[0] @ weight.astype(np.float64).T) ** 2)), rel=1e-9)


def test_with_equal_inputs_it_is_learned_rounding_on_those_inputs():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((4, 6)).astype(np.float32)
    operation = _gemm(weight)
    rows = rng.standard_normal((1, 40, 6))
    target, plain = TargetStatistics(operation, 0.5), LayerStatistics(operation)
    target.add(rows, rows)
    plain.add(rows)
    plain.finish()
    approx = weight[None] + 0.05 * rng.standard_normal((1, 4, 6))
    assert target.loss(approx) == pytest.approx(plain.loss(approx), rel=1e-9)
    np.testing.assert_allclose(target.gradient(approx), plain.gradient(approx), rtol=1e-4, atol=1e-6)


def test_the_gradient_is_the_loss_derivative():
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((3, 5)).astype(np.float32)
    stat = TargetStatistics(_gemm(weight), 0.5)
    stat.add(rng.standard_normal((1, 30, 5)), rng.standard_normal((1, 30, 5)))
    approx = weight[None].astype(np.float64) + 0.1 * rng.standard_normal((1, 3, 5))
    gradient = stat.gradient(approx)
    for index in [(0, 0, 0), (0, 1, 3), (0, 2, 4)]:
        step = np.zeros_like(approx)
        step[index] = 1e-5
        numeric = (stat.loss(approx + step) - stat.loss(approx - step)) / 2e-5
        assert gradient[index] == pytest.approx(numeric, rel=1e-3, abs=1e-6)


def _output_error(graph, batches):
    executor = ppqlike.NumpyExecutor(graph)
    with dequantized(graph):
        reference = [executor.forward(batch)[0] for batch in batches]
    quantized = [executor.forward(batch)[0] for batch in batches]
    return sum(float(np.sum((q - r) ** 2)) for q, r in zip(quantized, reference))


def reconstructed_chain(reconstruction, batches):
    """The W4A8 chain model after ``reconstruction``, its pass reports, and its output error without (0) and
    with (1) the pass."""
    errors = {}
    for passes in ((), (reconstruction,)):
        graph, policy = prepared(chain_model(), "ACADEMIC_W4A8")
        _, reports = run_passes(graph, policy, batches, extra=passes, stop_before="baking")
        errors[len(passes)] = _output_error(graph, batches)
    return graph, reports, errors


def layer_details(graph) -> list:
    """Each Conv/Gemm's reconstruction facts, asserting its weight was baked."""
    details = []
    for operation in graph.operations.values():
        if operation.type in ("Conv", "Gemm"):
            config = operation.config.input_quantization_config[1]
            assert config.state is S.BAKED
            details.append(config.detail["reconstruction"])
    return details


def test_the_pass_bakes_every_layer_no_worse_than_nearest_and_lowers_the_output_error():
    graph, reports, errors = reconstructed_chain(SequentialReconstructionPass(samples=16, steps=200),
                                                 data(batches=4, seed=3))
    report = reports["reconstruction"]
    assert report["layers"] == report["targets"] == 5     # four Conv (one depthwise) and the Gemm
    for detail in layer_details(graph):
        assert detail["loss_" + detail["kept"]] <= detail["loss_nearest"]
    assert errors[1] < errors[0]


def spent_and_after_adaround(spent, learned) -> tuple[dict, dict]:
    """The reports of a reconstruction pass ``spent`` run with its budget spent, and of AdaRound then ``learned``
    on the W4A8 chain model, asserting every layer after ``learned`` is no worse than the rounding AdaRound left
    it and than nearest rounding."""
    batches = data(batches=2, seed=4)
    graph, policy = prepared(chain_model(), "ACADEMIC_W4A8")
    _, spent_reports = run_passes(graph, policy, batches, extra=(spent,))
    graph, policy = prepared(chain_model(), "ACADEMIC_W4A8")
    _, reports = run_passes(graph, policy, batches, extra=(AdaroundPass(steps=100, verbose=False), learned))
    for detail in layer_details(graph):
        assert detail["loss_" + detail["kept"]] <= min(detail["loss_previous"], detail["loss_nearest"])
    return spent_reports, reports


def test_a_layer_never_leaves_worse_than_the_rounding_it_came_with_and_the_pass_stops_at_its_budget():
    spent, reports = spent_and_after_adaround(SequentialReconstructionPass(samples=8, steps=50, time_budget=0.0),
                                              SequentialReconstructionPass(samples=8, steps=20))
    assert spent["reconstruction"]["layers"] == 0 and spent["reconstruction"]["budget_spent"]
    assert reports["adaround"]["layers"] == reports["reconstruction"]["layers"] == 5


def test_the_setting_runs_it_after_calibration():
    from ppqlike.optim.recipe import build_pipeline, resolve_policy
    setting = QuantizationSettingFactory.for_platform("ACADEMIC_W4A8")
    setting.adaround, setting.reconstruction = True, True
    names = [p.name for p in build_pipeline(resolve_policy("ACADEMIC_W4A8", setting), setting).passes]
    assert names.index("adaround") < names.index("calibration") < names.index("reconstruction")


def test_best_reconstructs_where_the_weights_have_fewer_than_8_bits():
    from ppqlike.optim.recipe import apply_recipe
    for platform, expected in (("ACADEMIC_W4A8", True), ("ORT_INT8", False), ("TRT_INT8", False)):
        setting = QuantizationSettingFactory.for_platform(platform)
        setting.recipe = "best"
        assert apply_recipe(setting, platform)[0].reconstruction is expected
        setting.recipe = "balanced"
        assert apply_recipe(setting, platform)[0].reconstruction is False


def _token_mlp(seed=0):
    """x [N, 6, 8] -> MatMul [8, 16] + bias -> Relu -> MatMul [16, 8]: a transformer's MLP on tokens, the linear
    layers as MatMuls with constant weights (as exporters write them)."""
    from onnx import TensorProto, numpy_helper
    rng = np.random.default_rng(seed)
    spread = np.geomspace(0.1, 10.0, 16)
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in (
        ("w1", rng.standard_normal((8, 16)) * 0.4 * spread), ("b1", rng.standard_normal(16) * 0.1),
        ("w2", rng.standard_normal((16, 8)) * 0.3 / spread[:, None]))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="bias1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "token_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_matmul_weights_are_reconstructed_like_gemm_weights():
    """A MatMul with a constant [K, N] weight is a rounding target of both passes: its rows are the last axis of
    its input, its weight rounded no worse than nearest, and the output error falls."""
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((4, 6, 8)).astype(np.float32) for _ in range(4)]
    errors = {}
    for passes in ((), (SequentialReconstructionPass(samples=16, steps=200),)):
        graph, policy = prepared(_token_mlp(), "ACADEMIC_W4A8")
        _, reports = run_passes(graph, policy, batches, extra=passes, stop_before="baking")
        errors[len(passes)] = _output_error(graph, batches)
    assert reports["reconstruction"]["layers"] == reports["reconstruction"]["targets"] == 2
    for name in ("fc1", "fc2"):
        config = graph.operations[name].config.input_quantization_config[1]
        assert config.state is S.BAKED and config.baked_value.shape == graph.operations[name].inputs[1].value.shape
        detail = config.detail["reconstruction"]
        assert detail["loss_" + detail["kept"]] <= detail["loss_nearest"] and detail["rows"] == 16 * 6
    assert errors[1] < errors[0]
    graph, policy = prepared(_token_mlp(), "ACADEMIC_W4A8")
    _, reports = run_passes(graph, policy, batches, extra=(AdaroundPass(steps=100, verbose=False),))
    assert reports["adaround"]["layers"] == 2 and reports["adaround"]["skipped"] == 0
    graph, policy = prepared(_token_mlp(), "TRT_INT8")   # 8-bit MatMul weights keep nearest rounding
    _, reports = run_passes(graph, policy, batches, extra=(AdaroundPass(steps=100, verbose=False),))
    assert reports["adaround"]["layers"] == 0
    assert {entry["reason"] for entry in reports["adaround"]["skipped_ops"]} == \
        {"MatMul weight of 8 bits or more (nearest rounding)"}


def test_fitted_steps_are_those_that_fit_in_the_time_given():
    from ppqlike.optim.passes.adaround_rounding import PROBE_STEPS, fitted_steps
    assert PROBE_STEPS == 8
    assert fitted_steps(1000, 1.0, 0.08) == 100          # 0.01 s a step
    assert fitted_steps(50, 1.0, 0.08) == 50             # at most the steps asked for
    assert fitted_steps(1000, -3.0, 0.08) == PROBE_STEPS  # at least the probe


def test_a_layer_in_no_block_runs_the_steps_its_share_of_time_holds():
    """The token MLP's MatMuls are in no block (no gradient is known for MatMul): the block pass reconstructs them
    one at a time; with no time to share each runs its probe steps only, with none given all its steps."""
    from ppqlike.optim.passes.block_reconstruction import BlockReconstructionPass
    from ppqlike.optim.passes.adaround_rounding import PROBE_STEPS, learn_rounding
    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((4, 6, 8)).astype(np.float32) for _ in range(2)]
    graph, policy = prepared(_token_mlp(), "ACADEMIC_W4A8")
    _, reports = run_passes(graph, policy, batches, extra=(BlockReconstructionPass(samples=8, steps=120),))
    assert reports["reconstruction"]["blocks"] == 0 and reports["reconstruction"]["layers"] == 2
    assert [graph.operations[n].config.input_quantization_config[1].detail["reconstruction"]["steps_done"]
            for n in ("fc1", "fc2")] == [120, 120]
    graph, policy = prepared(_token_mlp(), "ACADEMIC_W4A8")
    run_passes(graph, policy, batches, stop_before="baking")
    operation = graph.operations["fc1"]
    stat = TargetStatistics(operation, 0.5)
    x = np.concatenate(batches)
    rows = RowHook.rows_at(operation, x, np.arange(48))
    stat.add(rows, rows)
    config = operation.config.input_quantization_config[1]
    _, facts = learn_rounding(stat, operation, config, steps=200, seconds=0.0)
    assert facts["steps_done"] == PROBE_STEPS
    _, facts = learn_rounding(stat, operation, config, steps=200)
    assert facts["steps_done"] == 200
