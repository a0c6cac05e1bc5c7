"""The accuracy target: the fewest ops moved to the platform's 16-bit grid (else FP32) until the cosine holds."""

import numpy as np
import onnx
import onnxruntime
import pytest

import ppqlike
from ppqlike.api import quantize_onnx_model
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.optim.passes.mixed_precision import output_cosine
from ppqlike.optim.setting import QuantizationSettingFactory
from ppqlike.platforms.policies import get_platform_policy
from shared_bench import PRESETS, load_images, requires_bench
from test_accuracy_passes import chain_model, data, measured_cosine, sensitive_model


def _quantize(model, platform, target, batches, recipe="plain", **changes):
    setting = QuantizationSettingFactory.for_platform(platform, recipe=recipe)
    setting.accuracy_target = target
    for name, value in changes.items():
        setattr(setting, name, value)
    return quantize_onnx_model(model, batches, platform=platform, setting=setting)


def _mixed_precision_report(graph):
    return next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == "mixed_precision")["report"]


def test_platforms_name_their_wider_grid():
    assert {name: get_platform_policy(name).higher_precision_bits
            for name in ("ORT_INT8", "DSP_INT8", "TIDL_INT8", "TRT_INT8", "TPU_INT8", "NXP_INT8")} == \
        {"ORT_INT8": 16, "DSP_INT8": 16, "TIDL_INT8": 16, "TRT_INT8": None, "TPU_INT8": "BF16", "NXP_INT8": None}


def test_the_sensitive_layer_moves_to_int16_with_its_weights_and_its_grid():
    batches = data(3)
    plain = _quantize(sensitive_model(), "DSP_INT8", None, batches)
    assert measured_cosine(plain, batches[:2]) < 0.99
    graph = _quantize(sensitive_model(), "DSP_INT8", 0.99, batches)
    meta = graph.metadata["quantization"]
    assert meta["mixed_precision_int16_ops"] == ["conv2", "relu2"] and meta["mixed_precision_fp32_ops"] == []
    assert measured_cosine(graph, batches[:2]) >= 0.99
    conv2, relu2, conv3 = (graph.operations[n] for n in ("conv2", "relu2", "conv3"))
    assert conv2.platform.name == "DSP_INT8"  # stays on the platform, unlike an FP32 move
    weight, bias = conv2.config.input_quantization_config[1:3]
    assert (weight.num_of_bits, weight.quant_min, weight.quant_max, weight.state) == (16, 0, 65535, S.BAKED)
    # int32 on its own scale: input scale x 16-bit weight scale would overflow (and a float bias onnxruntime
    # quantizes itself at that scale)
    assert bias.state is S.BAKED and bias.num_of_bits == 32 and not bias.masters
    output = relu2.config.output_quantization_config[0]
    assert (output.num_of_bits, output.quant_min, output.quant_max, output.state) == (16, 0, 65535, S.ACTIVATED)
    reader = conv3.config.input_quantization_config[0]
    assert reader.state is S.OVERLAPPED and reader.num_of_bits == 16  # one tensor, one grid
    # the 16-bit grid covers the FP32 range seen (min-max), at least the 8-bit range it replaces
    assert float(output.scale) * 65535 >= float(plain.operations["relu2"].config.output_quantization_config[0]
                                                .scale) * 255 * (1 - 1e-6)
    # the rest of the graph is untouched
    for name in ("conv1", "conv3"):
        assert graph.operations[name].config.input_quantization_config[1].num_of_bits == 8


def test_a_platform_without_a_wider_grid_moves_to_fp32():
    batches = data(3)
    graph = _quantize(sensitive_model(), "NXP_INT8", 0.99, batches)
    meta = graph.metadata["quantization"]
    assert "conv2" in meta["mixed_precision_fp32_ops"] and "mixed_precision_int16_ops" not in meta
    assert graph.operations["conv2"].platform.name == "FP32"


def test_tpu_moves_the_sensitive_layer_to_bf16_not_fp32():
    batches = data(3)
    graph = _quantize(sensitive_model(), "TPU_INT8", 0.99, batches)
    meta = graph.metadata["quantization"]
    assert "conv2" in meta["mixed_precision_bf16_ops"] and meta["mixed_precision_fp32_ops"] == []
    assert graph.operations["conv2"].platform.name == "TPU_INT8"
    assert graph.operations["conv2"].config.input_quantization_config[1].float_format.name == "BF16"
    assert measured_cosine(graph, batches[:2]) >= 0.99


def test_fp32_follows_when_int16_is_not_enough():
    batches = data(2)
    graph = _quantize(chain_model(), "DSP_INT8", 1.0, batches, mixed_precision_batches=1)
    report = _mixed_precision_report(graph)
    precisions = [step["precision"] for step in report["trace"] if "precision" in step]
    assert precisions[0] == "INT16" and "FP32" in precisions
    assert precisions.index("FP32") > max(i for i, p in enumerate(precisions) if p == "INT16")
    moved = graph.metadata["quantization"]
    fp32 = set(moved["mixed_precision_fp32_ops"])
    assert fp32 and not fp32 & set(moved["mixed_precision_int16_ops"])
    for name in fp32:
        assert all(c.state in (S.FP32, S.SOI) for c in graph.operations[name].config.all_configs())


@pytest.mark.parametrize("platform", ["DSP_INT8", "ORT_INT8"])
def test_int16_layers_export_to_opset_21_and_onnxruntime_computes_the_simulation(tmp_path, platform):
    batches = data(3)
    model = sensitive_model() if platform == "DSP_INT8" else chain_model()
    graph = _quantize(model, platform, 0.9999, batches)
    assert graph.metadata["quantization"]["mixed_precision_int16_ops"]
    path = tmp_path / "model.onnx"
    ppqlike.export_ppq_graph(graph, platform, str(path))
    exported = onnx.load(str(path))
    assert max(o.version for o in exported.opset_import if o.domain in ("", "ai.onnx")) == 21
    wide = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    assert any(i.data_type in wide for i in exported.graph.initializer)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    executor = ppqlike.NumpyExecutor(graph)
    output_config = graph.outputs[0].producer.config.output_quantization_config[0]
    step = float(output_config.scale)
    for batch in batches:
        got = session.run(None, {session.get_inputs()[0].name: batch})[0]
        want = executor.forward(batch)[0]
        # onnxruntime runs 16-bit groups in float: its summation order may move a rounding by one step
        assert np.max(np.abs(got - want)) <= 2 * step + 1e-6
        assert np.mean(got == want) > 0.9


@requires_bench
def test_mobilenetv2_reaches_the_target_on_held_aside_images_with_few_int16_ops():
    images, _, _ = load_images("mobilenetv2", "calib", 40)
    calibration, held = [images[i:i + 8] for i in range(0, 32, 8)], images[32:]
    # the plain recipe (min-max ranges, no protection): balanced keeps MobileNetV2 above 0.99 without a move
    graph = _quantize(str(PRESETS["mobilenetv2"].path), "ORT_INT8", 0.99, calibration,
                      recipe="plain", mixed_precision_batches=2)
    moved = graph.metadata["quantization"]
    assert moved["mixed_precision_fp32_ops"] == [] and 0 < len(moved["mixed_precision_int16_ops"]) <= 12
    report = _mixed_precision_report(graph)
    assert report["reached"] and report["final_cosine"] >= 0.99 > report["initial_cosine"]
    session = onnxruntime.InferenceSession(str(PRESETS["mobilenetv2"].path), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: held})[0]
    got = ppqlike.NumpyExecutor(graph).forward(held)[0]
    assert output_cosine([got], [reference]) > 0.985  # images the search did not see


def test_a_target_already_met_costs_one_measurement():
    graph = _quantize(chain_model(), "ORT_INT8", 0.5, data(2))
    report = _mixed_precision_report(graph)
    assert report["reached"] and report["measurements"] == 1 and report["most_sensitive"] == []
    assert report["moved"] == {"FP32": [], "INT16": []}


def test_a_first_layer_at_int16_runs_in_onnxruntime_with_every_optimization(tmp_path):
    """onnxruntime quantizes a float bias next to 16-bit Q/DQ at input x weight scale (overflowing int32) when
    it optimizes; the bias of a 16-bit layer is therefore written as int32 on a scale of its own."""
    from ppqlike.optim.passes import ParameterBakingPass
    from ppqlike.optim.passes.precision_moves import find_units, move_to_wider_grid
    from test_accuracy_passes import prepared, run_passes
    batches = data(2)
    graph, policy = prepared(chain_model(), "ORT_INT8")
    run_passes(graph, policy, batches, stop_before="baking")
    first = find_units(graph)[0]
    assert first[0].inputs[0].name == "x"  # reads the graph input
    observed = {"x": (float(min(b.min() for b in batches)), float(max(b.max() for b in batches)))}
    move_to_wider_grid(graph, first, 16, observed)
    ParameterBakingPass().optimize(graph)
    path = tmp_path / "first16.onnx"
    ppqlike.export_ppq_graph(graph, "ORT_INT8", str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # all optimizations
    got = session.run(None, {"x": batches[0]})[0]
    want = ppqlike.NumpyExecutor(graph).forward(batches[0])[0]
    assert output_cosine([got], [want]) > 0.999


def test_the_target_is_measured_on_batches_held_aside_from_calibration():
    batches = data(5)
    graph = _quantize(chain_model(), "TRT_INT8", -0.5, batches)         # a target that always holds: no moves
    report = _mixed_precision_report(graph)
    assert report["held_aside"] and report["batches"] == 1   # the last 2 batches of 4, measured merged
    assert graph.metadata["quantization"]["merged_batches"]["held_aside"] == 2
    # calibration saw the first three batches only: the same scales as calibrating on them alone
    alone = _quantize(chain_model(), "TRT_INT8", None, batches[:3])
    for name, operation in graph.operations.items():
        for mine, theirs in zip(operation.config.output_quantization_config,
                                alone.operations[name].config.output_quantization_config):
            if mine is not None and mine.scale is not None:
                np.testing.assert_array_equal(mine.scale, theirs.scale)
    # a dataloader of unknown length holds nothing aside; the target is measured on calibration batches
    class Unsized:
        def __iter__(self):
            return iter(batches)

    assert not _mixed_precision_report(_quantize(chain_model(), "TRT_INT8", -0.5, Unsized()))["held_aside"]


def test_the_target_is_held_to_the_mean_cosine_less_one_standard_error():
    from ppqlike.optim.passes.mixed_precision import cosine_lower_bound, sample_cosines
    values = np.array([0.99, 0.98, 1.0, 0.97])
    assert cosine_lower_bound(values) == pytest.approx(0.985 - np.std(values, ddof=1) / 2)
    assert cosine_lower_bound(np.array([0.95])) == 0.95
    # per sample: the cosine of each row, averaged over the outputs
    a, b = np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[1.0, 0.0], [1.0, -1.0]])
    np.testing.assert_allclose(sample_cosines([a, a], [a, b]), [1.0, 0.5])


def test_a_reader_read_float_after_a_move_has_its_int32_bias_float_too():
    """placement='compute_inputs' on ORT_INT8: a conv's input is the previous layer's output config; moving that
    layer to FP32 with its readers reading float leaves the conv's int32 bias (on S_input * S_weight) without a
    scale unless it goes float too; the graph then runs."""
    from ppqlike.optim.passes.precision_moves import find_units, move_to_fp32
    setting = QuantizationSettingFactory.for_platform("ORT_INT8")
    setting.recipe, setting.protection, setting.placement = "plain", False, "compute_inputs"
    model = chain_model()
    for node in model.graph.node:   # a HardSwish is a unit of its own: its output config is the next conv's input
        if node.op_type == "Relu":
            node.op_type = "HardSwish"
    model.opset_import[0].version = 14
    graph = quantize_onnx_model(model, data(2), platform="ORT_INT8", setting=setting)
    unit = next(unit for unit in find_units(graph) if [op.name for op in unit] == ["act1"])
    bias = graph.operations["conv2"].config.input_quantization_config[2]
    assert bias.state in (S.PASSIVE, S.PASSIVE_BAKED)
    move_to_fp32(graph, unit, readers="float")
    assert graph.operations["conv2"].config.input_quantization_config[0].state is S.FP32
    assert bias.state is S.FP32
    outputs = ppqlike.NumpyExecutor(graph).forward(data(1)[0])
    assert np.isfinite(outputs[0]).all()
