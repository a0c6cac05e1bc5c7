"""ONNX import/export round trips: onnxruntime's outputs stay bit-identical and exports pass onnx.checker."""

import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import IR_VERSION, make_model, run_onnxruntime
from ppqlike.core.errors import ExportError
from ppqlike.io import export_onnx_model, load_onnx_graph, save_onnx_graph
from shared_bench import MODEL_NAMES, PRESETS, load_images, requires_bench

RNG = np.random.default_rng(0)


def _info(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _session(model):
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])


def assert_round_trip(model, feeds, source=None):
    """Load ``source`` (default: the model), export, check, and compare onnxruntime bit for bit."""
    graph = load_onnx_graph(model if source is None else source)
    graph.check()
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    expected = _session(model).run(None, feeds)
    actual = _session(exported).run(None, feeds)
    assert [o.name for o in exported.graph.output] == [o.name for o in model.graph.output]
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    return graph, exported


@requires_bench
@pytest.mark.real_model
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_shared_model_round_trip_is_bit_identical(name):
    preset = PRESETS[name]
    images, _, _ = load_images(name, "dev", limit=4)
    model = onnx.load(str(preset.path))
    graph, exported = assert_round_trip(model, {preset.input_name: np.array(images)}, source=str(preset.path))
    assert not any(op.type == "Constant" for op in graph.operations.values())
    assert exported.graph.input[0].name == preset.input_name
    # The batch dimension stays dynamic.
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_constant_nodes_of_every_form_become_parameters():
    sparse = helper.make_sparse_tensor(_init("sv", np.array([5.0, 7.0], np.float32)),
                                       _init("si", np.array([1, 4], np.int64)), [2, 3])
    constants = [
        helper.make_node("Constant", [], ["c_tensor"], value=_init("t", np.full((2, 3), 0.5, np.float32))),
        helper.make_node("Constant", [], ["c_float"], value_float=2.0),
        helper.make_node("Constant", [], ["c_floats"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c_int"], value_int=1),
        helper.make_node("Constant", [], ["c_ints"], value_ints=[3, 2]),
        helper.make_node("Constant", [], ["c_sparse"], sparse_value=sparse),
    ]
    nodes = constants + [
        helper.make_node("Add", ["x", "c_tensor"], ["a"]),
        helper.make_node("Mul", ["a", "c_float"], ["b"]),
        helper.make_node("Add", ["b", "c_floats"], ["c"]),
        helper.make_node("Add", ["c", "c_sparse"], ["d"]),
        helper.make_node("Reshape", ["d", "c_ints"], ["e"]),
        helper.make_node("Gather", ["e", "c_int"], ["y"], axis=0),
    ]
    model = make_model(nodes, [_info("x", [2, 3])], [_info("y", [2])])
    graph, exported = assert_round_trip(model, {"x": RNG.normal(size=(2, 3)).astype(np.float32)})
    assert sorted(op.type for op in graph.operations.values()) == ["Add", "Add", "Add", "Gather", "Mul", "Reshape"]
    values = {name: graph.variables[name].value for name in ["c_float", "c_floats", "c_int", "c_ints", "c_sparse"]}
    assert values["c_float"].dtype == np.float32 and values["c_float"].shape == ()
    assert values["c_int"].dtype == np.int64 and values["c_int"] == 1
    assert values["c_ints"].tolist() == [3, 2] and values["c_floats"].dtype == np.float32
    np.testing.assert_array_equal(values["c_sparse"], [[0, 5, 0], [0, 7, 0]])
    assert not any(node.op_type == "Constant" for node in exported.graph.node)


def test_string_constants_load():
    nodes = [helper.make_node("Constant", [], ["s"], value_strings=[b"a", b"bc"]),
             helper.make_node("Identity", ["s"], ["y"])]
    graph = load_onnx_graph(make_model(nodes, [], [_info("y", [2], TensorProto.STRING)]))
    assert graph.variables["s"].value.tolist() == ["a", "bc"]


def test_initializer_shared_by_two_ops_stays_one_variable():
    w = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["x", "w"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r", "b"], ["y"])]
    model = make_model(nodes, [_info("x", [1, 3, 8, 8])], [_info("y", [1, 4, 8, 8])], [_init("w", w)])
    graph, exported = assert_round_trip(model, {"x": RNG.normal(size=(1, 3, 8, 8)).astype(np.float32)})
    assert len(graph.variables["w"].consumers) == 2
    assert [t.name for t in exported.graph.initializer] == ["w"]


def test_graph_input_that_is_also_an_initializer_ir3():
    nodes = [helper.make_node("Add", ["x", "bias"], ["y"])]
    graph_proto = helper.make_graph(nodes, "ir3", [_info("x", [2]), _info("bias", [2])], [_info("y", [2])],
                                    [_init("bias", np.array([1.0, 2.0], np.float32))])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 3
    graph, exported = assert_round_trip(model, {"x": np.array([0.5, 0.25], np.float32)})
    assert [v.name for v in graph.inputs] == ["x"] and graph.variables["bias"].is_parameter
    assert exported.ir_version >= 4  # initializers need not be inputs any more


def test_dynamic_dims_named_and_unnamed():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [_info("x", ["batch", None, 4])], [_info("y", ["batch", None, 4])])
    graph = load_onnx_graph(model)
    assert graph.inputs[0].shape == ["batch", None, 4]
    exported = export_onnx_model(graph)
    dims = exported.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and not dims[1].HasField("dim_value") and not dims[1].dim_param
    assert dims[2].dim_value == 4
    for shape in [(1, 2, 4), (3, 5, 4)]:
        assert_round_trip(model, {"x": RNG.normal(size=shape).astype(np.float32)})


def test_external_data_files(tmp_path):
    w = RNG.normal(size=(64, 32)).astype(np.float32)
    b = RNG.normal(size=(64,)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    model = make_model(nodes, [_info("x", [2, 32])], [_info("y", [2, 64])], [_init("w", w), _init("b", b)])
    path = tmp_path / "external.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save moves the tensors of what it saves to external data
    onnx.save(saved, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").is_file() and os.path.getsize(path) < w.nbytes
    feeds = {"x": RNG.normal(size=(2, 32)).astype(np.float32)}
    graph, _ = assert_round_trip(model, feeds, source=str(path))
    np.testing.assert_array_equal(graph.variables["w"].value, w)
    np.testing.assert_array_equal(graph.variables["b"].value, b)


@pytest.mark.parametrize("opset", [11, 21])
def test_opsets_11_and_21(opset):
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
             helper.make_node("ReduceSum", ["c"], ["s"], keepdims=1, **({"axes": [1]} if opset < 13 else {})),
             helper.make_node("Sub", ["c", "s"], ["y"])]
    inits = [_init("lo", np.float32(-0.5)), _init("hi", np.float32(0.5))]
    if opset >= 13:
        nodes[1].input.append("axes")
        inits.append(_init("axes", np.array([1], np.int64)))
    model = make_model(nodes, [_info("x", [2, 5])], [_info("y", [2, 5])], inits, opset=opset)
    graph, exported = assert_round_trip(model, {"x": RNG.normal(size=(2, 5)).astype(np.float32)})
    assert graph.opset == opset
    assert {(o.domain, o.version) for o in exported.opset_import} == {("", opset)}


def test_optional_inputs_omitted_in_the_middle():
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["c"]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="linear")]
    inits = [_init("hi", np.float32(0.3)), _init("scales", np.array([1, 1, 2, 2], np.float32))]
    model = make_model(nodes, [_info("x", [1, 2, 3, 3])], [_info("y", [1, 2, 6, 6])], inits)
    graph, exported = assert_round_trip(model, {"x": RNG.normal(size=(1, 2, 3, 3)).astype(np.float32)})
    ops = {op.type: op for op in graph.operations.values()}
    assert ops["Clip"].inputs[1] is None and ops["Resize"].inputs[1] is None
    assert [list(n.input) for n in exported.graph.node] == [["x", "", "hi"], ["c", "", "scales"]]


def test_ops_with_multiple_outputs_some_unused():
    nodes = [helper.make_node("Split", ["x"], ["s0", "s1", "s2"], axis=1, num_outputs=3),
             helper.make_node("TopK", ["s0", "k"], ["values", "indices"], axis=1),
             helper.make_node("Dropout", ["s2"], ["dropped", ""]),
             helper.make_node("MaxPool", ["x4", ], ["pooled", "argmax"], kernel_shape=[1, 2]),
             helper.make_node("Unsqueeze", ["values", "axes"], ["v4"]),
             helper.make_node("Concat", ["v4", "v4"], ["x4"], axis=3),
             helper.make_node("Add", ["dropped", "s1"], ["y"])]
    inits = [_init("k", np.array([2], np.int64)), _init("axes", np.array([0, 1], np.int64))]
    model = make_model(nodes, [_info("x", [2, 6])], [_info("y", [2, 2]), _info("pooled", [1, 1, 2, 3])], inits, opset=18)
    graph, exported = assert_round_trip(model, {"x": RNG.normal(size=(2, 6)).astype(np.float32)})
    ops = {op.type: op for op in graph.operations.values()}
    assert len(ops["Split"].outputs) == 3 and ops["Split"].outputs[2].consumers
    assert ops["TopK"].outputs[1].consumers == [] and ops["MaxPool"].outputs[1].consumers == []
    assert len(ops["Dropout"].outputs) == 1  # the trailing omitted mask stays omitted


def test_duplicate_and_missing_node_names_get_unique_names():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("Abs", ["b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"], name="Abs_2")]
    model = make_model(nodes, [_info("x", [3])], [_info("y", [3])])
    graph = load_onnx_graph(model)  # onnxruntime itself refuses the duplicate names
    assert len(graph.operations) == 4 and "Abs_2" in graph.operations
    assert graph.operations["Abs_2"].type == "Sigmoid"
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert len({n.name for n in exported.graph.node}) == 4
    assert run_onnxruntime(exported, {"x": np.array([-1, 0, 2], np.float32)})[0].tolist() == \
        pytest.approx([0.5, 0.5, 1 / (1 + np.exp(-2.0))])


def test_nodes_out_of_order_are_sorted_without_touching_the_given_model():
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["a"], name="first")]
    graph_proto = helper.make_graph(nodes, "unsorted", [_info("x", [2])], [_info("y", [2])])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = IR_VERSION
    before = model.SerializeToString()
    graph = load_onnx_graph(model)
    assert [op.name for op in graph.topological_sort()] == ["first", "second"]
    assert model.SerializeToString() == before
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    assert run_onnxruntime(exported, {"x": np.array([-1, 2], np.float32)})[0].tolist() == [0, -2]


def test_metadata_and_attributes_survive(tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("LeakyRelu", ["t"], ["l"], alpha=0.1),
             helper.make_node("Cast", ["l"], ["y"], to=TensorProto.FLOAT16)]
    model = make_model(nodes, [_info("x", [2, 3])], [_info("y", [3, 2], TensorProto.FLOAT16)])
    helper.set_model_props(model, {"author": "me"})
    graph = load_onnx_graph(model)
    path = tmp_path / "out.onnx"
    save_onnx_graph(graph, path)
    reloaded = onnx.load(str(path))
    onnx.checker.check_model(reloaded, full_check=True)
    assert {p.key: p.value for p in reloaded.metadata_props} == {"author": "me"}
    attributes = {n.op_type: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in reloaded.graph.node}
    assert attributes["Transpose"]["perm"] == [1, 0] and attributes["Cast"]["to"] == TensorProto.FLOAT16
    assert attributes["LeakyRelu"]["alpha"] == pytest.approx(0.1)
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]  # no temporary file left behind


def test_save_refuses_the_input_path_and_missing_folders(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", [2])], [_info("y", [2])])
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    before = source.read_bytes()
    graph = load_onnx_graph(str(source))
    with pytest.raises(ExportError, match="input model"):
        save_onnx_graph(graph, source, protect=(source,))
    with pytest.raises(ExportError, match="does not exist"):
        save_onnx_graph(graph, tmp_path / "missing" / "out.onnx")
    assert source.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
