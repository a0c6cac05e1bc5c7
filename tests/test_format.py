"""Graph formatting: constant folding, identity removal, BN and bias folding, on small graphs and real models."""

import ast
import collections
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model, run_onnxruntime
from ppqlike.core.errors import GraphError
from ppqlike.io import export_onnx_model, load_onnx_graph
from ppqlike.io.format import (FormatReport, fold_batchnorm, fold_bias_add, fold_constants, fold_followers,
                               fold_scale_mul, format_graph,
                               remove_dead_code, remove_identity)
from shared_bench import MODEL_NAMES, PRESETS, load_images, requires_bench

RNG = np.random.default_rng(0)


def _info(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _normal(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def _bn_params(prefix, channels):
    return [_init(f"{prefix}_gamma", RNG.uniform(0.5, 1.5, channels).astype(np.float32)),
            _init(f"{prefix}_beta", _normal(channels)),
            _init(f"{prefix}_mean", _normal(channels)),
            _init(f"{prefix}_var", RNG.uniform(0.5, 2.0, channels).astype(np.float32))]


def _bn(prefix, x, y, epsilon=1e-3):
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}_{p}" for p in ("gamma", "beta", "mean", "var")],
                            [y], epsilon=epsilon, name=f"{prefix}_node")


def _apply(model, step, feeds, rtol=1e-5, **options):
    """Load ``model``, run ``step`` on it, check links, and compare onnxruntime before/after."""
    graph = load_onnx_graph(model)
    report = step(graph, **options)
    graph.check()
    assert isinstance(report, FormatReport)
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    expected = run_onnxruntime(model, feeds)
    actual = run_onnxruntime(exported, feeds)
    assert [o.name for o in exported.graph.output] == [o.name for o in model.graph.output]
    for got, want in zip(actual, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))
    return graph, report


def _types(graph):
    return collections.Counter(op.type for op in graph.operations.values())


# ------------------------------------------------------------------ constant folding --
def test_fold_weight_transforms_and_arithmetic():
    w = _normal(3, 4)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Mul", ["wt", "two"], ["w2"]),
             helper.make_node("MatMul", ["x", "w2"], ["m"]),
             helper.make_node("Reshape", ["b", "bshape"], ["b2"]),
             helper.make_node("Add", ["m", "b2"], ["y"])]
    inits = [_init("w", w), _init("two", np.float32(2)), _init("b", _normal(1, 3)),
             _init("bshape", np.array([3], np.int64))]
    model = make_model(nodes, [_info("x", ["n", 4])], [_info("y", ["n", 3])], inits)
    graph, report = _apply(model, fold_constants, {"x": _normal(5, 4)})
    assert _types(graph) == {"MatMul": 1, "Add": 1}
    assert report.counts["ops folded"] == 3
    matmul = next(op for op in graph.operations.values() if op.type == "MatMul")
    np.testing.assert_array_equal(matmul.inputs[1].value, w.T * 2)
    assert sorted(graph.variables) == sorted(["x", "w2", "m", "b2", "y"])  # the sources are gone


def _padding_model(with_start=False):
    """Pad amounts computed at run time from the input's shape (as in EfficientNet-Lite0's export)."""
    shape_node = helper.make_node("Shape", ["x"], ["shape"], **({"start": 2} if with_start else {}))
    index = np.array([0] if with_start else [2], np.int64)
    nodes = [shape_node,
             helper.make_node("Gather", ["shape", "index"], ["h"], axis=0),
             helper.make_node("Mod", ["h", "two"], ["odd"]),
             helper.make_node("ConstantOfShape", ["six"], ["zeros"], value=_init("v", np.array([0], np.int64))),
             helper.make_node("Concat", ["zeros", "odd", "odd"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads", "zero"], ["p"], mode="constant"),
             helper.make_node("Relu", ["p"], ["y"])]
    inits = [_init("index", index), _init("two", np.array([2], np.int64)), _init("six", np.array([6], np.int64)),
             _init("zero", np.float32(0))]
    return make_model(nodes, [_info("x", ["n", 2, 5, 5])], [_info("y", ["n", 2, None, None])], inits,
                      opset=15 if with_start else 13)


def test_shape_arithmetic_folds_with_static_input_shapes():
    model = _padding_model()
    feeds = {"x": _normal(3, 2, 5, 5)}
    graph, report = _apply(model, fold_constants, feeds)  # batch is dynamic: Shape stays
    assert _types(graph)["Shape"] == 1 and report.skipped["Shape/Size of a dynamic shape"] == 1
    assert "ConstantOfShape" not in _types(graph)  # it depended on constants only
    graph, report = _apply(model, fold_constants, feeds, input_shapes={"x": [3, 2, 5, 5]})
    assert _types(graph) == {"Pad": 1, "Relu": 1}
    pad = next(op for op in graph.operations.values() if op.type == "Pad")
    assert pad.inputs[1].is_parameter and pad.inputs[1].value.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert graph.inputs[0].shape == [3, 2, 5, 5]
    assert report.counts["Shape/Size ops made constant from static shapes"] == 1


def test_shape_with_start_folds_despite_dynamic_batch():
    graph, _ = _apply(_padding_model(with_start=True), fold_constants, {"x": _normal(2, 2, 5, 5)})
    assert _types(graph) == {"Pad": 1, "Relu": 1}
    assert graph.inputs[0].shape == ["n", 2, 5, 5]


def test_shape_of_an_intermediate_tensor_uses_shape_inference():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Slice", ["s", "start", "end"], ["nc"]),
             helper.make_node("Concat", ["nc", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["y"])]
    inits = [_init("w", _normal(4, 3, 3, 3)), _init("start", np.array([0], np.int64)),
             _init("end", np.array([2], np.int64)), _init("minus1", np.array([-1], np.int64))]
    model = make_model(nodes, [_info("x", ["n", 3, 9, 9])], [_info("y", ["n", 4, None])], inits)
    graph, _ = _apply(model, fold_constants, {"x": _normal(2, 3, 9, 9)}, input_shapes={"x": [2, 3, 9, 9]})
    assert _types(graph) == {"Conv": 1, "Reshape": 1}
    reshape = next(op for op in graph.operations.values() if op.type == "Reshape")
    assert reshape.inputs[1].value.tolist() == [2, 4, -1]


def test_random_ops_are_not_folded():
    nodes = [helper.make_node("RandomNormal", [], ["noise"], shape=[2, 3], seed=1.0),
             helper.make_node("Mul", ["noise", "zero"], ["z"]),
             helper.make_node("Add", ["x", "z"], ["y"])]
    model = make_model(nodes, [_info("x", [2, 3])], [_info("y", [2, 3])], [_init("zero", np.float32(0))])
    graph = load_onnx_graph(model)
    fold_constants(graph)
    graph.check()
    assert _types(graph) == {"RandomNormal": 1, "Mul": 1, "Add": 1}


def test_large_expansion_is_not_stored_but_small_results_fold():
    nodes = [helper.make_node("ConstantOfShape", ["big_shape"], ["big"], value=_init("v", np.array([1.0], np.float32))),
             helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
             helper.make_node("Add", ["x", "total"], ["y"]),
             helper.make_node("ConstantOfShape", ["small_shape"], ["ones"], value=_init("v", np.array([1.0], np.float32))),
             helper.make_node("Mul", ["y", "ones"], ["y2"])]
    inits = [_init("big_shape", np.array([1500, 1000], np.int64)), _init("small_shape", np.array([3], np.int64))]
    model = make_model(nodes, [_info("x", [3])], [_info("y2", [3])], inits)
    graph, report = _apply(model, fold_constants, {"x": _normal(3)})
    assert _types(graph) == {"Add": 1, "Mul": 1}  # the big tensor was only needed to compute a scalar
    graph = load_onnx_graph(model)
    graph.outputs.append(graph.variables["big"])
    report = fold_constants(graph)
    assert "ConstantOfShape" in _types(graph) and report.skipped["ConstantOfShape: output too large to store"] == 1
    graph = load_onnx_graph(model)
    graph.outputs.append(graph.variables["big"])
    fold_constants(graph, max_expansion=1 << 22)
    assert "ConstantOfShape" not in _types(graph) and graph.variables["big"].value.shape == (1500, 1000)


def test_constant_graph_output_and_dead_code():
    nodes = [helper.make_node("Add", ["a", "b"], ["const_out"]),
             helper.make_node("Relu", ["x"], ["unused"]),
             helper.make_node("Neg", ["x"], ["y"])]
    model = make_model(nodes, [_info("x", [2]), _info("ignored", [2])], [_info("y", [2]), _info("const_out", [2])],
                       [_init("a", np.float32([1, 2])), _init("b", np.float32([3, 4]))])
    graph, report = _apply(model, fold_constants, {"x": _normal(2), "ignored": _normal(2)})
    assert _types(graph) == {"Neg": 1}
    assert graph.variables["const_out"].value.tolist() == [4, 6] and "unused" not in graph.variables
    assert [v.name for v in graph.inputs] == ["x", "ignored"]  # the interface stays
    assert report.counts["dead ops removed"] == 1


def test_remove_dead_code_keeps_graph_outputs():
    model = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["dead"])],
                       [_info("x", [2])], [_info("y", [2])])
    graph = load_onnx_graph(model)
    report = remove_dead_code(graph)
    graph.check()
    assert _types(graph) == {"Relu": 1} and report.counts["dead ops removed"] == 1


@pytest.mark.parametrize("shapes, match", [({"nope": [1, 2]}, "not an input"), ({"x": [1, 2]}, "rank"),
                                           ({"x": [1, 3, 5, 5]}, "contradicts"), ({"x": [0, 2, 5, 5]}, "positive")])
def test_bad_input_shapes(shapes, match):
    graph = load_onnx_graph(_padding_model())
    with pytest.raises(GraphError, match=match):
        fold_constants(graph, input_shapes=shapes)


# ------------------------------------------------------------------ identity removal --
def test_remove_identity_and_dropout():
    nodes = [helper.make_node("Identity", ["x"], ["x_copy"]),
             helper.make_node("Relu", ["x_copy"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d", "mask"]),
             helper.make_node("Identity", ["d"], ["i1"]),
             helper.make_node("Identity", ["i1"], ["y"]),
             helper.make_node("Identity", ["x"], ["x_out"])]  # graph input straight to graph output: kept
    model = make_model(nodes, [_info("x", [2, 3])], [_info("y", [2, 3]), _info("x_out", [2, 3])])
    graph, report = _apply(model, remove_identity, {"x": _normal(2, 3)})
    assert _types(graph) == {"Relu": 1, "Identity": 1}
    assert report.counts["Identity removed"] == 3 and report.counts["Dropout removed"] == 1
    relu = next(op for op in graph.operations.values() if op.type == "Relu")
    assert relu.inputs[0].name == "x" and relu.outputs[0].name == "y"


def test_dropout_with_used_mask_or_training_mode_stays():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d"]),
             helper.make_node("Dropout", ["d"], ["y", "mask"])]
    model = make_model(nodes, [_info("x", [4])], [_info("y", [4]), _info("mask", [4], TensorProto.BOOL)],
                       [_init("ratio", np.float32(0.5)), _init("train", np.array(True))])
    graph = load_onnx_graph(model)
    report = remove_identity(graph)
    graph.check()
    assert _types(graph) == {"Dropout": 2}
    assert report.skipped["Dropout in training mode"] == 1


# ------------------------------------------------------------------ BatchNorm folding --
def _conv_bn_model(bias=True, extra_reader=False, bn_is_output=False):
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1]),
             _bn("bn", "c", "y" if bn_is_output else "n")]
    inits = [_init("w", _normal(4, 3, 3, 3))] + ([_init("b", _normal(4))] if bias else []) + _bn_params("bn", 4)
    outputs = [_info("y", [1, 4, 6, 6])]
    if not bn_is_output:
        nodes.append(helper.make_node("Relu", ["n"], ["y"]))
    if extra_reader:
        nodes.append(helper.make_node("Sigmoid", ["c"], ["s"]))
        outputs.append(_info("s", [1, 4, 6, 6]))
    return make_model(nodes, [_info("x", [1, 3, 6, 6])], outputs, inits)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_bn_into_conv(bias):
    graph, report = _apply(_conv_bn_model(bias), fold_batchnorm, {"x": _normal(1, 3, 6, 6)})
    assert _types(graph) == {"Conv": 1, "Relu": 1}
    conv = next(op for op in graph.operations.values() if op.type == "Conv")
    assert len(conv.inputs) == 3 and conv.inputs[2].is_parameter and conv.inputs[2].value.dtype == np.float32
    assert report.counts["BatchNormalization folded into Conv"] == 1
    assert not any(name.startswith("bn_") for name in graph.variables)  # BN statistics are gone


def test_bn_as_graph_output_keeps_the_output_name():
    graph, _ = _apply(_conv_bn_model(bn_is_output=True), fold_batchnorm, {"x": _normal(1, 3, 6, 6)})
    assert _types(graph) == {"Conv": 1} and graph.outputs[0].name == "y"
    assert graph.outputs[0].producer.type == "Conv"


def test_bn_after_conv_with_two_readers_is_left_alone():
    graph, report = _apply(_conv_bn_model(extra_reader=True), fold_batchnorm, {"x": _normal(1, 3, 6, 6)})
    assert _types(graph)["BatchNormalization"] == 1
    assert report.skipped["BatchNormalization whose input has other readers"] == 1


def test_bn_on_graph_input_or_after_other_ops_stays():
    nodes = [_bn("a", "x", "n1"), helper.make_node("Relu", ["n1"], ["r"]), _bn("b", "r", "y")]
    model = make_model(nodes, [_info("x", [1, 4, 3, 3])], [_info("y", [1, 4, 3, 3])],
                       _bn_params("a", 4) + _bn_params("b", 4))
    graph, report = _apply(model, fold_batchnorm, {"x": _normal(1, 4, 3, 3)})
    assert _types(graph)["BatchNormalization"] == 2
    assert report.skipped["BatchNormalization on a graph input or constant"] == 1
    assert report.skipped["BatchNormalization after Relu"] == 1


@pytest.mark.parametrize("group", [1, 2])
def test_fold_bn_into_conv_transpose(group):
    # Weight [C_in, M/group, kh, kw] = [4, 3, 3, 3]: 3*group output channels.
    channels = 3 * group
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=group, strides=[2, 2]), _bn("bn", "c", "y")]
    inits = [_init("w", _normal(4, 3, 3, 3))] + _bn_params("bn", channels)
    model = make_model(nodes, [_info("x", [1, 4, 5, 5])], [_info("y", [1, channels, 11, 11])], inits)
    graph, _ = _apply(model, fold_batchnorm, {"x": _normal(1, 4, 5, 5)})
    assert _types(graph) == {"ConvTranspose": 1}


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [False, True])
def test_fold_bn_into_gemm(trans_b, with_c):
    weight = _normal(6, 5) if trans_b else _normal(5, 6)
    nodes = [helper.make_node("Gemm", ["x", "w"] + (["c"] if with_c else []), ["g"], transB=trans_b,
                              alpha=0.7, beta=1.3), _bn("bn", "g", "y")]
    inits = [_init("w", weight)] + ([_init("c", _normal(1, 6))] if with_c else []) + _bn_params("bn", 6)
    model = make_model(nodes, [_info("x", [2, 5])], [_info("y", [2, 6])], inits)
    graph, _ = _apply(model, fold_batchnorm, {"x": _normal(2, 5)})
    assert _types(graph) == {"Gemm": 1}


def test_fold_bn_into_2d_matmul_makes_a_gemm():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), _bn("bn", "m", "y")]
    model = make_model(nodes, [_info("x", [3, 5])], [_info("y", [3, 6])], [_init("w", _normal(5, 6))] + _bn_params("bn", 6))
    graph, report = _apply(model, fold_batchnorm, {"x": _normal(3, 5)})
    assert _types(graph) == {"Gemm": 1} and report.counts["MatMul turned into Gemm"] == 1


def test_bn_after_matmul_of_3d_or_unknown_rank_input_stays():
    # [2, 6, 5] @ [5, 6] -> [2, 6, 6]: BN's channel axis is 1, not the MatMul's last axis.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), _bn("bn", "m", "y")]
    inits = [_init("w", _normal(5, 6))] + _bn_params("bn", 6)
    model = make_model(nodes, [_info("x", [2, 6, 5])], [_info("y", [2, 6, 6])], inits)
    graph, report = _apply(model, fold_batchnorm, {"x": _normal(2, 6, 5)})
    assert _types(graph) == {"MatMul": 1, "BatchNormalization": 1}
    assert report.skipped["BatchNormalization after a MatMul whose input is not known to be 2-D"] == 1
    # A rank nobody can tell (reshaped to a run-time shape) is left alone too.
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"])] + nodes
    nodes[1].input[0] = "r"
    model = make_model(nodes, [_info("x", [6, 5]), _info("target", ["k"], TensorProto.INT64)], [_info("y", ["a", "b"])], inits)
    graph = load_onnx_graph(model)
    report = fold_batchnorm(graph)
    assert _types(graph) == {"Reshape": 1, "MatMul": 1, "BatchNormalization": 1}


def test_shared_weight_is_copied_not_corrupted():
    weight = _normal(4, 3, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"]), _bn("bn", "c1", "y1"),
             helper.make_node("Conv", ["x", "w"], ["y2"])]
    model = make_model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y1", [1, 4, 4, 4]), _info("y2", [1, 4, 4, 4])],
                       [_init("w", weight)] + _bn_params("bn", 4))
    graph, _ = _apply(model, fold_batchnorm, {"x": _normal(1, 3, 4, 4)})
    convs = sorted((op for op in graph.operations.values() if op.type == "Conv"), key=lambda op: op.outputs[0].name)
    np.testing.assert_array_equal(convs[1].inputs[1].value, weight)  # the second conv still reads the original
    assert convs[0].inputs[1] is not convs[1].inputs[1] and convs[1].inputs[1].name == "w"


# ------------------------------------------------------------------ bias folding --
@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), (), (1,)])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_per_channel_add_into_conv(shape, bias):
    addend = _normal(*shape) if shape else np.float32(0.25)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"]),
             helper.make_node("Add", ["addend", "c"], ["y"])]  # constant first: order does not matter
    inits = [_init("w", _normal(4, 3, 1, 1)), _init("addend", addend)] + ([_init("b", _normal(4))] if bias else [])
    model = make_model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y", [1, 4, 4, 4])], inits)
    graph, report = _apply(model, fold_bias_add, {"x": _normal(1, 3, 4, 4)})
    assert _types(graph) == {"Conv": 1} and report.counts["Add folded into the bias of Conv"] == 1


def test_fold_add_into_grouped_conv_transpose_and_bn_into_conv1d():
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], group=2),
             helper.make_node("Add", ["t", "addend"], ["y"]),
             helper.make_node("Conv", ["z", "w1"], ["c"]), _bn("bn", "c", "y1")]
    inits = [_init("w", _normal(4, 3, 2, 2)), _init("addend", _normal(1, 6, 1, 1)), _init("w1", _normal(5, 2, 3))]
    inits += _bn_params("bn", 5)
    model = make_model(nodes, [_info("x", [1, 4, 3, 3]), _info("z", [2, 2, 7])],
                       [_info("y", [1, 6, 4, 4]), _info("y1", [2, 5, 5])], inits)
    feeds = {"x": _normal(1, 4, 3, 3), "z": _normal(2, 2, 7)}
    graph, _ = _apply(model, lambda g: fold_bias_add(g).merge(fold_batchnorm(g)), feeds)
    assert _types(graph) == {"ConvTranspose": 1, "Conv": 1}


def test_add_of_a_plain_vector_after_conv_is_not_a_bias():
    # [C] broadcasts along the last spatial axis, not the channels: folding it would be wrong.
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "addend"], ["y"])]
    inits = [_init("w", _normal(4, 3, 1, 1)), _init("addend", _normal(4))]
    model = make_model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y", [1, 4, 4, 4])], inits)
    graph, report = _apply(model, fold_bias_add, {"x": _normal(1, 3, 4, 4)})
    assert _types(graph) == {"Conv": 1, "Add": 1}
    assert report.skipped["Add after Conv that is not a per-channel bias"] == 1


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("shape", [(6,), (1, 6)])
def test_fold_add_into_gemm(trans_b, shape):
    weight = _normal(6, 5) if trans_b else _normal(5, 6)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b, beta=0.5),
             helper.make_node("Add", ["g", "addend"], ["y"])]
    inits = [_init("w", weight), _init("c", _normal(6)), _init("addend", _normal(*shape))]
    model = make_model(nodes, [_info("x", [2, 5])], [_info("y", [2, 6])], inits)
    graph, _ = _apply(model, fold_bias_add, {"x": _normal(2, 5)})
    assert _types(graph) == {"Gemm": 1}


def test_fold_add_into_2d_matmul_makes_a_gemm():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "addend"], ["y"])]
    model = make_model(nodes, [_info("x", [3, 5])], [_info("y", [3, 6])], [_init("w", _normal(5, 6)), _init("addend", _normal(6))])
    graph, _ = _apply(model, fold_bias_add, {"x": _normal(3, 5)})
    assert _types(graph) == {"Gemm": 1}


def test_scalar_after_a_matmul_of_a_batched_weight_stays():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "one"], ["a"]),
             helper.make_node("Mul", ["a", "one"], ["y"])]
    model = make_model(nodes, [_info("x", [2, 3, 5])], [_info("y", [2, 3, 4])],
                       [_init("w", _normal(2, 5, 4)), _init("one", np.float32(1.5))])
    graph, _ = _apply(model, fold_followers, {"x": _normal(2, 3, 5)})
    assert _types(graph) == {"MatMul": 1, "Add": 1, "Mul": 1}


def test_add_of_two_activations_or_shared_output_stays():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"]),
             helper.make_node("Conv", ["x", "w"], ["d"]), helper.make_node("Add", ["d", "addend"], ["z"]),
             helper.make_node("Neg", ["d"], ["n"])]
    inits = [_init("w", _normal(3, 3, 1, 1)), _init("addend", _normal(1, 3, 1, 1))]
    shape = [1, 3, 2, 2]
    model = make_model(nodes, [_info("x", shape)], [_info("y", shape), _info("z", shape), _info("n", shape)], inits)
    graph, _ = _apply(model, fold_bias_add, {"x": _normal(*shape)})
    assert _types(graph) == {"Conv": 2, "Add": 2, "Neg": 1}


# ------------------------------------------------------------------ scale folding --
@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), (), (1,)])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_per_channel_mul_into_conv(shape, bias):
    scale = _normal(*shape) if shape else np.float32(-1.5)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["scale", "c"], ["y"])]  # constant first: order does not matter
    inits = [_init("w", _normal(4, 3, 3, 3)), _init("scale", scale)] + ([_init("b", _normal(4))] if bias else [])
    model = make_model(nodes, [_info("x", [1, 3, 5, 5])], [_info("y", [1, 4, 5, 5])], inits)
    graph, report = _apply(model, fold_scale_mul, {"x": _normal(1, 3, 5, 5)})
    assert _types(graph) == {"Conv": 1} and report.counts["Mul folded into the weights of Conv"] == 1


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fold_mul_into_gemm_and_matmul(trans_b):
    weight = _normal(6, 5) if trans_b else _normal(5, 6)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b, beta=0.5, alpha=2.0),
             helper.make_node("Mul", ["g", "scale"], ["y"]),
             helper.make_node("MatMul", ["z", "w2"], ["m"]), helper.make_node("Mul", ["m", "scale"], ["y2"])]
    inits = [_init("w", weight), _init("c", _normal(6)), _init("scale", _normal(1, 6)), _init("w2", _normal(5, 6))]
    model = make_model(nodes, [_info("x", [2, 5]), _info("z", [2, 3, 5])], [_info("y", [2, 6]), _info("y2", [2, 3, 6])],
                       inits)
    graph, report = _apply(model, fold_scale_mul, {"x": _normal(2, 5), "z": _normal(2, 3, 5)})
    assert _types(graph) == {"Gemm": 1, "MatMul": 1}   # a MatMul keeps its type: no bias to add


def test_mul_that_is_not_a_channel_scale_or_shares_the_output_stays():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "vector"], ["y"]),
             helper.make_node("Conv", ["x", "w"], ["d"]), helper.make_node("Mul", ["d", "scale"], ["z"]),
             helper.make_node("Neg", ["d"], ["n"]), helper.make_node("Mul", ["x", "x"], ["sq"])]
    inits = [_init("w", _normal(3, 3, 1, 1)), _init("vector", _normal(2)), _init("scale", _normal(1, 3, 1, 1))]
    shape = [1, 3, 2, 2]
    model = make_model(nodes, [_info("x", shape)],
                       [_info("y", shape), _info("z", shape), _info("n", shape), _info("sq", shape)], inits)
    graph, report = _apply(model, fold_scale_mul, {"x": _normal(*shape)})
    assert _types(graph) == {"Conv": 2, "Mul": 3, "Neg": 1}
    assert report.skipped["Mul after Conv that is not a finite per-channel scale"] == 1
    assert report.skipped["Mul whose input has other readers"] == 1


def test_fold_followers_folds_what_an_earlier_fold_makes_foldable():
    # PP-OCRv4's head: ConvTranspose -> bias Add -> BatchNormalization, and Conv -> Mul -> Add (a learned
    # affine): one round folds the Add, the next the BatchNormalization after it.
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["t"], strides=[2, 2]),
             helper.make_node("Add", ["t", "bt"], ["ta"]), _bn("bn", "ta", "y"),
             helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "s"], ["cm"]),
             helper.make_node("Add", ["cm", "b"], ["z"])]
    inits = [_init("wt", _normal(3, 4, 2, 2)), _init("bt", _normal(1, 4, 1, 1)), _init("w", _normal(5, 3, 3, 3)),
             _init("s", _normal(1)), _init("b", _normal(1))] + _bn_params("bn", 4)
    model = make_model(nodes, [_info("x", [1, 3, 4, 4])], [_info("y", [1, 4, 8, 8]), _info("z", [1, 5, 2, 2])], inits)
    graph, report = _apply(model, fold_followers, {"x": _normal(1, 3, 4, 4)})
    assert _types(graph) == {"ConvTranspose": 1, "Conv": 1}
    assert report.counts["BatchNormalization folded into ConvTranspose"] == 1
    assert report.counts["Mul folded into the weights of Conv"] == 1


# ------------------------------------------------------------------ everything together --
def test_format_graph_on_a_small_model():
    nodes = [helper.make_node("Identity", ["x"], ["xi"]),
             helper.make_node("Transpose", ["w_raw"], ["w"], perm=[1, 0, 2, 3]),
             helper.make_node("Conv", ["xi", "w"], ["c"], pads=[1, 1, 1, 1]),
             _bn("bn", "c", "n"),
             helper.make_node("Add", ["n", "addend"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["batch"]),
             helper.make_node("Concat", ["batch", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["flat"]),
             helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
             helper.make_node("Add", ["logits", "fc_bias"], ["y"])]
    inits = [_init("w_raw", _normal(3, 4, 3, 3)), _init("addend", _normal(4, 1, 1)),
             _init("zero", np.array([0], np.int64)), _init("one", np.array([1], np.int64)),
             _init("minus1", np.array([-1], np.int64)), _init("fc", _normal(64, 10)), _init("fc_bias", _normal(10))]
    inits += _bn_params("bn", 4)
    model = make_model(nodes, [_info("x", ["n", 3, 4, 4])], [_info("y", ["n", 10])], inits)
    graph, report = _apply(model, format_graph, {"x": _normal(2, 3, 4, 4)}, input_shapes={"x": [2, 3, 4, 4]})
    assert _types(graph) == {"Conv": 1, "Relu": 1, "Reshape": 1, "Gemm": 1}
    assert report.ops_before["Identity"] == 1 and sum(report.ops_after.values()) == 4
    assert "4 ops" in str(report)


# ------------------------------------------------------------------ real models --
@requires_bench
@pytest.mark.real_model
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_format_shared_model_keeps_outputs(name):
    preset = PRESETS[name]
    images, _, _ = load_images(name, "dev", limit=8)
    images = np.array(images)
    graph = load_onnx_graph(str(preset.path))
    report = format_graph(graph, input_shapes={preset.input_name: list(images.shape)})
    exported = export_onnx_model(graph)
    onnx.checker.check_model(exported, full_check=True)
    feeds = {preset.input_name: images}
    expected = run_onnxruntime(onnx.load(str(preset.path)), feeds)[0]
    actual = run_onnxruntime(exported, feeds)[0]
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale)
    assert (actual.argmax(1) == expected.argmax(1)).all()
    before, after = report.ops_before, report.ops_after
    print(f"\n{name}: {sum(before.values())} ops -> {sum(after.values())} ops; "
          f"max |diff| / max |y| = {np.abs(actual - expected).max() / scale:.2e}\n"
          f"  before {dict(sorted(before.items()))}\n  after  {dict(sorted(after.items()))}")
    assert not any(op.type == "Identity" for op in graph.operations.values())
    if name == "efficientnet_lite0":
        for op_type in ("Shape", "Gather", "ConstantOfShape", "Concat", "Slice", "Transpose", "Cast", "Unsqueeze"):
            assert after[op_type] == 0, op_type
        assert after["Reshape"] == 1  # the one before the classifier, on activations
        assert before["Pad"] == 17 and after["Pad"] == 0  # the padding arithmetic folded, then the zero Pads
        assert after["Conv"] == before["Conv"] == 49       # went into the convolutions' own pads
    if name == "mobilenetv2":
        for op_type in ("Shape", "Gather", "Unsqueeze", "Concat", "MatMul"):
            assert after[op_type] == 0, op_type
        assert after["Reshape"] == 1 and after["Gemm"] == 1
    if name == "squeezenet1.1":
        assert after["Dropout"] == 0


@requires_bench
@pytest.mark.real_model
def test_format_efficientnet_without_input_shapes_keeps_the_batch_dynamic():
    preset = PRESETS["efficientnet_lite0"]
    images = np.array(load_images("efficientnet_lite0", "dev", limit=3)[0])
    graph = load_onnx_graph(str(preset.path))
    format_graph(graph)
    after = _types(graph)
    # Only the batch-size arithmetic before the classifier's Reshape stays; all padding arithmetic folds.
    assert after["Shape"] == after["Gather"] == after["Unsqueeze"] == after["Concat"] == 1
    assert after["ConstantOfShape"] == after["Slice"] == after["Transpose"] == after["Cast"] == 0
    assert graph.inputs[0].shape[0] == "N"
    exported = export_onnx_model(graph)
    original = onnx.load(str(preset.path))
    for batch in (1, 3):
        feeds = {preset.input_name: images[:batch]}
        np.testing.assert_array_equal(run_onnxruntime(exported, feeds)[0], run_onnxruntime(original, feeds)[0])


# ------------------------------------------------------------------ layering --
def test_io_package_imports_no_higher_layer():
    package = pathlib.Path(__file__).resolve().parent.parent / "ppqlike" / "io"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
            elif isinstance(node, ast.Import):
                module = " ".join(alias.name for alias in node.names)
            else:
                continue
            for higher in ("executor", "platforms", "optim", "api", "cli", "export", "analysis"):
                assert f"..{higher}" not in module and f"ppqlike.{higher}" not in module, (path.name, module)
