"""NumpyExecutor behaviour: inputs, requested outputs, hooks, freeing, errors before data runs."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model, run_onnxruntime
from ppqlike.core.errors import ExecutionError, UnsupportedOperationError


def chain_model():
    """x -> Conv -> Relu -> Add(x-branch Conv) -> y, plus a second input z added at the end."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "z"], ["y"], name="add")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 5, 5]),
              helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "C", 1, 1])]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 5])], [w])


def feeds():
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((3, 2, 5, 5)).astype(np.float32),
            "z": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)}


def test_forward_matches_onnxruntime_and_accepts_lists():
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(chain_model()))
    expected = run_onnxruntime(chain_model(), feeds())[0]
    np.testing.assert_allclose(executor.forward(feeds())[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(executor.forward([feeds()["x"], feeds()["z"]])[0], expected, rtol=1e-5, atol=1e-6)
    # float64 input is converted to the declared float32
    as_double = {k: v.astype(np.float64) for k, v in feeds().items()}
    assert executor.forward(as_double)[0].dtype == np.float32


def test_intermediate_outputs_and_hooks_see_every_op():
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(chain_model()))
    seen = []

    class Hook(ppqlike.OperationHook):
        def before_operation(self, operation, inputs):
            seen.append(("before", operation.name, len(inputs)))

        def after_operation(self, operation, inputs, outputs):
            seen.append(("after", operation.name, outputs[0].shape))

    c, y = executor.forward(feeds(), output_names=["c", "y"], hooks=[Hook()])
    assert [s[:2] for s in seen] == [("before", "conv"), ("after", "conv"), ("before", "relu"), ("after", "relu"),
                                     ("before", "add"), ("after", "add")]
    np.testing.assert_allclose(y, np.maximum(c, 0) + feeds()["z"], rtol=1e-6)


def test_hook_can_replace_values():
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(chain_model()))

    class Zero(ppqlike.OperationHook):
        def after_operation(self, operation, inputs, outputs):
            return [np.zeros_like(outputs[0])] if operation.name == "relu" else None

    y = executor.forward(feeds(), hooks=[Zero()])[0]
    np.testing.assert_array_equal(y, np.broadcast_to(feeds()["z"], y.shape))


def test_only_needed_ops_run_and_intermediates_are_freed():
    graph = ppqlike.load_onnx_graph(chain_model())
    executor = ppqlike.NumpyExecutor(graph)
    plan = executor.compile(["r"])
    assert [s.operation.name for s in plan.steps] == ["conv", "relu"] and plan.needed_inputs == ("x",)
    full = executor.compile()
    released = {name for step in full.steps for name in step.release}
    assert released == {"c", "r", "x", "z"}  # every non-output value is dropped after its last reader
    # z is not needed for r
    executor.forward({"x": feeds()["x"]}, output_names=["r"])


def test_input_errors_name_the_input():
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(chain_model()))
    with pytest.raises(ExecutionError, match="'z' was not given"):
        executor.forward({"x": feeds()["x"]})
    with pytest.raises(ExecutionError, match="rank 4"):
        executor.forward({"x": feeds()["x"][0], "z": feeds()["z"]})
    with pytest.raises(ExecutionError, match="no input named"):
        executor.forward({**feeds(), "q": feeds()["z"]})
    with pytest.raises(ExecutionError, match="2 inputs"):
        executor.forward(feeds()["x"])
    with pytest.raises(ExecutionError, match="no tensor named 'nope'"):
        executor.forward(feeds(), output_names=["nope"])


def test_kernel_failure_names_the_node():
    executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(chain_model()))
    bad = dict(feeds(), z=np.ones((1, 3, 1, 1), np.float32))  # does not broadcast against 4 channels
    with pytest.raises(ExecutionError, match="Add node 'add' failed"):
        executor.forward(bad)


def test_unknown_op_fails_at_plan_time_with_type_node_and_domain():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    graph = ppqlike.load_onnx_graph(model)
    with pytest.raises(UnsupportedOperationError, match=r"'fancy'.*'FancyOp'.*'com.example'"):
        ppqlike.NumpyExecutor(graph)


def test_outputs_never_alias_parameters():
    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    nodes = [helper.make_node("Identity", ["w"], ["y"], name="id"), helper.make_node("Relu", ["x"], ["r"], name="r")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                        helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])], [weight])
    graph = ppqlike.load_onnx_graph(model)
    y, _ = ppqlike.NumpyExecutor(graph).forward(np.zeros(4, np.float32))
    y[:] = -1
    np.testing.assert_array_equal(graph.variables["w"].value, np.arange(4))


def test_plan_is_rebuilt_after_graph_edits():
    graph = ppqlike.load_onnx_graph(chain_model())
    executor = ppqlike.NumpyExecutor(graph)
    before = executor.forward(feeds())[0]
    relu = graph.operations["relu"]
    graph.bypass_operation(relu)
    after = executor.forward(feeds())[0]
    assert not np.array_equal(before, after) and (after < feeds()["z"].max() + 1e-6).any()


def test_opset_variants_pick_the_newest_not_newer_than_the_model():
    from ppqlike.executor.ops.base import by_opset
    build = by_opset({6: lambda op, opset: "clip-6", 11: lambda op, opset: "clip-11"})
    assert [build(None, opset) for opset in (1, 6, 10, 11, 21)] == ["clip-6", "clip-6", "clip-6", "clip-11",
                                                                     "clip-11"]


def _residual_model():
    """x -> Conv -> Relu = r; r -> Conv -> Clip -> Conv = p; Add(p, r) -> GlobalAveragePool: r has two
    readers, and is also asked for as an output."""
    rng = np.random.default_rng(4)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1], group=6, name="depthwise"),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["k"], name="clip"),
             helper.make_node("Conv", ["k", "w3", "b3"], ["p"], name="pointwise"),
             helper.make_node("Add", ["p", "r"], ["s"], name="add"),
             helper.make_node("GlobalAveragePool", ["s"], ["y"], name="gap")]
    initializers = [weight("w1", 6, 3, 3, 3), weight("b1", 6), weight("w2", 6, 1, 3, 3), weight("w3", 6, 6, 1, 1),
                    weight("b3", 6), numpy_helper.from_array(np.array(0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6, np.float32), "hi")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 40, 40])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 1, 1])], initializers)


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8", "NXP_INT8", "DSP_INT8"])
def test_quantized_forward_equals_running_each_op_through_its_configs(platform, tmp_path):
    """The executor's shortcuts (a value already on the grid its reader would quantize it to is passed
    as it is; outputs quantized in place; an activation fused into its producer) change no value: the
    result equals running op after op with ``run_operation`` (every config applied to a copy), the
    input and the parameters are left as they were, and a value with two readers reaches both intact."""
    import onnx
    path = tmp_path / "residual.onnx"
    onnx.save(_residual_model(), path)
    rng = np.random.default_rng(5)
    calibration = [rng.standard_normal((4, 3, 40, 40)).astype(np.float32) for _ in range(2)]
    graph = ppqlike.quantize_onnx_model(str(path), calibration, platform=platform)
    add = graph.operations["add"].config
    if add is not None:  # the Add reads r on a grid of its own: r must be quantized again for it
        from ppqlike.core.quant import QuantizationStates, TensorQuantizationConfig
        original = add.input_quantization_config[1]
        add.input_quantization_config[1] = TensorQuantizationConfig(
            original.policy, original.rounding, original.num_of_bits, original.quant_min, original.quant_max,
            scale=np.float32(float(np.max(original.scale)) * 2.5), offset=0, state=QuantizationStates.ACTIVATED)
    executor = ppqlike.NumpyExecutor(graph)
    x = rng.standard_normal((8, 3, 40, 40)).astype(np.float32) * 1.5
    kept = x.copy()
    parameters = {name: v.value.copy() for name, v in graph.variables.items() if v.is_parameter}
    r, y = executor.forward({"x": x}, output_names=["r", "y"])
    values = {"x": x}
    for operation in graph.topological_sort():
        inputs = [None if v is None else (values[v.name] if v.name in values else v.value) for v in operation.inputs]
        for variable, value in zip(operation.outputs, executor.run_operation(operation, [np.array(i) if
                                                                              isinstance(i, np.ndarray) else i
                                                                              for i in inputs])):
            values[variable.name] = value
    np.testing.assert_array_equal(y, values["y"])
    np.testing.assert_array_equal(r, values["r"])
    np.testing.assert_array_equal(x, kept)
    for name, value in parameters.items():
        np.testing.assert_array_equal(graph.variables[name].value, value)
    np.testing.assert_array_equal(executor.forward({"x": x}, output_names=["r", "y"])[1], y)  # again: same


class _Recorder(ppqlike.executor.OperationHook):
    """Records every output it is shown; lets the executor fuse when ``fuse``."""

    def __init__(self, fuse: bool):
        self.fuse, self.seen = fuse, {}

    def after_operation(self, operation, inputs, outputs):
        self.seen[operation.name] = [np.array(o, copy=True) for o in outputs]

    def lets_fuse(self, producer, activation):
        return self.fuse


@pytest.mark.parametrize("activation", ["Relu", "Clip"])
def test_a_hook_that_lets_fuse_sees_the_activation_outputs_bit_for_bit(activation):
    """The calibration's observer hook watches only a Conv's activation output: the executor then runs the
    Conv and its Relu/Clip as one kernel (as without hooks) and hands the hook the same values."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    bounds = [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    act = helper.make_node(activation, ["c"] + (["lo", "hi"] if activation == "Clip" else []), ["y"], name="act")
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), act],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 16, 16])],
                       [w] + (bounds if activation == "Clip" else []))
    graph = ppqlike.load_onnx_graph(model)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32) * 3
    executor = ppqlike.executor.NumpyExecutor(graph)
    apart, fused = _Recorder(False), _Recorder(True)
    out_apart = executor.forward(x, hooks=[apart])[0]
    out_fused = executor.forward(x, hooks=[fused])[0]
    assert set(apart.seen) == {"conv", "act"} and set(fused.seen) == {"act"}   # the Conv's result never made
    np.testing.assert_array_equal(fused.seen["act"][0].view(np.uint32), apart.seen["act"][0].view(np.uint32))
    np.testing.assert_array_equal(out_fused.view(np.uint32), executor.forward(x)[0].view(np.uint32))
    np.testing.assert_array_equal(out_apart.view(np.uint32), out_fused.view(np.uint32))
