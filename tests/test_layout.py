"""Memory-order views (core.layout) and the simulation numerics on channels-last arrays (issue 17):
whatever the layout, the same values come out, and in-place work reaches the array."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ppqlike.core import layout
from ppqlike.core.numerics import fake_quantize
from ppqlike.core.quant import (QuantizationPolicy, QuantizationProperty, QuantizationStates,
                                TensorQuantizationConfig)
from ppqlike.executor.integer_codes import integer_codes


def _stored(x: np.ndarray, axes) -> np.ndarray:
    """The values of ``x`` stored with its axes in memory in the order ``axes`` (outermost first)."""
    return np.ascontiguousarray(x.transpose(axes)).transpose(np.argsort(axes))


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None)
@given(shape=shapes, data=st.data())
def test_views_follow_memory_and_write_through(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    stored = _stored(x, axes)
    flat = layout.flat_view(stored)
    np.testing.assert_array_equal(np.sort(flat), np.sort(x.reshape(-1)))
    assert np.shares_memory(flat, stored)
    channel = data.draw(st.sampled_from([None] + list(range(len(shape)))))
    view = layout.channel_view(stored, channel)
    assert view.ndim == 3 and view.size == x.size and np.shares_memory(view, stored)
    if channel is not None:
        assert view.shape[1] == shape[channel]
        for index in range(shape[channel]):   # the middle axis of the view is the channel axis
            np.testing.assert_array_equal(np.sort(view[:, index].reshape(-1)),
                                          np.sort(np.take(x, index, axis=channel).reshape(-1)))
    view[...] = -1
    assert np.all(stored == -1)
    fresh = layout.empty_like_dense(stored)
    assert layout.same_layout(fresh, stored) or x.size == 1 or 1 in shape


def test_views_of_gapped_arrays_are_none():
    x = np.zeros((4, 6), np.float32)[:, ::2]
    assert layout.memory_axes(x) is None and layout.flat_view(x) is None and layout.channel_view(x, 1) is None
    assert layout.memory_axes(x.T.copy().T) == (1, 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10 ** 6), scale=st.floats(1e-3, 2.0), offset=st.integers(-20, 20),
       big=st.booleans())
def test_fake_quantize_same_values_in_any_layout(seed, scale, offset, big):
    """The per-tensor fast path walks memory order; the values equal those of the C-ordered array, bit for bit."""
    shape = (2, 40, 48, 80) if big else (2, 5, 6, 7)   # big: more than one block of the blockwise path
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)
    stored = _stored(x, (0, 2, 3, 1))
    expected = fake_quantize(x, np.float32(scale), offset, -128, 127)
    result = fake_quantize(stored, np.float32(scale), offset, -128, 127)
    np.testing.assert_array_equal(result, expected)
    assert layout.same_layout(result, stored)
    in_place = stored.copy(order="K")
    assert fake_quantize(in_place, np.float32(scale), offset, -128, 127, out=in_place) is in_place
    np.testing.assert_array_equal(in_place, expected)


@pytest.mark.parametrize("on_grid", [True, False])
def test_integer_codes_keep_the_layout(on_grid):
    policy = QuantizationPolicy(QuantizationProperty.PER_TENSOR | QuantizationProperty.LINEAR
                                | QuantizationProperty.ASYMMETRICAL)
    config = TensorQuantizationConfig(policy, quant_min=0, quant_max=255, scale=np.float32(0.05), offset=3,
                                      state=QuantizationStates.ACTIVATED)
    x = config.fake_quantize(np.random.default_rng(0).standard_normal((2, 40, 48, 80)).astype(np.float32))
    stored = _stored(x, (0, 2, 3, 1))
    codes = integer_codes(config, stored, on_grid)
    np.testing.assert_array_equal(codes, integer_codes(config, x, on_grid))
    assert layout.same_layout(codes, stored)
