"""Zero constant Pads fold into Conv pads; onnxruntime's outputs stay equal."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model, run_onnxruntime
from ppqlike.io.format import fold_pad_into_conv, format_graph
from shared_bench import PRESETS, load_images, requires_bench


def pad_conv_model(value=0.0, mode="constant", pads=(0, 0, 1, 2, 0, 0, 2, 1), conv_pads=(1, 0, 0, 1)):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], name="pad", mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv", pads=list(conv_pads), strides=[2, 2])]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 10])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])], inits)


def _outputs(graph, x):
    return run_onnxruntime(ppqlike.export_onnx_model(graph), {"x": x})[0]


def test_zero_pad_folds_and_outputs_match():
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 10)).astype(np.float32)
    expected = run_onnxruntime(pad_conv_model(), {"x": x})[0]
    graph = ppqlike.load_onnx_graph(pad_conv_model())
    report = fold_pad_into_conv(graph)
    assert report.counts["Pad folded into Conv pads"] == 1
    assert [op.type for op in graph.operations.values()] == ["Conv"]
    assert graph.operations["conv"].attributes["pads"] == [1 + 1, 0 + 2, 0 + 2, 1 + 1]
    graph.check()
    np.testing.assert_array_equal(_outputs(graph, x), expected)


@pytest.mark.parametrize("kwargs", [dict(value=1.0), dict(mode="reflect"), dict(pads=(0, 1, 1, 1, 0, 0, 1, 1))])
def test_other_pads_stay(kwargs):
    graph = ppqlike.load_onnx_graph(pad_conv_model(**kwargs))
    fold_pad_into_conv(graph)
    assert "Pad" in {op.type for op in graph.operations.values()}


@requires_bench
@pytest.mark.real_model
def test_efficientnet_loses_its_pads():
    preset = PRESETS["efficientnet_lite0"]
    images, _, _ = load_images("efficientnet_lite0", "dev", limit=4)
    graph = ppqlike.load_onnx_graph(preset.path)
    format_graph(graph)
    assert "Pad" not in {op.type for op in graph.operations.values()}
    expected = run_onnxruntime(onnx.load(str(preset.path)),
                               {preset.input_name: images})[0]
    got = run_onnxruntime(ppqlike.export_onnx_model(graph), {preset.input_name: images})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
