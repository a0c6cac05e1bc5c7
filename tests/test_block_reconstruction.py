"""Block reconstruction (BRECQ with QDrop): the ops' gradients against the executor's own forward (exact
adjoint identities for the linear ops), the blocks the graph is cut into, and the pass on a small network."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

import ppqlike
from ppqlike.optim.passes.block_gradients import gradient_unsupported, input_gradients
from ppqlike.optim.passes.block_partition import partition
from ppqlike.optim.passes.block_reconstruction import BlockReconstructionPass
from onnx_helpers import make_model, single_node_model
from test_accuracy_passes import chain_model, data, prepared, run_passes
from test_reconstruction import layer_details, reconstructed_chain, spent_and_after_adaround


def _operation(op_type, inputs, attributes=None, initializers=()):
    graph = ppqlike.load_onnx_graph(single_node_model(op_type, inputs, attributes, initializers))
    return graph, graph.operations[f"{op_type.lower()}_node"]


def _run(graph, operation, arguments):
    return ppqlike.NumpyExecutor(graph).run_operation(operation, arguments, quantized=False)[0].astype(np.float64)


def _dot(a, b):
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), stride=st.sampled_from([1, 2]), kernel=st.sampled_from([1, 3]),
       groups=st.sampled_from(["one", "depthwise", "two"]), pad=st.sampled_from([0, 1]))
def test_a_convolutions_gradients_are_its_adjoint(seed, stride, kernel, groups, pad):
    """<conv(x + d, W) - conv(x, W), r> = <dx, d> and <conv(x, W + D) - conv(x, W), r> = <dW, D>, exactly up
    to float rounding: the convolution is bilinear."""
    rng = np.random.default_rng(seed)
    channels = 4
    group = {"one": 1, "depthwise": channels, "two": 2}[groups]
    outputs = channels if groups == "depthwise" else 6
    x = rng.standard_normal((2, channels, 7, 6)).astype(np.float32)
    weight = rng.standard_normal((outputs, channels // group, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    graph, operation = _operation("Conv", {"x": x, "w": weight, "b": bias},
                                  {"strides": [stride, stride], "pads": [pad, 0, pad, pad], "group": group},
                                  initializers={"w", "b"})
    assert gradient_unsupported(operation) is None
    y = _run(graph, operation, [x, weight, bias])
    r = rng.standard_normal(y.shape).astype(np.float32)
    dx, dweight, dbias = input_gradients(operation, [x, weight, bias], r)
    assert dbias is None and dx.shape == x.shape and dweight.shape == weight.shape
    d = rng.standard_normal(x.shape).astype(np.float32)
    D = rng.standard_normal(weight.shape).astype(np.float32)
    moved_x = _dot(_run(graph, operation, [x + d, weight, bias]) - y, r)
    moved_w = _dot(_run(graph, operation, [x, weight + D, bias]) - y, r)
    assert _dot(dx, d) == pytest.approx(moved_x, rel=1e-4, abs=1e-3)
    assert _dot(dweight, D) == pytest.approx(moved_w, rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_a_gemms_gradients_are_its_adjoint(trans_b):
    rng = np.random.default_rng(trans_b)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    weight = rng.standard_normal((3, 4) if trans_b else (4, 3)).astype(np.float32)
    graph, operation = _operation("Gemm", {"x": x, "w": weight}, {"transB": trans_b}, initializers={"w"})
    y = _run(graph, operation, [x, weight])
    r = rng.standard_normal(y.shape).astype(np.float32)
    dx, dweight = input_gradients(operation, [x, weight], r)
    d, D = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(weight.shape).astype(np.float32)
    assert _dot(dx, d) == pytest.approx(_dot(_run(graph, operation, [x + d, weight]) - y, r), rel=1e-5)
    assert _dot(dweight, D) == pytest.approx(_dot(_run(graph, operation, [x, weight + D]) - y, r), rel=1e-5)


LINEAR_CASES = [
    ("Add", {"a": (2, 3, 4, 4), "b": (1, 3, 1, 1)}, {}, ()),
    ("Concat", {"a": (2, 3, 4, 4), "b": (2, 5, 4, 4)}, {"axis": 1}, ()),
    ("GlobalAveragePool", {"x": (2, 3, 5, 4)}, {}, ()),
    ("Flatten", {"x": (2, 3, 1, 1)}, {"axis": 1}, ()),
    ("Pad", {"x": (2, 3, 4, 5), "pads": np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64)}, {}, ("pads",)),
]


@pytest.mark.parametrize("op_type, shapes, attributes, initializers", LINEAR_CASES,
                         ids=[case[0] for case in LINEAR_CASES])
def test_the_linear_ops_gradients_are_their_adjoints(op_type, shapes, attributes, initializers):
    rng = np.random.default_rng(0)
    inputs = {name: shape if isinstance(shape, np.ndarray) else rng.standard_normal(shape).astype(np.float32)
              for name, shape in shapes.items()}
    graph, operation = _operation(op_type, inputs, attributes, initializers)
    assert gradient_unsupported(operation) is None
    arguments = list(inputs.values())
    y = _run(graph, operation, arguments)
    r = rng.standard_normal(y.shape).astype(np.float32)
    gradients = input_gradients(operation, arguments, r)
    for index, (name, value) in enumerate(inputs.items()):
        if name in initializers:
            continue
        d = rng.standard_normal(value.shape).astype(np.float32)
        moved = list(arguments)
        moved[index] = value + d
        assert gradients[index].shape == value.shape
        assert _dot(gradients[index], d) == pytest.approx(_dot(_run(graph, operation, moved) - y, r), rel=1e-5)


def test_relu_and_clip_pass_the_gradient_where_the_input_is_inside():
    x = np.array([[-2.0, -0.5, 0.5, 3.0, 7.0]], np.float32)
    dy = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    _, relu = _operation("Relu", {"x": x})
    np.testing.assert_array_equal(input_gradients(relu, [x], dy)[0], [[0, 0, 3, 4, 5]])
    low, high = np.array(0.0, np.float32), np.array(6.0, np.float32)
    _, clip = _operation("Clip", {"x": x, "lo": low, "hi": high}, initializers={"lo", "hi"})
    np.testing.assert_array_equal(input_gradients(clip, [x, low, high], dy)[0], [[0, 0, 3, 4, 0]])
    _, sigmoid = _operation("Sigmoid", {"x": x})
    assert "Sigmoid" in gradient_unsupported(sigmoid)


def _residual_model():
    """conv a -> relu -> [conv b -> relu -> conv c] + relu output -> conv d -> sigmoid -> conv e."""
    rng = np.random.default_rng(0)
    nodes, initializers = [], []

    def conv(name, source, target, cin, cout):
        weight = (rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32)
        initializers.append(helper.make_tensor(f"{name}_w", 1, weight.shape, weight.ravel().tolist()))
        nodes.append(helper.make_node("Conv", [source, f"{name}_w"], [target], name=name, pads=[1, 1, 1, 1]))

    conv("a", "x", "ya", 3, 4)
    nodes.append(helper.make_node("Relu", ["ya"], ["ra"], name="relu_a"))
    conv("b", "ra", "yb", 4, 4)
    nodes.append(helper.make_node("Relu", ["yb"], ["rb"], name="relu_b"))
    conv("c", "rb", "yc", 4, 4)
    nodes.append(helper.make_node("Add", ["ra", "yc"], ["sum"], name="add"))
    conv("d", "sum", "yd", 4, 4)
    nodes.append(helper.make_node("Sigmoid", ["yd"], ["sd"], name="sigmoid"))
    conv("e", "sd", "y", 4, 2)
    return make_model(nodes, [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", 1, [1, 2, 8, 8])], initializers)


def test_blocks_keep_a_residual_branch_whole_and_end_before_an_op_without_a_gradient():
    graph = ppqlike.load_onnx_graph(_residual_model())
    order = graph.topological_sort()
    layers = {"a", "b", "c", "d", "e"}
    blocks = partition(graph, order, layers, block_layers=3)
    assert [block.layers for block in blocks] == [["a", "b", "c"], ["d"], ["e"]]   # d ends before the Sigmoid
    assert blocks[0].inputs == ["x"] and blocks[0].outputs == ["sum"]
    # with room for one layer a block, the residual branch (two layers) is no block: its layers go alone
    assert [block.layers for block in partition(graph, order, layers, block_layers=1)] == [["a"], ["d"], ["e"]]


def test_the_pass_bakes_every_layer_no_worse_than_nearest_and_lowers_the_output_error():
    graph, reports, errors = reconstructed_chain(BlockReconstructionPass(samples=16, steps=200, batch=4),
                                                 data(batches=4, seed=3))
    report = reports["reconstruction"]
    assert report["blocks"] == 2 and report["block_layers"] == 5 and report["layers"] == 0
    for detail in layer_details(graph):
        assert detail["loss_" + detail["kept"]] <= detail["loss_nearest"]
    assert errors[1] < errors[0]


def test_a_block_never_leaves_worse_than_the_rounding_it_came_with_and_the_pass_stops_at_its_budget():
    spent, _ = spent_and_after_adaround(BlockReconstructionPass(samples=8, steps=50, time_budget=0.0),
                                        BlockReconstructionPass(samples=8, steps=20, batch=4))
    assert spent["reconstruction"]["blocks"] == 0 and spent["reconstruction"]["budget_spent"]


def test_a_shape_computed_from_the_input_neither_ties_the_graph_together_nor_enters_a_block():
    """EfficientNet-Lite0's head: Shape(input) -> Gather -> Unsqueeze -> Concat feeds the Reshape before the Gemm;
    the input read by Shape must not stay live (no block at all before the fix), and the Reshape reading the
    computed shape is no block's (its batch is the walk's)."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((4, 3, 3, 3)), "w2": rng.standard_normal((4, 4, 1, 1)),
               "fc": rng.standard_normal((2, 4))}
    initializers = [helper.make_tensor(name, 1, value.shape, value.astype(np.float32).ravel().tolist())
                    for name, value in weights.items()]
    initializers += [helper.make_tensor("zero", 7, [], [0]), helper.make_tensor("minus_one", 7, [1], [-1])]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], name="gather", axis=0),
             helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["gap"], name="gap"),
             helper.make_node("Unsqueeze", ["batch", "zero_axes"], ["batch1"], name="unsqueeze"),
             helper.make_node("Concat", ["batch1", "minus_one"], ["flat_shape"], name="concat", axis=0),
             helper.make_node("Reshape", ["gap", "flat_shape"], ["flat"], name="reshape"),
             helper.make_node("Gemm", ["flat", "fc"], ["y"], name="fc", transB=1)]
    initializers.append(helper.make_tensor("zero_axes", 7, [1], [0]))
    graph = ppqlike.load_onnx_graph(make_model(nodes, [helper.make_tensor_value_info("x", 1, [2, 3, 6, 6])],
                                               [helper.make_tensor_value_info("y", 1, [2, 2])], initializers))
    blocks = partition(graph, graph.topological_sort(), {"conv1", "conv2", "fc"}, block_layers=3)
    assert [block.layers for block in blocks] == [["conv1", "conv2"], ["fc"]]
    assert all(op.type not in ("Shape", "Gather", "Unsqueeze", "Concat", "Reshape")
               for block in blocks for op in block.operations)


def test_the_same_bits_with_one_two_and_four_kernel_threads():
    """The convolution's gradient is taken one image per thread and summed in image order: the rounding
    learned does not depend on the thread count."""
    from ppqlike.executor import set_num_threads
    baked = []
    try:
        for threads in (1, 2, 4):
            set_num_threads(threads)
            graph, policy = prepared(chain_model(), "ACADEMIC_W4A8")
            run_passes(graph, policy, data(batches=2, seed=5),
                       extra=(BlockReconstructionPass(samples=8, steps=30, batch=4),), stop_before="baking")
            baked.append([np.asarray(op.config.input_quantization_config[1].baked_value).tobytes()
                          for op in graph.topological_sort() if op.type in ("Conv", "Gemm")])
    finally:
        set_num_threads(None)
    assert baked[0] == baked[1] == baked[2]
