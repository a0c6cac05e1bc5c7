"""TPU_INT8's computing ops run on integer codes (``executor.requantizing_kernels``): the exact accumulator,
requantized by the integer multiplier and shift.  ``Requantize`` equals the int64 formula on any block
layout; whole models equal the float simulation (``runtime_kernels=False``: the float op, the accumulator
recovered from its result) and the ops run one by one (a hook), bit for bit - on hand-made graphs that take
each path (float32 sums, float64 sums, dead channels computed on int64) and on the shared models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from ppqlike import api
from ppqlike.core import numerics
from ppqlike.core.quant import QuantizationStates, RoundingPolicy, TensorQuantizationConfig
from ppqlike.core.quant_policy import QuantizationProperty
from ppqlike.core.requantization import IntegerRequantization
from ppqlike.executor import NumpyExecutor, OperationHook
from ppqlike.executor import requantizing_kernels
from ppqlike.executor.requantizing_kernels import requantization_of, wants_requantizing_kernel

from shared_bench import load_images, requires_bench
from test_onnxruntime_kernels import _model


def _output_config(multiplier, shift, policy, grid) -> TensorQuantizationConfig:
    quant_min, quant_max, offset = grid
    config = TensorQuantizationConfig(QuantizationProperty.ASYMMETRICAL | QuantizationProperty.LINEAR |
                                      QuantizationProperty.PER_TENSOR, policy, 8, quant_min, quant_max,
                                      scale=np.float32(0.05), offset=offset, state=QuantizationStates.ACTIVATED)
    config.requantization = IntegerRequantization.from_arrays(multiplier, shift, np.ones(len(multiplier)), 1)
    return config


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 31), ratio_exponent=st.integers(-20, -3), largest=st.sampled_from([300, 2 ** 23]),
       policy=st.sampled_from(list(RoundingPolicy)),
       grid=st.sampled_from([(-128, 127, 0), (0, 255, 128), (-127, 127, 0)]),
       layout=st.sampled_from(["pixel rows", "channels first", "channels_first()", "whole"]), clamped=st.booleans(),
       dead=st.booleans(), with_ties=st.booleans(), bias_apart=st.booleans())
def test_requantize_equals_the_int64_formula(seed, ratio_exponent, largest, policy, grid, layout, clamped, dead,
                                             with_ties, bias_apart):
    """q - z = clamp(round((P + B) * M0 * 2^-shift), low, high) for every policy, grid and shift, ties in
    range (a power-of-two ratio) and dead channels (a tiny ratio: a long shift, computed on int64) included,
    on blocks of several pixels a row, channels-first views, or a whole accumulator; the bias B in the
    accumulators or added by ``Requantize`` ("bias apart")."""
    rng = np.random.default_rng(seed)
    channels = 5
    ratios = 2.0 ** ratio_exponent * rng.uniform(0.5, 1.0, channels)
    if with_ties:
        ratios[0] = 2.0 ** ratio_exponent
    if dead:
        ratios[3] = 2.0 ** -30 * rng.uniform(0.5, 1.0)   # shift 61
    multiplier, shift = numerics.scale_to_multiplier_shift(ratios)
    config = _output_config(multiplier, shift, policy, grid)
    quant_min, quant_max, offset = grid
    low, high = (quant_min - offset + 7, quant_max - offset - 3) if clamped else (quant_min - offset,
                                                                                quant_max - offset)
    bounds = np.full(channels, float(largest))
    if dead:
        bounds[3] = 2.0 ** 31   # its float64 t may round wrongly: the int64 path
    bias = rng.integers(-2 ** 20, 2 ** 20, channels)
    if with_ties:
        bias[0] = 0   # keeps t = odd / 2
    float32_sums = largest < 2 ** 23 and not dead   # the accumulators come as float32
    requantize = requantization_of(config, bounds, bias, (float(low), float(high)) if clamped else None,
                                   bias_apart=bias_apart, float32_sums=float32_sums)
    if dead:
        assert 3 in requantize.exact
    if ratio_exponent > -14 or largest < 2 ** 10:   # shift + 8 <= 53, or |acc| * M0 < 2^53: float64 alone
        assert set(requantize.exact) <= {3}
    acc = rng.integers(-largest, largest + 1, (3, 4, 6, channels))
    if with_ties:   # acc * ratio = odd / 2
        acc[..., 0] = (2 * rng.integers(-100, 100, (3, 4, 6)) + 1) << (-ratio_exponent - 1)
        acc[..., 0] = np.clip(acc[..., 0], -largest, largest)
    if dead:
        acc[..., 3] = rng.integers(-2 ** 31, 2 ** 31, (3, 4, 6), dtype=np.int64)
    expected = numerics.requantize(acc + bias, multiplier, shift, 0, low, high, policy, channel_axis=3)
    if not bias_apart:   # the bias in the accumulators
        acc = acc + bias
    values = acc.astype(np.float32 if np.abs(acc).max() < 2 ** 24 else np.float64)
    if layout == "pixel rows":   # channels-last rows of 6 pixels
        got = np.empty(values.shape, np.float32).reshape(12, 6 * channels)
        requantize(values.reshape(12, 6 * channels), got)
        got = got.reshape(values.shape)
    elif layout == "channels first":
        first = np.ascontiguousarray(np.moveaxis(values, 3, 1))
        got = np.empty(first.shape, np.float32)
        requantize(np.moveaxis(first, 1, -1), np.moveaxis(got, 1, -1))
        got = np.moveaxis(got, 1, -1)
    elif layout == "channels_first()":   # NCHW in place, as the conv kernels hand it over
        got = np.ascontiguousarray(np.moveaxis(values, 3, 1)).astype(np.float32 if values.dtype == np.float32
                                                                       else np.float64)
        requantize.channels_first(got)
        got = np.moveaxis(got, 1, -1)
    else:
        got = requantize.whole(np.moveaxis(values, 3, 1), 1)
        got = np.moveaxis(got, 1, -1)
    np.testing.assert_array_equal(got, expected.astype(np.float32))


@pytest.mark.parametrize("center,clamp,exact", [(0.3, None, False), (-2.25, None, False), (3.0, (-1.0, 1.0), False),
                                                (0.5, None, True), (-2.5, None, True), (1.5, (-1.0, 1.0), True)])
def test_dead_channels_take_int64_only_where_a_rounding_boundary_is_within_reach(center, clamp, exact):
    """A channel whose float64 t may round wrongly (a long shift, a wide bias B) is computed on int64 only when
    (B +- max|P|) * ratio reaches a half integer inside the clamp range: a dead channel's t barely moves."""
    multiplier, shift = numerics.scale_to_multiplier_shift(np.array([2.0 ** -30 * 0.75, 0.01]))
    ratio = multiplier[0] / 2.0 ** shift[0]
    bias = np.array([round(center / ratio), 5])
    config = _output_config(multiplier, shift, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO, (-128, 127, 0))
    products = np.array([2.0 ** 12, 2.0 ** 12])
    requantize = requantization_of(config, products, bias, clamp, bias_apart=True)
    assert (0 in requantize.exact) == exact and 1 not in requantize.exact
    acc = np.random.default_rng(0).integers(-2 ** 12, 2 ** 12, (50, 2))
    got = np.empty(acc.shape, np.float32)
    requantize(acc.astype(np.float32), got)
    low, high = (-128, 127) if clamp is None else clamp
    np.testing.assert_array_equal(got, numerics.requantize(acc + bias, multiplier, shift, 0, int(low), int(high),
                                                           RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO, channel_axis=1))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 31), ratio_exponent=st.integers(-13, -2), bias_apart=st.booleans(),
       policy=st.sampled_from([RoundingPolicy.ROUND_HALF_EVEN, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
                               RoundingPolicy.ROUND_HALF_UP]),
       clamp=st.sampled_from([(-128.0, 127.0), (0.0, 127.0), (0.0, 30.0)]), power_of_two=st.booleans())
def test_float32_requantization_is_proven_only_where_every_accumulator_agrees(seed, ratio_exponent, bias_apart,
                                                                               policy, clamp, power_of_two):
    """``float32_ratios``: every channel it proves gives the int64 formula's code for every reachable P (all
    of them tried here), in the float32 computation ``Requantize`` runs; channels it does not prove exist
    (the proof is not vacuous)."""
    from ppqlike.executor.float32_requantization import _float32_codes, float32_ratios
    rng = np.random.default_rng(seed)
    channels = 24
    ratios = 2.0 ** ratio_exponent * rng.uniform(0.5, 1.0, channels)
    if power_of_two:
        ratios[:4] = 2.0 ** ratio_exponent   # ties in range
    multiplier, shift = numerics.scale_to_multiplier_shift(ratios)
    bounds = rng.integers(1, 2 ** 12, channels).astype(np.float64)
    bias = rng.integers(-2 ** 14, 2 ** 14, channels).astype(np.float64)
    low, high = clamp
    chosen, offset, proven = float32_ratios(multiplier, shift, bounds, bias, low, high, policy, bias_apart)
    products = np.arange(-2 ** 12, 2 ** 12 + 1, dtype=np.int64)
    for channel in np.flatnonzero(proven):
        reachable = products[np.abs(products) <= bounds[channel]]
        exact = numerics.requantize(reachable + int(bias[channel]), int(multiplier[channel]), int(shift[channel]), 0,
                                    int(low), int(high), policy)
        source = (reachable if bias_apart else reachable + int(bias[channel])).astype(np.float32)[None, :]
        codes = _float32_codes(source, chosen[channel:channel + 1],
                               None if offset is None else offset[channel:channel + 1], low, high)
        np.testing.assert_array_equal(codes[0], exact.astype(np.float32))
    note = (int(proven.sum()), channels)
    assert proven.any() or ratio_exponent < -10, note


def test_float32_requantization_leaves_some_channels_to_float64():
    """Small ratios (many accumulators per code) over a wide range: float32's 24 bits do not reach some
    channels' boundaries, which the proof then leaves to float64."""
    from ppqlike.executor.float32_requantization import float32_ratios
    rng = np.random.default_rng(0)
    ratios = 2.0 ** -14 * rng.uniform(0.5, 1.0, 64)
    multiplier, shift = numerics.scale_to_multiplier_shift(ratios)
    _, _, proven = float32_ratios(multiplier, shift, np.full(64, 2.0 ** 22), np.zeros(64), -128.0, 127.0,
                                  RoundingPolicy.ROUND_HALF_EVEN, False)
    assert 0 < proven.sum() < 64


@pytest.mark.parametrize("bias_apart", [False, True])
def test_mixed_requantization_of_a_few_unproven_channels(bias_apart, monkeypatch):
    """An op with some channels float32 cannot be proven for: float32 for the block, float64 for those
    channels' columns; equal to the int64 formula at every accumulator next to a rounding boundary (where
    float32 goes wrong in the unproven channels) and at random ones, on rows of several pixels."""
    monkeypatch.setattr(requantizing_kernels, "_MIXED_SHARE", 0.5)
    rng = np.random.default_rng(0)
    channels = 64
    multiplier, shift = numerics.scale_to_multiplier_shift(2.0 ** -10 * rng.uniform(0.5, 1.0, channels))
    config = _output_config(multiplier, shift, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO, (-128, 127, 0))
    bounds = np.full(channels, 2.0 ** 18)
    bias = rng.integers(-2 ** 10, 2 ** 10, channels)
    requantize = requantization_of(config, bounds, bias, None, bias_apart=bias_apart, float32_sums=True)
    assert requantize.in_float32 is not None and requantize.rest is not None
    assert 0 < requantize.rest[0].size < channels // 2
    ratio = multiplier / 2.0 ** shift
    halves = np.arange(-128.5, 128.0)
    near = np.floor(halves[:, None] / ratio[None, :] - bias)[:, None, :] + np.arange(-1, 3)[None, :, None]
    products = np.concatenate([near.reshape(-1, channels), rng.integers(-2 ** 18, 2 ** 18, (40, channels))])
    products = np.clip(products, -2 ** 18, 2 ** 18).astype(np.int64)[:1040]   # rows of 8 pixels below
    expected = numerics.requantize(products + bias, multiplier, shift, 0, -128, 127,
                                   RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO, channel_axis=1)
    values = (products if bias_apart else products + bias).astype(np.float32).reshape(130, 8 * channels)
    got = np.empty_like(values)
    requantize(values, got)
    np.testing.assert_array_equal(got.reshape(-1, channels), expected.astype(np.float32))
    first = np.ascontiguousarray(values.reshape(130, 8, channels).transpose(0, 2, 1))   # [images, channels, pixels]
    requantize.channels_first(first)
    np.testing.assert_array_equal(first.transpose(0, 2, 1).reshape(-1, channels), expected.astype(np.float32))


def _wide_model(seed: int) -> onnx.ModelProto:
    """A 1x1 Conv over 1200 channels (partial sums past 2^24: summed in float64) with a dead output
    channel (a tiny weight: a long shift), a Relu, then a 3x3 Conv with a bias."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((6, 1200, 1, 1)).astype(np.float32)
    wide[2] *= 1e-7
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="wide"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    initializers = [numpy_helper.from_array(wide, "w1"),
                    numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1"),
                    numpy_helper.from_array(rng.standard_normal((4, 6, 3, 3)).astype(np.float32), "w2"),
                    numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2")]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1200, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 5])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _attention_model(seed: int) -> onnx.ModelProto:
    """A transformer's products, large enough to be cut over the kernel threads: tokens by a weight, then the
    result by its own transpose (an activation by an activation)."""
    weight = np.random.default_rng(seed).standard_normal((96, 128)).astype(np.float32) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="linear"),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("MatMul", ["m", "t"], ["y"], name="scores")]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256, 256])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _expansion_model(seed: int) -> onnx.ModelProto:
    """A MobileNetV2 block: 1x1 expansion + Relu, depthwise 3x3 + Clip, 1x1 projection (one integer chain)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="expand"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=24, name="depthwise"),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="project")]
    arrays = {"w1": (24, 8, 1, 1), "b1": (24,), "w2": (24, 1, 3, 3), "b2": (24,), "w3": (8, 24, 1, 1), "b3": (8,)}
    initializers = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.5, name)
                    for name, shape in arrays.items()]
    initializers += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                     numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(nodes, "block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 12, 12])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _kept_chain_case(tmp_path, monkeypatch, platform: str, kernel: str, change):
    """A MobileNetV2 block quantized for ``platform``, run twice through its chain (the ``chains`` function
    ``kernel``), ``change(graph)`` between the two: (the second result, the first, the graph, the input)."""
    from ppqlike.executor import chains
    path = tmp_path / "block.onnx"
    onnx.save(_expansion_model(8), path)
    rng = np.random.default_rng(9)
    graph = api.quantize_onnx_model(str(path), [rng.standard_normal((2, 8, 12, 12)).astype(np.float32)],
                                    platform=platform)
    ran = []
    original = getattr(chains, kernel)
    monkeypatch.setattr(chains, kernel, lambda *a: ran.append(original(*a)) or ran[-1])
    x = np.ascontiguousarray(rng.standard_normal((2, 12, 12, 8)).astype(np.float32)).transpose(0, 3, 1, 2)
    executor = NumpyExecutor(graph)   # (channels-last, as a conv stack hands it on: the chain's layout)
    before = executor.forward(x)[0]
    change(graph)
    after = executor.forward(x)[0]
    assert len(ran) == 2 and all(out is not None for out in ran)   # the chain ran both times
    assert not np.array_equal(after, before)
    return after, graph, x


def test_a_kept_integer_chain_follows_its_configs(tmp_path, monkeypatch):
    """What an integer chain computes with is kept across forwards under its configs' revisions: a changed
    requantization between two forwards is what the second one computes with, as the float simulation."""
    from ppqlike.core.quant_graph import output_config

    def change(graph):
        config = output_config(graph.operations["depthwise"])
        facts, revision = config.requantization, config.revision
        config.requantization = IntegerRequantization.from_arrays(
            np.asarray(facts.multiplier) * 3 // 4, facts.right_shift, facts.accumulator_scale, facts.channel_axis)
        assert config.revision != revision
    after, graph, x = _kept_chain_case(tmp_path, monkeypatch, "TPU_INT8", "expand_then_depthwise_codes", change)
    np.testing.assert_array_equal(after, NumpyExecutor(graph, runtime_kernels=False).forward(x)[0])


def test_a_kept_float_chain_follows_its_configs(tmp_path, monkeypatch):
    """A float chain's epilogues and weights are kept across forwards the same way: a scale changed between
    two forwards is what the second one quantizes with, as the ops run one by one (hooked) do."""
    from ppqlike.core.quant import QuantizationStates

    def change(graph):
        outputs = [tqc for name in ("relu", "clip") for tqc in graph.operations[name].config.output_quantization_config]
        config = next(tqc for tqc in outputs if tqc is not None and tqc.state is QuantizationStates.ACTIVATED)
        config.scale = np.float32(config.scale) * np.float32(1.75)
    after, graph, x = _kept_chain_case(tmp_path, monkeypatch, "TRT_INT8", "expand_then_depthwise", change)
    np.testing.assert_array_equal(after, NumpyExecutor(graph).forward(x, hooks=[OperationHook()])[0])


def _three_ways(graph, x, names):
    """(integer kernels, float simulation, hooked) outputs ``names`` of ``graph`` on ``x``."""
    return (NumpyExecutor(graph).forward(x, output_names=names),
            NumpyExecutor(graph, runtime_kernels=False).forward(x, output_names=names),
            NumpyExecutor(graph).forward(x, output_names=names, hooks=[OperationHook()]))


@pytest.mark.parametrize("make,shape,names", [
    (lambda: _model(5), (4, 3, 12, 12), ["r1", "r2", "s", "y"]),
    (lambda: _wide_model(6), (3, 1200, 5, 5), ["r1", "y"]),
    (lambda: _attention_model(7), (4, 256, 96), ["m", "y"])])
def test_tpu_integer_kernels_equal_the_float_simulation(make, shape, names, tmp_path, monkeypatch):
    """Each requantized op (Conv, depthwise, pointwise, Gemm, MatMul; float32 and float64 sums, a dead channel
    on int64) runs on codes and gives the float simulation's values bit for bit; the graph's outputs too.
    Conv and MatMul results are requantized block by block inside the kernel, never whole."""
    path = tmp_path / "model.onnx"
    onnx.save(make(), path)
    rng = np.random.default_rng(1)
    calibration = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    setting = ppqlike.QuantizationSettingFactory.for_platform("TPU_INT8")
    setting.float_outputs = False   # the last op's integer kernel under test too
    graph = api.quantize_onnx_model(str(path), calibration, platform="TPU_INT8", setting=setting)
    requantized = [op for op in graph.operations.values() if wants_requantizing_kernel(op)]
    assert len(requantized) >= 2
    ran = []
    original = requantizing_kernels.run_requantizing_kernel

    def spy(operation, *arguments, **options):
        result = original(operation, *arguments, **options)
        ran.append((operation.name, result is not None))
        return result
    monkeypatch.setattr("ppqlike.executor.executor.run_requantizing_kernel", spy)
    whole = []
    original_whole = requantizing_kernels.Requantize.whole
    monkeypatch.setattr(requantizing_kernels.Requantize, "whole",
                        lambda self, accumulator, axis: whole.append(accumulator.shape) or original_whole(
                            self, accumulator, axis))
    x = rng.standard_normal(shape).astype(np.float32) * 1.5
    plain, in_float, hooked = _three_ways(graph, x, names)
    assert {name for name, done in ran if done} == {op.name for op in requantized}   # none fell back
    gemms = sum(op.type == "Gemm" for op in requantized)
    assert len(whole) == 2 * gemms   # a Gemm's accumulator is requantized whole (plain and hooked runs)
    for got, floated, want in zip(plain, in_float, hooked):
        np.testing.assert_array_equal(got, floated)
        np.testing.assert_array_equal(want, floated)


@requires_bench
@pytest.mark.parametrize("model", ["mobilenetv2", "squeezenet1.1"])
def test_real_tpu_integer_kernels_equal_the_float_simulation(model):
    """On a shared model, TPU_INT8's integer kernels (expansion chains included) give the float simulation's
    logits bit for bit, and so do the ops run one by one."""
    from shared_bench import PRESETS
    images, _, _ = load_images(model, "calib", 8)
    setting = ppqlike.QuantizationSettingFactory.for_platform("TPU_INT8", recipe="plain")
    graph = api.quantize_onnx_model(PRESETS[model].path, [images], platform="TPU_INT8", setting=setting)
    dev, _, _ = load_images(model, "dev", 4)
    plain, in_float, hooked = _three_ways(graph, dev, None)
    np.testing.assert_array_equal(plain[0].view(np.uint32), in_float[0].view(np.uint32))
    np.testing.assert_array_equal(hooked[0].view(np.uint32), in_float[0].view(np.uint32))
