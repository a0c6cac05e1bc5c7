"""If, Loop and Scan: bodies held as Graphs of the IR, loaded, edited, run, exported and quantized.

Every run is compared with onnxruntime on the same ONNX (relative 1e-4); opsets 11, 13, 16, 19 and 21
(If/Loop/Scan changed at 13, 16, 19 and 21: types only, which these models keep within).
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import onnx
import pytest

from control_flow_models import conv_control_conv, if_model, loop_model, scan_model
from onnx_helpers import run_onnxruntime
from ppqlike import api
from ppqlike.core.errors import ExecutionError, ModelLoadError
from ppqlike.core.subgraphs import captures, implicit_inputs, walk
from ppqlike.executor import NumpyExecutor, OperationHook
from ppqlike.io import load_onnx_graph
from ppqlike.io.format import format_graph
from ppqlike.io.onnx_export import export_onnx_model

OPSETS = [11, 13, 16, 19, 21]


def assert_close(got, expected):
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        assert np.shape(value) == np.shape(want)
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-6 * (1 + float(np.max(np.abs(want), initial=0))))


def feeds_for(model, seed: int, offset: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for graph_input in model.graph.input:
        shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
        feeds[graph_input.name] = (rng.standard_normal(shape) + offset).astype(np.float32)
    return feeds


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("offset", [1.0, -1.0, 0.0])   # then branch, else branch (both inner branches)
def test_if_with_outer_reads_and_nested_if_matches_onnxruntime(opset, offset):
    model = if_model(opset)
    graph = load_onnx_graph(model)
    outer_if = graph.operations["If_4"]
    assert sorted(v.name for v in implicit_inputs(outer_if)) == ["bias", "u", "x"]   # W became a body parameter
    then_branch = outer_if.attributes["then_branch"]
    assert then_branch.variables["W"].is_parameter and [v.name for v in captures(then_branch)] == ["x"]
    for seed in range(3):
        feeds = feeds_for(model, seed, offset)
        assert_close(NumpyExecutor(graph).forward(feeds), run_onnxruntime(model, feeds))


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("trip, condition, limit", [(True, True, 3.0), (True, False, 3.0), (False, True, 1.5),
                                                     (True, True, -100.0)])
def test_loop_matches_onnxruntime(opset, trip, condition, limit):
    """Trip count and condition, trip count only, condition only (stops when the body says), and a
    condition that ends after the first iteration; carried values, scan outputs, outer weight and value."""
    model = loop_model(opset, trip, condition, limit)
    graph = load_onnx_graph(model)
    for seed in range(3):
        feeds = feeds_for(model, seed)
        assert_close(NumpyExecutor(graph).forward(feeds), run_onnxruntime(model, feeds))


@pytest.mark.parametrize("opset", OPSETS)
def test_scan_axes_and_directions_match_onnxruntime(opset):
    model = scan_model(opset)
    graph = load_onnx_graph(model)
    for seed in range(3):
        feeds = feeds_for(model, seed)
        feeds["s"] = np.array(0.4 + 0.1 * seed, np.float32)
        assert_close(NumpyExecutor(graph).forward(feeds), run_onnxruntime(model, feeds))


@pytest.mark.parametrize("build", [if_model, loop_model, scan_model])
@pytest.mark.parametrize("opset", [11, 16, 21])
def test_load_export_round_trip_runs_as_the_original(build, opset):
    model = build(opset)
    graph = pickle.loads(pickle.dumps(load_onnx_graph(model)))   # Ray ships graphs pickled
    graph.check()
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported)
    for seed in range(2):
        feeds = feeds_for(model, seed, 0.5 - seed)
        if "s" in feeds:
            feeds["s"] = np.array(0.5, np.float32)
        assert_close(run_onnxruntime(exported, feeds), run_onnxruntime(model, feeds))


def test_edits_of_the_enclosing_graph_reach_the_bodies():
    """Renaming a value a body reads, or making its reader read another, renames the body's capture;
    dead-code removal keeps the op computing it; the export still runs as the original."""
    model = if_model(13)
    graph = load_onnx_graph(model)
    graph.rename_variable(graph.variables["u"], "u_renamed")
    outer_if = graph.operations["If_4"]
    inner_if = next(op for op in outer_if.attributes["else_branch"].operations.values() if op.type == "If")
    assert "u_renamed" in [v.name for v in implicit_inputs(outer_if)]
    assert "u_renamed" in inner_if.attributes["then_branch"].variables
    report = format_graph(graph)
    assert "Add_3" in graph.operations and "Sigmoid_2" in graph.operations, report
    graph.check()
    twice = graph.create_variable("twice_x")
    graph.create_operation("Add", [graph.variables["x"], graph.variables["x"]], [twice])
    graph.replace_variable(graph.variables["u_renamed"], twice)   # reads an equal value computed elsewhere
    graph.check()
    assert "twice_x" in inner_if.attributes["then_branch"].variables
    feeds = feeds_for(model, 3, -1.0)
    assert_close(run_onnxruntime(export_onnx_model(graph), feeds), run_onnxruntime(model, feeds))


def test_loop_invariant_weights_become_body_parameters():
    """A weight passed through the Loop as a carried value (paddle2onnx's way) becomes a body parameter."""
    from onnx import helper
    from control_flow_models import T, const, model as build, vi
    body = helper.make_graph([helper.make_node("MatMul", ["h_in", "w_in"], ["h_out"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
                             [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("h_in", shape=[2, 4]),
                              vi("w_in", shape=[4, 4])],
                             [vi("c_out", T.BOOL, []), vi("h_out", shape=[2, 4]), vi("w_in", shape=[4, 4])])
    model = build([helper.make_node("Loop", ["M", "", "h0", "W"], ["h", "w_final"], body=body),
                   helper.make_node("MatMul", ["h", "w_final"], ["y"])],   # the final weight is read too
                  [vi("h0", shape=[2, 4])], [vi("y", shape=[2, 4])],
                  [const("M", np.int64(3)), const("W", np.eye(4, dtype=np.float32) * 0.5 + 0.1)], 13)
    graph = load_onnx_graph(model)
    format_graph(graph)
    loop = next(op for op in graph.operations.values() if op.type == "Loop")
    assert len(loop.outputs) == 1 and loop.attributes["body"].variables["w_in"].is_parameter
    feeds = feeds_for(model, 0)
    assert_close(NumpyExecutor(graph).forward(feeds), run_onnxruntime(model, feeds))
    assert_close(run_onnxruntime(export_onnx_model(graph), feeds), run_onnxruntime(model, feeds))


def test_hooks_that_reach_bodies_see_their_ops():
    class Seen(OperationHook):
        def __init__(self, reaches):
            self.reaches_bodies, self.types = reaches, []

        def after_operation(self, operation, inputs, outputs):
            self.types.append(operation.type)

    model = loop_model(13)
    graph = load_onnx_graph(model)
    inside, outside = Seen(True), Seen(False)
    NumpyExecutor(graph).forward(feeds_for(model, 0), hooks=[inside, outside])
    assert outside.types == ["Relu", "Loop"]
    assert inside.types.count("Tanh") >= 1 and inside.types[-1] == "Loop"


def test_bad_control_flow_is_refused_clearly():
    from onnx import helper
    from control_flow_models import T, model as build, vi
    model = if_model(13)
    graph = load_onnx_graph(model)
    graph.variables["c"].shape = None
    wide = {"x": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)}
    graph.operations["Greater_1"].attributes.clear()
    graph.replace_input(graph.operations["Greater_1"], 0, graph.variables["x"])   # a [2, 3] condition
    with pytest.raises(ExecutionError, match="condition must hold one value"):
        NumpyExecutor(graph).forward(wide)
    body = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "b", [vi("s", shape=[2])],
                             [vi("t", shape=[2])])
    mapped = build([helper.make_node("SequenceMap", ["seq"], ["out"], body=body)],
                   [helper.make_tensor_sequence_value_info("seq", T.FLOAT, [2])],
                   [helper.make_tensor_sequence_value_info("out", T.FLOAT, None)], opset=17)
    mapped.graph.node[0].domain = "com.example"   # a subgraph of an op ppqlike does not know
    mapped.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(ModelLoadError, match="subgraphs of If, Loop, Scan, SequenceMap only"):
        load_onnx_graph(mapped)


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8"])
@pytest.mark.parametrize("kind", ["If", "Loop"])
def test_quantized_bodies_export_and_run_close_to_fp32(kind, platform, tmp_path):
    """conv -> If/Loop (a conv in the body) -> conv: the body's ops quantized (calibrated on what the body
    sees), the export loads and runs in onnxruntime with output cosine >= 0.99 against FP32; for ORT_INT8
    the export computes what the executor simulates."""
    model = conv_control_conv(kind)
    rng = np.random.default_rng(0)
    calibration = [(rng.standard_normal((2, 3, 8, 8)) * (0.5 + i % 2)).astype(np.float32) for i in range(8)]
    graph = api.quantize_onnx_model(model, calibration, platform=platform)
    control = next(op for op in graph.operations.values() if op.type == kind)
    assert control.config is None
    body_convs = [op for owner, op in walk(graph) if owner is not graph and op.type == "Conv"]
    assert body_convs and all(op.config is not None for op in body_convs)
    path = tmp_path / "quantized.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api.export_ppq_graph(graph, platform, str(path))
    exported = onnx.load(path)
    quantize_nodes = [node for node in exported.graph.node if node.op_type == kind][0]
    body_types = {node.op_type for attribute in quantize_nodes.attribute for node in attribute.g.node}
    assert "QuantizeLinear" in body_types and "DequantizeLinear" in body_types
    executor = NumpyExecutor(graph)
    for seed in range(4):
        x = (np.random.default_rng(100 + seed).standard_normal((2, 3, 8, 8)) * (0.5 + seed % 2)).astype(np.float32)
        deployed, = run_onnxruntime(exported, {"x": x})
        reference, = run_onnxruntime(model, {"x": x})
        assert cosine(deployed, reference) >= 0.99
        if platform == "ORT_INT8":
            np.testing.assert_allclose(executor.forward({"x": x})[0], deployed, rtol=1e-5, atol=1e-6)
