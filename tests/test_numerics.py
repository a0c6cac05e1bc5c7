"""Tests of ppqlike.core.rounding and ppqlike.core.numerics (DESIGN.md §2)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppqlike.core.errors import CalibrationDataError, QuantizationPolicyError, QuantizationStateError
from ppqlike.core.numerics import (
    dequantize, fake_quantize, fake_quantizer, minmax_to_scale_offset, power_of_2_scale, quantize, quantize_codes,
    requantize, rounding_right_shift, scale_to_multiplier_shift,
)
from ppqlike.core.rounding import RoundingPolicy, round_values

P = RoundingPolicy
POLICIES = list(RoundingPolicy)

ALMOST_HALF = 0.49999999999999994  # largest double below 0.5
VALUES = [2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 2.4, -2.4, 2.6, -2.6, ALMOST_HALF, -ALMOST_HALF, 0.0, 3.0, -3.0]
TABLE = {
    P.ROUND_HALF_EVEN:           [2, -2, 0, 0, 2, -2, 2, -2, 3, -3, 0, 0, 0, 3, -3],
    P.ROUND_HALF_AWAY_FROM_ZERO: [3, -3, 1, -1, 2, -2, 2, -2, 3, -3, 0, 0, 0, 3, -3],
    P.ROUND_HALF_TOWARDS_ZERO:   [2, -2, 0, 0, 1, -1, 2, -2, 3, -3, 0, 0, 0, 3, -3],
    P.ROUND_HALF_UP:             [3, -2, 1, 0, 2, -1, 2, -2, 3, -3, 0, 0, 0, 3, -3],
    P.ROUND_HALF_DOWN:           [2, -3, 0, -1, 1, -2, 2, -2, 3, -3, 0, 0, 0, 3, -3],
    P.ROUND_UP:                  [3, -2, 1, 0, 2, -1, 3, -2, 3, -2, 1, 0, 0, 3, -3],
    P.ROUND_DOWN:                [2, -3, 0, -1, 1, -2, 2, -3, 2, -3, 0, -1, 0, 3, -3],
    P.ROUND_TO_ZERO:             [2, -2, 0, 0, 1, -1, 2, -2, 2, -2, 0, 0, 0, 3, -3],
}


def ref_round(value, policy: RoundingPolicy) -> int:
    """Exact reference rounding of a Fraction (or anything Fraction accepts)."""
    fr = Fraction(value)
    lo, hi = math.floor(fr), math.ceil(fr)
    if policy is P.ROUND_UP:
        return hi
    if policy is P.ROUND_DOWN:
        return lo
    if policy is P.ROUND_TO_ZERO:
        return math.trunc(fr)
    diff = fr - lo
    if diff != Fraction(1, 2):
        return lo if diff < Fraction(1, 2) else hi
    return {
        P.ROUND_HALF_EVEN: lo if lo % 2 == 0 else hi,
        P.ROUND_HALF_AWAY_FROM_ZERO: hi if fr > 0 else lo,
        P.ROUND_HALF_TOWARDS_ZERO: lo if fr > 0 else hi,
        P.ROUND_HALF_UP: hi,
        P.ROUND_HALF_DOWN: lo,
    }[policy]


# ------------------------------------------------------------------ rounding
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_rounding_table_arrays_and_scalars(policy):
    expected = TABLE[policy]
    for dtype, n in ((np.float64, len(VALUES)), (np.float32, 10)):  # the first 10 are exact in float32
        got = round_values(np.array(VALUES[:n], dtype=dtype), policy)
        assert got.dtype == dtype
        assert got.tolist() == expected[:n], dtype
    for value, want in zip(VALUES, expected):
        got = round_values(value, policy)
        assert isinstance(got, float) and got == want, (value, got, want)
        assert round_values(np.float64(value), policy) == want
    for value, want in zip(VALUES[:10], expected[:10]):  # exact in float32
        assert round_values(np.float32(value), policy) == want
    assert round_values(VALUES, policy.name).tolist() == expected  # by name, from a list


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_round_values_matches_exact_reference_on_near_ties(policy):
    near = [np.nextafter(k + 0.5, s) for k in range(-4, 4) for s in (-np.inf, np.inf)]
    values = np.array(near + [k + 0.5 for k in range(-4, 4)])
    got = round_values(values, policy)
    assert got.tolist() == [ref_round(v, policy) for v in values]


def test_round_values_passes_through_integers_nan_inf_and_rejects_unknown_policy():
    ints = np.array([1, -2, 3])
    assert round_values(ints, P.ROUND_UP) is ints
    special = round_values(np.array([np.inf, -np.inf, np.nan]), P.ROUND_HALF_UP)
    assert special[0] == np.inf and special[1] == -np.inf and np.isnan(special[2])
    assert round_values(7, P.ROUND_DOWN) == 7.0
    with pytest.raises(QuantizationPolicyError, match="ROUND_SIDEWAYS"):
        round_values(1.5, "ROUND_SIDEWAYS")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2 ** 40, 2 ** 40), min_size=1, max_size=20),
       st.sampled_from(POLICIES), st.sampled_from([np.float64, np.float32]))
def test_array_equals_scalar_on_ties(halves, policy, dtype):
    if dtype is np.float32:
        halves = [h % (2 ** 22) - 2 ** 21 for h in halves]  # exact halves in float32
    values = np.array([h / 2 for h in halves], dtype=dtype)
    array_result = round_values(values, policy)
    for value, got in zip(values, array_result):
        assert round_values(value, policy) == got == ref_round(float(value), policy)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20), st.sampled_from(POLICIES))
def test_round_values_matches_reference_on_random_floats(values, policy):
    got = round_values(np.array(values), policy)
    assert got.tolist() == [ref_round(v, policy) for v in values]
    assert [round_values(v, policy) for v in values] == got.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-2.0 ** 24, 2.0 ** 24, width=32), min_size=1, max_size=30),
       st.sampled_from([np.float32, np.float64]))
def test_half_up_by_floor_in_each_dtype(values, dtype):
    """ROUND_HALF_UP is floor(t + b), b the float just below 0.5, with t = -0.5 set apart: exact in float32 and
    float64 (ties, their neighbours, the float below 0.5, large and tiny values), as the exact reference."""
    from ppqlike.core.rounding import round_into
    edges = [0.5, -0.5, 1.5, -1.5, 2.0 ** 22 + 0.5, -2.0 ** 22 - 0.5, 2.0 ** 23 + 1, 1e-30, -1e-30, 0.0, -0.0]
    edges += [float(np.nextafter(dtype(k + 0.5), dtype(side))) for k in range(-3, 3) for side in (-1e9, 1e9)]
    t = np.array(values + edges, dtype)
    got = round_into(t.copy(), np.empty_like(t), P.ROUND_HALF_UP)
    assert got.tolist() == [ref_round(float(v), P.ROUND_HALF_UP) for v in t]


# ------------------------------------------------------- quantize/dequantize
def test_quantize_basic_per_tensor_and_dtypes():
    x = np.array([-1.0, -0.25, 0.0, 0.25, 0.375, 10.0], dtype=np.float32)
    q = quantize(x, np.float32(0.25), 3, 0, 255)
    assert q.dtype == np.int32 and q.tolist() == [0, 2, 3, 4, 5, 43]  # 1.5 -> 2 (half even)
    assert quantize(x, 0.25, 3, 0, 255, P.ROUND_HALF_UP).tolist() == [0, 2, 3, 4, 5, 43]
    assert quantize(x, 0.25, 0, -2, 1).tolist() == [-2, -1, 0, 1, 1, 1]
    r = dequantize(q, np.float32(0.25), 3)
    assert r.dtype == np.float32 and r.tolist() == [-0.75, -0.25, 0.0, 0.25, 0.5, 10.0]
    wide = quantize(np.array([0.0, 1e12]), 1.0, 0, 0, 2 ** 32 - 1)
    assert wide.dtype == np.int64 and wide.tolist() == [0, 2 ** 32 - 1]
    assert quantize(2.5, 1.0, 0, -128, 127).tolist() == 2


def test_quantize_32_bit_bias_does_not_overflow():
    qmin, qmax = -2 ** 31, 2 ** 31 - 1
    x = np.array([123456.789, -123456.789, 1e9, -1e9, 0.0], dtype=np.float32)
    q = quantize(x, 0.001, 0, qmin, qmax)
    assert q.dtype == np.int32
    expected = [ref_round(Fraction(float(v)) / Fraction(0.001), P.ROUND_HALF_EVEN) for v in x[:2]]
    assert q[:2].tolist() == expected
    assert q[2:].tolist() == [qmax, qmin, 0]
    # float32 data and scale still divide in float64 for a 32-bit range: 1e8 / 3 -> 33333333
    q32 = quantize(np.float32([1e8]), np.float32(3.0), 0, qmin, qmax)
    assert q32.tolist() == [33333333] and float(np.float32(1e8) / np.float32(3.0)) != 33333333.0
    f = fake_quantize(x, np.float32(0.001), 0, qmin, qmax)
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, dequantize(quantize(x, np.float32(0.001), 0, qmin, qmax), np.float32(0.001), 0))


def test_bad_parameters_raise():
    with pytest.raises(QuantizationStateError, match="scale"):
        quantize(np.ones(3), 0.0, 0, 0, 255)
    with pytest.raises(QuantizationStateError, match="scale"):
        fake_quantize(np.ones(3), np.nan, 0, 0, 255)
    with pytest.raises(QuantizationStateError, match="quant_min"):
        quantize(np.ones(3), 1.0, 0, 5, 5)
    with pytest.raises(QuantizationStateError, match="channels"):
        quantize(np.ones((2, 3)), np.ones(4), 0, 0, 255, channel_axis=1)
    with pytest.raises(QuantizationStateError, match="channel_axis"):
        quantize(np.ones((2, 3)), np.ones(3), 0, 0, 255)


finite = st.floats(-1e4, 1e4, allow_nan=False, width=64)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=1, max_size=30), st.floats(1e-3, 10.0), st.integers(2, 16),
       st.booleans(), st.data())
def test_dequantize_quantize_error_within_half_step(values, scale, bits, signed, data):
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    offset = data.draw(st.integers(qmin, qmax))
    x = np.array(values)
    policy = data.draw(st.sampled_from([P.ROUND_HALF_EVEN, P.ROUND_HALF_UP, P.ROUND_HALF_AWAY_FROM_ZERO]))
    r = dequantize(quantize(x, scale, offset, qmin, qmax, policy), scale, offset).astype(np.float64)
    lo, hi = scale * (qmin - offset), scale * (qmax - offset)
    inside = (x >= lo) & (x <= hi)
    tol = scale / 2 * (1 + 1e-6) + 1e-6 * np.abs(x)
    assert np.all(np.abs(r - x)[inside] <= tol[inside])
    np.testing.assert_allclose(r[x < lo], np.float32(lo), rtol=1e-6)
    np.testing.assert_allclose(r[x > hi], np.float32(hi), rtol=1e-6)
    np.testing.assert_array_equal(fake_quantize(x, scale, offset, qmin, qmax, policy), r.astype(np.float32))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.sampled_from(POLICIES), st.sampled_from([np.float32, np.float64]),
       st.sampled_from([(-128, 127), (0, 255), (-127, 127), (-8, 7), (-32768, 32767), (-2 ** 31, 2 ** 31 - 1)]),
       st.integers(0, 2 ** 31))
def test_fake_quantize_equals_two_step_path(axis_pick, policy, dtype, qrange, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype)
    x[0, 0, :3] = [0.5, -0.5, 1.5]  # ties for scale 1
    if axis_pick == 3:
        axis, scale, offset = None, np.float32(rng.uniform(0.01, 1)), int(rng.integers(qmin, qmax + 1) // 2)
    else:
        axis = [0, 1, -1][axis_pick]
        n = x.shape[axis]
        scale = rng.uniform(0.01, 1, n).astype(np.float32)
        offset = (rng.integers(qmin, qmax + 1, n) // 2).astype(np.int64)
    for s in (scale, np.asarray(scale, dtype=np.float64)):
        q = quantize(x, s, offset, qmin, qmax, policy, channel_axis=axis)
        two_step = dequantize(q, s, offset, channel_axis=axis)
        fake = fake_quantize(x, s, offset, qmin, qmax, policy, channel_axis=axis)
        assert fake.dtype == np.float32 and fake.shape == x.shape
        np.testing.assert_array_equal(fake, two_step)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(POLICIES), st.integers(0, 2 ** 31), st.integers(1, 5), st.booleans())
def test_fake_quantize_on_threads_writes_the_same_bytes(policy, seed, blocks, in_place):
    """The executor hands the per-tensor path its kernel threads (``map_blocks``): the same blocks, so the
    same bytes as one thread, zero signs included, for fake_quantize and quantize_codes."""
    from ppqlike.executor.ops import _threads
    rng = np.random.default_rng(seed)
    scale = np.float32(0.125)
    x = (rng.standard_normal(blocks * (1 << 17) - 7) * 20).astype(np.float32)
    spots = rng.choice(x.size, 40, replace=False)
    x[spots[:30]] = (rng.integers(-200, 200, 30) + 0.5).astype(np.float32) * scale   # ties in some blocks
    x[spots[30:]] = -0.01   # rounds to a zero code
    _threads.set_num_threads(2)
    try:
        serial = fake_quantize(x.copy(), scale, 3, -128, 127, policy)
        source = x.copy()
        threaded = fake_quantize(source, scale, 3, -128, 127, policy, out=source if in_place else None,
                                 map_blocks=_threads.parallel_items)
        assert threaded.tobytes() == serial.tobytes()
        codes = quantize_codes(x, scale, 3, -128, 127, policy, map_blocks=_threads.parallel_items)
        assert codes.tobytes() == quantize_codes(x, scale, 3, -128, 127, policy).tobytes()
    finally:
        _threads.set_num_threads(None)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(POLICIES), st.sampled_from([(-128, 127), (0, 255), (-32768, 32767)]),
       st.integers(0, 2 ** 31), st.booleans())
def test_fake_quantize_in_blocks_and_in_place_equals_two_step_path(policy, qrange, seed, in_place):
    """Activations larger than a cache block: ties, NaN and inf scattered over several blocks (a block
    with a tie and a NaN must still round the tie by the policy), the result written into ``x`` itself."""
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange
    scale, offset = np.float32(0.25), int(rng.integers(qmin, qmax + 1) // 2)
    x = (rng.standard_normal(3 * (1 << 17) + 123) * 20).astype(np.float32)
    spots = rng.choice(x.size, 60, replace=False)
    x[spots[:40]] = (rng.integers(-200, 200, 40) + 0.5).astype(np.float32) * scale   # exact ties
    x[spots[40:50]] = np.nan
    x[spots[50:]] = np.inf * np.sign(rng.standard_normal(10))
    x = x.reshape(3, -1)
    with np.errstate(invalid="ignore"):
        expected = dequantize(quantize(x, scale, offset, qmin, qmax, policy), scale, offset)
        finite = np.isfinite(x)
        source = x.copy()
        got = fake_quantize(source, scale, offset, qmin, qmax, policy, out=source if in_place else None)
    assert (got is source) == in_place
    np.testing.assert_array_equal(got[finite], expected[finite])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    with np.errstate(invalid="ignore"):   # the codes: quantize's integers less Z, S times them the values
        codes = quantize_codes(x.T, scale, offset, qmin, qmax, policy).T   # channels-last-like memory order
        np.testing.assert_array_equal(codes[finite], (quantize(x, scale, offset, qmin, qmax, policy) - offset)[finite])
        assert (codes * scale).tobytes() == fake_quantize(x, scale, offset, qmin, qmax, policy).tobytes()
    assert quantize_codes(x.astype(np.float64), scale, offset, qmin, qmax, policy) is None
    # prepared once, run on blocks (C-ordered, transposed, strided, float64) into C-ordered outputs: the bytes
    # fake_quantize writes there, zero signs included
    quantizer = fake_quantizer(scale, offset, qmin, qmax, policy)
    with np.errstate(invalid="ignore"):
        for block in (x, x.T, x[:, ::2], x.astype(np.float64)):
            out, expected = np.empty(block.shape, np.float32), np.empty(block.shape, np.float32)
            assert quantizer(block, out) is out
            assert out.tobytes() == fake_quantize(block, scale, offset, qmin, qmax, policy, out=expected).tobytes()


def test_per_channel_matches_per_tensor_slices():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    scale = np.float32([0.1, 0.02, 0.3])
    offset = np.array([0, 5, -3])
    got = fake_quantize(x, scale, offset, -128, 127, channel_axis=1)
    for c in range(3):
        np.testing.assert_array_equal(got[:, c], fake_quantize(x[:, c], scale[c], offset[c], -128, 127))
    q = quantize(x, scale, offset, -128, 127, channel_axis=1)
    np.testing.assert_array_equal(dequantize(q, scale, offset, channel_axis=1), got)


def test_float32_division_not_reciprocal_multiplication():
    # x / s and x * (1 / s) differ in float32 for some values: we must divide.
    rng = np.random.default_rng(1)
    s = np.float32(0.1)
    x = (rng.standard_normal(200000) * 100).astype(np.float32)
    div = np.rint(x / s)
    mul = np.rint(x * (np.float32(1) / s))
    assert np.any(div != mul)  # the test data does tell the two apart
    np.testing.assert_array_equal(quantize(x, s, 0, -2 ** 15, 2 ** 15 - 1), div.astype(np.int32))


# -------------------------------------------------------------- onnxruntime
def _qdq_model(x_shape, scale, zero_point, axis):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
             numpy_helper.from_array(np.asarray(zero_point), "z")]
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)]
    qtype = helper.np_dtype_to_tensor_dtype(np.asarray(zero_point).dtype)
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("q", qtype, list(x_shape)),
         helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(x_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10  # onnxruntime 1.31 reads IR <= 13
    return model


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_fake_quantize_matches_onnxruntime_qdq(zp_dtype, axis):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(42)
    shape = (6, 5, 4)
    info = np.iinfo(zp_dtype)
    if axis is None:
        scale = np.float32(0.0371)
        zp = np.asarray(rng.integers(info.min // 2, info.max // 2 + 1), dtype=zp_dtype)
    else:
        scale = rng.uniform(0.005, 0.2, shape[axis]).astype(np.float32)
        zp = rng.integers(info.min // 2, info.max // 2 + 1, shape[axis]).astype(zp_dtype)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    # exact ties: (k + 0.5) * scale where that product divides back exactly
    x.reshape(-1)[:40] = (np.arange(-20, 20) + 0.5).astype(np.float32) * np.float32(0.25)
    if axis is None:
        scale = np.float32(0.25) if zp_dtype is np.int8 else scale
    model = _qdq_model(shape, scale, zp, axis)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q_ort, y_ort = session.run(None, {"x": x})
    q = quantize(x, scale, zp.astype(np.int64), int(info.min), int(info.max), channel_axis=axis)
    np.testing.assert_array_equal(q, q_ort.astype(np.int64))
    y = fake_quantize(x, scale, zp.astype(np.int64), int(info.min), int(info.max), channel_axis=axis)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, y_ort)


# ------------------------------------------------------------- scale choice
def test_minmax_to_scale_offset_examples():
    s, z = minmax_to_scale_offset(-1.0, 2.0, 0, 255, symmetric=False)
    assert s == float(np.float32(3 / 255)) and z == 85
    s, z = minmax_to_scale_offset(1.0, 3.0, 0, 255, symmetric=False)  # widened to [0, 3]
    assert s == float(np.float32(3 / 255)) and z == 0
    s, z = minmax_to_scale_offset(-3.0, -1.0, 0, 255, symmetric=False)  # widened to [-3, 0]
    assert z == 255
    assert minmax_to_scale_offset(-2.0, 1.0, -127, 127, True) == (float(np.float32(2 / 127)), 0)
    assert minmax_to_scale_offset(-2.0, 1.0, -128, 127, True) == (float(np.float32(2 / 127.5)), 0)
    assert minmax_to_scale_offset(-2.0, 1.0, 0, 255, True) == (float(np.float32(2 / 127.5)), 128)
    s, z = minmax_to_scale_offset(-2.0, 1.0, -127, 127, True, power_of_2=True)
    assert s == 2.0 ** -5 and z == 0  # 2/127 = 0.01575 -> 0.03125 (0.015625 would not cover)
    s, z = minmax_to_scale_offset(0.0, 0.0, 0, 255, False)
    assert s > 0 and math.isfinite(s) and z == 0
    s, z = minmax_to_scale_offset(0.0, 0.0, -128, 127, True, power_of_2=True)
    assert s > 0 and z == 0


def test_minmax_to_scale_offset_per_channel_and_errors():
    mins, maxs = np.array([-1.0, 0.0, -4.0]), np.array([2.0, 0.0, -1.0])
    s, z = minmax_to_scale_offset(mins, maxs, 0, 255, False)
    assert s.dtype == np.float32 and z.dtype == np.int64 and s.shape == z.shape == (3,)
    for c in range(3):
        assert (float(s[c]), int(z[c])) == minmax_to_scale_offset(float(mins[c]), float(maxs[c]), 0, 255, False)
    with pytest.raises(CalibrationDataError):
        minmax_to_scale_offset(np.nan, 1.0, 0, 255, False)
    with pytest.raises(CalibrationDataError):
        minmax_to_scale_offset(2.0, 1.0, 0, 255, False)
    with pytest.raises(CalibrationDataError, match="float32"):
        minmax_to_scale_offset(-1e300, 1e300, 0, 255, False)


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.sampled_from([(0, 255), (-128, 127), (-127, 127),
       (0, 15), (-32768, 32767)]), st.booleans(), st.booleans(), st.sampled_from(POLICIES))
def test_minmax_covers_range_and_zero_is_exact(a, b, qrange, symmetric, pow2, policy):
    lo, hi = min(a, b), max(a, b)
    qmin, qmax = qrange
    assume(not symmetric or qmin < 0)  # unsigned symmetric has Z=128: 0 exact, tested above
    s, z = minmax_to_scale_offset(lo, hi, qmin, qmax, symmetric, pow2, policy)
    assert s > 0 and qmin <= z <= qmax
    assert fake_quantize(np.array([0.0]), s, z, qmin, qmax)[0] == 0.0
    if pow2:
        assert math.log2(s) == round(math.log2(s))
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    # both ends are representable to within one step (the offset's own rounding may cost one)
    for v in (lo0, hi0):
        err = abs(float(fake_quantize(np.array([v]), s, z, qmin, qmax)[0]) - v)
        assert err <= s * 1.01 + 1e-6 * abs(v), (v, s, z)  # 1% slack: float32 rounding of s


def test_power_of_2_scale():
    assert power_of_2_scale(0.3) == 0.5
    assert power_of_2_scale(0.25) == 0.25
    assert power_of_2_scale(0.3, P.ROUND_DOWN) == 0.25
    assert power_of_2_scale(0.3, P.ROUND_HALF_EVEN) == 0.25  # log2 0.3 = -1.74 -> -2
    np.testing.assert_array_equal(power_of_2_scale(np.array([3.0, 4.0, 5.0])), [4.0, 4.0, 8.0])
    with pytest.raises(QuantizationStateError):
        power_of_2_scale(0.0)


# ------------------------------------------------------- multiplier / shift
def test_multiplier_shift_example_and_edges():
    assert scale_to_multiplier_shift(0.1234, 32) == (2119995857, 34)
    assert scale_to_multiplier_shift(0.0) == (0, 0)
    m, s = scale_to_multiplier_shift(3.0, 32)
    assert (m, s) == (3 << 29, 29)
    m, s = scale_to_multiplier_shift(0.1234, 8)
    assert 64 <= m < 128 and abs(m / 2 ** s - 0.1234) / 0.1234 <= 2 ** -7
    m, s = scale_to_multiplier_shift(1.0 - 2 ** -40, 16)  # rounds up to 2^15: renormalised
    assert (m, s) == (2 ** 14, 14)
    with pytest.raises(QuantizationStateError, match="2\\^7"):
        scale_to_multiplier_shift(200.0, 8)
    with pytest.raises(QuantizationStateError):
        scale_to_multiplier_shift(-0.5)
    m, s = scale_to_multiplier_shift(2.0 ** -80, 32)  # capped shift
    assert s <= 62
    arr_m, arr_s = scale_to_multiplier_shift(np.array([0.1234, 0.0, 3.0]))
    assert arr_m.dtype == arr_s.dtype == np.int64
    assert arr_m.tolist() == [2119995857, 0, 3 << 29] and arr_s.tolist() == [34, 0, 29]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([8, 16, 32]), st.floats(-30, 0), st.floats(0, 1, exclude_max=True))
def test_multiplier_shift_precision(bits, log2_scale, frac):
    scale = 2.0 ** log2_scale * (1 + frac)
    assume(scale < 2.0 ** (bits - 1))
    m, s = scale_to_multiplier_shift(scale, bits)
    assert 2 ** (bits - 2) <= m < 2 ** (bits - 1)
    assert 0 <= s <= 62
    assert abs(Fraction(m, 2 ** s) - Fraction(scale)) / Fraction(scale) <= Fraction(1, 2 ** (bits - 1))
    arr_m, arr_s = scale_to_multiplier_shift(np.array([scale, scale / 3]), bits)
    assert (int(arr_m[0]), int(arr_s[0])) == (m, s)
    assert (int(arr_m[1]), int(arr_s[1])) == scale_to_multiplier_shift(scale / 3, bits)


# ------------------------------------------------------------- requantize
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_rounding_right_shift_exhaustive_small(policy):
    values = np.arange(-64, 65)
    for shift in range(0, 5):
        got = rounding_right_shift(values, shift, policy)
        assert got.tolist() == [ref_round(Fraction(int(v), 2 ** shift), policy) for v in values]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=1, max_size=20), st.floats(1e-6, 4.0),
       st.sampled_from([8, 16, 32]), st.sampled_from(POLICIES), st.integers(-128, 127),
       st.sampled_from([(-128, 127), (0, 255), (-32768, 32767), (-2 ** 31, 2 ** 31 - 1)]))
def test_requantize_equals_exact_rounding(acc, scale, bits, policy, offset, qrange):
    qmin, qmax = qrange
    offset = min(max(offset, qmin), qmax)
    m, s = scale_to_multiplier_shift(scale, bits)
    y = requantize(np.array(acc, dtype=np.int32), m, s, offset, qmin, qmax, policy)
    expected = [min(max(ref_round(Fraction(a * m, 2 ** s), policy) + offset, qmin), qmax) for a in acc]
    assert y.tolist() == expected


def test_requantize_per_channel_and_errors():
    rng = np.random.default_rng(3)
    acc = rng.integers(-100000, 100000, (2, 3, 4))
    scales = np.array([0.001, 0.0123, 0.5])
    m, s = scale_to_multiplier_shift(scales)
    y = requantize(acc, m, s, np.array([0, 3, -3]), -128, 127, P.ROUND_HALF_UP, channel_axis=1)
    for c in range(3):
        np.testing.assert_array_equal(
            y[:, c], requantize(acc[:, c], int(m[c]), int(s[c]), [0, 3, -3][c], -128, 127, P.ROUND_HALF_UP))
    with pytest.raises(QuantizationStateError, match="overflow"):
        requantize(np.array([2 ** 40]), 2 ** 30, 10, 0, -128, 127)
    with pytest.raises(QuantizationStateError, match="integer"):
        requantize(np.array([1.5]), 1, 0, 0, -128, 127)
