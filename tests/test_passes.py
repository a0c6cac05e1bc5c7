"""Each core pass, on a small graph, leaves exactly the states its docstring promises."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from onnx_helpers import make_model, run_onnxruntime
from ppqlike.core.quant import QuantizationStates as S
from ppqlike.executor.simulation import dequantized
from ppqlike.optim.passes import (FusionPass, ParameterBakingPass, ParameterQuantizePass,
                                  PassiveParameterQuantizePass, QuantizationAlignmentPass,
                                  QuantizationSimplifyPass, RuntimeCalibrationPass)
from ppqlike.platforms.dispatch import dispatch_graph
from ppqlike.optim.passes import QuantizeRefinePass
from ppqlike.platforms.policies import get_platform_policy, get_quantizer

RNG = np.random.default_rng(0)


def _conv(rng, name, x, w_shape, out, pads=1, group=1, bias=True):
    inits = [numpy_helper.from_array((rng.standard_normal(w_shape) * 0.3).astype(np.float32), f"{name}_w")]
    inputs = [x, f"{name}_w"]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal(w_shape[0]) * 0.1).astype(np.float32), f"{name}_b"))
        inputs.append(f"{name}_b")
    node = helper.make_node("Conv", inputs, [out], name=name, pads=[pads] * 4, group=group)
    return node, inits


def small_model():
    """x -> conv1 -> relu1 -> {conv2 -> relu2, conv3 -> clip3} -> concat -> conv4 -> add(residual) -> gap -> flatten -> gemm."""
    rng = np.random.default_rng(1)  # the same weights on every call
    nodes, inits = [], []
    for node, init in [_conv(rng, "conv1", "x", (8, 3, 3, 3), "c1"), _conv(rng, "conv2", "r1", (4, 8, 3, 3), "c2"),
                       _conv(rng, "conv3", "r1", (4, 8, 1, 1), "c3", pads=0), _conv(rng, "conv4", "cat", (8, 8, 1, 1), "c4", pads=0)]:
        nodes.append(node)
        inits += init
    inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi"),
              numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.3).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes += [helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
              helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
              helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"], name="clip3"),
              helper.make_node("Concat", ["r2", "r3"], ["cat"], name="concat", axis=1),
              helper.make_node("Add", ["c4", "r1"], ["sum"], name="add"),
              helper.make_node("GlobalAveragePool", ["sum"], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)


def prepared_graph(platform="ORT_INT8"):
    graph = ppqlike.load_onnx_graph(small_model())
    policy = get_platform_policy(platform)
    dispatch_graph(graph, policy.platform, policy.quantizable_types)
    get_quantizer(policy).quantize(graph)
    QuantizeRefinePass(policy).optimize(graph)
    return graph, policy


def cfg(graph, op, side, index=0):
    config = graph.operations[op].config
    return (config.input_quantization_config if side == "in" else config.output_quantization_config)[index]


def data(batches=4):
    return [RNG.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(batches)]


def test_quantizer_writes_initial_configs():
    graph, _ = prepared_graph()
    assert cfg(graph, "conv1", "in", 0).state is S.INITIAL
    assert cfg(graph, "conv1", "in", 1).policy.per_channel
    assert cfg(graph, "conv1", "in", 2).state is S.PASSIVE_INIT
    assert cfg(graph, "clip3", "in", 1).state is S.PASSIVE_INIT


def test_fusion_overlaps_computing_output_and_activation_input():
    graph, policy = prepared_graph()
    report = FusionPass(policy.fused_activations).optimize(graph)
    assert report["fused"] == 3  # conv1+relu1, conv2+relu2, conv3+clip3
    for conv, act in [("conv1", "relu1"), ("conv2", "relu2"), ("conv3", "clip3")]:
        master = cfg(graph, act, "out")
        for config in (cfg(graph, conv, "out"), cfg(graph, act, "in")):
            assert config.state is S.OVERLAPPED and config.master is master
        assert master.state is S.INITIAL
    # conv4's output is read by the Add: not fused
    assert cfg(graph, "conv4", "out").state is S.INITIAL


def test_simplify_quantizes_every_tensor_once():
    graph, policy = prepared_graph()
    FusionPass(policy.fused_activations).optimize(graph)
    QuantizationSimplifyPass().optimize(graph)
    # r1 is read by conv2, conv3 and add: all three read relu1's output config
    for op, index in [("conv2", 0), ("conv3", 0), ("add", 1)]:
        config = cfg(graph, op, "in", index)
        assert config.state is S.OVERLAPPED and config.master is cfg(graph, "relu1", "out")
    # Flatten is value preserving: its output keeps its input's grid
    assert cfg(graph, "flatten", "out").state is S.OVERLAPPED
    assert cfg(graph, "flatten", "out").master is cfg(graph, "flatten", "in")
    # the graph input is quantized by its first reader only
    assert cfg(graph, "conv1", "in").state is S.INITIAL


def test_parameter_pass_activates_weights_only():
    graph, policy = prepared_graph()
    ParameterQuantizePass().optimize(graph)
    weight = cfg(graph, "conv1", "in", 1)
    assert weight.state is S.ACTIVATED and weight.scale.shape == (8,)
    w = graph.variables["conv1_w"].value
    np.testing.assert_allclose(weight.scale, np.abs(w).reshape(8, -1).max(1) / 127, rtol=1e-6)
    assert cfg(graph, "conv1", "in", 0).state is S.INITIAL
    assert cfg(graph, "conv1", "in", 2).state is S.PASSIVE_INIT


def run_core(graph, policy, stop_after=None):
    executor = ppqlike.NumpyExecutor(graph)
    passes = [FusionPass(policy.fused_activations), QuantizationSimplifyPass(), ParameterQuantizePass(),
              RuntimeCalibrationPass(verbose=False),
              QuantizationAlignmentPass(policy.concat_alignment, policy.add_alignment),
              PassiveParameterQuantizePass(), ParameterBakingPass()]
    batches = data()
    for current in passes:
        current.optimize(graph, executor=executor, dataloader=batches, calib_steps=len(batches))
        if current.name == stop_after:
            break
    return executor, batches


def test_calibration_activates_every_ungoverned_activation():
    graph, policy = prepared_graph()
    run_core(graph, policy, stop_after="calibration")
    for operation in graph.operations.values():
        for side, configs in (("in", operation.config.input_quantization_config),
                              ("out", operation.config.output_quantization_config)):
            for index, config in enumerate(configs):
                if config is None:
                    continue
                variable = (operation.inputs if side == "in" else operation.outputs)[index]
                if config.state is S.OVERLAPPED or config.state is S.PASSIVE_INIT:
                    continue
                assert config.state is S.ACTIVATED, (operation.name, side, index, config)
                assert config.scale is not None and np.all(config.scale > 0)
    # relu1's range was observed: asymmetric uint8 with offset 0 (ReLU output is non-negative)
    relu = cfg(graph, "relu1", "out")
    assert int(relu.offset) == 0


def test_alignment_makes_concat_producers_slaves():
    graph, policy = prepared_graph()
    run_core(graph, policy, stop_after="alignment")
    master = cfg(graph, "concat", "out")
    for act in ("relu2", "clip3"):
        config = cfg(graph, act, "out")
        assert config.state is S.SLAVE and config.master is master
        np.testing.assert_array_equal(config.scale, master.scale)
    # the fused conv output follows the chain to the concat's scale
    np.testing.assert_array_equal(cfg(graph, "conv2", "out").scale, master.scale)


def test_add_alignment_larger_range_governs():
    graph, _ = prepared_graph("TIDL_INT8")
    policy = get_platform_policy("TIDL_INT8")
    run_core(graph, policy, stop_after="alignment")
    a, b = cfg(graph, "add", "in", 0), cfg(graph, "add", "in", 1)
    assert S.SLAVE in (a.state, b.state)
    np.testing.assert_array_equal(a.scale, b.scale)


def test_passive_links_bias_and_clip_bounds():
    graph, policy = prepared_graph()
    run_core(graph, policy, stop_after="passive")
    bias = cfg(graph, "conv1", "in", 2)
    assert bias.state is S.PASSIVE
    expected = cfg(graph, "conv1", "in", 0).scale * cfg(graph, "conv1", "in", 1).scale
    np.testing.assert_allclose(bias.scale, expected, rtol=1e-6)
    assert np.all(bias.offset == 0) and bias.num_of_bits == 32
    low = cfg(graph, "clip3", "in", 1)
    assert low.state is S.PASSIVE
    np.testing.assert_array_equal(low.scale, cfg(graph, "clip3", "in", 0).scale)


def test_baking_stores_quantized_parameters_and_keeps_fp32():
    graph, policy = prepared_graph()
    executor, batches = run_core(graph, policy)
    weight = cfg(graph, "conv1", "in", 1)
    bias = cfg(graph, "conv1", "in", 2)
    assert weight.state is S.BAKED and bias.state is S.PASSIVE_BAKED
    original = graph.variables["conv1_w"].value
    assert not np.array_equal(weight.baked_value, original)
    # on the grid: integers after dividing by the per-channel scale
    q = weight.baked_value / weight.scale[:, None, None, None]
    np.testing.assert_allclose(q, np.round(q), atol=1e-3)
    # quantized and float runs differ, and dequantized() restores float exactly and every state after
    states = {id(c): c.state for op in graph.operations.values() for c in op.config.all_configs()}
    quantized = executor.forward(batches[0])[0]
    with dequantized(graph):
        fp32 = executor.forward(batches[0])[0]
    expected = run_onnxruntime(small_model(), {"x": batches[0]})[0]
    np.testing.assert_allclose(fp32, expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(quantized, fp32, atol=1e-6)
    assert np.corrcoef(quantized.ravel(), fp32.ravel())[0, 1] > 0.99
    assert states == {id(c): c.state for op in graph.operations.values() for c in op.config.all_configs()}


def test_dequantized_restores_states_after_an_exception():
    graph, policy = prepared_graph()
    run_core(graph, policy)
    before = [c.state for op in graph.operations.values() for c in op.config.all_configs()]
    with pytest.raises(RuntimeError):
        with dequantized(graph):
            assert all(c.state in (S.DEQUANTIZED, S.OVERLAPPED)
                       for op in graph.operations.values() for c in op.config.all_configs())
            raise RuntimeError("boom")
    assert before == [c.state for op in graph.operations.values() for c in op.config.all_configs()]


def test_all_zero_weight_channel_keeps_its_bias(tmp_path):
    """A weight channel of zeros borrows the widest channel's scale: its int32 bias stays in range, so
    that channel's output is still its bias (min-max alone gave it scale 2^-32 and a saturated bias)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    weight[2] = 0.0
    bias = np.array([0.1, -0.2, 0.75, 0.3], np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 8, 8])],
                       [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    path = tmp_path / "zero_channel.onnx"
    onnx.save(model, path)
    data = [rng.standard_normal((4, 3, 8, 8)).astype(np.float32)]
    graph = ppqlike.quantize_onnx_model(str(path), data, platform="ORT_INT8")
    conv = next(iter(graph.operations.values()))
    weight_scale = np.asarray(conv.config.input_quantization_config[1].scale)
    assert weight_scale[2] == weight_scale.max()
    output = ppqlike.NumpyExecutor(graph).forward(data[0])[0]
    step = float(conv.config.output_quantization_config[0].scale)
    assert np.all(np.abs(output[:, 2] - 0.75) <= step)
