"""The ops added for issue 35 inside a model: the executor runs it like onnxruntime, and ppqlike quantizes
it, exports it and the export runs in onnxruntime, without quantizing an index, a mask or a code.

The model: a small conv backbone whose features feed a classifier, a box/score head with
NonMaxSuppression, RoiAlign, an AffineGrid/GridSample warp with GroupNormalization, Sin and LRN,
a QuantizeLinear/DequantizeLinear pair (the executor test), Einsum/CumSum/Trilu, and ArgMax into
Unique.  It declares no types for its inner tensors, so integer outputs are known from the ops alone.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model, run_executor, run_onnxruntime
from ppqlike import api
from ppqlike.core.quant import QuantizationStates
from ppqlike.executor import NumpyExecutor
from ppqlike.export import build_qdq_model
from ppqlike.export.verify import run_qdq_model
from ppqlike.platforms.dispatch_soi import soi_input_indices, soi_operations

OUTPUTS = {"logits": 2, "selected": 2, "roi": 4, "lrn": 4, "tri": 3, "uniq": 1, "counts": 1}
INTEGER_OUTPUTS = {"selected", "uniq", "counts"}
SHAPE = (1, 3, 16, 16)


def _model(with_qdq: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    initializers = [
        weight("w1", [8, 3, 3, 3]), weight("b1", [8], 0.1), weight("w2", [8, 8, 3, 3]), weight("w3", [4, 8, 1, 1]),
        weight("w4", [1, 8, 1, 1]), weight("wg", [4, 8]), weight("w5", [8, 8, 1, 1]),
        const("qs", np.float32(0.05)), const("qz", np.uint8(128)),
        const("box_shape", np.array([1, -1, 4], np.int64)), const("score_shape", np.array([1, 1, -1], np.int64)),
        const("max_boxes", np.array([10], np.int64)), const("iou", np.array([0.5], np.float32)),
        const("rois", np.array([[0, 0, 8, 8], [4, 4, 15, 15]], np.float32)), const("roi_batch", np.zeros(2, np.int64)),
        const("theta", np.array([[[0.9, 0.1, 0.0], [-0.1, 0.9, 0.1]]], np.float32)),
        const("grid_size", np.array([1, 8, 12, 12], np.int64)), const("gn_scale", np.ones(8, np.float32)),
        const("gn_bias", np.zeros(8, np.float32)), const("k", np.array(1, np.int64)),
        const("cum_axis", np.array(1, np.int64))]
    conv_input = "dequantized" if with_qdq else "features"
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["features"]),
        helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wg"], ["logits"], transB=1),
        helper.make_node("Conv", ["features", "w3"], ["box_map"]),
        helper.make_node("Transpose", ["box_map"], ["box_last"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["box_last", "box_shape"], ["boxes"]),
        helper.make_node("Conv", ["features", "w4"], ["score_map"]),
        helper.make_node("Sigmoid", ["score_map"], ["score_probability"]),
        helper.make_node("Reshape", ["score_probability", "score_shape"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou"], ["selected"]),
        helper.make_node("RoiAlign", ["features", "rois", "roi_batch"], ["roi"], output_height=3, output_width=3),
        helper.make_node("AffineGrid", ["theta", "grid_size"], ["grid"]),
        helper.make_node("GridSample", ["features", "grid"], ["warped"]),
        helper.make_node("GroupNormalization", ["warped", "gn_scale", "gn_bias"], ["normalized"], num_groups=2),
        helper.make_node("Sin", ["normalized"], ["sin"]),
        helper.make_node("LRN", ["sin"], ["lrn"], size=3),
        helper.make_node("Conv", [conv_input, "w5"], ["mixed"]),
        helper.make_node("Einsum", ["mixed", "features"], ["gram"], equation="bchw,bdhw->bcd"),
        helper.make_node("CumSum", ["gram", "cum_axis"], ["cumulative"]),
        helper.make_node("Trilu", ["cumulative", "k"], ["tri"]),
        helper.make_node("ArgMax", ["score_map"], ["best"], axis=1, keepdims=0),
        helper.make_node("Unique", ["best"], ["uniq", "first", "inverse", "counts"]),
    ]
    if with_qdq:
        nodes[20:20] = [helper.make_node("QuantizeLinear", ["features", "qs", "qz"], ["codes"]),
                        helper.make_node("DequantizeLinear", ["codes", "qs", "qz"], ["dequantized"])]
    else:
        initializers = [i for i in initializers if i.name not in ("qs", "qz")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if name in INTEGER_OUTPUTS else TensorProto.FLOAT,
                                             [f"{name}_{axis}" for axis in range(rank)])
               for name, rank in OUTPUTS.items()]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))], outputs,
                      initializers, opset=21)


def _images(count, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def test_the_executor_runs_the_model_like_onnxruntime():
    model = _model(with_qdq=True)
    feeds = {"x": _images(1, 1)[0]}
    for name, got, want in zip(OUTPUTS, run_executor(model, feeds), run_onnxruntime(model, feeds)):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if name in INTEGER_OUTPUTS:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()), err_msg=name)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("new_ops") / "model.onnx"
    onnx.save(_model(with_qdq=False), str(path))
    return str(path)


@pytest.mark.parametrize("platform", ["TRT_INT8", "ORT_INT8"])
@pytest.mark.parametrize("dispatcher", ["conservative", "allin"])
def test_quantized_export_runs_and_quantizes_no_index(model_path, platform, dispatcher):
    graph = api.quantize_onnx_model(model_path, _images(4, 2), platform=platform, dispatcher=dispatcher)
    summary = graph.metadata["quantization"]["dispatch"]
    assert "NonMaxSuppression_13" in summary["SOI"]
    for operation in graph.operations.values():   # no index, mask or code is quantized
        if operation.config is None:
            continue
        for variable, config in zip(operation.outputs, operation.config.output_quantization_config):
            producer_index = operation.outputs.index(variable)
            if operation.type in ("NonMaxSuppression", "ArgMax") or (operation.type == "Unique" and producer_index):
                assert config is None or config.state in (QuantizationStates.FP32, QuantizationStates.SOI), \
                    (operation.name, variable.name, config.state)
    model, _ = build_qdq_model(graph)
    test = {"x": _images(1, 3)[0]}
    exported = run_qdq_model(model, test, optimization="disable")
    simulated = NumpyExecutor(graph).forward(test)
    reference = run_onnxruntime(_model(with_qdq=False), test)
    for name, e, s, f in zip(OUTPUTS, exported, simulated, reference):
        if name in INTEGER_OUTPUTS:
            np.testing.assert_array_equal(e, s, err_msg=name)   # the selection of the quantized scores
            continue
        np.testing.assert_allclose(e, s, rtol=1e-4, atol=1e-4 * float(np.abs(s).max()), err_msg=name)
        cosine = float(np.dot(e.ravel(), f.ravel()) / (np.linalg.norm(e) * np.linalg.norm(f)))
        assert cosine >= 0.99, (name, cosine)


def test_soi_slots_of_the_new_ops():
    graph = ppqlike.load_onnx_graph(_model(with_qdq=True))
    by_type = {op.type: op for op in graph.operations.values()}
    assert soi_input_indices(by_type["QuantizeLinear"]) == {1, 2}
    assert soi_input_indices(by_type["DequantizeLinear"]) == {1, 2}
    assert soi_input_indices(by_type["RoiAlign"]) == {1, 2}
    assert soi_input_indices(by_type["AffineGrid"]) == {1}
    assert "NonMaxSuppression_13" in soi_operations(graph)


def test_rotary_position_ids_computed_from_shapes_are_soi():
    """position_ids made from the input's shape (Shape -> Gather -> Range -> Unsqueeze) are shape arithmetic."""
    batch, heads, length, head = 1, 2, 5, 4
    angles = np.arange(8)[:, None] * np.linspace(0.1, 1, head // 2)
    initializers = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
                    numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
                    numpy_helper.from_array(np.array(2, np.int64), "axis_index"),
                    numpy_helper.from_array(np.array(0, np.int64), "zero"),
                    numpy_helper.from_array(np.array(1, np.int64), "one"),
                    numpy_helper.from_array(np.array([0], np.int64), "axes")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "axis_index"], ["length"]),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Unsqueeze", ["positions", "axes"], ["position_ids"]),
             helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "position_ids"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, heads, length, head])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, heads, length, head])],
                       initializers, opset=23)
    graph = ppqlike.load_onnx_graph(model)
    soi = soi_operations(graph)
    rotary = next(op.name for op in graph.operations.values() if op.type == "RotaryEmbedding")
    assert {op.name for op in graph.operations.values() if op.type != "RotaryEmbedding"} <= soi
    assert rotary not in soi
    x = np.random.default_rng(0).standard_normal((batch, heads, length, head)).astype(np.float32)
    np.testing.assert_allclose(run_executor(model, {"x": x})[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-5,
                               atol=1e-6)
