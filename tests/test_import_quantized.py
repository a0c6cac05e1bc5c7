"""Importing quantized models (QDQ and QOperator) written by onnxruntime's quantizer: simulated bit for bit,
analysed, re-exported, recalibrated; and a clear error for what cannot be mapped."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from ppqlike.core.errors import ModelLoadError, PlatformError
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.export.tensorrt import tensorrt_dynamic_ranges
from onnx_helpers import make_model
from shared_bench import load_images, quantize_static_with_onnxruntime, requires_bench

pytest.importorskip("onnxruntime.quantization")

#: (model, format, activation type, per channel): per-tensor and per-channel, uint8 activations (whose ops
#: onnxruntime runs as integer kernels throughout)
VARIANTS = [("mobilenetv2", "QDQ", "QUInt8", False), ("mobilenetv2", "QDQ", "QUInt8", True),
            ("mobilenetv2", "QOperator", "QUInt8", True), ("efficientnet_lite0", "QDQ", "QUInt8", True),
            ("efficientnet_lite0", "QOperator", "QUInt8", False)]
#: int8 activations: onnxruntime's CPU provider fuses only some ops into integer kernels and runs the rest
#: (depthwise convolutions among them) in float, whose summation order no simulation reproduces
INT8_VARIANT = ("mobilenetv2", "QDQ", "QInt8", True)


def onnxruntime_quantized(model: str, file_format: str, activations: str, per_channel: bool, folder) -> str:
    """The shared model quantized by onnxruntime.quantization.quantize_static on 4 calibration images.

    Weights use 7 bits (``reduce_range``), as onnxruntime advises for x86 CPUs without VNNI: there its u8 x s8
    kernels add products in pairs with 16-bit saturation, which 8-bit weights can overflow (an error of
    onnxruntime's, not of the file: the exact integer result is what the simulation computes)."""
    images, _, _ = load_images(model, "calib", 4)
    path = os.path.join(folder, f"{model}_{file_format}_{activations}_{per_channel}.onnx")
    return quantize_static_with_onnxruntime(model, path, images, file_format, activations, per_channel,
                                            reduce_range=True)


def run_file(path: str, images: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: images})[0]


@pytest.fixture(scope="module")
def quantized_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imported")
    return {variant: onnxruntime_quantized(*variant, str(folder)) for variant in VARIANTS + [INT8_VARIANT]}


@requires_bench
@pytest.mark.real_model
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_imported_simulation_equals_onnxruntime_bit_for_bit(quantized_files, variant):
    path = quantized_files[variant]
    images, _, _ = load_images(variant[0], "dev", 4)
    graph = ppqlike.import_quantized_onnx(path)
    facts = graph.metadata["quantization"]["imported"]
    assert facts["format"] == variant[1] and facts["weights"] > 40 and facts["runtime_kernels"] > 30
    simulated = ppqlike.NumpyExecutor(graph).forward(images)[0]
    np.testing.assert_array_equal(simulated, run_file(path, images))


@requires_bench
@pytest.mark.real_model
def test_imported_int8_activations_agree_where_onnxruntime_runs_integer_kernels(quantized_files):
    path = quantized_files[INT8_VARIANT]
    images, _, _ = load_images("mobilenetv2", "dev", 4)
    graph = ppqlike.import_quantized_onnx(path)
    facts = graph.metadata["quantization"]["imported"]
    assert facts["activations"] > 60 and 0 < facts["runtime_kernels"] < facts["quantized_ops"]
    simulated, expected = ppqlike.NumpyExecutor(graph).forward(images)[0], run_file(path, images)
    np.testing.assert_array_equal(simulated.argmax(1), expected.argmax(1))
    assert np.mean(simulated == expected) > 0.5


@requires_bench
@pytest.mark.real_model
def test_imported_configs_carry_the_file_scales(quantized_files):
    path = quantized_files[("mobilenetv2", "QDQ", "QUInt8", False)]
    model = onnx.load(path)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    graph = ppqlike.import_quantized_onnx(path)
    quantizers = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    checked = 0
    for operation in graph.operations.values():
        for variable, config in zip(operation.outputs, operation.config.output_quantization_config
                                    if operation.config else []):
            node = quantizers.get(variable.name)
            if node is None or config.state is not S.ACTIVATED:
                continue
            assert float(config.scale) == float(constants[node.input[1]])
            assert int(config.offset) == int(constants[node.input[2]]) and config.quant_max == 255
            checked += 1
    conv = next(op for op in graph.operations.values() if op.type == "Conv")
    weight, bias = conv.config.input_quantization_config[1:3]
    assert weight.state is S.BAKED and bias.state is S.PASSIVE_BAKED and bias.num_of_bits == 32
    assert checked > 50
    # the TensorRT ranges come from the same scales: amax = scale * 127 for symmetric, the range otherwise
    ranges = tensorrt_dynamic_ranges(graph)
    assert len(ranges["act_quant_info"]) >= checked and len(ranges["weight_quant_info"]) > 40


@requires_bench
@pytest.mark.real_model
def test_imported_model_reexports_analyses_and_recalibrates(quantized_files, tmp_path):
    path = quantized_files[("mobilenetv2", "QDQ", "QUInt8", False)]
    images, _, _ = load_images("mobilenetv2", "dev", 4)
    graph = ppqlike.import_quantized_onnx(path)
    written = ppqlike.export_ppq_graph(graph, "ORT_INT8", str(tmp_path / "again.onnx"), str(tmp_path / "again.json"))
    np.testing.assert_array_equal(run_file(written[0], images), run_file(path, images))
    analysis = ppqlike.graphwise_error_analyse(graph, [images[:2]], verbose=False)
    assert len(analysis) > 50 and all(np.isfinite(v) for v in analysis.values())
    # the Relus onnxruntime's quantizer folded into ranges are back: the float graph is MobileNetV2's again, so
    # the analysis measures quantization error (without them the float graph's activations are unbounded)
    assert graph.metadata["quantization"]["imported"]["restored_relus"] > 30 and min(analysis.values()) > 3
    unrestored = ppqlike.import_quantized_onnx(path, restore_activations=False)
    np.testing.assert_array_equal(ppqlike.NumpyExecutor(unrestored).forward(images)[0],
                                  ppqlike.NumpyExecutor(graph).forward(images)[0])
    assert min(ppqlike.graphwise_error_analyse(unrestored, [images[:2]], verbose=False).values()) < 1
    layers = ppqlike.layerwise_error_analyse(graph, [images[:2]], verbose=False)
    # an op alone adds no error where its weights are the file's (the float graph holds those very values)
    # and its output grid belongs to a fused successor: +inf dB there
    assert len(layers) > 50 and all(np.isfinite(v) or v == np.inf for v in layers.values())
    assert sum(np.isfinite(v) for v in layers.values()) > 30
    from ppqlike.analysis import write_report
    from ppqlike.export.tpu_mlir import tpu_calibration_table
    write_report(tmp_path / "report.html", graph, analysis)
    assert "imported" in (tmp_path / "report.html").read_text(encoding="utf-8").lower()
    thresholds = [line.split() for line in tpu_calibration_table(graph).splitlines() if not line.startswith("#")]
    assert len(thresholds) > 50 and all(float(row[1]) > 0 for row in thresholds)
    with pytest.raises(PlatformError, match="keep_imported_scales"):
        ppqlike.quantize_onnx_model(path, [images], platform="TRT_INT8")
    setting = ppqlike.QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.keep_imported_scales = False
    recalibrated = ppqlike.quantize_onnx_model(path, [images], platform="TRT_INT8", setting=setting)
    configs = [c for op in recalibrated.operations.values() if op.config for c in op.config.all_configs()]
    from ppqlike.optim.recipe import apply_recipe, resolve_policy
    observer = resolve_policy("TRT_INT8", apply_recipe(setting, "TRT_INT8")[0]).activation.observer
    assert any(c.observer_algorithm == observer for c in configs)  # calibrated for TensorRT, not the file's
    assert not any(c.observer_algorithm == "imported" for c in configs)


def tiny_qdq(dequantized_input_of_int8_graph_input: bool = False) -> onnx.ModelProto:
    """x -> Q -> DQ -> Relu -> y, or a DequantizeLinear reading an int8 graph input (cannot be mapped)."""
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.uint8), "z")
    if dequantized_input_of_int8_graph_input:
        nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"], name="dq_of_input"),
                 helper.make_node("Relu", ["x"], ["y"])]
        inputs = [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 4])]
    else:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
                 helper.make_node("Relu", ["d"], ["y"])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [scale, zero])


def test_tiny_qdq_model_imports_and_matches_onnxruntime():
    model = tiny_qdq()
    graph = ppqlike.import_quantized_onnx(model)
    x = np.array([[-1.0, 0.04, 0.05, 30.0]], np.float32)  # a tie at 0.05 / 0.1 and a clamp at 25.5
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ppqlike.NumpyExecutor(graph).forward(x)[0], session.run(None, {"x": x})[0])


def test_node_that_cannot_be_mapped_is_named():
    with pytest.raises(ModelLoadError, match="dq_of_input"):
        ppqlike.import_quantized_onnx(tiny_qdq(dequantized_input_of_int8_graph_input=True))


def test_errors_of_a_quantized_file_name_the_file_whatever_reads_it(tmp_path):
    path = tmp_path / "unmappable.onnx"
    onnx.save(tiny_qdq(dequantized_input_of_int8_graph_input=True), str(path))
    for load in (ppqlike.import_quantized_onnx, lambda p: ppqlike.quantize_onnx_model(p, [np.zeros((1, 4))])):
        with pytest.raises(ModelLoadError, match=f"model '{path}'.*dq_of_input"):
            load(str(path))


def test_float_model_is_not_imported():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(ModelLoadError, match="not quantized"):
        ppqlike.import_quantized_onnx(model)


def test_inspect_command_prints_what_was_imported(tmp_path, capsys):
    from ppqlike.cli import main
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_qdq(), str(path))
    assert main(["inspect", str(path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "QDQ model" in out and "scale 0.1 zero point 0" in out


def tiny_conv_qdq(weight_integers: np.ndarray) -> onnx.ModelProto:
    """x -> Q/DQ (uint8) -> Conv(weight DQ int8) -> Q/DQ -> y: one integer kernel for onnxruntime."""
    constants = [numpy_helper.from_array(np.float32(0.05), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
                 numpy_helper.from_array(weight_integers.astype(np.int8), "w"),
                 numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.int8(0), "wz"),
                 numpy_helper.from_array(np.float32(0.2), "ys"), numpy_helper.from_array(np.uint8(128), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="xq"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="wd"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="cq"),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="cd")]
    channels = weight_integers.shape[1]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 4, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], constants)


@pytest.mark.parametrize("largest", [64, 127])
def test_weights_beyond_7_bits_are_reported_as_a_saturation_risk(largest):
    import warnings
    from ppqlike.core.host import onnxruntime_saturates_u8s8 as x86_without_vnni
    weights = np.full((2, 8, 1, 1), largest, np.int8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = ppqlike.import_quantized_onnx(tiny_conv_qdq(weights))
    facts = graph.metadata["quantization"]["imported"]
    assert facts["runtime_kernels"] == 1 and facts["saturating_cpu"] == x86_without_vnni()
    assert facts["kernels_with_8bit_weights"] == (largest > 64)
    assert any("saturate" in str(w.message) for w in caught) == (largest > 64 and x86_without_vnni())
    # within 7 bits onnxruntime's integer kernel and the simulation agree exactly on any CPU
    if largest == 64:
        x = np.random.default_rng(0).uniform(0, 6.3, (1, 8, 4, 4)).astype(np.float32)
        session = onnxruntime.InferenceSession(tiny_conv_qdq(weights).SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(ppqlike.NumpyExecutor(graph).forward(x)[0], session.run(None, {"x": x})[0])
