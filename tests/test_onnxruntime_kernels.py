"""ORT_INT8 simulates onnxruntime's integer kernels: the exported model, run by onnxruntime with its
default optimizations (QDQ groups fused into QLinearConv, QLinearAdd, QLinearGlobalAveragePool,
QGemm), gives exactly the simulation's outputs, bit for bit, on a graph with every kernel kind."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ppqlike import api
from ppqlike.executor import NumpyExecutor
from ppqlike.executor.onnxruntime_kernels import wants_runtime_kernel
from ppqlike.export.verify import run_qdq_model
from ppqlike.optim.setting import QuantizationSettingFactory


def _weight_maker(rng):
    """weight(name, *shape, scale=0.3): a normal random initializer."""
    def weight(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    return weight


def _model(seed: int, size: int = 12) -> onnx.ModelProto:
    """Conv(3x3)+Relu -> depthwise Conv+Clip -> 1x1 Conv, residual Add, GlobalAveragePool, Flatten, Gemm
    on ``size`` x ``size`` maps."""
    weight = _weight_maker(np.random.default_rng(seed))

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8, name="depthwise"),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="pointwise"),
        helper.make_node("Add", ["c3", "r1"], ["s"], name="add"),
        helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], transB=1, name="fc"),
    ]
    initializers = [weight("w1", 8, 3, 3, 3), weight("b1", 8, scale=0.1), weight("w2", 8, 1, 3, 3),
                    weight("b2", 8, scale=0.1), weight("w3", 8, 8, 1, 1), weight("b3", 8, scale=0.1),
                    weight("w4", 10, 8), weight("b4", 10, scale=0.1),
                    numpy_helper.from_array(np.array(0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(nodes, "kernels",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _quantize(path, calibration, platform: str):
    """``path`` quantized for ``platform`` with every op on 8 bits: the protection off (it could move the
    one layer these small models have to int16 or float, and the kernels under test would not run), every
    op's output quantized (TensorRT's own placement leaves the outputs of pools and Concats float; balanced
    the ops writing the model's outputs)."""
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.protection = setting.float_outputs = False
    setting.placement = "every_output"
    return api.quantize_onnx_model(path, calibration, platform=platform, setting=setting)


def _quantized(seed: int, tmp_path, size: int = 12):
    rng = np.random.default_rng(seed + 100)
    path = tmp_path / f"m{seed}.onnx"
    onnx.save(_model(seed, size), path)
    calibration = [rng.standard_normal((8, 3, size, size)).astype(np.float32) for _ in range(2)]
    graph = _quantize(str(path), calibration, platform="ORT_INT8")
    exported = api.export_ppq_graph(graph, "ORT_INT8", tmp_path / f"q{seed}.onnx")[0]
    return graph, onnx.load(exported)


def test_every_kernel_kind_is_marked(tmp_path):
    graph, _ = _quantized(0, tmp_path)
    marked = sorted(op.name for op in graph.operations.values() if wants_runtime_kernel(op))
    assert marked == ["add", "conv1", "depthwise", "fc", "gap", "pointwise"]


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_simulation_equals_onnxruntime_bit_for_bit(seed, tmp_path_factory):
    graph, model = _quantized(seed, tmp_path_factory.mktemp("k"))
    x = np.random.default_rng(seed + 7).standard_normal((16, 3, 12, 12)).astype(np.float32) * 1.5
    deployed = run_qdq_model(model, {"x": x})[0]
    simulated = NumpyExecutor(graph).forward(x)[0]
    np.testing.assert_array_equal(simulated, deployed)
    # the float kernels (the ONNX QDQ semantics, onnxruntime unoptimized) are close but not equal
    spec = NumpyExecutor(graph, runtime_kernels=False).forward(x)[0]
    step = float(graph.operations["fc"].config.output_quantization_config[0].scale)
    assert np.max(np.abs(spec - run_qdq_model(model, {"x": x}, optimization="disable")[0])) <= 4 * step


def test_large_maps_run_bit_for_bit(tmp_path):
    """Activations of many cache blocks (the requantization, the integer recovery and the fake
    quantization work block by block) and a hook that replaces an input (the simulation must then
    check the grid again) still give onnxruntime's outputs."""
    from ppqlike.executor import OperationHook
    graph, model = _quantized(3, tmp_path, size=64)
    x = np.random.default_rng(11).standard_normal((8, 3, 64, 64)).astype(np.float32) * 1.5
    deployed = run_qdq_model(model, {"x": x})[0]
    np.testing.assert_array_equal(NumpyExecutor(graph).forward(x)[0], deployed)

    class Copies(OperationHook):  # the same values, but arrays the executor did not make
        def before_operation(self, operation, inputs):
            return [None if value is None else np.array(value) for value in inputs]
    np.testing.assert_array_equal(NumpyExecutor(graph).forward(x, hooks=[Copies()])[0], deployed)


def _single_conv(tmp_path, weight, bias, size, calibration, **attributes):
    """A one-Conv model on ``size`` x ``size`` maps quantized for ORT_INT8: (graph, exported model)."""
    inputs, initializers = ["x", "w"], [numpy_helper.from_array(weight, "w")]
    if bias is not None:
        inputs.append("b")
        initializers.append(numpy_helper.from_array(bias, "b"))
    channels, outputs = weight.shape[1], weight.shape[0]
    graph = helper.make_graph([helper.make_node("Conv", inputs, ["y"], name="conv", **attributes)], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs, size, size])],
                              initializers)
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    quantized = _quantize(str(path), calibration, platform="ORT_INT8")
    return quantized, onnx.load(api.export_ppq_graph(quantized, "ORT_INT8", tmp_path / "q.onnx")[0])


def _recorded(monkeypatch, name: str, module=None, record=None) -> list:
    """What ``<module>.<name>`` (default: ``onnxruntime_kernels``) returns, call after call, from now on;
    ``record(arguments, result)``: what to keep of each call instead."""
    if module is None:
        from ppqlike.executor import onnxruntime_kernels as module
    calls, original = [], getattr(module, name)

    def spy(*arguments):
        result = original(*arguments)
        calls.append(result if record is None else record(arguments, result))
        return result
    monkeypatch.setattr(module, name, spy)
    return calls


def test_wide_accumulators_run_in_float64_bit_for_bit(tmp_path, monkeypatch):
    """A 1x1 convolution over 2048 channels with full-range weights: max |x| * sum |w| passes 2^24, so the
    accumulator is not exact in float32 and the simulation computes it in float64; still onnxruntime's."""
    rng = np.random.default_rng(2)
    weight = rng.uniform(0.5, 1.0, (4, 2048, 1, 1)).astype(np.float32)  # sums of ~2048 * 95 * 190 > 2^24
    calibration = [rng.random((4, 2048, 2, 2)).astype(np.float32) for _ in range(2)]
    quantized, model = _single_conv(tmp_path, weight, None, 2, calibration)
    chosen = _recorded(monkeypatch, "_precision")
    x = rng.uniform(0.5, 1.0, (4, 2048, 2, 2)).astype(np.float32)
    simulated = NumpyExecutor(quantized).forward(x)[0]
    assert chosen == ["float64"]
    np.testing.assert_array_equal(simulated, run_qdq_model(model, {"x": x})[0])


def test_off_grid_inputs_fall_back_to_the_float_kernel(tmp_path):
    graph, _ = _quantized(1, tmp_path)
    executor = NumpyExecutor(graph)
    operation = graph.operations["pointwise"]
    x = np.random.default_rng(3).random((2, 8, 12, 12)).astype(np.float32)  # not on the input grid
    got = executor.run_operation(operation, [x, operation.inputs[1].value, operation.inputs[2].value])[0]
    reference = NumpyExecutor(graph, runtime_kernels=False).run_operation(
        operation, [x, operation.inputs[1].value, operation.inputs[2].value])[0]
    np.testing.assert_array_equal(got, reference)


def _ort_qlinear(op_type, a, b, sa, za, sb, zb, sy, zy):
    """onnxruntime's own QLinearAdd / QLinearMul kernel (com.microsoft) on uint8 operands."""
    initializers = [numpy_helper.from_array(np.array(v, np.float32), n)
                    for n, v in (("sa", sa), ("sb", sb), ("sy", sy))]
    initializers += [numpy_helper.from_array(np.array(v, np.uint8), n) for n, v in (("za", za), ("zb", zb), ("zy", zy))]
    node = helper.make_node(op_type, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], op_type, [helper.make_tensor_value_info(n, TensorProto.UINT8, list(v.shape))
                                                for n, v in (("a", a), ("b", b))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializers)
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    return run_qdq_model(model, {"a": a, "b": b})[0]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), ratios=st.sampled_from([(0.5, 0.5), (0.5, 0.25), (1.5, 0.5), None]))
def test_qlinear_add_matches_onnxruntime_on_ties(seed, ratios):
    """Scales in simple ratios make exact .5 results common: the rounding order must be onnxruntime's."""
    from ppqlike.executor.onnxruntime_elementwise import qlinear_add
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(0, 256, (4, 32, 8, 8)).astype(np.uint8) for _ in range(2))
    sy = np.float32(rng.uniform(0.01, 0.1))
    sa, sb = ((np.float32(sy * r) for r in ratios) if ratios else
              (np.float32(rng.uniform(0.01, 0.06)) for _ in range(2)))
    za, zb, zy = (int(v) for v in rng.integers(0, 256, 3))
    expected = _ort_qlinear("QLinearAdd", a, b, sa, za, sb, zb, sy, zy)
    np.testing.assert_array_equal(qlinear_add(a, b, sa, za, sb, zb, sy, zy, 0, 255), expected)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scalar=st.booleans(), ratio=st.sampled_from([0.25, 1.0, None]))
def test_qlinear_mul_matches_onnxruntime(seed, scalar, ratio):
    """onnxruntime's QLinearMul kernel, bit for bit, with vector and scalar second operands and scales in
    simple ratios (exact .5 results)."""
    from ppqlike.executor.onnxruntime_elementwise import qlinear_mul
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (4, 16, 24)).astype(np.uint8)
    b = rng.integers(0, 256, (1,) if scalar else (4, 16, 24)).astype(np.uint8)
    sa, sb = (np.float32(rng.uniform(0.005, 0.05)) for _ in range(2))
    sy = np.float32(sa * sb * 64 * ratio) if ratio else np.float32(rng.uniform(0.05, 0.5))
    za, zb, zy = (int(v) for v in rng.integers(0, 256, 3))
    expected = _ort_qlinear("QLinearMul", a, b, sa, za, sb, zb, sy, zy)
    np.testing.assert_array_equal(qlinear_mul(a, b, sa, za, sb, zb, sy, zy, 0, 255), expected)


@pytest.mark.parametrize("batch", [32, 1024])
def test_mul_of_a_layer_scale_runs_bit_for_bit(batch, tmp_path, monkeypatch):
    """A transformer-style layer scale (Mul by a constant per-channel vector, and by a scalar) between two
    MatMuls, after an activation (right after the MatMul it would fold into its weights): onnxruntime fuses
    QLinearMul, the simulation computes it (on a large batch from a table of its results on every pair of
    codes, ``_pair_lookup``)."""
    from ppqlike.executor import onnxruntime_elementwise
    looked_up = _recorded(monkeypatch, "_pair_lookup", onnxruntime_elementwise)
    rng = np.random.default_rng(5)
    initializers = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
                    for name, shape in (("w1", (16, 16)), ("gamma", (16,)), ("w2", (16, 8)))]
    initializers.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"], name="fc1"), helper.make_node("Tanh", ["m"], ["h"]),
             helper.make_node("Mul", ["gamma", "h"], ["s"], name="layer_scale"),   # the small operand first
             helper.make_node("Mul", ["s", "half"], ["t"], name="half_scale"),
             helper.make_node("MatMul", ["t", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 8])], initializers)
    path = tmp_path / "scale.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    calibration = [rng.standard_normal((8, 6, 16)).astype(np.float32) for _ in range(2)]
    quantized = _quantize(str(path), calibration, platform="ORT_INT8")
    assert {"layer_scale", "half_scale"} <= {op.name for op in quantized.operations.values()
                                             if wants_runtime_kernel(op)}
    model = onnx.load(api.export_ppq_graph(quantized, "ORT_INT8", tmp_path / "q.onnx")[0])
    x = rng.standard_normal((batch, 6, 16)).astype(np.float32) * 1.5
    executor = NumpyExecutor(quantized)
    np.testing.assert_array_equal(executor.forward(x)[0], run_qdq_model(model, {"x": x})[0])
    assert len([table for table in looked_up if table is not None]) == (2 if batch > 32 else 0)
    # the tables are kept between runs under the grids: a changed output scale gets a new one
    output = quantized.operations["layer_scale"].config.output_quantization_config[0]
    output.scale = np.float32(np.asarray(output.scale) * np.float32(1.37))
    model = onnx.load(api.export_ppq_graph(quantized, "ORT_INT8", tmp_path / "q2.onnx")[0])
    np.testing.assert_array_equal(executor.forward(x)[0], run_qdq_model(model, {"x": x})[0])


@pytest.mark.parametrize("large_bias, wraps", [(40.0, True), (3e-3, False)])
def test_saturated_bias_is_added_apart_bit_for_bit(large_bias, wraps, tmp_path, monkeypatch):
    """A channel of tiny weights under a large bias (EfficientNet has such channels), quantized without the
    pass that widens its weight scale (as a model quantized elsewhere and imported can come): the int32
    bias code saturates, so the products run in float32 and the bias is added apart; where the int32
    sum overflows, onnxruntime's accumulator wraps around, and so does the simulation's."""
    from ppqlike.optim.passes.bias_range import Int32BiasRangePass
    monkeypatch.setattr(Int32BiasRangePass, "optimize", lambda self, graph, **kwargs: {})
    rng = np.random.default_rng(6)
    weight = (rng.standard_normal((8, 16, 3, 3)) * 0.2).astype(np.float32)
    weight[3] *= 1e-6
    bias = (rng.standard_normal(8) * 0.1).astype(np.float32)
    bias[3] = large_bias   # its int32 code: saturated (and the sum overflowing), or past 2^24 only
    calibration = [rng.standard_normal((4, 16, 24, 24)).astype(np.float32) for _ in range(2)]
    quantized, model = _single_conv(tmp_path, weight, bias, 24, calibration, pads=[1, 1, 1, 1])
    chosen, wrapped = _recorded(monkeypatch, "_precision"), _recorded(monkeypatch, "wrap_int32")
    x = rng.standard_normal((8, 16, 24, 24)).astype(np.float32)
    simulated = NumpyExecutor(quantized).forward(x)[0]
    assert bool(wrapped) == wraps
    assert chosen == ["bias apart"]   # with the bias not exact in float32, the products alone exact
    np.testing.assert_array_equal(simulated, run_qdq_model(model, {"x": x})[0])


def test_a_bias_too_large_for_its_channel_widens_the_weight_scale(tmp_path):
    """The same channel quantized by the pipeline: its weight scale rises until its bias code fits in int32
    (the other channels keep theirs), no accumulator wraps, and the channel's output is its bias, as in
    float - where the saturated code gave it the ends of the range."""
    from ppqlike.optim.passes.bias_range import bias_fitting_scale
    rng = np.random.default_rng(6)
    weight = (rng.standard_normal((8, 16, 3, 3)) * 0.2).astype(np.float32)
    weight[3] *= 1e-6
    bias = (rng.standard_normal(8) * 0.1).astype(np.float32)
    bias[3] = 4.0
    calibration = [rng.standard_normal((4, 16, 24, 24)).astype(np.float32) for _ in range(2)]
    quantized, model = _single_conv(tmp_path, weight, bias, 24, calibration, pads=[1, 1, 1, 1])
    configs = quantized.operations["conv"].config.input_quantization_config
    input_scale, weight_scale = float(configs[0].scale), np.asarray(configs[1].scale)
    plain = np.abs(weight).reshape(8, -1).max(axis=1) / 127   # the symmetric min/max scales
    np.testing.assert_allclose(np.delete(weight_scale, 3), np.delete(plain, 3), rtol=1e-6)
    codes = np.abs(bias.astype(np.float64)) / np.asarray(configs[2].scale, np.float64)
    assert codes[3] <= 2 ** 31 - 1 < abs(bias[3]) / (input_scale * plain[3])
    x = rng.standard_normal((8, 16, 24, 24)).astype(np.float32)
    simulated = NumpyExecutor(quantized).forward(x)[0]
    np.testing.assert_array_equal(simulated, run_qdq_model(model, {"x": x})[0])
    output_scale = float(quantized.operations["conv"].config.output_quantization_config[0].scale)
    assert np.abs(simulated[:, 3] - 4.0).max() <= output_scale   # the bias, to the output's grid
    # the rule alone: power-of-two policies round the raised scale up to a power of two
    raised = bias_fitting_scale(np.array([4.0, 0.1]), 0.01, np.array([1e-12, 0.5], np.float32), 2 ** 31 - 1, True)
    assert raised[1] == np.float32(0.5) and np.log2(raised[0]) == np.round(np.log2(raised[0]))
    assert 4.0 / (0.01 * float(raised[0])) <= 2 ** 31 - 1


@given(st.lists(st.integers(-2 ** 40, 2 ** 40), min_size=1, max_size=40), st.sampled_from([2 ** 31, 2 ** 33, 2 ** 40]))
def test_wrap_int32_is_twos_complement(values, reach):
    """wrap_int32 gives the int32 of every integer accumulator (Python's arithmetic as the reference),
    on each of its paths: in range, within 2^32 of it, and the modulo."""
    from ppqlike.executor.onnxruntime_kernels import wrap_int32
    values = [v % (2 * reach) - reach for v in values]
    expected = [(v + 2 ** 31) % 2 ** 32 - 2 ** 31 for v in values]
    assert wrap_int32(np.array(values, np.float64)).tolist() == expected


def test_codes_handed_between_integer_kernels_are_the_values(tmp_path):
    """Integer kernels hand their results on as codes (``Codes``) when no hook watches: every value a
    caller can see - graph outputs, intermediate outputs read by integer kernels (relu1's result feeds
    the depthwise conv and the residual Add) and by float ops - equals the hooked run's, where every
    value is a float array, bit for bit; outputs are fresh writeable arrays."""
    from ppqlike.executor import OperationHook
    from ppqlike.executor.integer_codes import Codes, integer_codes
    graph, model = _quantized(5, tmp_path)
    x = np.random.default_rng(2).standard_normal((4, 3, 12, 12)).astype(np.float32) * 1.5
    names = ["r1", "r2", "s", "g", "f", "y"]
    executor = NumpyExecutor(graph)
    plain = executor.forward(x, output_names=names)
    hooked = executor.forward(x, output_names=names, hooks=[OperationHook()])
    for name, a, b in zip(names, plain, hooked):
        assert type(a) is np.ndarray and a.flags.writeable, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(executor.forward(x)[0], run_qdq_model(model, {"x": x})[0])

    config = graph.operations["relu1"].config.output_quantization_config[0]
    codes = np.array([[-3.0, 0.0, 7.0]], np.float32)
    held = Codes(codes.copy(), config)
    assert integer_codes(config, held, on_grid=True) is held.codes()   # read as they are
    values = held.values()
    np.testing.assert_array_equal(values, config.dequantize(codes.astype(np.int64) + int(config.offset)))
    assert held.codes() is None and held.values() is values                # once, in place
    np.testing.assert_array_equal(integer_codes(config, held), codes)      # recovered from the values


def _expansion_model(seed: int, saturated: bool = False) -> onnx.ModelProto:
    """MobileNetV2-like: stem Conv, depthwise, projection 1x1 (its result channels-last), then an
    expansion 1x1 -> Clip -> depthwise (stride 2) -> Clip -> projection, GlobalAveragePool.
    ``saturated``: a channel of the expansion and one of the depthwise conv have tiny weights under a
    large bias (EfficientNet has such channels): int32 bias codes saturated, sums wrapping around (the
    depthwise conv reads a Clip's output, whose exact zeros make sums of 0 that wrap only with a bias
    code of 2^31, not with onnxruntime's 2^31 - 1)."""
    rng = np.random.default_rng(seed)
    tiny = {"w4": 3, "w5": 5} if saturated else {}
    large = {"b4": (3, -40.0), "b5": (5, 2.5)} if saturated else {}

    def weight(name, *shape, scale=0.3):
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name in tiny:
            value[tiny[name]] *= 1e-6
        if name in large:
            value[large[name][0]] = large[name][1]
        return numpy_helper.from_array(value, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"], name="clip1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8, name="dw1"),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="project1"),
        helper.make_node("Conv", ["c3", "w4", "b4"], ["c4"], name="expand"),
        helper.make_node("Clip", ["c4", "lo", "hi"], ["r4"], name="clip4"),
        helper.make_node("Conv", ["r4", "w5", "b5"], ["c5"], pads=[1, 1, 1, 1], strides=[2, 2], group=24,
                         name="dw2"),
        helper.make_node("Clip", ["c5", "lo", "hi"], ["r5"], name="clip5"),
        helper.make_node("Conv", ["r5", "w6", "b6"], ["c6"], name="project2"),
        helper.make_node("GlobalAveragePool", ["c6"], ["y"], name="gap"),
    ]
    initializers = [weight("w1", 8, 3, 3, 3), weight("b1", 8, scale=0.1), weight("w2", 8, 1, 3, 3),
                    weight("b2", 8, scale=0.1), weight("w3", 6, 8, 1, 1), weight("b3", 6, scale=0.1),
                    weight("w4", 24, 6, 1, 1), weight("b4", 24, scale=0.1), weight("w5", 24, 1, 3, 3),
                    weight("b5", 24, scale=0.1), weight("w6", 8, 24, 1, 1), weight("b6", 8, scale=0.1),
                    numpy_helper.from_array(np.array(0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(nodes, "expansion",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 1, 1])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), saturated=st.booleans())
def test_integer_expansion_chain_runs_bit_for_bit(seed, saturated, tmp_path_factory):
    """The quantized expansion -> Clip -> depthwise -> Clip, and the projection after it, run as one kernel on
    codes (``integer_chains``), and equal onnxruntime and the ops run one by one (a hook) bit for bit."""
    from ppqlike.executor import OperationHook
    from ppqlike.executor import chains as chains_module
    tmp_path = tmp_path_factory.mktemp("chain")
    rng = np.random.default_rng(seed)
    onnx.save(_expansion_model(seed, saturated), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((8, 3, 16, 16)).astype(np.float32) * 2 for _ in range(2)]
    with pytest.MonkeyPatch.context() as patch:
        if saturated:   # biases left saturated, as a model quantized elsewhere and imported can have them
            from ppqlike.optim.passes.bias_range import Int32BiasRangePass
            patch.setattr(Int32BiasRangePass, "optimize", lambda self, graph, **kwargs: {})
        graph = _quantize(str(tmp_path / "m.onnx"), calibration, platform="ORT_INT8")
    model = onnx.load(api.export_ppq_graph(graph, "ORT_INT8", tmp_path / "q.onnx")[0])
    if saturated:   # the chain's convs have "bias apart" accumulators, with channels that may wrap
        step = graph.operations["expand"]
        codes = _chain_codes(step, graph)
        assert codes.bias_high is not None and codes.wide.size
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32) * 2
    executor = NumpyExecutor(graph)
    with pytest.MonkeyPatch.context() as patch:   # hypothesis: no function-scoped fixture
        ran = _recorded(patch, "expand_then_depthwise_codes", chains_module,
                        lambda arguments, result: (len(arguments) == 7, result is not None))
        chained = executor.forward(x)[0]
    assert ran[0] == (True, True)   # with the projection
    np.testing.assert_array_equal(chained, run_qdq_model(model, {"x": x})[0])
    np.testing.assert_array_equal(chained, executor.forward(x, hooks=[OperationHook()])[0])


def _chain_codes(operation, graph):
    from ppqlike.executor.integer_chains import conv_codes
    from ppqlike.executor.simulation import quantize_inputs
    arguments = quantize_inputs(operation, [None] + [v.value for v in operation.inputs[1:]])
    return conv_codes(operation, arguments, np.array([0.0, 6.0], np.float32))


@pytest.mark.parametrize("platform, runtime_kernels", [("TRT_INT8", True), ("ORT_INT8", False)])
def test_fake_quantized_expansion_chain_runs_as_one_kernel(platform, runtime_kernels, tmp_path, monkeypatch):
    """Where the convs run float kernels (TensorRT-style fake quantization, or onnxruntime's QDQ
    semantics), the chain runs ``expand_then_depthwise`` with each block clipped and fake-quantized in
    cache, the projection after it inside too; the stem Conv and its Clip quantize in the conv kernel's
    blocks; equal to the ops run one by one bit for bit, and close to onnxruntime running the QDQ
    export unoptimized."""
    from ppqlike.executor import OperationHook
    from ppqlike.executor import chains as chains_module
    rng = np.random.default_rng(3)
    onnx.save(_expansion_model(3), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((8, 3, 16, 16)).astype(np.float32) * 2 for _ in range(2)]
    graph = _quantize(str(tmp_path / "m.onnx"), calibration, platform=platform)
    model = onnx.load(api.export_ppq_graph(graph, platform, tmp_path / "q.onnx")[0])
    ran = _recorded(monkeypatch, "expand_then_depthwise", chains_module,
                    lambda arguments, result: (len(arguments) == 7 and arguments[6] is not None, result is not None))
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32) * 2
    executor = NumpyExecutor(graph, runtime_kernels=runtime_kernels)
    chained = executor.forward(x)[0]
    assert ran == [(True, True)]   # with the projection
    np.testing.assert_array_equal(chained, executor.forward(x, hooks=[OperationHook()])[0])
    step = float(graph.operations["gap"].config.output_quantization_config[0].scale)
    deployed = run_qdq_model(model, {"x": x}, optimization="disable")[0]
    assert np.max(np.abs(chained - deployed)) <= 4 * step


@settings(max_examples=300, deadline=None)
@given(products=st.integers(-(2 ** 24) + 2 ** 8 + 1, 2 ** 24 - 2 ** 8 - 1), bias=st.integers(-(2 ** 31), 2 ** 31 - 1))
def test_bias_added_apart_rounds_once(products, bias):
    """The "bias apart" split: with h = float32(bias) and l = bias - h, float32(products + l) is exact
    and float32(that + h) is the one rounding of the exact sum, float32(products + bias)."""
    high = np.float32(bias)
    low = np.float32(bias - float(high))
    assert float(low) == bias - float(high) and abs(float(low)) <= 2 ** 7
    exact_low = np.float32(products) + low
    assert float(exact_low) == products + float(low)
    assert exact_low + high == np.float32(float(products + bias))


def _fire_model(seed: int) -> onnx.ModelProto:
    """SqueezeNet-like: Conv+Relu, MaxPool, a fire module (squeeze 1x1+Relu, expand 1x1+Relu and 3x3+Relu,
    Concat), Conv, GlobalAveragePool, Flatten."""
    weight = _weight_maker(np.random.default_rng(seed))

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="squeeze"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="expand1"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r2", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1], name="expand3"),
        helper.make_node("Relu", ["c4"], ["r4"], name="relu4"),
        helper.make_node("Concat", ["r3", "r4"], ["cat"], axis=1, name="concat"),
        helper.make_node("Conv", ["cat", "w5", "b5"], ["c5"], name="head"),
        helper.make_node("GlobalAveragePool", ["c5"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["y"], name="flatten"),
    ]
    initializers = [weight("w1", 8, 3, 3, 3), weight("b1", 8, scale=0.1), weight("w2", 4, 8, 1, 1),
                    weight("b2", 4, scale=0.1), weight("w3", 6, 4, 1, 1), weight("b3", 6, scale=0.1),
                    weight("w4", 6, 4, 3, 3), weight("b4", 6, scale=0.1), weight("w5", 10, 12, 1, 1),
                    weight("b5", 10, scale=0.1)]
    graph = helper.make_graph(nodes, "fire",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 17, 17])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _moved_codes(monkeypatch) -> list:
    """(op type, ``fusion.run_on_codes``'s result) of every op the executor tries to run on codes."""
    from ppqlike.executor import executor as executor_module
    return _recorded(monkeypatch, "run_on_codes", executor_module,
                     record=lambda arguments, result: (arguments[0].type, result))


def test_ops_that_move_values_move_codes(tmp_path, monkeypatch):
    """MaxPool, Concat (inputs on one grid) and Flatten between integer kernels run on the codes
    (``fusion.run_on_codes``): equal to onnxruntime and to the hooked run bit for bit, intermediate
    values included."""
    from ppqlike.executor import OperationHook
    rng = np.random.default_rng(4)
    onnx.save(_fire_model(4), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((8, 3, 17, 17)).astype(np.float32) * 2 for _ in range(2)]
    graph = _quantize(str(tmp_path / "m.onnx"), calibration, platform="ORT_INT8")
    model = onnx.load(api.export_ppq_graph(graph, "ORT_INT8", tmp_path / "q.onnx")[0])
    moved = _moved_codes(monkeypatch)
    x = rng.standard_normal((4, 3, 17, 17)).astype(np.float32) * 2
    executor = NumpyExecutor(graph)
    names = ["p1", "cat", "y"]
    plain = executor.forward(x, output_names=names)
    assert sorted(kind for kind, result in moved if result is not None) == ["Concat", "Flatten", "MaxPool"]
    hooked = executor.forward(x, output_names=names, hooks=[OperationHook()])
    for name, a, b in zip(names, plain, hooked):
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(plain[-1], run_qdq_model(model, {"x": x})[0])


@pytest.mark.parametrize("platform", ["TRT_INT8", "NXP_INT8"])
def test_values_moved_onto_their_grid_are_not_quantized_again(tmp_path, monkeypatch, platform):
    """In the float simulation a Concat whose inputs lie on its output grid is not fake-quantized again
    (``fusion.moves_grid``): its results equal the hooked run's, which quantizes every op's output, bit for
    bit."""
    from ppqlike.executor import OperationHook
    from ppqlike.executor import executor as executor_module
    rng = np.random.default_rng(5)
    onnx.save(_fire_model(5), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((8, 3, 17, 17)).astype(np.float32) * 2 for _ in range(2)]
    graph = _quantize(str(tmp_path / "m.onnx"), calibration, platform=platform)
    on_grid = _recorded(monkeypatch, "moves_grid", executor_module,
                        record=lambda arguments, result: (arguments[0].type, result))
    x = rng.standard_normal((4, 3, 17, 17)).astype(np.float32) * 2
    executor = NumpyExecutor(graph)
    names = ["p1", "cat", "y"]
    plain = executor.forward(x, output_names=names)
    assert ("Concat", True) in on_grid
    hooked = executor.forward(x, output_names=names, hooks=[OperationHook()])
    for name, a, b in zip(names, plain, hooked):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_moves_grid_needs_one_per_tensor_grid_the_output_keeps():
    """``fusion.moves_grid``: a Concat's result skips its output quantization only when every input lies
    on one per-tensor grid (after its input config, or as its producer left it) that the output config,
    rounding to nearest, keeps."""
    from ppqlike.core.ir import Operation
    from ppqlike.core.quant_operation import OperationQuantizationConfig
    from ppqlike.core.quant import (QuantizationProperty, QuantizationStates,
                                    RoundingPolicy, TensorQuantizationConfig)
    from ppqlike.executor.fusion import moves_grid
    from ppqlike.executor.simulation import grid_key
    per_tensor = QuantizationProperty.SYMMETRICAL | QuantizationProperty.LINEAR | QuantizationProperty.PER_TENSOR

    def config(scale, rounding=RoundingPolicy.ROUND_HALF_EVEN, state=QuantizationStates.ACTIVATED):
        return TensorQuantizationConfig(per_tensor, rounding=rounding, scale=scale, state=state)

    def concat(inputs, output):
        operation = Operation("cat", "Concat")
        operation.config = OperationQuantizationConfig(inputs, [output])
        return operation
    on_half, on_third = grid_key(config(0.5)), grid_key(config(1 / 3))
    passing = [config(0.5, state=QuantizationStates.FP32), config(0.5, state=QuantizationStates.FP32)]
    assert moves_grid(concat([config(0.5), config(0.5)], config(0.5)), ("a", "b"), {})
    assert moves_grid(concat(passing, config(0.5)), ("a", "b"), {"a": on_half, "b": on_half})
    assert not moves_grid(concat(passing, config(0.5)), ("a", "b"), {"a": on_half, "b": on_third})
    assert not moves_grid(concat(passing, config(0.5)), ("a", "b"), {"a": on_half})
    assert not moves_grid(concat([config(0.5), config(1 / 3)], config(0.5)), ("a", "b"), {})
    assert not moves_grid(concat([config(0.5), config(0.5)], config(1 / 3)), ("a", "b"), {})
    assert not moves_grid(concat([config(0.5), config(0.5)], config(0.5, RoundingPolicy.ROUND_UP)), ("a", "b"), {})
    add = concat([config(0.5), config(0.5)], config(0.5))
    add.type = "Add"                             # arithmetic: its results are not its inputs' elements
    assert not moves_grid(add, ("a", "b"), {})


def test_codes_move_through_reshape_read_by_shape(tmp_path, monkeypatch):
    """A transformer's Reshape takes its target shape from a Shape of the value it reshapes: the Shape
    reads the codes' shape, the Reshape and Transpose move codes, the float inputs reach the integer
    kernels as codes (``quantize_inputs(as_codes=True)``); bit for bit with onnxruntime and the hooked run."""
    from ppqlike.executor import OperationHook
    rng = np.random.default_rng(8)
    weight = _weight_maker(rng)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["b1", "h"], ["a"], name="bias"),
             helper.make_node("Shape", ["a"], ["s"], name="shape"),
             helper.make_node("Reshape", ["a", "s"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("MatMul", ["t", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "attention-like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8])],
                              [weight("w1", 16, 16), weight("b1", 16, scale=0.1), weight("w2", 6, 8)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((64, 6, 16)).astype(np.float32) for _ in range(2)]
    quantized = _quantize(str(tmp_path / "m.onnx"), calibration, platform="ORT_INT8")
    model = onnx.load(api.export_ppq_graph(quantized, "ORT_INT8", tmp_path / "q.onnx")[0])
    moved = _moved_codes(monkeypatch)
    x = rng.standard_normal((1024, 6, 16)).astype(np.float32)
    executor = NumpyExecutor(quantized)
    plain = executor.forward(x)[0]
    assert sorted(kind for kind, result in moved if result is not None) == ["Reshape", "Transpose"]
    np.testing.assert_array_equal(plain, executor.forward(x, hooks=[OperationHook()])[0])
    np.testing.assert_array_equal(plain, run_qdq_model(model, {"x": x})[0])


@pytest.mark.parametrize("platform", ["TRT_INT8", "PPL_CUDA_INT8", "ORT_INT8", "TPU_INT8", "TIDL_INT8", "NXP_INT8",
                                      "DSP_INT8", "ACADEMIC_INT8", "ACADEMIC_W4A8"])
def test_fused_run_equals_the_op_by_op_run(platform, tmp_path):
    """Whatever the executor fuses, chains or hands on as codes without hooks, the graph computes what
    it computes op by op (a hook turns every shortcut off) - on every platform, bit for bit.  TPU_INT8's
    convs requantize their accumulator before the Relu/Clip after them, which must then not fuse."""
    from ppqlike.executor import OperationHook
    rng = np.random.default_rng(12)
    onnx.save(_expansion_model(12), tmp_path / "m.onnx")
    calibration = [rng.standard_normal((8, 3, 16, 16)).astype(np.float32) * 2 for _ in range(2)]
    graph = _quantize(str(tmp_path / "m.onnx"), calibration, platform=platform)
    x = rng.standard_normal((64, 3, 16, 16)).astype(np.float32) * 2
    executor = NumpyExecutor(graph)
    np.testing.assert_array_equal(executor.forward(x)[0], executor.forward(x, hooks=[OperationHook()])[0])
    if platform == "TPU_INT8":   # the conv's output config quantizes (OVERLAPPED, with a requantization)
        from ppqlike.executor.fusion import configs_let_fuse
        assert not configs_let_fuse(graph.operations["expand"], graph.operations["clip4"])
