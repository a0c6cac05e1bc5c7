"""Recurrent ops (LSTM, GRU, RNN) in quantized models: what each platform policy does with them, end to end.

Every built-in platform keeps them float (PlatformPolicy.recurrent == 'float', see its docstring for the
platforms' own documentation); a conv -> LSTM/GRU -> Gemm model built here (so that CI, which has no real
recurrent model files, checks something real-ish) is quantized, exported, run in onnxruntime and compared
with FP32.  The real pretrained models are in test_recurrent_models.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ppqlike import api
from ppqlike.core.errors import PlatformError
from ppqlike.core.op_facts import RECURRENT_TYPES
from ppqlike.core.quant import QuantizationStates
from ppqlike.executor import NumpyExecutor
from ppqlike.io.load import load_graph
from ppqlike.optim.setting import QuantizationSetting, QuantizationSettingFactory
from ppqlike.platforms.dispatch import dispatch_graph
from ppqlike.platforms.policies import PLATFORM_POLICIES
from ppqlike.platforms.quantizer import PlatformPolicy
from ppqlike.platforms.target import TargetPlatform
from onnx_helpers import IR_VERSION, run_onnxruntime

PLATFORMS = ["ORT_INT8", "TRT_INT8", "TPU_INT8"]
HEIGHT, WIDTH, CHANNELS, HIDDEN, CLASSES = 8, 24, 8, 16, 11


def recurrent_model(op_type: str = "LSTM", seed: int = 0) -> onnx.ModelProto:
    """A small CRNN: Conv 3x3 + Relu over a [N, 1, 8, 24] image, its columns as a sequence through a
    bidirectional LSTM/GRU (sequence_lens a graph input, initial_h a constant), then a Gemm per step."""
    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op_type]
    features = CHANNELS * HEIGHT

    def normal(*shape, scale=1.0):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32))

    initializers = {
        "conv_w": normal(CHANNELS, 1, 3, 3, scale=0.4), "conv_b": normal(CHANNELS, scale=0.1),
        "to_sequence": numpy_helper.from_array(np.array([0, 0, features], np.int64)),
        "W": normal(2, gates * HIDDEN, features, scale=1 / np.sqrt(features)),
        "R": normal(2, gates * HIDDEN, HIDDEN, scale=1 / np.sqrt(HIDDEN)),
        "B": normal(2, 2 * gates * HIDDEN, scale=0.1),
        "initial_h": normal(2, 1, HIDDEN, scale=0.3),
        "to_rows": numpy_helper.from_array(np.array([-1, 2 * HIDDEN], np.int64)),
        "fc_w": normal(CLASSES, 2 * HIDDEN, scale=1 / np.sqrt(2 * HIDDEN)), "fc_b": normal(CLASSES, scale=0.1)}
    for name, tensor in initializers.items():
        tensor.name = name
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Transpose", ["relu"], ["columns"], perm=[3, 0, 1, 2]),   # [W, N, C, H]
        helper.make_node("Reshape", ["columns", "to_sequence"], ["sequence"]),     # [W, N, C*H]
        helper.make_node(op_type, ["sequence", "W", "R", "B", "lengths", "initial_h"], ["Y"],
                         hidden_size=HIDDEN, direction="bidirectional", name="recurrent"),
        helper.make_node("Transpose", ["Y"], ["steps"], perm=[0, 2, 1, 3]),        # [W, N, 2, H]
        helper.make_node("Reshape", ["steps", "to_rows"], ["rows"]),
        helper.make_node("Gemm", ["rows", "fc_w", "fc_b"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "crnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, HEIGHT, WIDTH]),
                        helper.make_tensor_value_info("lengths", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [WIDTH, CLASSES])],
        list(initializers.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def feeds(count: int, seed: int) -> list[dict]:
    """Images of a few bright strokes on a dark ground, and each sequence's length (some shorter)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        image = rng.uniform(0, 0.2, (1, 1, HEIGHT, WIDTH)).astype(np.float32)
        for _ in range(4):
            row, column = rng.integers(0, HEIGHT), rng.integers(0, WIDTH - 4)
            image[0, 0, row, column:column + 4] += rng.uniform(0.5, 1.0)
        batches.append({"x": image, "lengths": np.array([rng.integers(WIDTH // 2, WIDTH + 1)], np.int32)})
    return batches


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def quantize_and_export(model, platform, tmp_path, setting=None):
    source = tmp_path / "crnn.onnx"
    onnx.save(model, source)
    graph = api.quantize_onnx_model(str(source), feeds(6, seed=1), platform=platform, setting=setting)
    exported = tmp_path / f"crnn_{platform}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # TPU_INT8 rounds half away from zero: the export says so
        api.export_ppq_graph(graph, platform, str(exported))
    return graph, onnx.load(exported)


def dequantized_tensors(model: onnx.ModelProto) -> set[str]:
    return {node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear"}


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_recurrent_model_quantizes_exports_and_runs(op_type, platform, tmp_path):
    model = recurrent_model(op_type)
    graph, exported = quantize_and_export(model, platform, tmp_path)
    recurrent = graph.operations["recurrent"]
    assert recurrent.platform is TargetPlatform.FP32 and recurrent.config is None
    assert graph.operations["Conv_0"].platform.name == platform
    # the head writes the model's output: float on its quantized input (float_outputs, balanced's), where every
    # op's outputs are quantized (TensorRT's placement leaves the outputs float already: its Gemm stays int8)
    float_outputs = [] if platform == "TRT_INT8" else ["Gemm_7"]
    assert graph.metadata["quantization"]["dispatch"]["float_outputs"] == float_outputs
    assert graph.operations["Gemm_7"].platform.name == ("FP32" if float_outputs else platform)
    node = next(n for n in exported.graph.node if n.op_type == op_type)
    dequantized = dequantized_tensors(exported)
    assert not set(node.input[1:]) & dequantized   # W, R, B, sequence_lens, initial_h stay as they were
    assert {"W", "R", "B", "initial_h", "lengths"} <= set(node.input)
    held_out = feeds(6, seed=7)
    for feed in held_out:
        reference = run_onnxruntime(model, feed)[0]
        deployed = run_onnxruntime(exported, feed)[0]
        simulated = NumpyExecutor(graph).forward(feed)[0]
        assert cosine(deployed, reference) >= 0.99
        assert cosine(deployed, simulated) >= 0.999   # DESIGN.md 6: what the export computes is simulated


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8"])
def test_quantize_treatment_quantizes_input_and_outputs_only(platform, tmp_path):
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recurrent = "quantize"
    model = recurrent_model("LSTM", seed=3)
    graph, exported = quantize_and_export(model, platform, tmp_path, setting)
    recurrent = graph.operations["recurrent"]
    assert recurrent.platform.name == platform
    inputs = recurrent.config.input_quantization_config
    assert inputs[0].state not in (QuantizationStates.SOI, QuantizationStates.FP32)
    assert [c.state for c in inputs[1:]] == [QuantizationStates.SOI] * 5   # W, R, B, lengths, initial_h
    if platform != "TRT_INT8":   # TensorRT's placement quantizes Y only where an int8 kernel reads it
        assert recurrent.config.output_quantization_config[0].state is QuantizationStates.ACTIVATED
        assert any(n.op_type == "QuantizeLinear" and n.input[0] == "Y" for n in exported.graph.node)
    node = next(n for n in exported.graph.node if n.op_type == "LSTM")
    assert not set(node.input[1:]) & dequantized_tensors(exported)
    for feed in feeds(4, seed=8):
        assert cosine(run_onnxruntime(exported, feed)[0], run_onnxruntime(model, feed)[0]) >= 0.99


def test_every_builtin_policy_keeps_recurrent_ops_float():
    assert RECURRENT_TYPES == {"LSTM", "GRU", "RNN"}
    assert {policy.recurrent for policy in PLATFORM_POLICIES.values()} == {"float"}


@pytest.mark.parametrize("dispatcher", ["conservative", "aggressive", "pointwise"])
@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_dispatch_labels_recurrent_ops_by_the_treatment(dispatcher, op_type):
    types = PLATFORM_POLICIES[TargetPlatform.TRT_INT8].quantizable_types | RECURRENT_TYPES
    for treatment, expected in (("float", TargetPlatform.FP32), ("quantize", TargetPlatform.TRT_INT8)):
        graph = load_graph(recurrent_model(op_type))
        summary = dispatch_graph(graph, "TRT_INT8", types, dispatcher, recurrent=treatment)
        assert graph.operations["recurrent"].platform is expected
        assert graph.operations["Conv_0"].platform is TargetPlatform.TRT_INT8
        assert summary["types"]["TARGET" if treatment == "quantize" else "FP32"][op_type] == 1
    graph = load_graph(recurrent_model(op_type))
    dispatch_graph(graph, "TRT_INT8", types, dispatcher, dispatching_table={"recurrent": "TARGET"},
                   recurrent="float")
    assert graph.operations["recurrent"].platform is TargetPlatform.TRT_INT8   # a pin wins


def test_unknown_recurrent_treatment_is_refused():
    with pytest.raises(PlatformError, match="recurrent treatment 'int8'"):
        PlatformPolicy(platform=TargetPlatform.TRT_INT8, recurrent="int8")
    with pytest.raises(PlatformError, match="setting.recurrent 'int8'"):
        QuantizationSetting(recurrent="int8")
    with pytest.raises(PlatformError, match="recurrent treatment 'weights'"):
        dispatch_graph(load_graph(recurrent_model()), "TRT_INT8", {"Conv"}, recurrent="weights")
