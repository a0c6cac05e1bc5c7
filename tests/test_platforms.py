"""Each platform's policy shows in the configs it produces on a small graph."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ppqlike
from ppqlike.api import quantize_onnx_model
from ppqlike.core import numerics
from ppqlike.core.quant import QuantizationStates as S, RoundingPolicy
from ppqlike.platforms.policies import PLATFORM_POLICIES
from ppqlike.platforms.target import TargetPlatform
from test_passes import small_model


def quantized(platform, observer=None):
    batches = [np.random.default_rng(i).standard_normal((2, 3, 8, 8)).astype(np.float32) for i in range(3)]
    setting = ppqlike.QuantizationSettingFactory.for_platform(platform)
    if observer:
        setting.activation_observer = observer
    return quantize_onnx_model(small_model(), batches, platform=platform, setting=setting), batches


def configs(graph):
    return [(op, c) for op in graph.operations.values() if op.config is not None for c in op.config.all_configs()]


def activation_roots(graph):
    return [c for op, c in configs(graph) if c.state in (S.ACTIVATED, S.SLAVE) and c.num_of_bits == 8
            and c.baked_value is None]


def is_power_of_two(values):
    exponents = np.log2(np.asarray(values, np.float64))
    return np.allclose(exponents, np.round(exponents))


@pytest.mark.parametrize("platform", ["TIDL_INT8", "NXP_INT8"])
def test_power_of_two_platforms(platform):
    graph, _ = quantized(platform)
    scales = [c.scale for _, c in configs(graph) if c.scale is not None and c.num_of_bits == 8]
    assert scales and all(is_power_of_two(s) for s in scales)
    assert all(c.scale.ndim == 0 for _, c in configs(graph) if c.scale is not None and c.num_of_bits == 8)
    expected = RoundingPolicy.ROUND_HALF_UP if platform == "NXP_INT8" else RoundingPolicy.ROUND_HALF_EVEN
    assert all(c.rounding is expected for _, c in configs(graph))


def test_dsp_weights_and_activations_are_asymmetric_uint8():
    graph, _ = quantized("DSP_INT8")
    weight = graph.operations["conv1"].config.input_quantization_config[1]
    assert weight.state is S.BAKED and weight.scale.ndim == 0 and (weight.quant_min, weight.quant_max) == (0, 255)
    offsets = [int(c.offset) for c in activation_roots(graph)] + [int(weight.offset)]
    assert any(o != 0 for o in offsets)
    add_input = graph.operations["add"].config.output_quantization_config[0]
    assert (add_input.quant_min, add_input.quant_max) == (0, 255)


def test_trt_weights_per_channel_symmetric_and_bias_float():
    graph, _ = quantized("TRT_INT8")
    conv = graph.operations["conv1"].config
    weight = conv.input_quantization_config[1]
    assert weight.policy.per_channel and weight.policy.symmetric and weight.scale.shape == (8,)
    assert np.all(weight.offset == 0) and (weight.quant_min, weight.quant_max) == (-127, 127)
    assert conv.input_quantization_config[2].state is S.FP32  # TensorRT keeps the bias in float
    assert all(int(c.offset) == 0 and c.quant_min == -128 for c in activation_roots(graph))


def test_ort_activations_uint8_and_bias_int32():
    graph, _ = quantized("ORT_INT8")
    conv = graph.operations["conv1"].config
    assert conv.input_quantization_config[2].num_of_bits == 32
    assert conv.input_quantization_config[2].state is S.PASSIVE_BAKED
    assert all(c.quant_min == 0 and c.quant_max == 255 for c in activation_roots(graph))


def test_w4a8_weights_are_four_bit():
    graph, _ = quantized("ACADEMIC_W4A8")
    weight = graph.operations["conv1"].config.input_quantization_config[1]
    assert weight.num_of_bits == 4 and (weight.quant_min, weight.quant_max) == (-8, 7)
    assert not weight.policy.symmetric and weight.offset.shape == weight.scale.shape == (8,)   # a zero point per channel
    codes = weight.baked_value / weight.scale[:, None, None, None] + weight.offset[:, None, None, None]
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)   # every weight on its channel's grid
    assert codes.min() >= -8 - 1e-4 and codes.max() <= 7 + 1e-4
    # min-max ranges: each channel's extremes reach the ends of its 16 levels
    lowest, highest = np.round(codes).reshape(8, -1).min(axis=1), np.round(codes).reshape(8, -1).max(axis=1)
    assert np.all((lowest == -8) | (highest == 7)) and np.all(highest - lowest >= 14), (lowest, highest)


def test_tpu_requantization_is_integer_and_matches_the_formula():
    graph, batches = quantized("TPU_INT8", observer="minmax")
    conv = graph.operations["conv4"]  # not fused: its output config is applied
    output = conv.config.output_quantization_config[0]
    facts = output.requantization
    assert all(isinstance(m, int) for m in facts.multiplier) and all(isinstance(s, int) for s in facts.right_shift)
    assert all(r is RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO for r in [c.rounding for _, c in configs(graph)])
    data, weight, bias = conv.config.input_quantization_config
    # M0 / 2^rshift reproduces S_x * S_w / S_y
    ratio = np.asarray(facts.multiplier, np.float64) / 2.0 ** np.asarray(facts.right_shift)
    exact = np.float64(data.scale) * weight.scale.astype(np.float64) / np.float64(output.scale)
    np.testing.assert_allclose(ratio, exact, rtol=2.0 ** -30)
    # the simulated output equals the integer formula computed here from integers alone
    executor = ppqlike.NumpyExecutor(graph)
    conv_input, conv_output = executor.forward(batches[0], output_names=["cat", "c4"])
    q_x = data.quantize(conv_input).astype(np.int64)
    q_w = np.rint(weight.baked_value / weight.scale[:, None, None, None]).astype(np.int64)
    q_b = np.rint(bias.baked_value / bias.scale).astype(np.int64)
    acc = np.einsum("nchw,oc->nohw", q_x, q_w[:, :, 0, 0]) + q_b[None, :, None, None]
    expected_q = numerics.requantize(acc, np.asarray(facts.multiplier), np.asarray(facts.right_shift), 0,
                                     output.quant_min, output.quant_max, output.rounding, channel_axis=1)
    np.testing.assert_array_equal(output.quantize(conv_output), expected_q)


def test_tpu_activations_clip_the_requantized_outputs_in_place(monkeypatch):
    """Each Relu/Clip after a requantized Conv (TPU: the Conv's output config requantizes, the activation's
    quantizes to the same grid) is one clamp to the grid edges: inside the integer kernel's requantization
    (``requantizing_kernels``, the default), or, with the float kernels (``runtime_kernels=False``), one
    clip of the requantized result in place (``fusion.activate_on_grid``).  Both equal the ops run one by
    one (a hook) bit for bit."""
    from ppqlike.executor import OperationHook
    from ppqlike.executor import executor as executor_module
    graph, batches = quantized("TPU_INT8", observer="minmax")
    calls = []
    original = executor_module.activate_on_grid

    def spy(activation, *arguments):
        result = original(activation, *arguments)
        calls.append((activation.name, result is not None))
        return result
    monkeypatch.setattr(executor_module, "activate_on_grid", spy)
    names = ["r1", "r2", "r3", "y"]
    x = batches[0] * 3
    plain = ppqlike.NumpyExecutor(graph).forward(x, output_names=names)
    assert calls == []   # clamped inside the integer kernels
    in_float = ppqlike.NumpyExecutor(graph, runtime_kernels=False).forward(x, output_names=names)
    assert sorted(calls) == [("clip3", True), ("relu1", True), ("relu2", True)]
    hooked = ppqlike.NumpyExecutor(graph).forward(x, output_names=names, hooks=[OperationHook()])
    for got, floated, want in zip(plain, in_float, hooked):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(floated, want)
    assert plain[0].min() == 0 and (hooked[0] == 0).mean() > 0.2   # the Relu did clip


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), ratio_exponent=st.integers(-18, -2),
       largest=st.sampled_from([200, 40000, 2 ** 22]), policy=st.sampled_from(list(RoundingPolicy)),
       grid=st.sampled_from([(-128, 127, 0), (0, 255, 0), (0, 255, 128), (-127, 127, 0), (-8, 7, 0)]),
       with_ties=st.booleans())
def test_integer_requantization_equals_the_int64_formula(seed, ratio_exponent, largest, policy, grid, with_ties):
    """``requantize_output`` (float64 blocks: without a data check where the shift allows, after one
    otherwise, int64 beyond) equals the int64 multiply, rounding right shift and clamp for every
    rounding policy, grid and shift (2^-20 .. 2^-3 output-to-accumulator ratios: shifts 33 .. 50),
    halfway cases included - and, where no multiplier allows a tie in range, by rint alone."""
    from ppqlike.core.quant import QuantizationStates, TensorQuantizationConfig
    from ppqlike.core.quant_policy import QuantizationProperty
    from ppqlike.core.requantization import IntegerRequantization
    from ppqlike.executor.simulation import requantize_output
    quant_min, quant_max, offset = grid
    rng = np.random.default_rng(seed)
    channels = 6
    accumulator_scale = 2.0 ** ratio_exponent * rng.uniform(0.5, 1.0, channels) * 0.05
    if with_ties:
        accumulator_scale[0] = 2.0 ** ratio_exponent * 0.05   # a power-of-two ratio: M0 = 2^30, ties happen
    multiplier, shift = numerics.scale_to_multiplier_shift(accumulator_scale / 0.05)
    codes = rng.integers(-largest, largest, (2, channels, 9, 9))
    odd = 2 * rng.integers(-largest >> -ratio_exponent, (largest >> -ratio_exponent) + 1, (9, 9)) + 1
    codes[0, 0] = odd << (-ratio_exponent - 1)   # acc * 2^ratio_exponent: halfway between two integers
    value = codes * accumulator_scale.reshape(1, -1, 1, 1)   # float64: the codes stay exact
    facts = IntegerRequantization.from_arrays(multiplier, shift, accumulator_scale, 1)
    config = TensorQuantizationConfig(QuantizationProperty.ASYMMETRICAL | QuantizationProperty.LINEAR |
                                      QuantizationProperty.PER_TENSOR, policy, 8 if quant_max > 7 else 4,
                                      quant_min, quant_max, scale=np.float32(0.05), offset=offset,
                                      state=QuantizationStates.ACTIVATED)
    config.requantization = facts
    assert facts.ties_possible(max(abs(quant_min - offset), abs(quant_max - offset)) + 1) == with_ties
    acc = np.rint(value / accumulator_scale.reshape(1, -1, 1, 1)).astype(np.int64)
    q = numerics.requantize(acc, np.asarray(multiplier), np.asarray(shift), offset, quant_min, quant_max, policy,
                            channel_axis=1)
    np.testing.assert_array_equal(requantize_output(config, value), numerics.dequantize(q, np.float32(0.05), offset))


@settings(max_examples=200, deadline=None)
@given(multiplier=st.integers(-600, 600), shift=st.integers(0, 12), reach=st.integers(1, 40))
def test_ties_possible_is_whether_some_accumulator_is_halfway(multiplier, shift, reach):
    """``IntegerRequantization.ties_possible``: some integer accumulator gives acc * M0 * 2^-shift exactly
    halfway between two integers with |t| < reach - checked against every accumulator that can (|t| < reach
    bounds |acc|)."""
    from fractions import Fraction
    from ppqlike.core.requantization import IntegerRequantization
    facts = IntegerRequantization.from_arrays([multiplier], [shift], [1.0], 1)
    bound = 0 if multiplier == 0 else reach * 2 ** shift // abs(multiplier) + 1
    halfway = any(abs(t) < reach and t.denominator == 2
                  for t in (Fraction(acc * multiplier, 2 ** shift) for acc in range(-bound, bound + 1)))
    assert facts.ties_possible(reach) == halfway


def test_integer_requantization_of_dead_channels_with_long_shifts():
    """A channels-last output (seen as rows of several pixels) with two channels of a tiny accumulator scale,
    as a dead channel has (right shifts past 53 - 8, accumulators near 2^31): their float64 t is checked for
    near ties - one of them has a power-of-two ratio, so exact ties in range - and those channels computed
    in int64; the whole equals the int64 formula."""
    from ppqlike.core.quant import QuantizationStates, TensorQuantizationConfig
    from ppqlike.core.quant_policy import QuantizationProperty
    from ppqlike.core.requantization import IntegerRequantization
    from ppqlike.executor.simulation import requantize_output
    rng = np.random.default_rng(3)
    channels = 24
    accumulator_scale = rng.uniform(1e-4, 1e-3, channels)
    accumulator_scale[5], accumulator_scale[17] = 3e-10, 0.05 * 2.0 ** -27   # M0 = 2^30, shift 57 for the second
    multiplier, shift = numerics.scale_to_multiplier_shift(accumulator_scale / 0.05)
    assert shift[5] + 8 > 53 and shift[17] == 57 and multiplier[17] == 2 ** 30
    multiplier[9], shift[9] = (21 * 2 ** 56 - 15) // 199, 57   # t = 199 * M0 / 2^57 = 10.5 - 15 * 2^-57 (below
    # the half by less than float64's error: its product says 10.5), M0 < 2^53
    codes = rng.integers(-40000, 40000, (4, 10, 10, channels))
    codes[..., 5] = rng.integers(-2 ** 31, 2 ** 31, (4, 10, 10))
    codes[..., 9] = 199
    codes[..., 17] = (2 * rng.integers(-20, 20, (4, 10, 10)) + 1) * 2 ** 26   # t = odd / 2: halfway, in range
    value = codes * accumulator_scale   # float64: the codes stay exact
    facts = IntegerRequantization.from_arrays(multiplier, shift, accumulator_scale, 3)
    config = TensorQuantizationConfig(QuantizationProperty.SYMMETRICAL | QuantizationProperty.LINEAR |
                                      QuantizationProperty.PER_TENSOR, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
                                      8, -128, 127, scale=np.float32(0.05), offset=0,
                                      state=QuantizationStates.ACTIVATED)
    config.requantization = facts
    acc = np.rint(value / accumulator_scale).astype(np.int64)
    q = np.stack([numerics.requantize(acc[..., c], int(multiplier[c]), int(shift[c]), 0, -128, 127,
                                      RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO) for c in range(channels)], axis=-1)
    expected = numerics.dequantize(q, np.float32(0.05), 0)
    np.testing.assert_array_equal(requantize_output(config, value), expected)
    assert np.abs(expected[..., 17]).max() < 127 * 0.05   # the halfway codes lie inside the range
    assert np.all(expected[..., 9] == np.float32(10 * 0.05))   # not 11: t is just below the half


def test_every_platform_has_a_policy_and_quantizes():
    assert set(PLATFORM_POLICIES) == {p for p in TargetPlatform if p.is_quantized}
    for platform in PLATFORM_POLICIES:
        graph, batches = quantized(platform.name, observer="minmax")
        assert np.isfinite(ppqlike.NumpyExecutor(graph).forward(batches[0])[0]).all()


def test_dequantized_turns_off_integer_requantization_too():
    from ppqlike.executor.simulation import dequantized
    from onnx_helpers import run_onnxruntime
    graph, batches = quantized("TPU_INT8", observer="minmax")
    executor = ppqlike.NumpyExecutor(graph)
    with dequantized(graph):
        fp32 = executor.forward(batches[0])[0]
    np.testing.assert_allclose(fp32, run_onnxruntime(small_model(), {"x": batches[0]})[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(executor.forward(batches[0])[0], fp32, atol=1e-6)


@pytest.mark.parametrize("shape, axis, channels, largest", [
    ((3, 40, 30, 30), 1, 40, 40000), ((2, 197, 384), 2, 384, 40000), ((3, 8, 100, 100), 1, 8, 40000),
    ((5, 7, 3000), 1, 1, 40000), ((3, 40, 30, 30), 1, 40, 2 ** 23)])
def test_integer_requantization_of_large_outputs_in_blocks(shape, axis, channels, largest):
    """The TPU-style requantization of an output of many cache blocks (per channel along the image
    channels or the last axis, a channel of many blocks, per tensor; accumulators whose products with
    the multiplier stay below 2^53, run in float64, and larger ones, run in int64) equals the formula
    on the whole array: acc = rint(y / S_acc), requantized with the integer multiplier and shift in
    int64, dequantized."""
    from ppqlike.core.quant import QuantizationStates, TensorQuantizationConfig
    from ppqlike.core.quant_policy import QuantizationProperty
    from ppqlike.core.requantization import IntegerRequantization
    from ppqlike.executor.simulation import requantize_output
    rng = np.random.default_rng(9)
    accumulator_scale = rng.uniform(1e-4, 1e-3, channels)
    codes = rng.integers(-largest, largest, shape)
    codes.reshape(-1)[:50] = (np.arange(50) - 25) * 2 ** 12 + 2 ** 11   # halfway cases for the right shift
    along = [1] * len(shape)
    along[axis] = channels
    value = (codes * accumulator_scale.reshape(along)).astype(np.float32)
    if largest > 2 ** 20:
        value = (codes * accumulator_scale.reshape(along)).astype(np.float64)   # float64: codes stay exact
    multiplier, shift = numerics.scale_to_multiplier_shift(accumulator_scale / 0.05)
    facts = IntegerRequantization.from_arrays(multiplier, shift, accumulator_scale, axis)
    config = TensorQuantizationConfig(QuantizationProperty.SYMMETRICAL | QuantizationProperty.LINEAR |
                                      QuantizationProperty.PER_TENSOR, RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO,
                                      8, -128, 127, scale=np.float32(0.05), offset=0,
                                      state=QuantizationStates.ACTIVATED)
    config.requantization = facts
    acc = np.rint(value.astype(np.float64) / accumulator_scale.reshape(along)).astype(np.int64)
    per_channel = channels > 1
    q = numerics.requantize(acc, np.asarray(multiplier) if per_channel else int(np.atleast_1d(multiplier)[0]),
                            np.asarray(shift) if per_channel else int(np.atleast_1d(shift)[0]), 0, -128, 127,
                            RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO, channel_axis=axis if per_channel else None)
    np.testing.assert_array_equal(requantize_output(config, value), numerics.dequantize(q, np.float32(0.05), 0))
