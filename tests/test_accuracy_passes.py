"""The optional accuracy passes: equalization, bias correction, learned rounding, threshold search, mixed precision."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model
from ppqlike.api import quantize_onnx_model
from ppqlike.optim.recipe import build_pipeline, resolve_policy
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.executor.simulation import dequantized
from ppqlike.optim.passes import (AdaroundPass, BiasCorrectionPass, FusionPass, LayerwiseEqualizationPass,
                                  MixedPrecisionPass, ParameterBakingPass, ParameterQuantizePass,
                                  PassiveParameterQuantizePass, QuantizationAlignmentPass,
                                  QuantizationSimplifyPass, RuntimeCalibrationPass)
from ppqlike.optim.passes.mixed_precision import output_cosine
from ppqlike.platforms.dispatch import dispatch_graph
from ppqlike.optim.passes import QuantizeRefinePass
from ppqlike.platforms.policies import get_platform_policy, get_quantizer
from ppqlike.optim.setting import QuantizationSetting, QuantizationSettingFactory
from counting_loader import CountingLoader
from shared_bench import PRESETS, load_images, requires_bench


# ------------------------------------------------------------------ models
def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def _conv(name, x, out, weight, bias=None, **attributes):
    inits = [_init(f"{name}_w", weight)]
    inputs = [x, f"{name}_w"]
    if bias is not None:
        inits.append(_init(f"{name}_b", bias))
        inputs.append(f"{name}_b")
    node = helper.make_node("Conv", inputs, [out], name=name, kernel_shape=list(np.shape(weight)[2:]), **attributes)
    return node, inits


def _model(nodes_and_inits, extra_inits=(), channels=3, size=8, out_shape=("N", 10), output="y"):
    nodes, inits = [], list(extra_inits)
    for node, node_inits in nodes_and_inits:
        nodes.append(node)
        inits += node_inits
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                      [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(out_shape))], inits)


def _activation(kind, x, out, name):
    if kind == "relu":
        return helper.make_node("Relu", [x], [out], name=name), []
    return helper.make_node("Clip", [x, f"{name}_lo", f"{name}_hi"], [out], name=name), \
        [_init(f"{name}_lo", 0.0), _init(f"{name}_hi", 6.0)]


def chain_model(activation="relu", seed=0):
    """conv1 -> act -> depthwise conv2 -> act -> conv3 -> act -> conv4 -> GAP -> Flatten -> Gemm, unbalanced channels."""
    rng = np.random.default_rng(seed)
    spread = np.geomspace(0.05, 20.0, 8).astype(np.float32)
    w1 = rng.standard_normal((8, 3, 3, 3)) * 0.3 * spread[:, None, None, None]
    b1 = rng.standard_normal(8) * 0.1 * spread
    w2 = rng.standard_normal((8, 1, 3, 3)) * 0.5 / spread[:, None, None, None]
    parts = [_conv("conv1", "x", "c1", w1, b1, pads=[1, 1, 1, 1]), _activation(activation, "c1", "a1", "act1"),
             _conv("conv2", "a1", "c2", w2, rng.standard_normal(8) * 0.1, pads=[1, 1, 1, 1], group=8),
             _activation(activation, "c2", "a2", "act2"),
             _conv("conv3", "a2", "c3", rng.standard_normal((8, 8, 1, 1)) * 0.4, rng.standard_normal(8) * 0.1),
             _activation(activation, "c3", "a3", "act3"),
             _conv("conv4", "a3", "c4", rng.standard_normal((6, 8, 1, 1)) * 0.4, rng.standard_normal(6) * 0.1),
             (helper.make_node("GlobalAveragePool", ["c4"], ["gap"], name="gap"), []),
             (helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"), []),
             (helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1), [])]
    return _model(parts, [_init("fc_w", rng.standard_normal((10, 6)) * 0.5), _init("fc_b", np.zeros(10))])


def data(batches=4, seed=0, size=8, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((4, 3, size, size)) * scale).astype(np.float32) for _ in range(batches)]


def prepared(model, platform="DSP_INT8", setting=None, table=None):
    """Graph after dispatch and the platform quantizer (INITIAL configs), with its policy."""
    graph = ppqlike.load_onnx_graph(model)
    setting = setting or QuantizationSettingFactory.for_platform(platform)
    policy = resolve_policy(platform, setting)
    dispatch_graph(graph, policy.platform, policy.quantizable_types, dispatcher=setting.dispatcher,
                   dispatching_table=table)
    get_quantizer(policy).quantize(graph)
    QuantizeRefinePass(policy).optimize(graph)
    return graph, policy


def run_passes(graph, policy, batches, extra=(), stop_before="baking"):
    executor = ppqlike.NumpyExecutor(graph)
    passes = [FusionPass(policy.fused_activations), QuantizationSimplifyPass(), ParameterQuantizePass(),
              RuntimeCalibrationPass(verbose=False),
              QuantizationAlignmentPass(policy.concat_alignment, policy.add_alignment),
              PassiveParameterQuantizePass(), *extra, ParameterBakingPass()]
    reports = {}
    for current in passes:
        if current.name == stop_before:
            break
        reports[current.name] = current.optimize(graph, executor=executor, dataloader=batches,
                                                 calib_steps=len(batches))
    return executor, reports


def fp32_outputs(graph, batches):
    executor = ppqlike.NumpyExecutor(graph)
    with dequantized(graph):
        return [executor.forward(b)[0] for b in batches]


def assert_same_function(before, after, rtol=1e-4):
    for b, a in zip(before, after):
        assert np.max(np.abs(a - b)) <= rtol * np.max(np.abs(b)), np.max(np.abs(a - b)) / np.max(np.abs(b))


# ------------------------------------------------------------ equalization
@pytest.mark.parametrize("activation", ["relu", "clip"])
def test_equalization_keeps_fp32_outputs(activation):
    graph, policy = prepared(chain_model(activation))
    batches = data(3, scale=4.0)  # large inputs: ReLU6 saturates often
    before = fp32_outputs(graph, batches)
    FusionPass(policy.fused_activations).optimize(graph)
    report = LayerwiseEqualizationPass(iterations=5).optimize(graph)
    assert report["pairs"] == 3
    assert_same_function(before, fp32_outputs(graph, batches))
    if activation == "relu":
        assert report["mean_spread_after"] < 0.5 * report["mean_spread_before"]
        assert report["channels_scaled"] > 0


def test_equalization_narrows_weight_range_spread_on_relu_chains():
    graph, _ = prepared(chain_model("relu"))
    w1 = graph.variables["conv1_w"].value
    ranges = np.abs(w1).reshape(8, -1).max(1)
    report = LayerwiseEqualizationPass(iterations=10).optimize(graph)
    after = np.abs(graph.variables["conv1_w"].value).reshape(8, -1).max(1)
    assert after.max() / after.min() < 0.2 * ranges.max() / ranges.min()
    assert all(p["spread_after"] < p["spread_before"] for p in report["pair_details"])
    # the depthwise conv is balanced against both neighbours: its channel ranges now meet conv1's
    depthwise = np.abs(graph.variables["conv2_w"].value).reshape(8, -1).max(1)
    assert depthwise.max() / depthwise.min() < 20


def clip_model(seed=0):
    """x -> Clip(0, 1) -> conv1 (some channels small: provably below 6) -> Clip(0, 6) -> conv2 -> conv3."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, 3, 1, 1)) * 0.3
    w1[:4] = np.abs(w1[:4]) * 20.0 + 3.0               # channels 0-3 reach the bound 6, 4-7 never do
    parts = [(helper.make_node("Clip", ["x", "lo", "one"], ["xc"], name="clip_in"), []),
             _conv("conv1", "xc", "c1", w1, rng.standard_normal(8) * 0.1),
             _activation("clip", "c1", "a1", "act1"),
             _conv("conv2", "a1", "c2", rng.standard_normal((8, 8, 1, 1)) * 2.0, rng.standard_normal(8) * 0.1),
             _conv("conv3", "c2", "y", rng.standard_normal((4, 8, 1, 1)), None)]
    return _model(parts, [_init("lo", 0.0), _init("one", 1.0)], out_shape=("N", 4, 8, 8))


def test_equalization_through_clip_moves_only_channels_the_clip_never_cuts():
    graph, _ = prepared(clip_model())
    batches = data(2, scale=3.0)
    before = fp32_outputs(graph, batches)
    w1 = graph.variables["conv1_w"].value.copy()
    report = LayerwiseEqualizationPass(iterations=5).optimize(graph)
    assert_same_function(before, fp32_outputs(graph, batches))
    moved = ~np.isclose(graph.variables["conv1_w"].value, w1).reshape(8, -1).all(axis=1)
    assert not moved[:4].any()          # saturating channels keep their scale
    assert moved[4:].any()
    assert report["clip_safe_channels"] > 0 and report["clip_fixed_channels"] > 0
    # 'skip' leaves the pair alone
    graph, _ = prepared(clip_model())
    report = LayerwiseEqualizationPass(iterations=5, clip="skip").optimize(graph)
    assert any("act1" in s["reason"] for s in report["skipped_pairs"])


def test_equalization_respects_shared_weights_and_dispatch():
    rng = np.random.default_rng(0)
    shared = rng.standard_normal((4, 4, 1, 1))
    parts = [_conv("conv0", "x", "c0", rng.standard_normal((4, 3, 1, 1)), np.zeros(4)),
             (helper.make_node("Relu", ["c0"], ["r0"], name="relu0"), []),
             (helper.make_node("Conv", ["r0", "shared_w"], ["c1"], name="conv1", kernel_shape=[1, 1]), []),
             (helper.make_node("Relu", ["c1"], ["r1"], name="relu1"), []),
             (helper.make_node("Conv", ["r1", "shared_w"], ["c2"], name="conv2", kernel_shape=[1, 1]), []),
             (helper.make_node("Relu", ["c2"], ["r2"], name="relu2"), []),
             _conv("conv3", "r2", "y", rng.standard_normal((2, 4, 1, 1)), np.zeros(2))]
    model = _model(parts, [_init("shared_w", shared)], out_shape=("N", 2, 8, 8))
    graph, _ = prepared(model)
    before = {name: v.value.copy() for name, v in graph.variables.items() if v.is_parameter}
    report = LayerwiseEqualizationPass().optimize(graph)
    assert report["pairs"] == 0 and report["skipped"] == 3
    assert all("shared_w" in s["reason"] or "conv1" in s["reason"] or "conv2" in s["reason"]
               for s in report["skipped_pairs"])
    for name, value in before.items():
        np.testing.assert_array_equal(graph.variables[name].value, value)
    # an op pinned to FP32 by the dispatching table is not touched
    graph, _ = prepared(chain_model(), table={"conv2": "FP32"})
    report = LayerwiseEqualizationPass().optimize(graph)
    assert {(p["first"], p["second"]) for p in report["pair_details"]} == {("conv3", "conv4")}
    skipped = {s["pair"]: s["reason"] for s in report["skipped_pairs"]}
    assert "conv2 is not TARGET" in skipped["conv1 -> conv2"]


def test_equalization_refuses_quantized_weights_and_runs_first_in_the_pipeline():
    graph, policy = prepared(chain_model())
    ParameterQuantizePass().optimize(graph)
    report = LayerwiseEqualizationPass().optimize(graph)
    assert report["pairs"] == 0 and sum("INITIAL" in s["reason"] for s in report["skipped_pairs"]) == 3
    setting = QuantizationSetting(equalization=True, bias_correction=True, adaround=True,
                                  accuracy_target=0.99)
    names = build_pipeline(get_platform_policy("DSP_INT8"), setting).names
    assert names.index("equalization") < names.index("parameter")
    assert names.index("parameter") < names.index("adaround") < names.index("calibration")
    assert names.index("passive") < names.index("bias_correction") < names.index("mixed_precision") \
        < names.index("baking")
    assert "equalization" not in build_pipeline(get_platform_policy("DSP_INT8"), QuantizationSetting()).names


def test_equalization_lowers_per_tensor_quantization_error():
    batches = data(4)
    errors = {}
    for enabled in (False, True):
        setting = QuantizationSetting(equalization=enabled)
        graph = quantize_onnx_model(chain_model(), batches, platform="DSP_INT8", setting=setting)
        executor = ppqlike.NumpyExecutor(graph)
        quantized = [executor.forward(b)[0] for b in batches]
        with dequantized(graph):
            reference = [executor.forward(b)[0] for b in batches]
        errors[enabled] = np.mean([np.mean((q - r) ** 2) for q, r in zip(quantized, reference)])
    assert errors[True] < 0.5 * errors[False]


@requires_bench
def test_equalization_on_mobilenetv2_keeps_outputs_and_narrows_spread():
    images, _, _ = load_images("mobilenetv2", "calib", 2)
    graph, policy = prepared(str(PRESETS["mobilenetv2"].path))
    from ppqlike.optim.recipe import format_for_quantization
    graph = ppqlike.load_onnx_graph(str(PRESETS["mobilenetv2"].path))
    format_for_quantization(graph, QuantizationSetting())
    dispatch_graph(graph, policy.platform, policy.quantizable_types)
    get_quantizer(policy).quantize(graph)
    QuantizeRefinePass(policy).optimize(graph)
    before = fp32_outputs(graph, [images])
    report = LayerwiseEqualizationPass(iterations=10).optimize(graph)
    assert report["pairs"] >= 30 and report["channels_scaled"] > 100
    assert report["mean_spread_after"] < report["mean_spread_before"]
    assert_same_function(before, fp32_outputs(graph, [images]))


# ---------------------------------------------------------- bias correction
def no_bias_model(seed=0):
    """conv1 without bias (an outlier weight makes per-tensor rounding coarse) -> Relu -> conv2 -> GAP -> Gemm."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((8, 3, 3, 3)) * 0.2
    w1[0, 0, 0, 0] = 4.0
    w2 = rng.standard_normal((8, 8, 3, 3)) * 0.2
    w2[1, 2, 1, 1] = -5.0
    parts = [(helper.make_node("Conv", ["x", "conv1_w"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1] * 4),
              [_init("conv1_w", w1)]),
             (helper.make_node("Relu", ["c1"], ["r1"], name="relu1"), []),
             _conv("conv2", "r1", "c2", w2, rng.standard_normal(8) * 0.1, pads=[1] * 4),
             (helper.make_node("GlobalAveragePool", ["c2"], ["gap"], name="gap"), []),
             (helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"), []),
             (helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1), [])]
    return _model(parts, [_init("fc_w", rng.standard_normal((10, 8))), _init("fc_b", np.zeros(10))])


def mean_errors(graph, batches):
    """Per output element, the mean (over the data) of quantized minus FP32 output; and the output MSE."""
    executor = ppqlike.NumpyExecutor(graph)
    quantized = np.concatenate([executor.forward(b)[0] for b in batches])
    with dequantized(graph):
        reference = np.concatenate([executor.forward(b)[0] for b in batches])
    return np.abs((quantized - reference).mean(axis=0)).mean(), np.mean((quantized - reference) ** 2)


def test_bias_correction_lowers_mean_output_error_and_creates_missing_bias():
    rng = np.random.default_rng(0)
    batches = [rng.random((4, 3, 8, 8)).astype(np.float32) for _ in range(4)]  # image-like: positive mean
    results = {}
    for enabled in (False, True):
        graph, policy = prepared(no_bias_model(), "DSP_INT8")
        extra = [BiasCorrectionPass(new_bias="int32", verbose=False, create_biases=True)] if enabled else []
        executor, reports = run_passes(graph, policy, batches, extra, stop_before=None)
        results[enabled] = mean_errors(graph, batches), graph, reports
    (bias_off, mse_off), _, _ = results[False]
    (bias_on, mse_on), graph, reports = results[True]
    assert bias_on < 0.3 * bias_off
    assert mse_on < 0.5 * mse_off
    report = reports["bias_correction"]
    assert report["corrected"] == 3 and report["biases_created"] == 1
    conv1 = graph.operations["conv1"]
    assert len(conv1.inputs) == 3 and conv1.inputs[2].is_parameter
    bias_config = conv1.config.input_quantization_config[2]
    assert bias_config.state is S.PASSIVE_BAKED and bias_config.num_of_bits == 32
    expected = conv1.config.input_quantization_config[0].scale * conv1.config.input_quantization_config[1].scale
    np.testing.assert_allclose(bias_config.scale, expected, rtol=1e-6)
    # the FP32 model keeps its function (a zero bias); the quantized model reads the baked correction
    assert not conv1.inputs[2].value.any() and np.abs(bias_config.baked_value).max() > 0
    conv2 = graph.operations["conv2"]
    original = numpy_helper.to_array(next(i for i in no_bias_model().graph.initializer if i.name == "conv2_b"))
    np.testing.assert_array_equal(conv2.inputs[2].value, original)
    assert not np.allclose(conv2.config.input_quantization_config[2].baked_value, original, atol=1e-4)


def test_bias_correction_leaves_an_op_without_bias_alone_so_a_zero_input_stays_zero():
    """By default an op without a bias gets none (NNCF corrects only ops with one): a created bias would move
    what the op makes of a zero input (an STFT convolution's silence, zero padding)."""
    rng = np.random.default_rng(0)
    batches = [rng.random((4, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    graph, policy = prepared(no_bias_model(), "DSP_INT8")
    executor, reports = run_passes(graph, policy, batches, [BiasCorrectionPass(new_bias="int32", verbose=False)],
                                   stop_before=None)
    report = reports["bias_correction"]
    assert report["biases_created"] == 0 and sorted(entry["op"] for entry in report["ops"]) == ["conv2", "fc"]
    assert any(entry["op"] == "conv1" and entry["reason"].startswith("no bias") for entry in report["skipped_ops"])
    assert len(graph.operations["conv1"].inputs) == 2
    seen = {}

    class Keep(ppqlike.executor.OperationHook):
        def after_operation(self, operation, inputs, outputs):
            if operation.name == "conv1":
                seen["conv1"] = np.array(outputs[0])
    ppqlike.NumpyExecutor(graph).forward(np.zeros((2, 3, 8, 8), np.float32), hooks=[Keep()])
    assert not seen["conv1"].any()   # silence in, silence out


def test_bias_correction_on_float_bias_platform_keeps_new_bias_float():
    graph, policy = prepared(no_bias_model(), "TRT_INT8")
    batches = data(2)
    _, reports = run_passes(graph, policy, batches, [BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True)],
                            stop_before=None)
    assert reports["bias_correction"]["new_bias"] == "float"
    assert graph.operations["conv1"].config.input_quantization_config[2] is None


def test_bias_correction_draws_no_batch_past_its_deadline():
    batches = data(3)
    reports = {}
    for budget in (None, 0.0):
        graph, policy = prepared(no_bias_model(), "TRT_INT8")
        correction = BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True, time_budget=budget)
        _, passes = run_passes(graph, policy, batches, [correction], stop_before=None)
        reports[budget] = passes["bias_correction"]
    assert reports[None]["batches"] == 3 and not reports[None]["budget_spent"]
    # a budget spent before the pass starts: nothing measured, nothing corrected (the wall time is the user's)
    assert reports[0.0]["batches"] == 0 and reports[0.0]["budget_spent"] and reports[0.0]["corrected"] == 0

    def slow_second(items):   # the deadline passes while the second batch is read
        for index, batch in enumerate(items):
            if index == 1:
                time.sleep(1.2)
            yield batch

    graph, policy = prepared(no_bias_model(), "TRT_INT8")
    executor, _ = run_passes(graph, policy, batches, stop_before="bias_correction")
    report = BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True, time_budget=1.0).optimize(
        graph, executor=executor, dataloader=slow_second(batches), calib_steps=3)
    assert report["batches"] == 2 and report["budget_spent"]   # the batch read past it is measured, none after
    assert report["corrected"] == reports[None]["corrected"] > 0


def test_bias_correction_reads_no_batch_once_its_samples_are_measured():
    loader = CountingLoader(data(4))   # 4 batches of 4 samples
    graph, policy = prepared(no_bias_model(), "TRT_INT8")
    correction = BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True, samples=5)
    executor = ppqlike.NumpyExecutor(graph)
    for current in [FusionPass(policy.fused_activations), QuantizationSimplifyPass(), ParameterQuantizePass(),
                    RuntimeCalibrationPass(verbose=False), PassiveParameterQuantizePass()]:
        current.optimize(graph, executor=executor, dataloader=loader.batches, calib_steps=4)
    report = correction.optimize(graph, executor=executor, dataloader=loader, calib_steps=4)
    assert (report["batches"], report["samples"], loader.made) == (2, 8, 2)
    assert report["corrected"] == 3


def test_bias_correction_leaves_ops_whose_weights_lie_on_their_grid():
    """Weights that are integers times a power of two, each output channel reaching 127 steps, quantize
    exactly (per-channel symmetric int8): nothing to correct, and the op is not measured."""
    rng = np.random.default_rng(3)
    graph, policy = prepared(no_bias_model(), "TRT_INT8")
    weight = graph.operations["conv1"].inputs[1]
    codes = rng.integers(-126, 127, weight.value.shape)
    codes.reshape(len(codes), -1)[:, 0] = 127
    weight.value = (codes * 2.0 ** -6).astype(np.float32)
    _, reports = run_passes(graph, policy, data(2), [BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True)],
                            stop_before=None)
    report = reports["bias_correction"]
    assert {"op": "conv1", "reason": "weight quantization is exact"} in report["skipped_ops"]
    assert sorted(entry["op"] for entry in report["ops"]) == ["conv2", "fc"]
    assert len(graph.operations["conv1"].inputs) == 2   # no zero bias was created for it


@pytest.mark.parametrize("platform", ["DSP_INT8", "TRT_INT8"])   # int32 biases baked / float biases changed
def test_checked_bias_correction_keeps_a_gain_and_undoes_a_loss_exactly(platform, monkeypatch):
    """checked_on: the output error is measured before and after; the correction stays where it fell, and is
    undone where it rose: then the graph (its biases, inputs, configs and outputs) is the one without it."""
    import ppqlike.optim.passes.bias_correction as module
    rng = np.random.default_rng(0)
    batches = [rng.random((4, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    plain, policy = prepared(no_bias_model(), platform)
    run_passes(plain, policy, batches, stop_before=None)
    checked, _ = prepared(no_bias_model(), platform)
    _, reports = run_passes(checked, policy, batches, [BiasCorrectionPass(verbose=False, checked_on=8, create_biases=True)],
                            stop_before=None)
    report = reports["bias_correction"]
    assert report["kept"] and report["error_after"] < report["error_before"] and report["checked_samples"] == 8
    assert report["corrected"] == 3 and len(checked.operations["conv1"].inputs) == 3
    errors = iter([0.1, 0.2])   # the error measured before and after: a loss
    monkeypatch.setattr(module, "output_error", lambda *args: next(errors))
    undone, _ = prepared(no_bias_model(), platform)
    _, reports = run_passes(undone, policy, batches, [BiasCorrectionPass(verbose=False, checked_on=8, create_biases=True)],
                            stop_before=None)
    report = reports["bias_correction"]
    assert not report["kept"] and report["corrected"] == 0 and report["biases_created"] == 0
    assert sorted(undone.variables) == sorted(plain.variables)
    for name, operation in plain.operations.items():
        other = undone.operations[name]
        assert [v.name for v in other.inputs] == [v.name for v in operation.inputs]
        for variable in operation.inputs:
            np.testing.assert_array_equal(undone.variables[variable.name].value, variable.value)
        if operation.config is not None:
            for mine, theirs in zip(operation.config.input_quantization_config, other.config.input_quantization_config):
                assert (mine is None) == (theirs is None)
                if mine is not None:
                    assert mine.state is theirs.state
                    np.testing.assert_array_equal(mine.baked_value if mine.baked_value is not None else 0,
                                                  theirs.baked_value if theirs.baked_value is not None else 0)
    for batch in batches:
        np.testing.assert_array_equal(ppqlike.NumpyExecutor(undone).forward(batch)[0],
                                      ppqlike.NumpyExecutor(plain).forward(batch)[0])


def test_layer_scope_bias_correction_makes_each_layer_mean_exact_on_fp32_inputs():
    """scope='layer' (NNCF's fast bias correction): for each corrected op, on the calibration data, the mean
    output channel of op(Q(x), W_q) with the corrected bias equals that of op(x, W) with the FP32 bias, x
    the op's FP32 input and Q its input grid; the weights-only scope leaves the input-grid part."""
    rng = np.random.default_rng(4)
    batches = [rng.random((4, 3, 8, 8)).astype(np.float32) for _ in range(3)]
    from ppqlike.optim.passes.bias_correction import quantized_weight
    from ppqlike.executor import OperationHook
    gaps = {}
    for scope in ("weights", "layer"):
        graph, policy = prepared(no_bias_model(), "TRT_INT8")
        original = {name: graph.operations[name].inputs[1].value.copy() for name in ("conv2", "fc")}
        biases = {name: graph.operations[name].inputs[2].value.copy() for name in ("conv2", "fc")}
        correction = BiasCorrectionPass(new_bias=None, verbose=False, create_biases=True, scope=scope)
        executor, _ = run_passes(graph, policy, batches, [correction], stop_before="bias_correction")
        inputs = {name: [] for name in original}

        class Keep(OperationHook):
            def before_operation(self, operation, arguments):
                if operation.name in inputs:
                    inputs[operation.name].append(np.asarray(arguments[0]))
        with dequantized(graph):   # the FP32 inputs the pass sees (before it moves TensorRT's float biases)
            for batch in batches:
                executor.forward(batch, hooks=[Keep()])
        report = correction.optimize(graph, executor=executor, dataloader=batches, calib_steps=len(batches))
        assert report["scope"] == scope and report["corrected"] == 3
        for name in original:
            operation = graph.operations[name]
            x = np.concatenate(inputs[name])
            config = operation.config.input_quantization_config
            seen = config[0].fake_quantize(x)
            weight_q = quantized_weight(config[1], original[name])
            run = lambda data, weight, bias: executor.run_operation(operation, [data, weight, bias],
                                                                    quantized=False)[0]
            quantized = run(seen, weight_q, operation.inputs[2].value).mean(axis=0)
            reference = run(x, original[name], biases[name]).mean(axis=0)
            axes = tuple(range(1, quantized.ndim))
            gaps[scope, name] = np.abs((quantized - reference).mean(axis=axes) if axes else quantized - reference)
    for name in ("conv2", "fc"):
        assert gaps["layer", name].max() < 1e-4 * (1 + np.abs(biases[name]).max()), gaps["layer", name]
        assert gaps["weights", name].max() > 10 * gaps["layer", name].max()


def test_bias_correction_fast_conv_mean_matches_running_the_conv():
    from ppqlike.executor.ops import build_kernel
    from ppqlike.optim.passes.bias_correction import _conv_error_mean
    rng = np.random.default_rng(3)
    for attributes, w_shape, x_shape in [({"pads": [1, 1, 1, 1], "group": 1}, (8, 4, 3, 3), (3, 4, 9, 9)),
                                         ({"pads": [0, 1, 2, 1], "strides": [2, 2], "group": 4}, (8, 1, 3, 3),
                                          (3, 4, 10, 11)),
                                         ({"pads": [2, 2, 2, 2], "strides": [2, 1], "dilations": [2, 2],
                                           "group": 2}, (6, 2, 5, 3), (2, 4, 13, 12))]:
        graph = ppqlike.Graph()
        x, y = graph.create_variable("x"), graph.create_variable("y")
        w = graph.create_variable("w", value=rng.standard_normal(w_shape).astype(np.float32))
        op = graph.create_operation("Conv", [x, w], [y], attributes={**attributes, "kernel_shape": list(w_shape[2:])})
        value = rng.standard_normal(x_shape).astype(np.float32)
        expected = build_kernel(op, 13)([value, w.value])[0].mean(axis=(0, 2, 3))
        np.testing.assert_allclose(_conv_error_mean(op, value, w.value), expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------- learned rounding
def smooth_data(batches=4, seed=0):
    """Image-like inputs: neighbouring pixels are correlated (for white noise nearest rounding is optimal)."""
    rng = np.random.default_rng(seed)
    coarse = [rng.standard_normal((4, 3, 4, 4)) for _ in range(batches)]
    return [(np.kron(c, np.ones((1, 1, 2, 2))) + 0.1 * rng.standard_normal((4, 3, 8, 8))).astype(np.float32)
            for c in coarse]


def calibrated_w4a8_chain(batches):
    """The Relu chain on ACADEMIC_W4A8 through calibration (weights not yet rounded): (graph, executor)."""
    graph, policy = prepared(chain_model("relu"), "ACADEMIC_W4A8",
                             QuantizationSettingFactory.for_platform("ACADEMIC_W4A8"))
    executor, _ = run_passes(graph, policy, batches)
    return graph, executor


def test_adaround_lowers_layer_reconstruction_error():
    batches = smooth_data(4)
    graph, executor = calibrated_w4a8_chain(batches)
    conv1 = graph.operations["conv1"]
    weight = conv1.inputs[1].value
    config = conv1.config.input_quantization_config[1]
    nearest = config.fake_quantize(weight)
    report = AdaroundPass(steps=300, samples=512, scale_search=False, verbose=False).optimize(
        graph, executor=executor, dataloader=batches, calib_steps=len(batches))
    assert report["layers"] == 5 and report["improved"] >= 4
    assert report["mean_relative_error_learned"] < 0.7 * report["mean_relative_error_nearest"]
    assert config.state is S.BAKED and "adaround" in config.detail
    learned = config.baked_value
    # on the grid of the config, at most one step from the weight, and not the nearest rounding everywhere
    steps = learned / config.scale[:, None, None, None]
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
    assert np.all(np.abs(learned - weight) <= config.scale[:, None, None, None] * 1.0001)
    assert np.any(learned != nearest)
    # the layer's output error on the calibration data and on fresh data, against nearest rounding
    kernel = executor._kernel(conv1)
    input_config = conv1.config.input_quantization_config[0]
    for batch_set in (batches, smooth_data(2, seed=7)):
        errors = {}
        for name, value in (("nearest", nearest), ("learned", learned)):
            total = 0.0
            for x in batch_set:
                xq = input_config.fake_quantize(x)
                total += np.sum((kernel([xq, value])[0] - kernel([xq, weight])[0]) ** 2)
            errors[name] = total
        assert errors["learned"] < 0.9 * errors["nearest"]
    # baking leaves the learned values alone
    ParameterBakingPass().optimize(graph)
    np.testing.assert_array_equal(config.baked_value, learned)


def test_adaround_scale_search_never_does_worse_than_min_max():
    batches = smooth_data(4)
    graph, executor = calibrated_w4a8_chain(batches)
    min_max = {op: graph.operations[op].config.input_quantization_config[1].scale.copy()
               for op in ("conv1", "conv2", "conv3", "conv4", "fc")}
    report = AdaroundPass(steps=200, samples=512, verbose=False).optimize(
        graph, executor=executor, dataloader=batches, calib_steps=len(batches))
    changed = [d for d in report["layer_details"] if d["scale_changed"]]
    assert changed and all(d["clip_ratio"] <= 1.0 for d in report["layer_details"])
    for detail in changed:
        new_scale = graph.operations[detail["op"]].config.input_quantization_config[1].scale
        assert np.all(new_scale <= min_max[detail["op"]] * (1 + 1e-6)) and np.any(new_scale < min_max[detail["op"]])
    for detail in report["layer_details"]:
        assert detail["learned_loss"] <= detail["nearest_loss"] or not detail["kept_learned"]


def test_adaround_in_the_pipeline_is_opt_in():
    batches = data(3)
    setting = QuantizationSettingFactory.for_platform("ACADEMIC_W4A8")
    setting.adaround, setting.adaround_steps, setting.adaround_samples = True, 100, 256
    setting.protection = setting.float_outputs = False   # every layer rounded by AdaRound (none kept float)
    graph = quantize_onnx_model(chain_model(), batches, platform="ACADEMIC_W4A8", setting=setting)
    names = [p["name"] for p in graph.metadata["quantization"]["passes"]]
    assert "adaround" in names
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "adaround")
    assert report["layers"] == 5 and report["inputs"] == "float"
    assert all(op.config.input_quantization_config[1].state is S.BAKED
               for op in graph.operations.values() if op.type in ("Conv", "Gemm"))


def test_settings_saved_with_the_old_mixed_precision_key_still_load():
    loaded = QuantizationSetting.from_dict({"mixed_precision_target_cosine": 0.99})
    assert loaded.accuracy_target == 0.99 and "accuracy_target" in loaded.to_dict()


def test_adaround_stops_at_its_time_budget_with_a_valid_graph():
    batches = data(3)
    outputs = {}
    for budget in (None, 0.0):
        setting = QuantizationSettingFactory.for_platform("ACADEMIC_W4A8")
        setting.adaround, setting.adaround_steps, setting.adaround_samples = True, 100, 256
        setting.protection = setting.float_outputs = False   # every layer rounded by AdaRound (none kept float)
        setting.time_budget_s = budget
        graph = quantize_onnx_model(chain_model(), batches, platform="ACADEMIC_W4A8", setting=setting)
        report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "adaround")
        assert all(op.config.input_quantization_config[1].state is S.BAKED
                   for op in graph.operations.values() if op.type in ("Conv", "Gemm"))
        outputs[budget] = ppqlike.NumpyExecutor(graph).forward(batches[0])[0]
        if budget == 0.0:  # spent at once: every layer keeps nearest rounding, as without the pass
            assert report["layers"] == 0 and report["budget_spent"] and report["skipped"] == 5
            setting.adaround = False
            plain = quantize_onnx_model(chain_model(), batches, platform="ACADEMIC_W4A8", setting=setting)
            np.testing.assert_array_equal(outputs[budget], ppqlike.NumpyExecutor(plain).forward(batches[0])[0])
        else:
            assert report["layers"] == 5 and not report["budget_spent"]
    assert not np.array_equal(outputs[None], outputs[0.0])


def test_adaround_stops_inside_a_layer_at_the_deadline_and_keeps_a_rounding_no_worse_than_nearest():
    from ppqlike.optim.passes.adaround import learn_rounding
    from ppqlike.optim.passes.adaround_rows import LayerStatistics, RowHook
    batches = smooth_data(4)
    graph, executor = calibrated_w4a8_chain(batches)
    conv1 = graph.operations["conv1"]
    config = conv1.config.input_quantization_config[1]
    stat = LayerStatistics(conv1)
    hook = RowHook({"conv1": stat}, 128, seed=0)
    for batch in batches:
        executor.forward(batch, hooks=[hook])
    stat.finish()
    nearest = config.fake_quantize(conv1.inputs[1].value).reshape(stat.weight.shape)
    stopped, facts = learn_rounding(stat, conv1, config, steps=300, deadline=0.0)   # long past
    assert facts["steps_done"] == 0 and facts["learned_loss"] == pytest.approx(facts["nearest_loss"], rel=1e-6)
    np.testing.assert_allclose(stopped, nearest, rtol=0, atol=1e-6)
    _, finished = learn_rounding(stat, conv1, config, steps=300)
    assert finished["steps_done"] == 300 and finished["learned_loss"] < finished["nearest_loss"]


def test_learned_rounding_keeps_weights_that_lie_on_their_grid_without_iterating():
    import warnings
    from ppqlike.optim.passes.adaround import learn_rounding
    from ppqlike.optim.passes.adaround_rows import LayerStatistics, RowHook
    batches = smooth_data(4)
    graph, executor = calibrated_w4a8_chain(batches)
    conv1 = graph.operations["conv1"]
    config = conv1.config.input_quantization_config[1]
    on_grid = config.fake_quantize(conv1.inputs[1].value)
    conv1.inputs[1].value = on_grid                      # nearest rounding is exact: its loss is 0 up to float error
    stat = LayerStatistics(conv1)
    hook = RowHook({"conv1": stat}, 128, seed=0)
    for batch in batches:
        executor.forward(batch, hooks=[hook])
    stat.finish()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # dividing by that loss overflowed Adam's moments
        learned, facts = learn_rounding(stat, conv1, config, steps=300)
    assert facts["steps_done"] == 0 and facts["changed"] == 0.0
    np.testing.assert_array_equal(learned.reshape(on_grid.shape), on_grid)


# --------------------------------------------------------- threshold search
def test_threshold_search_picks_the_candidate_with_the_smallest_reader_error():
    graph, policy = prepared(chain_model("relu"), "TPU_INT8", QuantizationSetting(activation_observer="search"))
    batches = smooth_data(3)
    _, reports = run_passes(graph, policy, batches, stop_before="alignment")
    searched = [(op, c) for op in graph.operations.values() if op.config is not None
                for c in op.config.all_configs() if "search" in c.detail]
    assert reports["calibration"]["searched"] == len(searched) >= 5
    for op, config in searched:
        facts = config.detail["search"]
        errors, candidates = np.array(facts["errors"]), facts["candidates"]
        assert config.state is S.ACTIVATED
        assert facts["selected"] == int(np.argmin(errors)) and errors[facts["selected"]] <= errors[0]  # KL first
        assert candidates == sorted(candidates) and facts["readers"]
        threshold = float(config.scale) * (config.quant_max - config.quant_min) / 2
        np.testing.assert_allclose(threshold, candidates[facts["selected"]], rtol=1e-5)
    # relu1's output is read by the depthwise conv: the error counted is that conv's output error
    act1 = graph.operations["act1"].config.output_quantization_config[0]
    assert act1.detail["search"]["readers"] == ["conv2"]


# ----------------------------------------------------------- mixed precision
def sensitive_model(seed=0):
    """conv2's weights hold one huge outlier on an input channel that is always 0 (relu1 of a dead
    conv1 channel): per-tensor quantization wipes out conv2's other weights, and nothing else changes."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((8, 3, 3, 3)) * 0.3, rng.standard_normal(8) * 0.1
    w1[4], b1[4] = 0.0, -1.0
    w2 = rng.standard_normal((8, 8, 3, 3)) * 0.2
    w2[3, 4, 1, 1] = 60.0
    w3 = rng.standard_normal((8, 8, 3, 3)) * 0.2
    parts = [_conv("conv1", "x", "c1", w1, b1, pads=[1] * 4),
             (helper.make_node("Relu", ["c1"], ["r1"], name="relu1"), []),
             _conv("conv2", "r1", "c2", w2, rng.standard_normal(8) * 0.1, pads=[1] * 4),
             (helper.make_node("Relu", ["c2"], ["r2"], name="relu2"), []),
             _conv("conv3", "r2", "y", w3, rng.standard_normal(8) * 0.1, pads=[1] * 4)]
    return _model(parts, out_shape=("N", 8, 8, 8))


def measured_cosine(graph, batches):
    executor = ppqlike.NumpyExecutor(graph)
    quantized = [executor.forward(b) for b in batches]
    with dequantized(graph):
        reference = [executor.forward(b) for b in batches]
    return float(np.mean([output_cosine(q, r) for q, r in zip(quantized, reference)]))


def test_mixed_precision_reaches_target_with_the_sensitive_layer():
    batches = data(3)
    graph, policy = prepared(sensitive_model(), "DSP_INT8")
    executor, _ = run_passes(graph, policy, batches)
    start = measured_cosine(graph, batches[:2])
    assert start < 0.99
    report = MixedPrecisionPass(0.99, batches=2, verbose=False).optimize(
        graph, executor=executor, dataloader=batches, calib_steps=len(batches))
    assert report["reached"] and report["final_cosine"] >= 0.99
    assert "conv2" in report["fp32_ops"] and report["fp32_op_count"] <= 2
    assert report["most_sensitive"][0]["unit"][0] == "conv2"
    assert graph.metadata["quantization"]["mixed_precision_fp32_ops"] == report["fp32_ops"]
    conv2 = graph.operations["conv2"]
    assert str(getattr(conv2.platform, "name", conv2.platform)) == "FP32"
    assert all(c.state is S.FP32 for c in conv2.config.all_configs())
    # the fused relu went with it; conv3 now quantizes the float tensor it reads, on the old grid
    assert "relu2" in report["fp32_ops"]
    conv3_input = graph.operations["conv3"].config.input_quantization_config[0]
    assert conv3_input.state is S.ACTIVATED and conv3_input.scale is not None
    ParameterBakingPass().optimize(graph)
    assert measured_cosine(graph, batches[:2]) >= 0.99
    assert graph.operations["conv1"].config.input_quantization_config[1].state is S.BAKED


def test_mixed_precision_leaves_a_good_graph_alone_and_records_in_metadata():
    batches = data(2)
    setting = QuantizationSetting(accuracy_target=0.5, mixed_precision_batches=1)
    graph = quantize_onnx_model(chain_model(), batches, platform="TPU_INT8", setting=setting)
    assert graph.metadata["quantization"]["mixed_precision_fp32_ops"] == []
    setting = QuantizationSettingFactory.for_platform("TPU_INT8")
    setting.accuracy_target = 0.9999
    setting.mixed_precision_batches = 1
    setting.protection = False   # the accuracy target alone moves the sensitive op
    graph = quantize_onnx_model(sensitive_model(), batches, platform="TPU_INT8", setting=setting)
    meta = graph.metadata["quantization"]
    chosen, bf16 = meta["mixed_precision_fp32_ops"], meta["mixed_precision_bf16_ops"]
    assert chosen or bf16   # TPU-MLIR's BF16 is tried before FP32 (issue 36)
    assert all(str(getattr(graph.operations[n].platform, "name", "")) == "FP32" for n in chosen)
    try:
        from ppqlike.export.tpu_mlir import tpu_quantize_table
    except ImportError:  # the exporter is optional here
        return
    table = tpu_quantize_table(graph)
    for names, mode in ((chosen, "F32"), (bf16, "BF16")):
        for name in names:
            for variable in graph.operations[name].outputs:
                assert f"{variable.name} {mode}" in table


def test_settings_validate_accuracy_options():
    with pytest.raises(ppqlike.PPQLikeError):
        QuantizationSetting(equalization_clip="approximately")
    with pytest.raises(ppqlike.PPQLikeError):
        QuantizationSetting(accuracy_target=1.5)
    with pytest.raises(ppqlike.PPQLikeError):
        QuantizationSetting(adaround_steps=0)
    setting = QuantizationSetting(equalization=True, adaround=True, accuracy_target=0.99)
    assert QuantizationSetting.from_dict(setting.to_dict()) == setting
