"""A Relu/Clip folded into the fake quantization after it: the same bits as the clip and then the quantization."""

import numpy as np
from hypothesis import given, settings, strategies as st

from ppqlike.core import numerics
from ppqlike.core.clipped_quantization import code_bounds, fake_quantize_clipped
from ppqlike.core.rounding import RoundingPolicy

GRIDS = [(-128, 127, 0), (0, 255, 0), (0, 255, 128), (-127, 127, 0), (0, 255, 3), (-8, 7, 0)]
BOUNDS = [(0.0, 6.0), (0.0, None), (None, None), (-1.0, 1.0), (0.5, 3.0), (-0.0, 6.0), (0.0, 0.0), (None, 2.0)]


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.05, 0.0234, 1.0, 0.5, 2.0 ** -5, 0.9, 3e-3, 2.0, 17.0]),
       grid=st.sampled_from(GRIDS), bounds=st.sampled_from(BOUNDS), policy=st.sampled_from(list(RoundingPolicy)),
       magnitude=st.sampled_from([1e-2, 1.0, 10.0, 1e3]), layout=st.sampled_from(["new", "in place", "strided"]))
def test_folded_clip_gives_the_bits_of_clip_then_fake_quantize(seed, scale, grid, bounds, policy, magnitude, layout):
    """Every value, ties, subnormals and infinities included, in every output layout; where the clip folds,
    the very bits of the dense fake quantization, the sign of each zero too (``numerics.fake_quantize`` gives
    the values of the two-step quantization, but the sign of a zero by its path: see its docstring)."""
    rng = np.random.default_rng(seed)
    quant_min, quant_max, offset = grid
    low, high = bounds
    scale = np.float32(scale)
    x = (rng.standard_normal((3, 11, 7)) * magnitude).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [-0.0, 0.0, -scale / 4, scale / 2, -scale / 2, np.float32(-1e-45), np.inf, -np.inf]
    flat[8:40] = ((rng.integers(-300, 300, 32) + 0.5) * scale).astype(np.float32)   # halfway values
    clipped = np.clip(x, -np.inf if low is None else low, np.inf if high is None else high)
    want = numerics.fake_quantize(clipped, scale, offset, quant_min, quant_max, policy)
    if layout == "in place":
        out = x.copy()
        got = fake_quantize_clipped(out, scale, offset, quant_min, quant_max, policy, low, high, out)
    elif layout == "strided":   # a padded buffer's interior, as a depthwise convolution's input
        buffer = np.full((3, 13, 7), np.nan, np.float32)
        got = fake_quantize_clipped(x, scale, offset, quant_min, quant_max, policy, low, high, buffer[:, 1:-1])
        assert np.isnan(buffer[:, [0, -1]]).all()
    else:
        got = fake_quantize_clipped(x, scale, offset, quant_min, quant_max, policy, low, high, np.empty_like(x))
    np.testing.assert_array_equal(got, want)
    folded = code_bounds(scale, offset, quant_min, quant_max, low, high)
    if folded is not None:   # folded: the very bits (half up on codes >= 0: zeros come out +0.0)
        floor_rounded = folded[0] >= 0 and policy in (RoundingPolicy.ROUND_HALF_UP,
                                                       RoundingPolicy.ROUND_HALF_AWAY_FROM_ZERO)
        expected = np.where(want == 0, np.float32(0), want) if floor_rounded else want
        np.testing.assert_array_equal(bits(got), bits(expected))


def test_half_up_is_a_floor_of_the_code_plus_the_float_below_a_half_on_every_float32_to_2_22():
    """floor(t + (0.5 - 2^-25)) in float32 equals floor(t + 0.5) in exact arithmetic for every float32
    t in [0, 2^22] (about 1.25e9 values; t + 0.5 in float32 would fail at t = 0.5 - 2^-25)."""
    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    top = int(np.float32(2.0 ** 22).view(np.uint32))
    step = 1 << 22
    for start in range(0, top + 1, step):
        t = np.arange(start, min(start + step, top + 1), dtype=np.uint32).view(np.float32)
        np.testing.assert_array_equal(np.floor(t + below_half), np.floor(t.astype(np.float64) + 0.5))
    t = np.nextafter(np.float32(0.5), np.float32(0))
    assert np.floor(t + np.float32(0.5)) == 1 and np.floor(t + below_half) == 0   # why not t + 0.5


def test_code_bounds_fold_only_where_the_signs_of_zero_survive():
    """Relu6 on int8 folds to the codes [0, 6 / S]; a range starting at code 0 with a clip below 0 (rounding
    -0.3 first gives -0.0, clipping first +0.0) or no lower clip, a scale above 1 (a tiny negative x / S
    could become -0.0) and an empty range do not fold."""
    scale = np.float32(0.05)
    assert code_bounds(scale, 0, -128, 127, 0.0, 6.0) == (np.float32(0.0), np.float32(6.0) / scale)
    assert code_bounds(scale, 0, -128, 127, None, None) == (-128.0, 127.0)
    assert code_bounds(scale, 0, 0, 255, -1.0, 1.0) is None
    assert code_bounds(scale, 0, 0, 255, None, 6.0) is None
    assert code_bounds(np.float32(2.0), 0, -128, 127, 0.0, 6.0) is None
    assert code_bounds(scale, 0, -128, 127, 7.0, 9.0) is None            # 140 .. 180 lies past 127
    assert code_bounds(scale, 0, -128, 127, 0.1 + 2 ** -30, 6.0) is None  # not a float32 number
    naive = np.rint(np.clip(np.float32(-0.01) / scale, np.float32(0), np.float32(255)))
    exact = numerics.fake_quantize(np.float32(-0.01), scale, 0, 0, 255)
    assert bits(naive * scale) != bits(exact)   # the naive fold gives +0.0 where the quantization gives -0.0
