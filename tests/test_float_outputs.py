"""The ops that write a model's outputs run in float (``setting.float_outputs``, on in balanced and best)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model

import ppqlike
from ppqlike import api
from ppqlike.optim.setting import QuantizationSettingFactory
from ppqlike.platforms import TargetPlatform, dispatch_graph
from ppqlike.platforms.policies import get_platform_policy
from shared_bench import PRESETS, load_images, requires_bench

FP32 = TargetPlatform.FP32
ORT_TYPES = get_platform_policy("ORT_INT8").quantizable_types


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _classifier(rng):
    """x -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Softmax -> y; Relu -> Flatten -> MatMul -> Add(bias)
    -> z; Relu -> Conv -> Sigmoid -> s; the Relu's output also a graph output (r)."""
    inits = [_init("w1", rng.normal(size=(8, 3, 3, 3)) * 0.3), _init("b1", rng.normal(size=8) * 0.1),
             _init("w2", rng.normal(size=(8 * 6 * 6, 5)) * 0.1), _init("b2", rng.normal(size=5)),
             _init("w3", rng.normal(size=(2, 8, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Softmax", ["f"], ["y"], name="softmax", axis=1),
             helper.make_node("Flatten", ["r"], ["rf"], name="flatten2"),
             helper.make_node("MatMul", ["rf", "w2"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b2"], ["z"], name="bias"),
             helper.make_node("Conv", ["r", "w3"], ["h"], name="head"),
             helper.make_node("Sigmoid", ["h"], ["s"], name="sigmoid")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (
        ("y", ["N", 8]), ("z", ["N", 5]), ("r", ["N", 8, 6, 6]), ("s", ["N", 2, 6, 6]))]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])], outputs,
                       inits, opset=13)
    return model


def test_output_writers_are_the_last_computations():
    graph = ppqlike.load_onnx_graph(_classifier(np.random.default_rng(0)))
    summary = dispatch_graph(graph, "ORT_INT8", ORT_TYPES, float_outputs=True)
    assert summary["float_outputs"] == ["gap", "flatten", "matmul", "bias", "head", "sigmoid"]
    labels = {op.name: op.platform for op in graph.operations.values()}
    assert labels["gap"] is FP32 and labels["matmul"] is FP32 and labels["bias"] is FP32
    # the Relu's output is a graph output but the GlobalAveragePool and the Flatten before the MatMul also
    # compute on it: the Conv and the Relu stay quantized
    assert labels["conv"] is TargetPlatform.ORT_INT8 and labels["relu"] is TargetPlatform.ORT_INT8
    assert labels["flatten2"] is TargetPlatform.ORT_INT8


def test_output_writers_off_and_pinned():
    graph = ppqlike.load_onnx_graph(_classifier(np.random.default_rng(0)))
    summary = dispatch_graph(graph, "ORT_INT8", ORT_TYPES)
    assert summary["float_outputs"] == [] and graph.operations["gap"].platform is TargetPlatform.ORT_INT8
    graph = ppqlike.load_onnx_graph(_classifier(np.random.default_rng(0)))
    summary = dispatch_graph(graph, "ORT_INT8", ORT_TYPES, float_outputs=True, dispatching_table={"gap": "TARGET"})
    assert "gap" not in summary["float_outputs"] and graph.operations["gap"].platform is TargetPlatform.ORT_INT8
    assert graph.operations["flatten"].platform is FP32


def _quantized(platform, **changes):
    rng = np.random.default_rng(1)
    model = _classifier(rng)
    batches = [rng.normal(size=(4, 3, 6, 6)).astype(np.float32) for _ in range(4)]
    setting = QuantizationSettingFactory.for_platform(platform)
    for key, value in changes.items():
        setattr(setting, key, value)
    return model, batches, api.quantize_onnx_model(model, batches, platform=platform, setting=setting)


@pytest.mark.parametrize("platform", ["ORT_INT8", "TPU_INT8"])
def test_balanced_writes_outputs_in_float_and_onnxruntime_agrees(platform, tmp_path):
    model, batches, graph = _quantized(platform)
    # (the bias Add is folded into the MatMul before dispatch)
    assert sorted(graph.metadata["quantization"]["dispatch"]["float_outputs"]) == ["flatten", "gap", "head", "matmul",
                                                                                 "sigmoid"]
    path = tmp_path / "model.onnx"
    api.export_ppq_graph(graph, platform, path)
    exported = onnx.load(path)
    producers = {output: node for node in exported.graph.node for output in node.output}
    for name in ("y", "z", "s"):   # written by float ops, not by a DequantizeLinear
        assert producers[name].op_type in ("Softmax", "MatMul", "Gemm", "Add", "Sigmoid")
    assert producers["r"].op_type == "DequantizeLinear"   # the Relu's output stays quantized
    from ppqlike.executor import NumpyExecutor
    from ppqlike.export.verify import run_qdq_model
    x = batches[0]
    simulated = NumpyExecutor(graph).forward(x)
    deployed = run_qdq_model(exported, {"x": x})
    for ours, theirs in zip(simulated, deployed):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_plain_and_compute_inputs_quantize_as_before():
    *_, graph = _quantized("ORT_INT8", recipe="plain")
    assert graph.metadata["quantization"]["dispatch"]["float_outputs"] == []
    *_, graph = _quantized("ORT_INT8", float_outputs=False)
    assert graph.metadata["quantization"]["dispatch"]["float_outputs"] == []
    *_, graph = _quantized("TRT_INT8")   # TensorRT's placement leaves outputs float already: its int8 MatMul stays
    assert graph.metadata["quantization"]["dispatch"]["float_outputs"] == []
    assert graph.operations["matmul"].platform is TargetPlatform.TRT_INT8


@pytest.mark.real_model
@requires_bench
def test_squeezenet_logits_are_not_tied_on_a_grid():
    """SqueezeNet's averaged logits, read by its float Softmax, are written by a float GlobalAveragePool: close
    logits no longer tie at one 8-bit code (16 of 300 dev images did on ORT_INT8 with them quantized)."""
    images, _, _ = load_images("squeezenet1.1", "calib", 16)
    graph = api.quantize_onnx_model(str(PRESETS["squeezenet1.1"].path), [images[:8], images[8:]], platform="ORT_INT8")
    writers = graph.metadata["quantization"]["dispatch"]["float_outputs"]
    assert [graph.operations[name].type for name in writers][:1] == ["GlobalAveragePool"]
    from ppqlike.executor import NumpyExecutor
    dev, _, _ = load_images("squeezenet1.1", "dev", 8)
    probabilities = NumpyExecutor(graph).forward(dev)[0]
    top = np.sort(probabilities, axis=1)[:, -2:]
    assert (top[:, 1] > top[:, 0]).all()
