"""Issue 33, item 5(a): no grid on a tensor read where a zero gives inf or NaN (Log, Reciprocal, a divisor, the base
of a negative power), on every platform.  A grid rounds what is under half a step to zero: quiet audio through
``Clip(min=1e-10) -> Log`` came out -inf, then NaN.  The old code fails every end-to-end test here (NaN)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from audio_models import audio_frames, log_mel_model, normaliser_model
from onnx_helpers import make_model, run_onnxruntime
from ppqlike import api
from ppqlike.core.op_facts import zero_keeping_inputs, zero_sensitive_inputs
from ppqlike.core.quant import QuantizationStates
from ppqlike.core.quant_graph import governing_config, input_config, output_config
from ppqlike.export import build_qdq_model
from ppqlike.export.verify import verify_export
from ppqlike.io.load import load_graph

PLATFORMS = ["ORT_INT8", "TRT_INT8", "TPU_INT8"]
CALIB = [audio_frames(8, 1), audio_frames(8, 2)]
TEST = audio_frames(16, 3)
LOUD = slice(0, 10)  # frames 10-17 are at amplitude 1e-4


def _cosines(reference: np.ndarray, actual: np.ndarray) -> np.ndarray:
    reference, actual = reference.reshape(len(reference), -1), actual.reshape(len(actual), -1)
    return (reference * actual).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(actual, axis=1)


def _exported_outputs(model: onnx.ModelProto, platform: str) -> tuple[list, list, object]:
    graph = api.quantize_onnx_model(model, CALIB, platform=platform)
    exported, _ = build_qdq_model(graph)
    return run_onnxruntime(model, {"frames": TEST}), run_onnxruntime(exported, {"frames": TEST}), graph


@pytest.mark.parametrize("platform", PLATFORMS)
def test_log_mel_front_end_stays_finite_on_quiet_audio(platform):
    """The Clip's result (what Log reads) is on no grid: the exported model has no Q/DQ pair between Clip and
    Log, the output is finite and close to FP32 (old code: -inf log-mel, NaN cosine).  Quiet frames still lose
    their detail upstream (the STFT's grid, set by the loud frames 74 dB above, rounds them to zero), hence
    mean cosines of 0.97-0.98 (the worst clip 0.86) rather than 0.999."""
    reference, exported, graph = _exported_outputs(log_mel_model(), platform)
    assert all(np.isfinite(value).all() for value in exported)
    logmel, head = (_cosines(r, e) for r, e in zip(reference, exported))
    assert logmel.mean() >= 0.96 and logmel.min() >= 0.8, logmel
    assert head.mean() >= 0.95, head
    model, _ = build_qdq_model(graph)
    log = next(node for node in model.graph.node if node.op_type == "Log")
    producer = next(node for node in model.graph.node if log.input[0] in node.output)
    assert producer.op_type == "Clip"  # read straight from the Clip, no DequantizeLinear between
    clip = graph.operations["floor"]
    assert output_config(clip).state is QuantizationStates.FP32
    assert input_config(clip, 1).state is QuantizationStates.FP32  # the floor 1e-10 is not rounded to 0
    assert governing_config(output_config(graph.operations["mel"])) is None  # fused: the MatMul writes float
    assert graph.metadata["quantization"]["passes"][0]["report"]["kept_off_grid"] == ["guarded"]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("style", ["reciprocal", "div", "pow"])
def test_guarded_divisions_stay_finite_on_quiet_audio(style, platform):
    """spec / sqrt(mean(spec^2) + 1e-6) as Reciprocal(Sqrt), Div by Sqrt and Pow(-0.5): the guarded energy is
    kept float through the Sqrt that passes its zeros on (old code: 0 / 0 on the quiet frames, NaN)."""
    reference, exported, graph = _exported_outputs(normaliser_model(style), platform)
    assert np.isfinite(exported[0]).all()
    assert _cosines(reference[0], exported[0]).mean() >= 0.99
    assert _cosines(reference[0][:, LOUD], exported[0][:, LOUD]).min() >= 0.99
    guard = graph.operations["guard"]
    assert guard.config is None or output_config(guard).state is QuantizationStates.FP32


def test_ort_int8_export_computes_the_simulation():
    """A TARGET MatMul that writes float (its fused Clip refused the grid) is still exported as simulated."""
    graph = api.quantize_onnx_model(log_mel_model(), CALIB, platform="ORT_INT8")
    result = verify_export(graph, TEST[:4], optimizations=("disable",))
    for stats in result["end_to_end"]["disable"].values():
        assert stats["cosine"] >= 0.99999 and stats["within_one_step"] >= 0.999, stats


def _one_op(op_type: str, constants: dict, inputs=("a", "b"), **attributes):
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in constants.items()]
    node = helper.make_node(op_type, [n for n in inputs], ["y"], name="op", **attributes)
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in inputs
                    if n and n not in constants]
    model = make_model([node], graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                       initializers)
    return load_graph(model).operations["op"]


@pytest.mark.parametrize("op_type,constants,inputs,sensitive,keeping", [
    ("Log", {}, ("a",), (0,), ()),
    ("Reciprocal", {}, ("a",), (0,), ()),
    ("Div", {}, ("a", "b"), (1,), (0,)),
    ("Div", {"b": 2.0}, ("a", "b"), (1,), (0,)),
    ("Pow", {"b": -0.5}, ("a", "b"), (0,), ()),
    ("Pow", {"b": 0.5}, ("a", "b"), (), (0,)),  # a grid keeps signs: sqrt of what it gives is defined
    ("Sqrt", {}, ("a",), (), (0,)),
    ("Relu", {}, ("a",), (), (0,)),
    ("Mul", {}, ("a", "b"), (), (0, 1)),
    ("Mul", {"b": 3.0}, ("a", "b"), (), (0,)),
    ("Add", {"b": 1e-6}, ("a", "b"), (), ()),  # an eps: a guard
    ("Clip", {"lo": 1e-10}, ("a", "lo"), (), ()),  # a floor above zero: a guard
    ("Clip", {"lo": 0.0, "hi": 6.0}, ("a", "lo", "hi"), (), (0,)),
    ("Max", {"b": 1e-6}, ("a", "b"), (), ()),
    ("Max", {"b": 0.0}, ("a", "b"), (), (0,)),
    ("Reshape", {}, ("a",), (), (0,)),
    ("ReduceMean", {}, ("a",), (), ()),  # zero only where a whole window is
])
def test_op_facts_say_where_zero_breaks_and_where_it_passes(op_type, constants, inputs, sensitive, keeping):
    if op_type == "Reshape":
        operation = load_graph(make_model(
            [helper.make_node("Reshape", ["a", "shape"], ["y"], name="op")],
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            [numpy_helper.from_array(np.array([2], np.int64), "shape")])).operations["op"]
    else:
        operation = _one_op(op_type, constants, inputs)
    assert zero_sensitive_inputs(operation) == sensitive
    assert zero_keeping_inputs(operation) == keeping
