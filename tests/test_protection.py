"""The protection of sensitive layers (optim/passes/protection.py) and the verdict (analysis/verdict.py).

The model copies what wrecks MobileNetV2's first depthwise layer: a conv whose output channels span two
orders of magnitude, read by a depthwise conv that scales each channel back.  One per-tensor 8-bit grid
leaves the narrow channels a few steps; the protection finds that point alone, on calibration data, and
moves it to the platform's higher precision; without it the verdict warns and names the layer.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ppqlike import api
from ppqlike.analysis.verdict import QuantizationQualityWarning
from ppqlike.executor import NumpyExecutor
from ppqlike.executor.simulation import dequantized
from ppqlike.optim.passes.references import batch_key
from ppqlike.optim.passes.sensitivity import sample_cosines
from ppqlike.optim.setting import QuantizationSettingFactory

from counting_loader import CountingLoader
from onnx_helpers import make_model, run_onnxruntime

RNG = np.random.default_rng(11)
CHANNELS = 8


def _spread_model(spread: float = 300.0):
    """x -> conv (channel c scaled by spread^(-c/7)) -> relu -> depthwise (scaled back) -> relu -> 1x1 conv
    -> GAP -> flatten -> gemm -> y."""
    gains = spread ** (-np.arange(CHANNELS) / (CHANNELS - 1))
    first = RNG.standard_normal((CHANNELS, 3, 3, 3)) * gains[:, None, None, None]
    depthwise = RNG.standard_normal((CHANNELS, 1, 3, 3)) / gains[:, None, None, None]
    tensors = {"w1": first, "b1": np.abs(RNG.standard_normal(CHANNELS)) * gains,
               "w2": depthwise * 0.3, "b2": np.zeros(CHANNELS), "w3": RNG.standard_normal((16, CHANNELS, 1, 1)) * 0.3,
               "b3": np.zeros(16), "w4": RNG.standard_normal((10, 16)) * 0.3, "b4": np.zeros(10)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv_first", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu_first"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv_depthwise", pads=[1, 1, 1, 1],
                              group=CHANNELS),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu_depthwise"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv_pointwise"),
             helper.make_node("GlobalAveragePool", ["c3"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="head", transB=1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, 16, 16])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 10])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tensors.items()])


def _data(batches: int = 5, size: int = 16) -> list[np.ndarray]:
    return [RNG.standard_normal((size, 3, 16, 16)).astype(np.float32) for _ in range(batches)]


def _quantize(model, platform: str, protection: bool):
    """Quantized with the plain recipe (the platform's own ranges) and the protection on or off (balanced
    turns it on)."""
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe = "plain"
    setting.protection = protection
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = api.quantize_onnx_model(model, _data(), platform=platform, setting=setting)
    return graph, [w for w in caught if issubclass(w.category, QuantizationQualityWarning)]


def _cosine(model, graph, path) -> float:
    """Mean output cosine of the exported model (run by onnxruntime) against the FP32 model, on new data."""
    x = RNG.standard_normal((32, 3, 16, 16)).astype(np.float32)
    exported = onnx.load(api.export_ppq_graph(graph, graph.metadata["quantization"]["platform"], path)[0])
    return float(np.mean(sample_cosines(run_onnxruntime(exported, {"x": x}), run_onnxruntime(model, {"x": x}))))


@pytest.mark.parametrize("platform,precision", [("TRT_INT8", "FP32"), ("TPU_INT8", "BF16"), ("ORT_INT8", "INT16")])
def test_the_wrecked_layer_is_found_and_protected(platform, precision, tmp_path):
    model = _spread_model()
    plain, warned = _quantize(model, platform, protection=False)
    protected, _ = _quantize(model, platform, protection=True)
    report = next(p["report"] for p in protected.metadata["quantization"]["passes"] if p["name"] == "protection")
    assert report["held_aside"] and len(report["protected"]) == 1, report
    assert report["protected"][0]["precision"] == precision
    assert set(report["protected"][0]["ops"]) & {"relu_first", "conv_first"}, report
    assert protected.metadata["quantization"]["protected_ops"] == report["protected"][0]["ops"]
    before, after = _cosine(model, plain, tmp_path / "plain.onnx"), _cosine(model, protected, tmp_path / "p.onnx")
    assert after > 0.99 and (1 - after) < 0.5 * (1 - before), (before, after)
    verdict = protected.metadata["quantization"]["verdict"]
    assert verdict["ok"] and verdict["held_aside"] and verdict["output_cosine"] > 0.99


def test_nothing_is_protected_where_nothing_is_wrecked():
    graph, warned = _quantize(_spread_model(spread=1.0), "TRT_INT8", protection=True)
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "protection")
    assert report["protected"] == [] and not warned
    assert graph.metadata["quantization"]["verdict"]["ok"]


def test_the_verdict_warns_and_names_the_layer():
    graph, warned = _quantize(_spread_model(spread=3000.0), "TPU_INT8", protection=False)
    verdict = graph.metadata["quantization"]["verdict"]
    assert not verdict["ok"] and verdict["output_cosine"] < 0.98
    assert len(warned) == 1
    message = str(warned[0].message)
    assert verdict["worst_ops"][0]["op"] in message and "accuracy_target" in message
    assert verdict["worst_ops"][0]["op"] in {"relu_first", "conv_first", "conv_depthwise", "relu_depthwise"}


def test_the_protected_model_is_simulated_as_deployed(tmp_path):
    model = _spread_model()
    graph, _ = _quantize(model, "TRT_INT8", protection=True)
    x = RNG.standard_normal((8, 3, 16, 16)).astype(np.float32)
    exported = onnx.load(api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx")[0])
    simulated, deployed = NumpyExecutor(graph).forward(x)[0], run_onnxruntime(exported, {"x": x})[0]
    np.testing.assert_allclose(deployed, simulated, rtol=1e-3, atol=1e-3 * np.abs(simulated).max())


def _log_power_model():
    """A log-power front end as audio models write it: x -> conv (filters) -> square -> mel-like MatMul
    (non-negative weights) -> Clip(min=1e-10) -> Log -> conv whose weights sum to zero over the bands (it
    reads the spectral shape, not the level) -> y."""
    rng = np.random.default_rng(5)
    shape_weights = rng.standard_normal((6, 8, 1))
    tensors = {"filters": rng.standard_normal((16, 1, 32)) * 0.2, "mel": np.abs(rng.standard_normal((8, 16))),
               "floor": np.array(1e-10), "w2": shape_weights - shape_weights.mean(axis=1, keepdims=True),
               "b2": np.zeros(6)}
    nodes = [helper.make_node("Conv", ["x", "filters"], ["spectrum"], name="filters", strides=[16]),
             helper.make_node("Mul", ["spectrum", "spectrum"], ["power"], name="square"),
             helper.make_node("MatMul", ["mel", "power"], ["mel_power"], name="mel"),
             helper.make_node("Clip", ["mel_power", "floor"], ["guarded"], name="guard"),
             helper.make_node("Log", ["guarded"], ["log_mel"], name="log"),
             helper.make_node("Conv", ["log_mel", "w2", "b2"], ["y"], name="conv")]
    return make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 1, 512])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 6, 31])],
                      [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in tensors.items()])


def _audio(count: int, rng) -> np.ndarray:
    """Noise clips at levels spread over 80 dB (what a log-mel front end is for)."""
    gains = 10.0 ** (-4.0 * rng.random((count, 1, 1)))
    return (rng.standard_normal((count, 1, 512)) * gains).astype(np.float32)


def test_a_log_power_front_end_moves_to_fp32_where_16_bits_do_not_hold_it(tmp_path):
    model, rng = _log_power_model(), np.random.default_rng(6)
    setting = QuantizationSettingFactory.for_platform("ORT_INT8")
    setting.recipe, setting.protection = "plain", True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = api.quantize_onnx_model(model, [_audio(16, rng) for _ in range(5)], platform="ORT_INT8",
                                        setting=setting)
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "protection")
    assert report["initial_error"] > 0.02, report       # the 8-bit front end is wrecked
    at = next(index for index, entry in enumerate(report["protected"]) if "front_units" in entry)
    single, front = report["protected"][:at], report["protected"][at]   # (after the front: units it hid)
    assert single and all(entry["precision"] == "INT16" for entry in single), report
    assert single[-1]["error_after"] > 0.1, report      # 16 bits do not hold 80 dB of level squared
    assert front["precision"] == "FP32" and "front_units" in front and "filters" in front["ops"], report
    assert report["final_error"] < 0.01, report
    x = _audio(32, rng)
    exported = onnx.load(api.export_ppq_graph(graph, "ORT_INT8", tmp_path / "m.onnx")[0])
    cosine = float(np.mean(sample_cosines(run_onnxruntime(exported, {"x": x}), run_onnxruntime(model, {"x": x}))))
    assert cosine > 0.99 and graph.metadata["quantization"]["verdict"]["ok"], (cosine, report)


@pytest.mark.parametrize("batches,size,held", [(5, 16, 1), (16, 1, 4), (8, 1, 2), (8, 4, 2), (3, 1, 0)])
def test_enough_samples_are_held_aside_whatever_the_batch_size(batches, size, held):
    """One batch of 16 is held aside as before; image-by-image data holds aside as many batches as make 16
    samples, at most a quarter of them (none below HOLD_ASIDE_FROM batches), and the protection and the
    verdict measure on all of them."""
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.recipe, setting.protection = "plain", True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = api.quantize_onnx_model(_spread_model(), _data(batches, size), platform="TRT_INT8", setting=setting)
    record = graph.metadata["quantization"]
    report = next(p["report"] for p in record["passes"] if p["name"] == "protection")
    assert report["held_aside"] == bool(held) and record["verdict"]["held_aside"] == bool(held)
    if held:   # the protection measures on 4 samples at least (the last calibration samples join), the verdict not
        assert report["samples"] == max(held * size, 4) and record["verdict"]["samples"] == held * size
    else:   # on the calibration batches (up to 16 samples); the verdict on the first one
        assert report["samples"] == min(16, batches * size) and record["verdict"]["samples"] == min(16, size)
    # batches of fewer than 8 samples run merged (optim/batch_merge.py): the held-aside ones in one batch
    merged = record["merged_batches"] is not None
    assert merged == (bool(held) and 2 * size <= 16)
    topped = bool(held) and held * size < 4
    assert report["batches"] == (1 + topped if merged else held or min(batches, -(-16 // size)))


def test_a_batch_whose_inputs_share_no_leading_axis_is_one_sample():
    from ppqlike.optim.passes.sensitivity import sample_count
    assert sample_count(np.zeros((5, 3))) == 5 and sample_count({"a": np.zeros((4, 2)), "b": np.zeros(4)}) == 4
    assert sample_count({"chunks": np.zeros((62, 576)), "state": np.zeros((2, 1, 128))}) == 1
    assert sample_count([np.zeros((3, 2)), np.array(7)]) == 1


@pytest.mark.parametrize("recipe", ["balanced", "plain"])
def test_a_lazy_loader_is_read_once(recipe):
    """The observer choice, the protection and the verdict all measure on the held-aside batches; they are
    read in the same pass as the calibration batches and kept, not read again through the whole loader by each
    (bench/run.py: 792 JPEGs decoded for 200 calibration images before).  The configs are those of the same
    batches given as a list."""
    model, data = _spread_model(), _data(6, 16)   # batches of 16: one held aside, as from a list
    loader = CountingLoader(data)
    setting = QuantizationSettingFactory.for_platform("ORT_INT8")
    setting.recipe = recipe
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = api.quantize_onnx_model(model, loader, platform="ORT_INT8", setting=setting)
        listed = api.quantize_onnx_model(model, tuple(data), platform="ORT_INT8", setting=setting)
    assert loader.made == len(data), loader.made
    assert graph.metadata["quantization"]["verdict"]["held_aside"]
    configs = [(op.name, [(c.state.name, np.asarray(c.scale).tolist()) for c in op.config.output_quantization_config])
               for op in graph.topological_sort() if op.config is not None]
    again = [(op.name, [(c.state.name, np.asarray(c.scale).tolist()) for c in op.config.output_quantization_config])
             for op in listed.topological_sort() if op.config is not None]
    assert configs == again


def test_a_loader_that_declares_its_batch_size_holds_aside_enough_samples():
    """A loader of single images (a CalibrationFolder or torch DataLoader with batch_size=1, as the command line
    gives a model of fixed batch 1) holds aside batches for 16 samples, at most a quarter: 4 of 16, not 1."""
    loader = CountingLoader(_data(16, 1))
    loader.batch_size = 1
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.recipe, setting.protection = "plain", True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = api.quantize_onnx_model(_spread_model(), loader, platform="TRT_INT8", setting=setting)
    record = graph.metadata["quantization"]
    report = next(p["report"] for p in record["passes"] if p["name"] == "protection")
    assert report["held_aside"] and record["verdict"]["samples"] == 4
    # batches of 1 run merged (optim/batch_merge.py): the 4 held aside as one batch; the loader read once
    assert record["merged_batches"]["held_aside"] == 4 and report["batches"] == 1
    assert loader.made == 16


def test_the_verdict_compares_with_the_fp32_model_as_loaded_after_bias_correction():
    """TensorRT keeps biases float, so bias correction writes into them; the verdict still measures against
    the model the user gave (onnxruntime running it), not against the corrected float graph.  The correction
    measures on the first calibration batch as calibration read it: a lazy loader is still read once."""
    model, data = _spread_model(), _data(6, 16)   # batches of 16: the last one held aside
    loader = CountingLoader(data)
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.bias_correction, setting.bias_correction_samples = True, 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = api.quantize_onnx_model(model, loader, platform="TRT_INT8", setting=setting)
    assert loader.made == len(data)
    record = graph.metadata["quantization"]
    correction = next(p["report"] for p in record["passes"] if p["name"] == "bias_correction")
    assert correction["float_biases_changed"] and (correction["batches"], correction["samples"]) == (1, 16)
    quantized = NumpyExecutor(graph).forward(data[-1])
    expected = float(np.mean(sample_cosines(quantized, run_onnxruntime(model, {"x": data[-1]}))))
    assert record["verdict"]["held_aside"] and record["verdict"]["samples"] == 16
    assert abs(record["verdict"]["output_cosine"] - expected) < 2e-6
    with dequantized(graph):   # the graph's own float function now differs from the model's
        corrected = NumpyExecutor(graph).forward(data[-1])
    assert abs(float(np.mean(sample_cosines(quantized, corrected))) - expected) > 1e-5


def test_batches_are_known_by_their_content():
    batch = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    assert batch_key(batch) == batch_key(batch.copy()) == batch_key(np.asfortranarray(batch))
    assert batch_key({"a": batch, "b": batch[:2]}) == batch_key({"b": batch[:2].copy(), "a": batch})
    changed = batch.copy()
    changed[3, 2, 1, 1] += 1e-3
    assert batch_key(changed) != batch_key(batch) != batch_key(batch[:3])
    assert batch_key(batch) != batch_key(batch.astype(np.float64))


def test_few_held_aside_samples_are_topped_up_with_the_last_calibration_samples():
    from ppqlike.optim.passes.sensitivity import topped_up
    calibration = [np.full((3, 2), i, np.float32) for i in range(4)]   # 12 samples, batch i filled with i
    held = [np.full((1, 2), 9, np.float32)]
    got = topped_up(list(held), held, calibration, 4)
    assert [b.shape[0] for b in got] == [1, 3] and got[1][0, 0] == 3   # the last calibration batch joins
    got = topped_up(list(held), held, calibration, 6)
    assert [b.shape[0] for b in got] == [1, 2, 3] and [b[0, 0] for b in got] == [9, 2, 3]   # first 2 of batch 2
    assert topped_up(list(held), None, calibration, 6) == held   # nothing held aside: calibration samples already
    enough = [np.full((4, 2), 9, np.float32)]
    assert len(topped_up(list(enough), enough, calibration, 4)) == 1   # enough held aside: as they are


def test_fronts_are_units_doubling_each_taken_to_the_end_of_its_layer():
    """Fronts of 1, 2, 4, ... units, each taken on to where the next unit with a Conv/Gemm/MatMul starts: a layer's
    activations written as ops of their own (HardSwish, an SE block's Mul) move with it."""
    from types import SimpleNamespace
    from ppqlike.optim.passes.protection import front_sizes, layer_ends

    def units(*types):
        return [[SimpleNamespace(type=t) for t in unit.split("+")] for unit in types]
    graph = units("Conv", "HardSwish", "Conv", "HardSwish", "Mul", "Conv", "Relu", "Gemm", "Softmax")
    assert layer_ends(graph) == [2, 5, 7, 9]
    assert front_sizes(graph) == [2, 5, 8]   # 1 -> 2, 2 -> 2 (once), 4 -> 5, 8 (not 9: a unit is left out)
    assert layer_ends(units("Add", "Conv+Relu", "Conv", "Gemm")) == [2, 3, 4]   # a leading unit joins layer 1
    assert front_sizes(units("Sigmoid", "Mul", "Add")) == [1, 2]                # no layer: 1, 2, 4, ... units
