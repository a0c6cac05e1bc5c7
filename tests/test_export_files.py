"""Config JSON round trip, TensorRT dynamic ranges, TPU-MLIR tables and export_ppq_graph, on the small graph."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import onnx
import pytest

from ppqlike import api
from ppqlike.core.errors import ExportError
from ppqlike.core.quant import QuantizationStates
from ppqlike.executor import NumpyExecutor
from ppqlike.export import (ExportRoundingWarning, build_qdq_model, config_to_json, load_config_json,
                            load_quantized_graph, tensorrt_dynamic_ranges, tpu_calibration_table,
                            tpu_quantize_table)
from ppqlike.export.common import iter_configs, tensor_configs
from ppqlike.export.verify import run_qdq_model
from ppqlike.optim.passes.parameter import minmax_parameter
from ppqlike.optim.setting import QuantizationSettingFactory
from test_export_qdq import CALIB, TEST, small_model

S = QuantizationStates


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("export_files") / "small.onnx"
    onnx.save(small_model(), str(path))
    return str(path)


def quantize(source, platform, **setting_changes):
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.float_outputs = False   # every op of the small model quantized, its last one too
    for key, value in setting_changes.items():
        setattr(setting, key, value)
    return api.quantize_onnx_model(source, CALIB, platform=platform, setting=setting)


def _links(graph):
    """Config id -> (to_dict without masters, master ids): the structure a round trip must keep."""
    ids = {id(c): f"{op.name}/{side}/{slot}" for op, side, slot, _, c in iter_configs(graph)}
    result = {}
    for op, side, slot, _, config in iter_configs(graph):
        data = config.to_dict()
        data.pop("masters")
        result[f"{op.name}/{side}/{slot}"] = (data, [ids[id(m)] for m in config.masters])
    return result


@pytest.mark.parametrize("platform", ["TRT_INT8", "ORT_INT8", "TPU_INT8", "DSP_INT8", "ACADEMIC_W4A8"])
def test_config_json_round_trip_is_bit_identical(source, tmp_path, platform):
    graph = quantize(source, platform)
    path = tmp_path / "config.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportRoundingWarning)  # TPU: tested in test_export_qdq
        api.export_ppq_graph(graph, platform, tmp_path / "model.onnx", config_save_to=path)
    data = json.loads(path.read_text())
    assert data["format"] == "ppqlike-quantization-config" and data["platform"] == platform
    assert len(data["configs"]) == sum(1 for _ in iter_configs(graph))
    # nothing stored (re-baked) but the biases bias correction moved off their FP32 values (stored), where
    # their ops are still quantized (the protection may have moved them since)
    corrected = {entry["op"] for entry in next(p["report"] for p in graph.metadata["quantization"]["passes"]
                                               if p["name"] == "bias_correction")["ops"] if entry["stored"] == "baked"
                 and graph.operations[entry["op"]].config.input_quantization_config[2].state is QuantizationStates.PASSIVE_BAKED}
    stored = {(c["op"], c["slot"]) for c in data["configs"] if c.get("baked") not in (None, "rebake")}
    assert stored == {(name, 2) for name in corrected}
    assert (data["rounding_warning"] is not None) == (platform == "TPU_INT8")
    reloaded = load_quantized_graph(source, path)
    assert _links(reloaded) == _links(graph)
    for op in graph.operations.values():
        assert reloaded.operations[op.name].platform == op.platform
    np.testing.assert_array_equal(NumpyExecutor(reloaded).forward(TEST)[0], NumpyExecutor(graph).forward(TEST)[0])
    for op, side, slot, variable, config in iter_configs(graph):  # baked values bit for bit
        other = reloaded.operations[op.name].config
        other = (other.input_quantization_config if side == "input" else other.output_quantization_config)[slot]
        if config.baked_value is not None:
            assert np.array_equal(other.baked_value, config.baked_value) and other.baked_value.dtype == np.float32
    a, _ = build_qdq_model(graph)  # and the same export
    b, _ = build_qdq_model(reloaded)
    np.testing.assert_array_equal(run_qdq_model(a, {"x": TEST})[0], run_qdq_model(b, {"x": TEST})[0])


def test_config_json_keeps_baked_values_it_cannot_recompute(source):
    """A baked value no re-quantization gives (an AdaRound-style pass rounded a weight the other way)
    is stored, and the QDQ export writes integers that give it back."""
    graph = quantize(source, "ORT_INT8")
    config = graph.operations["conva"].config.input_quantization_config[1]
    baked = config.baked_value.copy()
    scale = config.scale.reshape(-1, 1, 1, 1)
    changed = baked.reshape(-1)
    index = int(np.argmin(np.abs(changed)))
    changed[index] += scale.reshape(-1)[index // (baked.size // baked.shape[0])]  # one grid step up
    config.baked_value = baked
    data = config_to_json(graph)
    entry = [c for c in data["configs"] if c["id"] == "conva/input/1"][0]
    assert isinstance(entry["baked"], dict)
    fresh = api.quantize_onnx_model(source, CALIB, platform="ORT_INT8")
    load_config_json(fresh, json.loads(json.dumps(data)))
    np.testing.assert_array_equal(fresh.operations["conva"].config.input_quantization_config[1].baked_value, baked)
    np.testing.assert_array_equal(NumpyExecutor(fresh).forward(TEST)[0], NumpyExecutor(graph).forward(TEST)[0])
    model, report = build_qdq_model(graph)
    assert report["quantized_parameters"] > 0 and not report["notes"]
    out = run_qdq_model(model, {"x": TEST}, optimization="disable")[0]
    assert np.abs(out - NumpyExecutor(graph).forward(TEST)[0]).max() <= 2 * float(
        graph.operations["gemm"].config.output_quantization_config[0].scale)


def test_config_json_refuses_another_graph(source, tmp_path):
    graph = quantize(source, "TRT_INT8")
    path = tmp_path / "c.json"
    api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx", config_save_to=path)
    unformatted = api.load_onnx_graph(source)
    unformatted.operations["gemm"].type = "MatMul"
    with pytest.raises(ExportError, match="gemm"):
        load_config_json(unformatted, path)
    with pytest.raises(ExportError, match="not a ppqlike quantization config"):
        load_config_json(api.load_onnx_graph(source), tmp_path / "m.dynamic_range.json")
    changed = api.load_onnx_graph(source)
    changed.variables["w1"].value = changed.variables["w1"].value * 2
    with pytest.warns(UserWarning, match="differ from those of the exported graph"):
        load_config_json(changed, path)


def test_tensorrt_dynamic_ranges(source):
    # every output quantized, so that the file holds every kind of tensor (TensorRT's own placement,
    # the default, quantizes only what Conv/Gemm/MatMul/Add read: x, r1, a, s, f)
    default = tensor_configs(quantize(source, "TRT_INT8"))
    assert set(default) == set(tensorrt_dynamic_ranges(quantize(source, "TRT_INT8"))["act_quant_info"])
    graph = quantize(source, "TRT_INT8", placement="every_output")
    ranges = tensorrt_dynamic_ranges(graph)
    activations = ranges["act_quant_info"]
    assert set(activations) == set(tensor_configs(graph))
    assert {"x", "r1", "c1", "ca", "a", "s", "cat", "p", "t", "f", "y"} <= set(activations)
    for name, config in tensor_configs(graph).items():
        assert np.float32(activations[name] / 127) == np.float32(config.scale)  # TensorRT: scale = amax / 127
    assert activations["c1"] == activations["r1"]  # Conv output fused with its Relu
    weight = graph.operations["conv1"].config.input_quantization_config[1]
    assert np.allclose(ranges["weight_quant_info"]["w1"], weight.scale * 127)
    assert "b1" not in ranges["weight_quant_info"]


def test_tpu_mlir_tables(source):
    graph = quantize(source, "TPU_INT8", dispatching_table={"add": "FP32"})
    table = tpu_calibration_table(graph)
    rows = [line.split() for line in table.splitlines() if line and not line.startswith("#")]
    assert all(len(row) == 4 for row in rows)
    configs = tensor_configs(graph)
    assert [row[0] for row in rows] == list(configs)
    unsigned = 0
    for name, threshold, low, high in rows:
        # TPU-MLIR: a tensor whose min is 0 is unsigned, scale = threshold / 255; signed: threshold / 127
        levels = 255 if configs[name].quant_min == 0 else 127
        unsigned += levels == 255
        assert np.float32(float(threshold) / levels) == np.float32(configs[name].scale)
        assert float(low) == (0.0 if levels == 255 else -float(threshold)) and float(high) == float(threshold)
    assert 0 < unsigned < len(rows)
    qtable = tpu_quantize_table(graph)
    assert [line for line in qtable.splitlines() if not line.startswith("#")] == ["s F32"]


def test_export_ppq_graph_writes_what_each_platform_needs(source, tmp_path):
    trt = quantize(source, "TRT_INT8")
    paths = api.export_ppq_graph(trt, "TRT_INT8", tmp_path / "trt.onnx", tmp_path / "trt.json")
    assert [os.path.basename(p) for p in paths] == ["trt.onnx", "trt.dynamic_range.json", "trt.json"]
    model = onnx.load(paths[0])
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    quantize_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert all(readers[n.output[0]] == 1 for n in quantize_nodes)  # TRT preset: a pair per consumer
    ort_graph = quantize(source, "ORT_INT8")
    paths = api.export_ppq_graph(ort_graph, "ORT_INT8", tmp_path / "ort.onnx")
    assert [os.path.basename(p) for p in paths] == ["ort.onnx"]
    tpu = quantize(source, "TPU_INT8")
    with pytest.warns(ExportRoundingWarning):
        paths = api.export_ppq_graph(tpu, "TPU_INT8", tmp_path / "tpu.onnx", tmp_path / "tpu.json")
    assert [os.path.basename(p) for p in paths] == ["tpu.onnx", "tpu_cali_table", "tpu_qtable", "tpu.json"]
    assert json.loads((tmp_path / "tpu.json").read_text())["rounding_warning"]
    with pytest.raises(ExportError, match="unknown export option"):
        api.export_ppq_graph(trt, "TRT_INT8", tmp_path / "x.onnx", per_consumer=True)
    with pytest.warns(UserWarning, match="quantized for TRT_INT8"):
        api.export_ppq_graph(trt, "ORT_INT8", tmp_path / "x.onnx")
    for path in tmp_path.iterdir():
        assert not path.name.startswith(".ppqlike-")  # no temporary left



def test_config_json_stores_parameters_a_pass_changed(source, tmp_path):
    """An equalization-style pass rescales a weight (and its bias): the JSON stores the changed FP32
    values, found by formatting the source again, so the round trip stays bit-identical."""
    graph = quantize(source, "ORT_INT8")
    operation = graph.operations["conv1"]
    weight, bias = operation.inputs[1], operation.inputs[2]
    weight.value = weight.value * np.float32(0.5)
    bias.value = bias.value * np.float32(0.5)
    weight_config, bias_config = operation.config.input_quantization_config[1:3]
    weight_config.reset()  # BAKED is final: start the weight config again, as a pass would
    minmax_parameter(weight_config, weight.value)
    weight_config.state = S.ACTIVATED
    weight_config.baked_value = weight_config.fake_quantize(weight.value)
    weight_config.state = S.BAKED
    bias_config._state = S.PASSIVE  # re-bake the bias on the new S_in * S_w (a test shortcut)
    bias_config.baked_value = bias_config.fake_quantize(bias.value)
    bias_config._state = S.PASSIVE_BAKED
    data = config_to_json(graph)
    assert set(data["parameters"]) == {"w1", "b1"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    reloaded = load_quantized_graph(source, path)
    np.testing.assert_array_equal(NumpyExecutor(reloaded).forward(TEST)[0], NumpyExecutor(graph).forward(TEST)[0])
    assert not config_to_json(reloaded, parameters="none")["parameters"]


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8"])
def test_round_trip_and_export_after_accuracy_passes(source, tmp_path, platform):
    """Equalization, AdaRound and bias correction change FP32 parameters and baked values: the
    JSON stores what cannot be recomputed, and the export still follows the simulation."""
    from ppqlike.export.verify import verify_export
    graph = quantize(source, platform, equalization=True, adaround=True, bias_correction=True)
    data = config_to_json(graph)
    assert any(isinstance(c.get("baked"), dict) for c in data["configs"])  # AdaRound's own rounding
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    reloaded = load_quantized_graph(source, path)
    np.testing.assert_array_equal(NumpyExecutor(reloaded).forward(TEST)[0], NumpyExecutor(graph).forward(TEST)[0])
    result = verify_export(graph, TEST, optimizations=("disable",), per_operation_inputs=TEST[:4])
    assert result["end_to_end"]["disable"]["y"]["within_one_step"] >= 0.999
    assert result["per_operation"]["min_exact"] >= 0.999
