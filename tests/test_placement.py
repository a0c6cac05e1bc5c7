"""TensorRT's placement (optim/passes/placement.py): Q/DQ on the inputs of computing ops and on the skip input
of a residual Add fused into a conv, float elsewhere and at the graph's outputs; the export runs in
onnxruntime with the simulated values."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ppqlike import api
from ppqlike.executor import NumpyExecutor
from ppqlike.optim.passes.placement import compute_input_tensors

from onnx_helpers import make_model, run_onnxruntime
from shared_bench import PRESETS, load_images, requires_bench

RNG = np.random.default_rng(7)


def _residual_model():
    """x -> conv_a -> relu -> (skip) ; conv_b(relu) -> add(skip, conv_b) -> relu -> conv_c -> y (+ MatMul head)."""
    def weight(name, shape):
        return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["skip"], name="relu_a"),
        helper.make_node("Conv", ["skip", "wb", "bb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["skip", "b"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu_s"),
        helper.make_node("Conv", ["r", "wc", "bc"], ["c"], name="conv_c"),
        helper.make_node("GlobalAveragePool", ["c"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], name="head", transB=1),
    ]
    initializers = [weight("wa", (8, 3, 3, 3)), weight("ba", (8,)), weight("wb", (8, 8, 3, 3)), weight("bb", (8,)),
                    weight("wc", (8, 8, 1, 1)), weight("bc", (8,)), weight("wd", (5, 8)), weight("bd", (5,))]
    return make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, 12, 12])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 5])], initializers)


def _quantized_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors the QDQ model quantizes: the inputs of its activation QuantizeLinear nodes."""
    initializers = {i.name for i in model.graph.initializer}
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in initializers}


def test_trt_quantizes_the_inputs_of_computing_ops_and_the_skip_input_only(tmp_path):
    model = _residual_model()
    data = [RNG.standard_normal((4, 3, 12, 12)).astype(np.float32) for _ in range(3)]
    graph = api.quantize_onnx_model(model, data, platform="TRT_INT8")
    assert compute_input_tensors(graph) == {"x", "skip", "r", "f"}
    paths = api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx")
    exported = onnx.load(paths[0])
    quantized = _quantized_tensors(exported)
    assert quantized == {"x", "skip", "r", "f"}          # not a, b, s, c, g, nor the output y
    producers = {o: n for n in exported.graph.node for o in n.output}
    assert producers["y"].op_type == "Gemm"               # the graph output comes straight out of the head
    x = RNG.standard_normal((6, 3, 12, 12)).astype(np.float32)
    simulated = NumpyExecutor(graph).forward(x)[0]
    deployed = run_onnxruntime(exported, {"x": x})[0]
    np.testing.assert_allclose(deployed, simulated, rtol=1e-4, atol=1e-4 * np.abs(simulated).max())


def test_other_platforms_keep_quantizing_every_output(tmp_path):
    model = _residual_model()
    data = [RNG.standard_normal((4, 3, 12, 12)).astype(np.float32) for _ in range(3)]
    setting = api.QuantizationSettingFactory.for_platform("TPU_INT8")
    setting.float_outputs = False   # (balanced writes the model's output in float: tests/test_float_outputs.py)
    graph = api.quantize_onnx_model(model, data, platform="TPU_INT8", setting=setting)
    paths = api.export_ppq_graph(graph, "TPU_INT8", tmp_path / "m.onnx")
    quantized = _quantized_tensors(onnx.load(paths[0]))
    assert {"a", "b", "skip", "s", "r", "c", "y_float"} <= quantized   # every op's output, the head's included


@requires_bench
@pytest.mark.real_model
def test_trt_placement_on_mobilenetv2(tmp_path):
    images, _, _ = load_images("mobilenetv2", "calib", 16)
    setting = api.QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.protection = False   # the placement alone (the protection may leave a wrecked layer's input float)
    graph = api.quantize_onnx_model(str(PRESETS["mobilenetv2"].path), [images[:8], images[8:]], platform="TRT_INT8",
                                    setting=setting)
    exported = onnx.load(api.export_ppq_graph(graph, "TRT_INT8", tmp_path / "m.onnx")[0])
    producers = {o: n for n in exported.graph.node for o in n.output}
    readers = collections.defaultdict(list)
    for node in exported.graph.node:
        for name in node.input:
            readers[name].append(node)
    dequantized = {n.output[0] for n in exported.graph.node if n.op_type == "DequantizeLinear"}
    for node in exported.graph.node:
        if node.op_type in ("Conv", "MatMul", "Gemm"):
            assert node.input[0] in dequantized, node.name     # every computing op reads int8
        if node.op_type == "Add" and all(i not in {t.name for t in exported.graph.initializer} for i in node.input):
            assert sum(i in dequantized for i in node.input) == 1, node.name   # the skip input only
    output = exported.graph.output[0].name
    assert output not in dequantized and producers[output].op_type != "DequantizeLinear"
